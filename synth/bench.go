package synth

import (
	"fmt"
)

// BenchOptions override the real shape of an architecture for a benchmark model; zero fields
// keep the real model's value (see Bench).
type BenchOptions struct {
	Layers, Embd, Heads, HeadsKV int
	Experts, ExpertsUsed         int
	ExpertFFN                    int // routed expert width
	FFN                          int // dense width (dense models, DeepSeek's leading dense layers)
	Vocab                        int
	Seed                         uint64
	Types                        Recipe
	// FullAttentionInterval overrides qwen35moe's: every Nth layer full attention, the rest
	// DeltaNet (a benchmark file of few layers still gets a full-attention layer).
	FullAttentionInterval int
}

// realShapes are the public shapes of the target models by name (DESIGN.md section 7 and
// their GGUF metadata), used as benchmark defaults. Layer counts are real too; benchmarks
// usually override them to keep files small.
var realShapes = map[string]Spec{
	"mixtral-8x7b": {Arch: ArchLlama, Tokenizer: TokSPM, Vocab: 32000, Layers: 32, Embd: 4096, Heads: 32, HeadsKV: 8,
		Experts: 8, ExpertsUsed: 2, ExpertFFN: 14336, Context: 32768, RopeBase: 1e6, Eps: 1e-5},
	"qwen1.5-moe-a2.7b": {Arch: ArchQwen2MoE, Tokenizer: TokQwen2, Vocab: 151936, Layers: 24, Embd: 2048, Heads: 16,
		Experts: 60, ExpertsUsed: 4, ExpertFFN: 1408, SharedFFN: 5632, Context: 8192, RopeBase: 1e6, Eps: 1e-6},
	"qwen3-30b-a3b": {Arch: ArchQwen3MoE, Tokenizer: TokQwen3, Vocab: 151936, Layers: 48, Embd: 2048, Heads: 32,
		HeadsKV: 4, HeadDim: 128, FFN: 6144, Experts: 128, ExpertsUsed: 8, ExpertFFN: 768,
		Context: 40960, RopeBase: 1e6, Eps: 1e-6},
	"olmoe-1b-7b": {Arch: ArchOLMoE, Tokenizer: TokOLMo, Vocab: 50304, Layers: 16, Embd: 2048, Heads: 16,
		Experts: 64, ExpertsUsed: 8, ExpertFFN: 1024, Context: 4096, RopeBase: 10000, Eps: 1e-5},
	// DeepSeek-V2-Lite (MLA layout).
	"deepseek-v2-lite": {Arch: ArchDeepSeek2, Tokenizer: TokDeepSeek, Vocab: 102400, Layers: 27, Embd: 2048, Heads: 16,
		FFN: 10944, LeadingDense: 1, Experts: 64, ExpertsUsed: 6, ExpertFFN: 1408, SharedExperts: 2,
		ExpertWeightsScale: 1, MLA: true, KVLoraRank: 512, RopeDim: 64, QKNopeDim: 128, VHeadDim: 128,
		Context: 163840, RopeBase: 10000, Eps: 1e-6,
		YaRN: &YaRN{Factor: 40, OrigContext: 4096, LogMultiplier: 0.0707}},
	// GLM-4.5-Air: 46 layers and the nextn block (block_count 47), 96 heads of 128 over 8 KV
	// heads, half of each head rotated, q/k/v biases, one dense layer (10944) then 128
	// experts of 1408 top-8 with a shared one, sigmoid with the selection bias, renormalised,
	// scale 1, one expert group. Its tokenizer is GLM's; the synthetic one is Qwen2's.
	"glm-4.5-air": {Arch: ArchGLM4MoE, Tokenizer: TokQwen2, Vocab: 151552, Layers: 47, Embd: 4096, Heads: 96,
		HeadsKV: 8, HeadDim: 128, RopeDim: 64, FFN: 10944, LeadingDense: 1, Experts: 128, ExpertsUsed: 8,
		ExpertFFN: 1408, SharedExperts: 1, ExpertWeightsScale: 1, ExpertWeightsNorm: true, NextN: 1,
		Context: 131072, RopeBase: 1e6, Eps: 1e-5},
	// gpt-oss-20b (openai/gpt-oss-20b config.json): 24 layers of 2880, 64 heads of 64 over 8
	// KV heads, a window of 128 on the even layers (layer_types starts with
	// sliding_attention), 32 experts of 2880 top-4, YaRN factor 32 over 4096, rope base 150000.
	// Its tokenizer is o200k_harmony; the synthetic one is Qwen2's.
	"gpt-oss-20b": gptOSS(24, 32),
	// gpt-oss-120b: gpt-oss-20b with 36 layers of 128 experts.
	"gpt-oss-120b": gptOSS(36, 128),
	// Qwen3.6-35B-A3B, the architecture of Qwen3.5-35B-A3B (llama.cpp's qwen35moe, as its
	// GGUFs' metadata has it): 40 layers of 2048, every fourth full attention (16 heads of 256
	// over 2 KV heads, gated, a quarter of each head rotated with M-RoPE sections 11/11/10, rope
	// base 1e7) and the other 30 gated DeltaNet (16 key and 32 value heads of 128, a
	// convolution of 4); every layer routes top-8 over 256 experts of 512 beside a shared expert
	// of 512. Its multi-token-prediction block is not in llama.cpp's converted files (block_count
	// 40). Its tokenizer is Qwen3.5's (248320 tokens); the synthetic one is Qwen3's.
	"qwen3.6-35b-a3b": {Arch: ArchQwen35MoE, Tokenizer: TokQwen3, Vocab: 248320, Layers: 40, Embd: 2048, Heads: 16,
		HeadsKV: 2, HeadDim: 256, RopeDim: 64, Experts: 256, ExpertsUsed: 8, ExpertFFN: 512, SharedFFN: 512,
		DeltaNet: &DeltaNet{ConvK: 4, HeadDim: 128, KHeads: 16, VHeads: 32, Interval: 4, Sections: [4]int{11, 11, 10, 0}},
		Context:  262144, RopeBase: 1e7, Eps: 1e-6},
	// Dense Qwen2-1.5B and Qwen3-1.7B, for comparisons with dense models.
	"qwen2-1.5b": {Arch: ArchQwen2, Tokenizer: TokQwen2, Vocab: 151936, Layers: 28, Embd: 1536, Heads: 12, HeadsKV: 2,
		FFN: 8960, Context: 32768, RopeBase: 1e6, Eps: 1e-6},
	"qwen3-1.7b": {Arch: ArchQwen3, Tokenizer: TokQwen3, Vocab: 151936, Layers: 28, Embd: 2048, Heads: 16, HeadsKV: 8,
		HeadDim: 128, FFN: 6144, Tied: true, Context: 40960, RopeBase: 1e6, Eps: 1e-6},
}

