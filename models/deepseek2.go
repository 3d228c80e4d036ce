package models

import (
	"fmt"
	"math"
)

// DeepSeek-V2 (-Lite): MLA attention, leading dense layers, routed experts with shared experts,
// expert weight scale and optional renormalisation, YaRN rope moved into the attention scale.
// V3-style files (Moonlight, GLM-4.7-Flash) add sigmoid gating, the selection bias and expert
// groups; GLM-4.7-Flash ends with a multi-token-prediction block that is not run.
func init() { Register("deepseek2", buildDeepseek2) }

func buildDeepseek2(f *File, c *Config) (*Model, error) {
	l := newLoader(f, c)
	r := l.r
	if err := l.nextn(); err != nil {
		return nil, err
	}
	m := &Model{Config: c, File: f}
	l.embeddings(m)
	d, err := l.mla()
	if err != nil {
		return nil, err
	}
	gating := Gating(r.int(".expert_gating_func", 0, false))
	if gating == 0 {
		gating = GatingSoftmax
		// GLM-4.7-Flash files converted before the key existed route by sigmoid: llama.cpp
		// knows them by their layers (47 or 48 besides the nextn block) and vocabulary.
		if (c.Layers == 47 || c.Layers == 48) && c.Vocab == 154880 {
			gating = GatingSigmoid
		}
	}
	if gating > GatingSoftmaxWeight {
		return nil, fmt.Errorf("expert_gating_func %d is not supported", gating)
	}
	normW := r.bool(".expert_weights_norm", false)
	scaleW := r.float(".expert_weights_scale", 0)
	groups, groupsUsed := l.expertGroups()
	for i := 0; i < c.Layers && l.err == nil; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		at := l.mlAttention(p, c.Heads[i], d)
		layer := Layer{AttnNorm: l.norm(p+"attn_norm", c.Embd), Attn: at, FFNNorm: l.norm(p+"ffn_norm", c.Embd)}
		if i < c.DenseLead {
			layer.Dense = l.ffn(p, "")
		} else {
			moe := l.moe(p)
			if moe != nil {
				moe.Gating, moe.NormWeights, moe.WeightsScale = gating, normW, scaleW
				moe.Groups, moe.GroupsUsed = groups, groupsUsed
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

// mlaDims is the MLA geometry every layer shares. qRank may be 0 in the metadata; the first
// layer with a factored query then sets it from its tensor, for the layers after it.
type mlaDims struct {
	rank, qRank, headK, headV, nope, ropeD int
	rope                                   *Rope
	yarnLogMul                             float32
}

// mla reads the MLA sizes and the rope, and refuses sizes no MLA layer can have before any
// tensor is checked against them. Newer conversions give key_length and value_length for the
// absorbed form and the heads' own sizes under the _mla keys.
func (l *loader) mla() (*mlaDims, error) {
	r, c := l.r, l.c
	d := &mlaDims{}
	d.rank = r.int(".attention.kv_lora_rank", 0, true)
	d.qRank = r.int(".attention.q_lora_rank", 0, false)
	d.headK, d.headV = c.HeadDimK, c.HeadDimV
	mla := r.has(".attention.key_length_mla") && r.has(".attention.value_length_mla")
	if mla {
		d.headK = r.int(".attention.key_length_mla", 0, true)
		d.headV = r.int(".attention.value_length_mla", 0, true)
	}
	d.ropeD = c.Rope.Dims
	if l.err == nil && r.err != nil {
		l.fail(r.err)
	}
	if l.err != nil {
		return nil, l.err
	}
	if d.rank <= 0 || d.headK <= d.ropeD || d.headV <= 0 {
		return nil, fmt.Errorf("implausible MLA sizes: kv_lora_rank %d, key %d, value %d, rope %d", d.rank, d.headK, d.headV, d.ropeD)
	}
	d.nope = d.headK - d.ropeD
	d.rope = l.rope(false)
	d.yarnLogMul = r.float(".rope.scaling.yarn_log_multiplier", 0)
	if d.yarnLogMul != 0 {
		// The converter stores 0.1*mscale_all_dim; llama.cpp divides it back out.
		d.yarnLogMul /= 0.1
		if d.rope.ExtFactor != 0 {
			// mscale == mscale_all_dim for DeepSeek-V2, so YaRN's rope magnitude cancels to 1.
			d.rope.AttnFactor = r.float(".rope.scaling.attn_factor", 1) / (1 + 0.1*float32(math.Log(float64(1/d.rope.FreqScale))))
		}
	}
	return d, nil
}

// mlAttention loads the attention of the layer with tensor prefix p and h heads. Conversions
// differ in two places: the query is factored (attn_q_a, attn_q_b) or one matrix (V2-Lite), and
// the latent's key and value projections come per head (attn_k_b, attn_v_b), which absorbed
// attention wants, or as the legacy attn_kv_b.
func (l *loader) mlAttention(p string, h int, d *mlaDims) *MLAttention {
	f, c := l.f, l.c
	at := &MLAttention{Heads: h, Nope: d.nope, RopeD: d.ropeD, Rank: d.rank, HeadV: d.headV, Eps: c.NormEps, Rope: d.rope}
	at.Scale = mlaScale(d.rope, d.yarnLogMul, d.headK)
	if f.Tensor(p+"attn_q_a.weight") != nil {
		if d.qRank == 0 {
			d.qRank = f.Tensor(p + "attn_q_a.weight").Matrix().Rows
		}
		at.QA = l.matrix(p+"attn_q_a.weight", c.Embd, d.qRank)
		at.QANorm = l.norm(p+"attn_q_a_norm", d.qRank)
		at.QB = l.matrix(p+"attn_q_b.weight", d.qRank, h*d.headK)
	} else {
		at.Q = l.matrix(p+"attn_q.weight", c.Embd, h*d.headK)
	}
	at.KVA = l.matrix(p+"attn_kv_a_mqa.weight", c.Embd, d.rank+d.ropeD)
	at.KVANorm = l.norm(p+"attn_kv_a_norm", d.rank)
	at.O = l.matrix(p+"attn_output.weight", h*d.headV, c.Embd)
	if kb := l.optional(p+"attn_k_b.weight", d.nope, d.rank, h); kb != nil {
		vb := l.tensor(p+"attn_v_b.weight", d.rank, d.headV, h)
		if vb != nil {
			for j := 0; j < h; j++ {
				at.KB = append(at.KB, kb.Expert(j))
				at.VB = append(at.VB, vb.Expert(j))
			}
		}
	} else if kvb := l.tensor(p+"attn_kv_b.weight", d.rank, h*(d.nope+d.headV)); kvb != nil {
		at.KVB = kvb.Matrix()
	}
	return at
}
