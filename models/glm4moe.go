package models

import (
	"fmt"
	"math"
)

// GLM-4.5 / GLM-4.5-Air (llama.cpp glm4moe): standard attention with q/k/v biases, NEOX rope
// over the first rope.dimension_count values of each head, optional per-head q/k norm (the
// 355B model), and post_attention_norm where the others have ffn_norm; leading dense layers, then
// sigmoid-gated experts chosen with the selection bias (exp_probs_b), within the best expert
// groups where the file sets them, their weights renormalised and scaled, beside a shared
// expert. The file's last nextn_predict_layers blocks are the multi-token-prediction head,
// which llama.cpp loads but never runs: they are no layers of the model here, so nothing
// computes, uploads or places them.
func init() { Register("glm4moe", buildGLM4MoE) }

func buildGLM4MoE(f *File, c *Config) (*Model, error) {
	l := newLoader(f, c)
	r := l.r
	if err := l.nextn(); err != nil {
		return nil, err
	}
	// llama.cpp requires these; a default would run a model other than the one trained.
	// (Without expert_weights_scale it scales by nothing, as 0 means here.)
	r.int(".expert_feed_forward_length", 0, true)
	r.int(".expert_count", 0, true)
	r.int(".expert_used_count", 0, true)
	r.int(".expert_shared_count", 0, true)
	scaleW := r.float(".expert_weights_scale", 0)
	normW := r.bool(".expert_weights_norm", false)
	gating := Gating(r.int(".expert_gating_func", 0, false))
	if r.err != nil {
		return nil, r.err
	}
	switch {
	case c.Experts <= 0:
		return nil, fmt.Errorf("metadata key %q: glm4moe needs experts, has %d", r.key(".expert_count"), c.Experts)
	case c.DenseLead >= c.Layers:
		return nil, fmt.Errorf("metadata key %q: %d leading dense blocks of %d leave no MoE layers", r.key(".leading_dense_block_count"), c.DenseLead, c.Layers)
	case gating == 0:
		gating = GatingSigmoid // llama.cpp's default for glm4moe
	case gating > GatingSoftmaxWeight:
		return nil, fmt.Errorf("metadata key %q: gating function %d is not supported", r.key(".expert_gating_func"), gating)
	case c.HeadDimK != c.HeadDimV:
		return nil, fmt.Errorf("glm4moe key length %d differs from value length %d", c.HeadDimK, c.HeadDimV)
	}
	if secs := r.uints(".rope.dimension_sections"); len(secs) >= 2 && secs[0] > 0 && secs[1] > 0 {
		return nil, fmt.Errorf("metadata key %q: multimodal (M-RoPE) glm4moe files are not supported", r.key(".rope.dimension_sections"))
	}
	groups, groupsUsed := l.expertGroups()

	m := &Model{Config: c, File: f}
	l.embeddings(m)
	rope := l.rope(true)
	for i := 0; i < c.Layers && l.err == nil; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		at := l.glm4moeAttention(p, i, rope)
		layer := Layer{AttnNorm: l.norm(p+"attn_norm", c.Embd), Attn: at, FFNNorm: l.norm(p+"post_attention_norm", c.Embd)}
		if i < c.DenseLead {
			layer.Dense = l.ffn(p, "")
			m.Layers = append(m.Layers, layer)
			continue
		}
		moe := l.moe(p)
		if moe == nil {
			break
		}
		moe.Gating, moe.NormWeights, moe.WeightsScale = gating, normW, scaleW
		moe.Groups, moe.GroupsUsed = groups, groupsUsed
		if moe.SelectionBias == nil {
			l.fail(fmt.Errorf("tensor %q is missing", p+"exp_probs_b.bias"))
		}
		if c.Shared > 0 {
			moe.Shared = l.ffn(p, "_shexp")
			if sh := moe.Shared; sh != nil && l.err == nil && sh.Gate.Rows != c.Shared*c.ExpertFFN {
				l.fail(fmt.Errorf("tensor %q has %d rows, want %d shared experts of %d", p+"ffn_gate_shexp.weight", sh.Gate.Rows, c.Shared, c.ExpertFFN))
			}
		}
		layer.MoE = moe
		m.Layers = append(m.Layers, layer)
	}
	return l.done(m)
}

// glm4moeAttention loads block i's attention (tensors prefixed p): biased q/k/v, an unbiased
// output, and the q/k norms where the file has them.
func (l *loader) glm4moeAttention(p string, i int, rope *Rope) *StdAttention {
	c := l.c
	h, hkv, hd := c.Heads[i], c.HeadsKV[i], c.HeadDimK
	at := &StdAttention{
		Heads: h, HeadsKV: hkv, HeadDK: hd, HeadDV: hd,
		Q:     l.matrix(p+"attn_q.weight", c.Embd, h*hd),
		K:     l.matrix(p+"attn_k.weight", c.Embd, hkv*hd),
		V:     l.matrix(p+"attn_v.weight", c.Embd, hkv*hd),
		O:     l.matrix(p+"attn_output.weight", h*hd, c.Embd),
		BQ:    l.vec(p+"attn_q.bias", h*hd, true),
		BK:    l.vec(p+"attn_k.bias", hkv*hd, true),
		BV:    l.vec(p+"attn_v.bias", hkv*hd, true),
		Scale: 1 / float32(math.Sqrt(float64(hd))), // llama.cpp reads no attention.scale here
		Eps:   c.NormEps,
		Rope:  rope,
	}
	// The q/k norms come as a pair or not at all: the attention normalises both or neither.
	if l.f.Tensor(p+"attn_q_norm.weight") != nil || l.f.Tensor(p+"attn_k_norm.weight") != nil {
		at.QKNorm, at.QNorm, at.KNorm = QKNormPerHead, l.norm(p+"attn_q_norm", hd), l.norm(p+"attn_k_norm", hd)
	}
	return at
}
