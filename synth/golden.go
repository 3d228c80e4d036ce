package synth

import (
	"fmt"
)

// Bases are the golden models' shapes, one per architecture and layout, each a scaled-down
// copy of a real model (named in the comment). Golden combines them with type recipes.
//
// All have n_embd 256 so that K-quants (256-element blocks) apply to rows of n_embd, while the
// expert widths (128) and DeepSeek's dense width (384) are not multiples of 256, so K-quant
// recipes fall back to 32-element types on ffn_down as they do in real Qwen1.5-MoE and
// DeepSeek-V2-Lite files. Mixtral's expert width (256) keeps K-quants on its ffn_down, as in
// the real Mixtral.
var Bases = map[string]Spec{
	// Mixtral-8x7B: llama with 8 experts, top-2 renormalised softmax, GQA, SentencePiece.
	"mixtral": {Arch: ArchLlama, Seed: 0x6d697874, Tokenizer: TokSPM, Vocab: 420,
		Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2,
		Experts: 8, ExpertsUsed: 2, ExpertFFN: 256,
		Context: 32768, RopeBase: 1e6, Eps: 1e-5},
	// Qwen1.5-MoE-A2.7B: shared expert behind a sigmoid gate, q/k/v biases, no GQA, top-4.
	"qwen2moe": {Arch: ArchQwen2MoE, Seed: 0x71326d6f, Tokenizer: TokQwen2, Vocab: 460,
		Layers: 2, Embd: 256, Heads: 4,
		Experts: 8, ExpertsUsed: 4, ExpertFFN: 128, SharedFFN: 256,
		Context: 8192, RopeBase: 1e6, Eps: 1e-6},
	// Qwen3-30B-A3B: per-head q/k norm, head size 128 != 256/4, GQA 4/2, 16 experts top-4.
	"qwen3moe": {Arch: ArchQwen3MoE, Seed: 0x71336d6f, Tokenizer: TokQwen3, Vocab: 480,
		Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, HeadDim: 128, FFN: 768,
		Experts: 16, ExpertsUsed: 4, ExpertFFN: 128,
		Context: 40960, RopeBase: 1e6, Eps: 1e-6},
	// OLMoE-1B-7B: q/k norm over the whole projections, no renormalisation of top-k weights.
	"olmoe": {Arch: ArchOLMoE, Seed: 0x6f6c6d6f, Tokenizer: TokOLMo, Vocab: 400,
		Layers: 2, Embd: 256, Heads: 4,
		Experts: 8, ExpertsUsed: 3, ExpertFFN: 128,
		Context: 4096, RopeBase: 10000, Eps: 1e-5},
	// DeepSeek-V2-Lite as current converters write it: MLA with attn_k_b/attn_v_b and one KV
	// head of kv_lora+rope, a leading dense layer, 2 shared experts, YaRN (factor 40 from 4096).
	"deepseek2-mla": {Arch: ArchDeepSeek2, Seed: 0x64736b32, Tokenizer: TokDeepSeek, Vocab: 440,
		Layers: 3, Embd: 256, Heads: 4, FFN: 384, LeadingDense: 1,
		Experts: 16, ExpertsUsed: 4, ExpertFFN: 128, SharedExperts: 2,
		ExpertWeightsScale: 1.5, ExpertWeightsNorm: false,
		MLA: true, KVLoraRank: 128, RopeDim: 16, QKNopeDim: 32, VHeadDim: 32,
		Context: 163840, RopeBase: 10000, Eps: 1e-6,
		YaRN: &YaRN{Factor: 40, OrigContext: 4096, LogMultiplier: 0.0707}},
	// DeepSeek-V2-Lite in the older layout: one attn_kv_b, key_length 48 (= nope+rope) and
	// n_head KV heads. Normalised top-k weights and a larger scale exercise the other branch.
	"deepseek2-legacy": {Arch: ArchDeepSeek2, Seed: 0x64736b6c, Tokenizer: TokDeepSeek, Vocab: 440,
		Layers: 3, Embd: 256, Heads: 4, FFN: 384, LeadingDense: 1,
		Experts: 8, ExpertsUsed: 3, ExpertFFN: 128, SharedExperts: 2,
		ExpertWeightsScale: 2.5, ExpertWeightsNorm: true,
		MLA: false, KVLoraRank: 128, RopeDim: 16, QKNopeDim: 32, VHeadDim: 32,
		Context: 163840, RopeBase: 10000, Eps: 1e-6,
		YaRN: &YaRN{Factor: 40, OrigContext: 4096, LogMultiplier: 0.0707}},
	// DeepSeek-V3 / Moonlight / GLM-4.7-Flash routing on the V2-Lite MLA shape: sigmoid gating
	// with the selection bias, 16 experts in 4 groups of which the best 2 compete,
	// renormalised and scaled weights, and GLM-4.7-Flash's nextn block at the end, not run.
	"deepseek2-v3": {Arch: ArchDeepSeek2, Seed: 0x64736b33, Tokenizer: TokDeepSeek, Vocab: 440,
		Layers: 4, NextN: 1, Embd: 256, Heads: 4, FFN: 384, LeadingDense: 1,
		Experts: 16, ExpertsUsed: 4, ExpertFFN: 64, SharedExperts: 1,
		ExpertWeightsScale: 2.5, ExpertWeightsNorm: true, SigmoidGating: true, ExpertGroups: 4, ExpertGroupsUsed: 2,
		MLA: true, KVLoraRank: 128, RopeDim: 16, QKNopeDim: 32, VHeadDim: 32,
		Context: 163840, RopeBase: 10000, Eps: 1e-6,
		YaRN: &YaRN{Factor: 40, OrigContext: 4096, LogMultiplier: 0.0707}},
	// GLM-4.5-Air: a leading dense layer, q/k/v biases, head 128 with NEOX rope on its first
	// 64 values, GQA 4/2, 16 experts top-4 in 4 groups of which the best 2 compete (the Air
	// has one group; grouped files route so), sigmoid routing with the selection bias,
	// renormalised and scaled weights, a shared expert, and one multi-token-prediction block
	// at the end that llama.cpp never runs. Experts 64 wide keep the F32 file under 20 MiB.
	"glm4moe": {Arch: ArchGLM4MoE, Seed: 0x676c6d35, Tokenizer: TokQwen2, Vocab: 460,
		Layers: 4, Embd: 256, Heads: 4, HeadsKV: 2, HeadDim: 128, FFN: 384, LeadingDense: 1,
		Experts: 16, ExpertsUsed: 4, ExpertFFN: 64, SharedExperts: 1,
		ExpertWeightsScale: 1.8, ExpertWeightsNorm: true, ExpertGroups: 4, ExpertGroupsUsed: 2,
		RopeDim: 64, NextN: 1,
		Context: 131072, RopeBase: 1e6, Eps: 1e-5},
	// gpt-oss-20b: head 64 with 8 query heads on a 256 embedding (its 64 heads of 64 are
	// wider than its 2880), GQA 8/2, q/k/v/o biases, a sink per head, a window of 8 positions
	// on layers 0 and 2 (shorter than the prompt), YaRN (factor 32 from 4096) over NEOX rope;
	// 16 experts of 64 top-4 chosen on the biased router's logits, their weights a softmax
	// over the chosen, biased experts with the clamped SwiGLU-OAI.
	"gpt-oss": {Arch: ArchGPTOSS, Seed: 0x6770746f, Tokenizer: TokQwen2, Vocab: 440,
		Layers: 3, Embd: 256, Heads: 8, HeadsKV: 2, HeadDim: 64,
		Experts: 16, ExpertsUsed: 4, ExpertFFN: 64, SlidingWindow: 8,
		Context: 131072, RopeBase: 150000, Eps: 1e-5,
		YaRN: &YaRN{Factor: 32, OrigContext: 4096}},
	// Qwen3.5/3.6-35B-A3B: layers 0-2 gated DeltaNet (conv kernel 4, heads of 32, 2
	// key heads under 4 value heads, so that value heads share key heads), layer 3 full
	// attention (4 heads of 64 over 2 KV heads, queries with output gates, q/k norms, NEOX
	// rope over 16 of 64 values in sections 3/3/2); 16 experts of 64 top-4 renormalised
	// beside a 96-wide shared expert behind a sigmoid gate.
	"qwen35moe": {Arch: ArchQwen35MoE, Seed: 0x71333541, Tokenizer: TokQwen3, Vocab: 420,
		Layers: 4, Embd: 256, Heads: 4, HeadsKV: 2, HeadDim: 64, RopeDim: 16,
		Experts: 16, ExpertsUsed: 4, ExpertFFN: 64, SharedFFN: 96,
		DeltaNet: &DeltaNet{ConvK: 4, HeadDim: 32, KHeads: 2, VHeads: 4, Interval: 4, Sections: [4]int{3, 3, 2, 0}},
		Context:  262144, RopeBase: 1e7, Eps: 1e-6},
	// Dense references: Llama 2 style, Qwen2 (biases), Qwen3 (q/k norm, tied embeddings).
	"llama": {Arch: ArchLlama, Seed: 0x6c6c616d, Tokenizer: TokSPM, Vocab: 360,
		Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, FFN: 512,
		Context: 4096, RopeBase: 10000, Eps: 1e-5},
	"qwen2": {Arch: ArchQwen2, Seed: 0x71776e32, Tokenizer: TokQwen2, Vocab: 380,
		Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, FFN: 384,
		Context: 32768, RopeBase: 1e6, Eps: 1e-6},
	"qwen3": {Arch: ArchQwen3, Seed: 0x71776e33, Tokenizer: TokQwen3, Vocab: 400,
		Layers: 2, Embd: 256, Heads: 4, HeadsKV: 2, HeadDim: 128, FFN: 512, Tied: true,
		Context: 40960, RopeBase: 1e6, Eps: 1e-6},
}

