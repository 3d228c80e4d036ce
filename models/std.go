package models

import "fmt"

// stdArch describes the architectures built from StdAttention and SwiGLU experts; each
// architecture file fills one in and registers buildStd with it.
type stdArch struct {
	neox        bool
	qkNorm      QKNorm
	normWeights bool // renormalise top-k expert weights
	// scaleKey names the metadata key of an expert weight scale, if the architecture has one.
	scaleKey string
	// sharedGate: a sigmoid-gated shared expert (Qwen2-MoE) may be present.
	sharedGate bool
}

func (a stdArch) build(f *File, c *Config) (*Model, error) {
	l := newLoader(f, c)
	m := &Model{Config: c, File: f}
	l.embeddings(m)
	rope := l.rope(a.neox)
	for i := 0; i < c.Layers && l.err == nil; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		h, hkv, hd, hdv := c.Heads[i], c.HeadsKV[i], c.HeadDimK, c.HeadDimV
		at := &StdAttention{
			Heads: h, HeadsKV: hkv, HeadDK: hd, HeadDV: hdv,
			Q:     l.matrix(p+"attn_q.weight", c.Embd, h*hd),
			K:     l.matrix(p+"attn_k.weight", c.Embd, hkv*hd),
			V:     l.matrix(p+"attn_v.weight", c.Embd, hkv*hdv),
			O:     l.matrix(p+"attn_output.weight", h*hdv, c.Embd),
			BQ:    l.vec(p+"attn_q.bias", h*hd, false),
			BK:    l.vec(p+"attn_k.bias", hkv*hd, false),
			BV:    l.vec(p+"attn_v.bias", hkv*hdv, false),
			BO:    l.vec(p+"attn_output.bias", c.Embd, false),
			Scale: defaultScale(l.r, hd),
			Eps:   c.NormEps,
			Rope:  rope,
		}
		switch a.qkNorm {
		case QKNormPerHead:
			at.QKNorm, at.QNorm, at.KNorm = a.qkNorm, l.norm(p+"attn_q_norm", hd), l.norm(p+"attn_k_norm", hd)
		case QKNormFull:
			at.QKNorm, at.QNorm, at.KNorm = a.qkNorm, l.norm(p+"attn_q_norm", h*hd), l.norm(p+"attn_k_norm", hkv*hd)
		}
		layer := Layer{AttnNorm: l.norm(p+"attn_norm", c.Embd), Attn: at, FFNNorm: l.norm(p+"ffn_norm", c.Embd)}
		if f.Tensor(p+"ffn_gate_inp.weight") != nil {
			moe := l.moe(p)
			if moe != nil {
				moe.NormWeights = a.normWeights
				if a.scaleKey != "" {
					moe.WeightsScale = l.r.float(a.scaleKey, 0)
				}
				if a.sharedGate && f.Tensor(p+"ffn_gate_shexp.weight") != nil {
					moe.Shared = l.ffn(p, "_shexp")
					moe.SharedGate = l.vec(p+"ffn_gate_inp_shexp.weight", c.Embd, false)
				}
			}
			layer.MoE = moe
		} else {
			layer.Dense = l.ffn(p, "")
		}
		m.Layers = append(m.Layers, layer)
	}
	return l.done(m)
}

func init() {
	// Plain llama and Mixtral (llama with experts): NORM rope, renormalised top-k.
	Register("llama", stdArch{normWeights: true}.build)
	Register("qwen2", stdArch{neox: true}.build)
	Register("qwen3", stdArch{neox: true, qkNorm: QKNormPerHead}.build)
}
