package synth

import (
	"fmt"
)

// Architectures, spelled as general.architecture.
const (
	ArchLlama     = "llama"     // dense Llama, or Mixtral when Experts > 0
	ArchQwen2     = "qwen2"     // dense, q/k/v biases
	ArchQwen2MoE  = "qwen2moe"  // Qwen1.5-MoE: shared expert behind a sigmoid gate, q/k/v biases
	ArchQwen3     = "qwen3"     // dense, per-head q/k RMSNorm
	ArchQwen3MoE  = "qwen3moe"  // Qwen3-30B-A3B: per-head q/k RMSNorm, key_length != n_embd/n_head
	ArchOLMoE     = "olmoe"     // OLMoE: q/k RMSNorm over the whole projection
	ArchDeepSeek2 = "deepseek2" // DeepSeek-V2(-Lite): MLA, leading dense layers, shared experts
	// GLM-4.5(-Air): q/k/v biases, partial NEOX rope, leading dense layers, sigmoid routing
	// with the selection bias, a shared expert, and multi-token-prediction blocks at the end
	ArchGLM4MoE = "glm4moe"
	// gpt-oss: q/k/v/o biases, attention sinks, a sliding window on the even layers, YaRN,
	// a biased router choosing by its logits, biased experts with the SwiGLU-OAI activation
	ArchGPTOSS = "gpt-oss"
	// Qwen3.5/3.6-MoE: gated DeltaNet layers with a gated full-attention layer every few,
	// partial rope with sections, post-attention norms, and a sigmoid-gated shared expert
	ArchQwen35MoE = "qwen35moe"
)

// Spec describes one synthetic model. Field names follow the GGUF keys they become; zero values
// mean "not used by this architecture" unless a comment says otherwise.
type Spec struct {
	Name string // general.name; also the file and fixture name in the golden set
	Arch string
	Seed uint64 // with a tensor's name, seeds that tensor's values

	Tokenizer string // TokSPM, TokQwen2, TokQwen3, TokOLMo or TokDeepSeek
	Vocab     int    // exact number of tokens

	Layers  int
	Embd    int
	Heads   int
	HeadsKV int // 0 = Heads
	// HeadDim sets attention.key_length and value_length when it differs from Embd/Heads
	// (Qwen3 does this); 0 = Embd/Heads and no keys are written.
	HeadDim int
	// FFN is feed_forward_length: the dense FFN width of dense models and of DeepSeek's leading
	// dense layers. For llama-with-experts and OLMoE, whose files store the expert width in
	// feed_forward_length, leave it 0.
	FFN int

	Experts     int // expert_count; 0 = dense
	ExpertsUsed int // expert_used_count (top-k)
	ExpertFFN   int // width of one routed expert
	// SharedFFN is Qwen2-MoE's shared expert width (expert_shared_feed_forward_length).
	SharedFFN int
	// SharedExperts is DeepSeek's expert_shared_count; the shared FFN is SharedExperts*ExpertFFN wide.
	SharedExperts      int
	LeadingDense       int     // DeepSeek's leading_dense_block_count
	ExpertWeightsScale float32 // DeepSeek's expert_weights_scale (0 = key absent)
	ExpertWeightsNorm  bool    // DeepSeek's expert_weights_norm
	// SigmoidGating makes DeepSeek2 route as V3 does (expert_gating_func 2, with an
	// exp_probs_b selection bias per MoE layer); glm4moe always routes so.
	SigmoidGating bool
	// ExpertGroups > 1 limits the choice to the ExpertGroupsUsed best groups of experts
	// (expert_group_count, expert_group_used_count).
	ExpertGroups, ExpertGroupsUsed int
	// NextN is nextn_predict_layers (glm4moe; GLM-4.7-Flash as deepseek2): the last NextN of
	// Layers are the multi-token-prediction blocks, which llama.cpp loads but does not run.
	NextN int
	// SlidingWindow is gpt-oss's attention.sliding_window: the even layers see only the last
	// SlidingWindow positions.
	SlidingWindow int
	// DeltaNet is qwen35moe's linear-attention shape.
	DeltaNet *DeltaNet

	// DeepSeek attention. MLA selects the split attn_k_b/attn_v_b layout with one shared KV
	// head (what current llama.cpp converters write); otherwise one attn_kv_b holds per head
	// QKNopeDim k rows then VHeadDim v rows (older files).
	MLA        bool
	QLoraRank  int // 0 = attn_q directly (V2-Lite); >0 = attn_q_a, attn_q_a_norm, attn_q_b (V2, V3)
	KVLoraRank int
	RopeDim    int // rope.dimension_count (the q_pe / k_pe width; glm4moe: the rotated part of a head)
	QKNopeDim  int
	VHeadDim   int

	Tied     bool    // no output.weight: the LM head reuses token_embd
	Context  int     // context_length
	RopeBase float32 // rope.freq_base
	Eps      float32 // attention.layer_norm_rms_epsilon
	YaRN     *YaRN

	Types Recipe // tensor types
}

// YaRN is DeepSeek-V2's rope scaling: rope.scaling.type "yarn" with these parameters.
type YaRN struct {
	Factor      float32 // rope.scaling.factor
	OrigContext int     // rope.scaling.original_context_length
	// LogMultiplier is rope.scaling.yarn_log_multiplier as the converter writes it
	// (0.1*mscale_all_dim; llama.cpp divides it by 0.1 again when loading).
	LogMultiplier float32
}