// goldenVariants lists the recipes applied to each base. Together they make every weight type
// the engine supports appear in at least one model (TestGoldenCoverage checks this):
// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
var goldenVariants = []struct {
	base    string
	recipes []Recipe
}{
	{"mixtral", []Recipe{F32, F16, q4km8Golden, Q2K}},
	{"qwen2moe", []Recipe{F32, q4kmGolden, Q4_0M}},
	{"qwen3moe", []Recipe{F32, BF16, Q5KM, Q3KM}},
	{"olmoe", []Recipe{F32, Q8_0, Q5_1M, IQ4NL}},
	{"deepseek2-mla", []Recipe{F32, F16, q4kmGolden}},
	{"deepseek2-legacy", []Recipe{F32, Q5_1M}},
	{"llama", []Recipe{F32, Q4_0M}},
	{"qwen2", []Recipe{F32, IQ4NL}},
	{"qwen3", []Recipe{F32, Q2K}},
	{"deepseek2-v3", []Recipe{F32, q4kmGolden}},
	{"glm4moe", []Recipe{F32, Q8_0, q4kmGolden}},
	{"gpt-oss", []Recipe{F32, mxfp4Golden}},
	{"qwen35moe", []Recipe{F32, Q8_0, q4kmGolden}},
}

// Golden returns the specs of the golden model set, in a fixed order.
func Golden() []Spec {
	var out []Spec
	for _, g := range goldenVariants {
		for _, r := range g.recipes {
			s := Bases[g.base]
			s.Name = g.base + "-" + r.Name
			s.Types = r
			out = append(out, s)
		}
	}
	return out
}

