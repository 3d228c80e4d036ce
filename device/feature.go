package device

// Feature is an operation some models need beyond what every device computes (models.Model.
// Features lists a model's). The host's operations compute them all; a device with kernels of
// its own computes those it says it does (Featured), and the engine refuses a model that needs
// another rather than run a different model's numbers.
type Feature string

// The features, named as an error message names them.
const (
	SlidingWindow     Feature = "sliding-window attention"
	AttentionSinks    Feature = "attention sinks"
	GatedAttnOutput   Feature = "gated attention output"
	DeltaNetLayers    Feature = "gated DeltaNet layers"
	RouterBiases      Feature = "router biases"
	ExpertBiases      Feature = "expert biases"
	SwiGLUOAI         Feature = "the SwiGLU-OAI activation"
	SigmoidSharedGate Feature = "the sigmoid shared-expert gate"
)

// Featured is implemented by devices with kernels of their own that compute some Features.
type Featured interface {
	Computes(f Feature) bool
}