// gptOSS is gpt-oss's shape with the given layers and experts: the rest is the same in the
// 20b and the 120b.
func gptOSS(layers, experts int) Spec {
	return Spec{Arch: ArchGPTOSS, Tokenizer: TokQwen2, Vocab: 201088, Layers: layers, Embd: 2880, Heads: 64,
		HeadsKV: 8, HeadDim: 64, Experts: experts, ExpertsUsed: 4, ExpertFFN: 2880, SlidingWindow: 128,
		Context: 131072, RopeBase: 150000, Eps: 1e-5, YaRN: &YaRN{Factor: 32, OrigContext: 4096}}
}

// archShapes name the shape Bench uses for each architecture.
var archShapes = map[string]string{
	ArchLlama: "mixtral-8x7b", ArchQwen2MoE: "qwen1.5-moe-a2.7b", ArchQwen3MoE: "qwen3-30b-a3b",
	ArchOLMoE: "olmoe-1b-7b", ArchDeepSeek2: "deepseek-v2-lite", ArchGLM4MoE: "glm-4.5-air",
	ArchGPTOSS: "gpt-oss-20b", ArchQwen35MoE: "qwen3.6-35b-a3b", ArchQwen2: "qwen2-1.5b", ArchQwen3: "qwen3-1.7b",
}

// denseLlama is Llama-2-7B, the default for -arch llama with -experts 0.
var denseLlama = Spec{Arch: ArchLlama, Tokenizer: TokSPM, Vocab: 32000, Layers: 32, Embd: 4096, Heads: 32,
	FFN: 11008, Context: 4096, RopeBase: 10000, Eps: 1e-5}

// Bench returns a benchmark spec: the real shape of arch (archShapes) with the options'
// overrides. For llama, Experts < 0 asks for the dense Llama-2 shape.
func Bench(arch string, o BenchOptions) (Spec, error) {
	name, ok := archShapes[arch]
	if !ok {
		return Spec{}, fmt.Errorf("no benchmark shape for architecture %q", arch)
	}
	return BenchShape(name, o)
}

// BenchShape returns a benchmark spec: the real shape of the named model (mixtral-8x7b,
// gpt-oss-120b, ...; realShapes) with the options' overrides. For
// mixtral-8x7b, Experts < 0 asks for the dense Llama-2 shape.
func BenchShape(name string, o BenchOptions) (Spec, error) {
	s, ok := realShapes[name]
	if !ok {
		return Spec{}, fmt.Errorf("no benchmark shape %q", name)
	}
	arch := s.Arch
	if arch == ArchLlama && o.Experts < 0 {
		s, o.Experts = denseLlama, 0
	}
	set := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	set(&s.Layers, o.Layers)
	set(&s.Embd, o.Embd)
	set(&s.Heads, o.Heads)
	set(&s.HeadsKV, o.HeadsKV)
	set(&s.Experts, o.Experts)
	set(&s.ExpertsUsed, o.ExpertsUsed)
	set(&s.ExpertFFN, o.ExpertFFN)
	set(&s.FFN, o.FFN)
	set(&s.Vocab, o.Vocab)
	if o.FullAttentionInterval != 0 && s.DeltaNet != nil {
		d := *s.DeltaNet // realShapes' own stays as it is
		d.Interval = o.FullAttentionInterval
		s.DeltaNet = &d
	}
	if s.ExpertsUsed > s.Experts {
		s.ExpertsUsed = s.Experts
	}
	if s.LeadingDense >= s.Layers {
		s.LeadingDense = 0
	}
	if s.NextN >= s.Layers-s.LeadingDense {
		s.NextN = 0 // too few layers left to spare one for next-token prediction
	}
	s.Seed = o.Seed
	if s.Seed == 0 {
		s.Seed = 1
	}
	s.Types = o.Types
	if s.Types.Name == "" {
		s.Types = Q8_0
	}
	s.Name = fmt.Sprintf("bench-%s-e%d-k%d-%s", arch, s.Experts, s.ExpertsUsed, s.Types.Name)
	return s, s.Validate()
}