// GoldenSpec returns the golden spec with the given name.
func GoldenSpec(name string) (Spec, error) {
	for _, s := range Golden() {
		if s.Name == name {
			return s, nil
		}
	}
	return Spec{}, fmt.Errorf("no golden model named %q", name)
}

// WriteGolden writes the golden model called name to path; it returns the file's hex SHA-256.
func WriteGolden(name, path string) (string, error) {
	s, err := GoldenSpec(name)
	if err != nil {
		return "", err
	}
	return WriteFile(s, path)
}

// PromptLen is the number of tokens of a golden prompt.
const PromptLen = 16

// Prompts returns n candidate prompts of a spec: PromptLen token ids each, drawn from the
// ordinary (non-special) tokens, starting with BOS when the tokenizer adds one. They depend
// only on the seed and the vocabulary, so all type variants of a base share them. The
// reference runner uses the first candidate whose greedy continuation has no near-tie, so
// that the test's demand for an identical continuation is fair.
func Prompts(s Spec, n int) ([][]int32, error) {
	voc, err := buildVocab(s.Tokenizer, s.Vocab)
	if err != nil {
		return nil, fmt.Errorf("prompts of %q: %w", s.Name, err)
	}
	var normal []int32
	for id, t := range voc.types {
		if t == tokNormal {
			normal = append(normal, int32(id))
		}
	}
	out := make([][]int32, n)
	for i := range out {
		r := newRNG(s.Seed, fmt.Sprintf("#prompt/%d", i))
		var p []int32
		if voc.addBOS {
			p = append(p, int32(voc.bos))
		}
		for len(p) < PromptLen {
			p = append(p, normal[r.intn(len(normal))])
		}
		out[i] = p
	}
	return out, nil
}