func (s *Spec) headsKV() int {
	if s.HeadsKV == 0 {
		return s.Heads
	}
	return s.HeadsKV
}

func (s *Spec) headDim() int {
	if s.HeadDim != 0 {
		return s.HeadDim
	}
	return s.Embd / s.Heads
}

// moe reports whether layer il routes over experts.
func (s *Spec) moe(il int) bool {
	return s.Experts > 0 && il >= s.LeadingDense
}

// Validate checks the spec for combinations llama.cpp would reject or that make no sense.
func (s *Spec) Validate() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("spec %q: %s", s.Name, fmt.Sprintf(format, args...))
	}
	switch s.Arch {
	case ArchLlama, ArchQwen2, ArchQwen2MoE, ArchQwen3, ArchQwen3MoE, ArchOLMoE, ArchDeepSeek2, ArchGLM4MoE, ArchGPTOSS, ArchQwen35MoE:
	default:
		return fail("unknown architecture %q", s.Arch)
	}
	if s.Name == "" {
		return fail("no name")
	}
	if s.Layers <= 0 || s.Embd <= 0 || s.Heads <= 0 || s.Vocab <= 0 {
		return fail("layers, embd, heads and vocab must be positive")
	}
	if s.HeadDim == 0 && s.Embd%s.Heads != 0 { // with HeadDim the heads need not tile the width (GLM-4.5-Air)
		return fail("embd %d not a multiple of heads %d", s.Embd, s.Heads)
	}
	if s.Heads%s.headsKV() != 0 {
		return fail("heads %d not a multiple of kv heads %d", s.Heads, s.headsKV())
	}
	moeArch := s.Arch == ArchQwen2MoE || s.Arch == ArchQwen3MoE || s.Arch == ArchOLMoE || s.Arch == ArchDeepSeek2 || s.Arch == ArchGLM4MoE || s.Arch == ArchGPTOSS || s.Arch == ArchQwen35MoE
	if moeArch && s.Experts == 0 {
		return fail("%s needs experts", s.Arch)
	}
	if (s.Arch == ArchQwen2 || s.Arch == ArchQwen3) && s.Experts != 0 {
		return fail("%s is dense", s.Arch)
	}
	if s.Experts > 0 && (s.ExpertsUsed <= 0 || s.ExpertsUsed > s.Experts || s.ExpertFFN <= 0) {
		return fail("bad expert counts %d/%d ffn %d", s.ExpertsUsed, s.Experts, s.ExpertFFN)
	}
	if s.Experts == 0 && s.FFN <= 0 {
		return fail("dense model without FFN width")
	}
	if s.Arch == ArchQwen2MoE && s.SharedFFN <= 0 {
		return fail("qwen2moe needs a shared expert")
	}
	if s.Arch == ArchDeepSeek2 {
		if s.KVLoraRank <= 0 || s.RopeDim <= 0 || s.QKNopeDim <= 0 || s.VHeadDim <= 0 || s.SharedExperts <= 0 {
			return fail("deepseek2 needs kv_lora_rank, rope, nope and v head sizes and shared experts")
		}
		if s.LeadingDense > 0 && s.FFN <= 0 {
			return fail("deepseek2 leading dense layers need FFN")
		}
		if s.HeadsKV != 0 || s.HeadDim != 0 {
			return fail("deepseek2 head sizes come from the MLA fields")
		}
	}
	if s.Arch == ArchGLM4MoE {
		if s.SharedExperts <= 0 || s.LeadingDense > 0 && s.FFN <= 0 {
			return fail("glm4moe needs shared experts, and FFN for leading dense layers")
		}
		if s.RopeDim <= 0 || s.RopeDim > s.headDim() || s.RopeDim%2 != 0 {
			return fail("glm4moe rope dimension %d does not fit head %d", s.RopeDim, s.headDim())
		}
	}
	if s.NextN != 0 && s.Arch != ArchGLM4MoE && s.Arch != ArchDeepSeek2 {
		return fail("only glm4moe and deepseek2 (GLM-4.7-Flash) have next-token-prediction blocks")
	}
	if s.NextN < 0 || s.NextN > 0 && s.NextN >= s.Layers-s.LeadingDense {
		return fail("%d next-token-prediction blocks leave no MoE layer of %d", s.NextN, s.Layers)
	}
	if err := s.validateGPTOSS(); err != nil {
		return fail("%v", err)
	}
	if err := s.validateQwen35(); err != nil {
		return fail("%v", err)
	}
	if s.ExpertGroups > 1 && (s.Experts%s.ExpertGroups != 0 || s.ExpertGroups >= s.Experts ||
		s.ExpertGroupsUsed <= 0 || s.ExpertGroupsUsed >= s.ExpertGroups) {
		return fail("%d of %d expert groups of %d experts", s.ExpertGroupsUsed, s.ExpertGroups, s.Experts)
	}
	if s.Arch != ArchLlama && s.Tokenizer == TokSPM {
		return fail("only llama uses the SentencePiece tokenizer here")
	}
	if s.Tokenizer == "" {
		return fail("no tokenizer style")
	}
	return s.Types.validate()
}
