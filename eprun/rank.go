package eprun

import (
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// Rank is the model on one rank's device, as the group drives it: the steps of a forward pass
// and of a MoE layer that are the model's own (its router, its experts' SwiGLU, its combine),
// while the group exchanges, plans and moves. The engine's rank models implement it.
type Rank interface {
	// Device is the rank's device.
	Device() device.Device
	// Label names the device work enqueued next, on devices that draw it: name, then
	// "L<layer>" and "E<expert>" where they are not negative.
	Label(kind, name string, layer, expert int)
	// HostBackend computes on the device's kernels with the host's operations and Go
	// memory, as every step of a MoE layer under expert parallelism does.
	HostBackend() models.Backend
	// Route runs layer's router on T rows of x and routes every token: its logits (T rows
	// of the layer's experts) and each token's choice.
	Route(b models.Backend, layer int, moe *models.MoE, x []float32, T int) ([]float32, []Route, error)
	// Expert computes routed expert e of layer on T rows of x into out, with its matrices f
	// (where the rank has them): its SwiGLU block, or gpt-oss's with the expert's biases.
	Expert(b models.Backend, layer, e int, f *models.FFN, x []float32, T int, out []float32)
	// Combine sums each token's expert outputs into out, weighted, in the order of its
	// slots: slot off[t]+k of ys holds token t's k-th expert's output.
	Combine(b models.Backend, layer int, routes []Route, ys []float32, off []int, out []float32)
	// SharedExpert adds the layer's shared expert, if it has one, to out.
	SharedExpert(b models.Backend, layer int, moe *models.MoE, x []float32, T int, out []float32)
	// Forward runs a pass of tokens at positions pos0.. on kv (NewKV's) and returns every
	// row's logits.
	Forward(kv *models.KVCache, tokens []int32, pos0 int) ([]float32, error)
	// NewKV makes a KV cache in host memory for Forward.
	NewKV() (*models.KVCache, error)
	// Upload puts the rank's weights on its device, if it has memory of its own: the
	// non-expert weights, then its experts (Group.UploadExperts).
	Upload() error
	// Close releases the rank's device.
	Close() error
}

// Route is the experts chosen for one token and their mixing weights, in top-k order, then
// any expert a plan adds beyond them.
type Route struct {
	Experts []int
	Weights []float32
}

// Model is what a group needs of the model it spreads: its layers, and what it tells the
// processes of a group that must agree on what they run.
type Model struct {
	Arch *models.Model
	// Name names the model; NonExpertBytes and ExpertBytes are its weights'.
	Name                        string
	NonExpertBytes, ExpertBytes int64
	// Calibrate runs the first maxTokens tokens of text through the model, shows see each MoE
	// layer's routing of them, and returns the tokens it ran; NewGroup averages MACS's
	// centroids from it (Centroids) where Options.MACSEta asks for them.
	Calibrate func(text string, maxTokens int, see func(Routed)) (int, error)
}
