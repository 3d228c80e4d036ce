package models

import (
	"fmt"
	"math"
)

// gpt-oss (llama.cpp's gpt-oss / LLM_ARCH_OPENAI_MOE): standard attention with q/k/v/o
// biases, NEOX rope (YaRN in the published files) over heads of rope.dimension_count, a learnt
// sink logit per head, and a sliding window on every other layer (the even ones: llama.cpp's
// swa pattern 2); post_attention_norm where the others have ffn_norm; every layer a MoE block
// with a biased router, top-k on the raw logits and a softmax over the chosen ones, and
// experts with biases and the clamped SwiGLU-OAI activation. No shared expert, no q/k norm,
// an untied output.
func init() { Register("gpt-oss", buildGPTOSS) }

// The activation's constants: llama.cpp hard-codes them (build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE)
// and reads no key for them, so a file cannot change them.
const (
	gptossAlpha = 1.702
	gptossLimit = 7.0
)

func buildGPTOSS(f *File, c *Config) (*Model, error) {
	l := newLoader(f, c)
	r := l.r
	// llama.cpp requires these; a default would run a model other than the one trained.
	r.int(".expert_feed_forward_length", 0, true)
	r.int(".expert_count", 0, true)
	r.int(".expert_used_count", 0, true)
	window := r.int(".attention.sliding_window", 0, true)
	if r.err != nil {
		return nil, r.err
	}
	switch {
	case window <= 0:
		// llama.cpp's mask would hide every position, the query's own included.
		return nil, fmt.Errorf("metadata key %q: a sliding window of %d positions", r.key(".attention.sliding_window"), window)
	case c.Experts <= 0:
		return nil, fmt.Errorf("metadata key %q: gpt-oss needs experts, has %d", r.key(".expert_count"), c.Experts)
	case c.HeadDimK != c.Rope.Dims || c.HeadDimV != c.Rope.Dims:
		// llama.cpp shapes the heads by the rope dimension alone.
		return nil, fmt.Errorf("gpt-oss key length %d and value length %d differ from the rope dimension %d", c.HeadDimK, c.HeadDimV, c.Rope.Dims)
	}
	if p, ok := f.KV[r.key(".attention.sliding_window_pattern")]; ok {
		if n, ok := toInt(p); !ok || n != 2 {
			return nil, fmt.Errorf("metadata key %q: %v: only the pattern of 2 (sliding window on the even layers) is supported", r.key(".attention.sliding_window_pattern"), p)
		}
	}
	for _, k := range []string{".rope.freq_base_swa", ".rope.dimension_count_swa"} {
		if r.has(k) {
			return nil, fmt.Errorf("metadata key %q: a rope of its own for the sliding-window layers is not supported", r.key(k))
		}
	}

	m := &Model{Config: c, File: f}
	l.embeddings(m)
	if l.err == nil && m.Output == m.TokenEmbd {
		l.fail(fmt.Errorf("tensor %q is missing", "output.weight"))
	}
	rope := l.rope(true)
	hd := c.HeadDimK
	for i := 0; i < c.Layers && l.err == nil; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		h, hkv := c.Heads[i], c.HeadsKV[i]
		at := &StdAttention{
			Heads: h, HeadsKV: hkv, HeadDK: hd, HeadDV: hd,
			Q:     l.matrix(p+"attn_q.weight", c.Embd, h*hd),
			K:     l.matrix(p+"attn_k.weight", c.Embd, hkv*hd),
			V:     l.matrix(p+"attn_v.weight", c.Embd, hkv*hd),
			O:     l.matrix(p+"attn_output.weight", h*hd, c.Embd),
			BQ:    l.vec(p+"attn_q.bias", h*hd, true),
			BK:    l.vec(p+"attn_k.bias", hkv*hd, true),
			BV:    l.vec(p+"attn_v.bias", hkv*hd, true),
			BO:    l.vec(p+"attn_output.bias", c.Embd, true),
			Sinks: l.vec(p+"attn_sinks.weight", h, true),
			Scale: 1 / float32(math.Sqrt(float64(hd))), // llama.cpp reads no attention.scale here
			Eps:   c.NormEps,
			Rope:  rope,
		}
		if i%2 == 0 {
			at.Window = window
		}
		layer := Layer{AttnNorm: l.norm(p+"attn_norm", c.Embd), Attn: at, FFNNorm: l.norm(p+"post_attention_norm", c.Embd)}
		moe := l.moe(p)
		if moe == nil {
			break
		}
		if moe.SelectionBias != nil {
			l.fail(fmt.Errorf("tensor %q: gpt-oss has no selection bias", p+"exp_probs_b.bias"))
		}
		nff := c.ExpertFFN
		moe.Gating = GatingSoftmaxWeight
		moe.RouterBias = l.vec(p+"ffn_gate_inp.bias", c.Experts, true)
		moe.GateBias = l.bias2(p+"ffn_gate_exps.bias", nff, c.Experts)
		moe.UpBias = l.bias2(p+"ffn_up_exps.bias", nff, c.Experts)
		moe.DownBias = l.bias2(p+"ffn_down_exps.bias", c.Embd, c.Experts)
		moe.OAI = &OAIActivation{Alpha: gptossAlpha, Limit: gptossLimit}
		layer.MoE = moe
		m.Layers = append(m.Layers, layer)
	}
	return l.done(m)
}

// bias2 loads a required bias of n values per expert ({n, experts}), decoded to floats.
func (l *loader) bias2(name string, n, experts int) []float32 {
	if t := l.get(name, true, n, experts); t != nil {
		return t.Float32s()
	}
	return nil
}
