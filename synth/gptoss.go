package synth

import (
	"fmt"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/quant"
)

// gpt-oss (llama.cpp's gpt-oss, OpenAI's gpt-oss-20b/120b): the tensors and keys of
// llama.cpp's LLM_ARCH_OPENAI_MOE loader.

// MXFP4MoE is what llama.cpp's MXFP4_MOE preset writes for gpt-oss, as in the published
// gpt-oss GGUFs: the routed experts in MXFP4, the rest Q8_0 (RecipeByName's "mxfp4", which
// public shapes and benchmarks take).
var MXFP4MoE = Recipe{Name: "mxfp4", FileType: ftypeMXFP4MoE, Base: quant.Q8_0, Rules: map[string]quant.Type{
	"ffn_gate_exps": quant.MXFP4, "ffn_up_exps": quant.MXFP4, "ffn_down_exps": quant.MXFP4,
}}

// mxfp4Golden is MXFP4MoE with an F16 token embedding, so that the golden gpt-oss model has
// F16 beside MXFP4 (its fixture, gpt-oss-mxfp4, was made from it).
var mxfp4Golden = Recipe{Name: "mxfp4", FileType: ftypeMXFP4MoE, Base: quant.Q8_0, Rules: map[string]quant.Type{
	"ffn_gate_exps": quant.MXFP4, "ffn_up_exps": quant.MXFP4, "ffn_down_exps": quant.MXFP4,
	"token_embd": quant.F16,
}}

// ftypeMXFP4MoE is llama_ftype LLAMA_FTYPE_MOSTLY_MXFP4_MOE.
const ftypeMXFP4MoE = 38

// Gains of gpt-oss's experts: the gate and up products come out wide enough that the
// activation's clamp at ±7 bites on a few percent of the values, as it must to be tested.
const (
	gptossExpertGain = 3.5
	// gptossSinkStd spreads the sinks over the scale of the attention scores, so that a
	// sink takes a real share of some heads' attention and almost none of others'.
	gptossSinkStd = 1.5
	// gptossRouterBiasStd makes the router's bias change the choice of experts often.
	gptossRouterBiasStd = 1.0
)

func (s *Spec) validateGPTOSS() error {
	if s.Arch != ArchGPTOSS {
		if s.SlidingWindow != 0 {
			return fmt.Errorf("only gpt-oss has a sliding window")
		}
		return nil
	}
	switch {
	case s.SlidingWindow <= 0:
		return fmt.Errorf("gpt-oss needs a sliding window")
	case s.LeadingDense != 0 || s.SharedExperts != 0 || s.SharedFFN != 0 || s.SigmoidGating || s.ExpertGroups > 1:
		return fmt.Errorf("gpt-oss has neither dense layers, shared experts, sigmoid gating nor groups")
	case s.Tied:
		return fmt.Errorf("gpt-oss's output is not tied to token_embd")
	}
	return nil
}

// gptossAttention adds what gpt-oss's attention has beyond the projections: q/k/v/o biases
// and a sink logit per head.
func (s *Spec) gptossAttention(b blockDefs) {
	n, p, il := s.Embd, b.prefix, b.il
	hd, hkv := s.headDim(), s.headsKV()
	b.bias(p+"attn_q.bias", "attn_q.bias", il, s.Heads*hd)
	b.bias(p+"attn_k.bias", "attn_k.bias", il, hkv*hd)
	b.bias(p+"attn_v.bias", "attn_v.bias", il, hkv*hd)
	b.bias(p+"attn_output.bias", "attn_output.bias", il, n)
	b.ts = append(b.ts, tensorDef{name: p + "attn_sinks.weight", shape: u64([]int{s.Heads}), role: "attn_sinks",
		layer: il, init: initBias, std: gptossSinkStd})
}

// gptossExperts adds gpt-oss's experts after the router: the router's bias, the stacked
// experts and their biases, one row per expert.
func (s *Spec) gptossExperts(b blockDefs) {
	n, p, il := s.Embd, b.prefix, b.il
	e, f := s.Experts, s.ExpertFFN
	b.ts = append(b.ts, tensorDef{name: p + "ffn_gate_inp.bias", shape: u64([]int{e}), role: "ffn_gate_inp.bias",
		layer: il, init: initBias, std: gptossRouterBiasStd})
	b.w("ffn_gate_exps", gain(gptossExpertGain, n), n, f, e)
	b.w("ffn_up_exps", gain(gptossExpertGain, n), n, f, e)
	b.w("ffn_down_exps", gain(1, f), f, n, e)
	for _, x := range []struct {
		role string
		rows int
	}{{"ffn_gate_exps", f}, {"ffn_up_exps", f}, {"ffn_down_exps", n}} {
		b.ts = append(b.ts, tensorDef{name: p + x.role + ".bias", shape: u64([]int{x.rows, e}), role: x.role + ".bias",
			layer: il, init: initBias, std: biasStd})
	}
}

// gptossMetadata adds gpt-oss's keys: the expert width (also written as feed_forward_length,
// as the converter does), the sliding window, and the rope over whole heads.
func (s *Spec) gptossMetadata(kv ggml.KV) {
	a := s.Arch + "."
	kv[a+"feed_forward_length"] = uint32(s.ExpertFFN)
	kv[a+"expert_feed_forward_length"] = uint32(s.ExpertFFN)
	kv[a+"attention.sliding_window"] = uint32(s.SlidingWindow)
	kv[a+"rope.dimension_count"] = uint32(s.headDim())
}
