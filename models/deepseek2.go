package models

import (
	"fmt"
	"math"
)

// DeepSeek-V2 (-Lite): MLA attention, leading dense layers, routed experts with shared experts,
// expert weight scale and optional renormalisation, YaRN rope moved into the attention scale.
func init() { Register("deepseek2", buildDeepseek2) }

func buildDeepseek2(f *File, c *Config) (*Model, error) {
	l := newLoader(f, c)
	r := l.r
	m := &Model{Config: c, File: f}
	l.embeddings(m)
	rank := r.int(".attention.kv_lora_rank", 0, true)
	qRank := r.int(".attention.q_lora_rank", 0, false)
	headK, headV := c.HeadDimK, c.HeadDimV
	mla := r.has(".attention.key_length_mla") && r.has(".attention.value_length_mla")
	if mla {
		headK = r.int(".attention.key_length_mla", 0, true)
		headV = r.int(".attention.value_length_mla", 0, true)
	}
	ropeD := c.Rope.Dims
	if l.err == nil && r.err != nil {
		l.fail(r.err)
	}
	if l.err != nil {
		return nil, l.err
	}
	if rank <= 0 || headK <= ropeD || headV <= 0 {
		return nil, fmt.Errorf("implausible MLA sizes: kv_lora_rank %d, key %d, value %d, rope %d", rank, headK, headV, ropeD)
	}
	nope := headK - ropeD
	rope := l.rope(false)
	yarnLogMul := r.float(".rope.scaling.yarn_log_multiplier", 0)
	if yarnLogMul != 0 {
		// The converter stores 0.1*mscale_all_dim; llama.cpp divides it back out.
		yarnLogMul /= 0.1
		if rope.ExtFactor != 0 {
			// mscale == mscale_all_dim for DeepSeek-V2, so YaRN's rope magnitude cancels to 1.
			rope.AttnFactor = r.float(".rope.scaling.attn_factor", 1) / (1 + 0.1*float32(math.Log(float64(1/rope.FreqScale))))
		}
	}
	gating := Gating(r.int(".expert_gating_func", 0, false))
	if gating == 0 {
		gating = GatingSoftmax
	}
	if gating > GatingSoftmaxWeight {
		return nil, fmt.Errorf("expert_gating_func %d is not supported", gating)
	}
	normW := r.bool(".expert_weights_norm", false)
	scaleW := r.float(".expert_weights_scale", 0)
	for i := 0; i < c.Layers && l.err == nil; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		h := c.Heads[i]
		at := &MLAttention{Heads: h, Nope: nope, RopeD: ropeD, Rank: rank, HeadV: headV, Eps: c.NormEps, Rope: rope}
		at.Scale = mlaScale(rope, yarnLogMul, headK)
		if f.Tensor(p+"attn_q_a.weight") != nil {
			if qRank == 0 {
				qRank = f.Tensor(p + "attn_q_a.weight").Matrix().Rows
			}
			at.QA = l.matrix(p+"attn_q_a.weight", c.Embd, qRank)
			at.QANorm = l.norm(p+"attn_q_a_norm", qRank)
			at.QB = l.matrix(p+"attn_q_b.weight", qRank, h*headK)
		} else {
			at.Q = l.matrix(p+"attn_q.weight", c.Embd, h*headK)
		}
		at.KVA = l.matrix(p+"attn_kv_a_mqa.weight", c.Embd, rank+ropeD)
		at.KVANorm = l.norm(p+"attn_kv_a_norm", rank)
		at.O = l.matrix(p+"attn_output.weight", h*headV, c.Embd)
		if kb := l.optional(p+"attn_k_b.weight", nope, rank, h); kb != nil {
			vb := l.tensor(p+"attn_v_b.weight", rank, headV, h)
			if vb != nil {
				for j := 0; j < h; j++ {
					at.KB = append(at.KB, kb.Expert(j))
					at.VB = append(at.VB, vb.Expert(j))
				}
			}
		} else if kvb := l.tensor(p+"attn_kv_b.weight", rank, h*(nope+headV)); kvb != nil {
			at.KVB = kvb.Matrix()
		}
		layer := Layer{AttnNorm: l.norm(p+"attn_norm", c.Embd), Attn: at, FFNNorm: l.norm(p+"ffn_norm", c.Embd)}
		if i < c.DenseLead {
			layer.Dense = l.ffn(p, "")
		} else {
			moe := l.moe(p)
			if moe != nil {
				moe.Gating, moe.NormWeights, moe.WeightsScale = gating, normW, scaleW
				if f.Tensor(p+"ffn_gate_shexp.weight") != nil {
					moe.Shared = l.ffn(p, "_shexp")
				}
			}
			layer.MoE = moe
		}
		m.Layers = append(m.Layers, layer)
	}
	return l.done(m)
}
