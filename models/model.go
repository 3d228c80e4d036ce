package models

import (
	"fmt"
	"slices"
	"sort"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// Model is a loaded architecture: hyper-parameters and weight handles, plus the attention
// code of its family. The engine runs the layer loop and the feed-forward blocks.
type Model struct {
	Config     *Config
	File       *File
	TokenEmbd  *Tensor
	OutputNorm Norm
	Output     *Tensor // token_embd when the file ties them
	Layers     []Layer
}

// Layer is one transformer block.
type Layer struct {
	AttnNorm Norm
	Attn     Attention
	FFNNorm  Norm
	// Exactly one of Dense and MoE is set.
	Dense *FFN
	MoE   *MoE
}

// Norm is an RMSNorm weight (and optional bias), decoded to floats at load.
type Norm struct {
	Weight []float32
	Bias   []float32
}

// FFN is a SwiGLU feed-forward block: down(silu(gate x) * (up x)).
type FFN struct {
	Gate, Up, Down quant.Matrix
}

// Gating is how router logits become expert probabilities (llama.cpp expert_gating_func).
type Gating int

// The gating functions of llama.cpp.
const (
	GatingSoftmax       Gating = 1
	GatingSigmoid       Gating = 2
	GatingSoftmaxWeight Gating = 3 // softmax over the selected top-k logits
)

// MoE is a routed mixture-of-experts block with optional shared experts.
type MoE struct {
	Router *Tensor // ffn_gate_inp {n_embd, n_expert}
	// GateExps, UpExps {n_embd, n_ff_exp, n_expert} and DownExps {n_ff_exp, n_embd, n_expert}.
	GateExps, UpExps, DownExps *Tensor
	// SelectionBias is added to the probabilities for choosing experts only (exp_probs_b).
	SelectionBias []float32
	Experts, Used int
	Gating        Gating
	NormWeights   bool    // renormalise the top-k weights to sum 1
	WeightsScale  float32 // 0 = none
	// Groups > 1 splits the experts into that many equal groups, and selection keeps only
	// the GroupsUsed groups whose two best selection scores sum highest (DeepSeek-V3's
	// group-limited routing; llama.cpp expert_group_count, expert_group_used_count).
	Groups, GroupsUsed int
	// Shared is the always-on shared expert(s), nil if none; SharedGate, when set, scales it
	// by sigmoid(SharedGate . x) (Qwen2-MoE).
	Shared     *FFN
	SharedGate []float32
	// SharedSigmoid: the shared gate is ggml_sigmoid (Qwen3.5), not Qwen2-MoE's silu(v)/v,
	// which differs in the last bits (SigmoidGatedAdd).
	SharedSigmoid bool
	// RouterBias is added to the router's logits, nil if none (gpt-oss's ffn_gate_inp.bias).
	RouterBias []float32
	// GateBias, UpBias ({n_ff_exp, n_expert}) and DownBias ({n_embd, n_expert}) are the
	// experts' biases, nil if none (gpt-oss): ExpertBiases slices one expert's.
	GateBias, UpBias, DownBias []float32
	// OAI, when set, replaces the experts' SwiGLU with gpt-oss's clamped one (SwiGLUOAI).
	OAI *OAIActivation
}

// OAIActivation is gpt-oss's gated activation: ggml's swiglu_oai with these constants.
type OAIActivation = device.OAIActivation

// ExpertBiases returns expert e's gate, up and down biases (nil where the block has none).
func (m *MoE) ExpertBiases(e int) (gate, up, down []float32) {
	slice := func(b []float32) []float32 {
		if b == nil {
			return nil
		}
		n := len(b) / m.Experts
		return b[e*n : (e+1)*n : (e+1)*n]
	}
	return slice(m.GateBias), slice(m.UpBias), slice(m.DownBias)
}

// PlainExperts says whether the experts are SwiGLU blocks without biases, as the engine's
// smallExperts computes them; the others (gpt-oss's) take the paths that know biases and
// the SwiGLU-OAI activation: the engine's expertFFN and fusedExperts, and a GPU's fused
// kernels.
func (m *MoE) PlainExperts() bool {
	return m.OAI == nil && m.GateBias == nil && m.UpBias == nil && m.DownBias == nil
}

// Features lists what of the model only some devices compute (device.Feature): sliding-window
// attention, attention sinks, gated attention output, DeltaNet layers, router and expert
// biases, the SwiGLU-OAI activation, the sigmoid shared-expert gate. The host's operations
// (HostOps and the engine's host expert path) compute them all. Empty for the models every
// device runs.
func (m *Model) Features() []device.Feature {
	var out []device.Feature
	add := func(f device.Feature) {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for _, l := range m.Layers {
		if a, ok := l.Attn.(*StdAttention); ok {
			if a.Window != 0 {
				add(device.SlidingWindow)
			}
			if a.Sinks != nil {
				add(device.AttentionSinks)
			}
			if a.OutGate {
				add(device.GatedAttnOutput)
			}
		}
		if _, ok := l.Attn.(*DeltaNet); ok {
			add(device.DeltaNetLayers)
		}
		if moe := l.MoE; moe != nil {
			if moe.RouterBias != nil {
				add(device.RouterBiases)
			}
			if moe.GateBias != nil || moe.UpBias != nil || moe.DownBias != nil {
				add(device.ExpertBiases)
			}
			if moe.OAI != nil {
				add(device.SwiGLUOAI)
			}
			if moe.SharedSigmoid {
				add(device.SigmoidSharedGate)
			}
		}
	}
	return out
}

// Register adds an architecture. Each architecture file calls it from init.
func Register(arch string, build func(f *File, c *Config) (*Model, error)) {
	if _, dup := registry[arch]; dup {
		panic("models: architecture registered twice: " + arch)
	}
	registry[arch] = build
}

var registry = map[string]func(f *File, c *Config) (*Model, error){}

// Architectures lists the registered architecture names.
func Architectures() []string {
	var names []string
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Load builds the model description of an opened file.
func Load(f *File) (*Model, error) {
	arch := f.Architecture()
	build, ok := registry[arch]
	if !ok {
		return nil, fmt.Errorf("%s: architecture %q: %w (supported: %v)", f.Path, arch, ErrUnknownArchitecture, Architectures())
	}
	c, err := readConfig(f)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", f.Path, arch, err)
	}
	m, err := build(f, c)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", f.Path, arch, err)
	}
	return m, nil
}
