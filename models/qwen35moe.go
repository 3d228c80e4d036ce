package models

import (
	"fmt"

	"github.com/commit-run/commit-run/device"
)

// Qwen3.5/3.6-MoE (llama.cpp qwen35moe, Qwen3.5-35B-A3B and its kin): a hybrid stack where
// three layers in four are gated DeltaNet linear attention (DeltaNet) and every fourth is
// full attention whose queries carry an output gate, with per-head q/k norms and partial
// NEOX rope under multi-section (interleaved M-RoPE) positions, which for text are one
// position in every section. Every layer's attention is followed by post_attention_norm
// and an MoE of softmax top-k renormalised, beside a shared expert behind a sigmoid gate.
// The file's last nextn_predict_layers blocks are a multi-token-prediction head that the
// decoder never runs, left out as GLM's are.
func init() { Register("qwen35moe", buildQwen35MoE) }

func buildQwen35MoE(f *File, c *Config) (*Model, error) {
	l := newLoader(f, c)
	r := l.r
	if err := l.nextn(); err != nil {
		return nil, err
	}
	dn := DeltaNet{DeltaNetLayer: device.DeltaNetLayer{
		ConvK:   r.int(".ssm.conv_kernel", 0, true),
		HeadDim: r.int(".ssm.state_size", 0, true),
		VHeads:  r.int(".ssm.time_step_rank", 0, true),
		KHeads:  r.int(".ssm.group_count", 0, true),
		Eps:     c.NormEps,
	}}
	inner := r.int(".ssm.inner_size", 0, true)
	interval := r.int(".full_attention_interval", 4, false)
	scaleW := r.float(".expert_weights_scale", 0)
	sharedFFN := r.int(".expert_shared_feed_forward_length", 0, false)
	if r.err != nil {
		return nil, r.err
	}
	switch {
	case dn.ConvK < 1 || dn.HeadDim <= 0 || dn.VHeads <= 0 || dn.KHeads <= 0:
		return nil, fmt.Errorf("metadata keys %q, %q, %q, %q: conv kernel %d, state %d, %d value and %d key heads", r.key(".ssm.conv_kernel"), r.key(".ssm.state_size"), r.key(".ssm.time_step_rank"), r.key(".ssm.group_count"), dn.ConvK, dn.HeadDim, dn.VHeads, dn.KHeads)
	case inner != dn.HeadDim*dn.VHeads:
		return nil, fmt.Errorf("metadata key %q: inner size %d is not state size %d times %d value heads", r.key(".ssm.inner_size"), inner, dn.HeadDim, dn.VHeads)
	case dn.VHeads%dn.KHeads != 0:
		return nil, fmt.Errorf("metadata key %q: %d key heads do not divide %d value heads", r.key(".ssm.group_count"), dn.KHeads, dn.VHeads)
	case interval <= 0:
		return nil, fmt.Errorf("metadata key %q: interval %d", r.key(".full_attention_interval"), interval)
	case c.Experts <= 0:
		return nil, fmt.Errorf("metadata key %q: qwen35moe needs experts, has %d", r.key(".expert_count"), c.Experts)
	case c.HeadDimK != c.HeadDimV:
		return nil, fmt.Errorf("qwen35moe key length %d differs from value length %d", c.HeadDimK, c.HeadDimV)
	}
	recurrent, err := l.recurrentLayers(interval)
	if err != nil {
		return nil, err
	}
	if err := l.textSections(); err != nil {
		return nil, err
	}

	m := &Model{Config: c, File: f}
	l.embeddings(m)
	rope := l.rope(true)
	for i := 0; i < c.Layers && l.err == nil; i++ {
		p := fmt.Sprintf("blk.%d.", i)
		layer := Layer{AttnNorm: l.norm(p+"attn_norm", c.Embd), FFNNorm: l.norm(p+"post_attention_norm", c.Embd)}
		if recurrent[i] {
			layer.Attn = l.deltaNet(p, dn)
		} else {
			layer.Attn = l.gatedAttention(p, i, rope)
		}
		moe := l.moe(p)
		if moe == nil {
			break
		}
		moe.NormWeights, moe.WeightsScale = true, scaleW
		moe.Shared = l.ffn(p, "_shexp")
		moe.SharedGate = l.vec(p+"ffn_gate_inp_shexp.weight", c.Embd, true)
		moe.SharedSigmoid = true
		if sh := moe.Shared; sh != nil && sharedFFN != 0 && sh.Gate.Rows != sharedFFN && l.err == nil {
			l.fail(fmt.Errorf("tensor %q has %d rows, metadata key %q says %d", p+"ffn_gate_shexp.weight", sh.Gate.Rows, r.key(".expert_shared_feed_forward_length"), sharedFFN))
		}
		layer.MoE = moe
		m.Layers = append(m.Layers, layer)
	}
	return l.done(m)
}

// recurrentLayers reads which layers are DeltaNet: attention.recurrent_layers where the file
// lists them, else all but every interval-th.
func (l *loader) recurrentLayers(interval int) ([]bool, error) {
	c, r := l.c, l.r
	out := make([]bool, c.Layers)
	if r.has(".attention.recurrent_layers") {
		flags := r.perLayer(".attention.recurrent_layers", c.Layers+c.NextN, 0, true)
		if r.err != nil {
			return nil, r.err
		}
		for i := range out {
			out[i] = flags[i] != 0
		}
		return out, nil
	}
	for i := range out {
		out[i] = (i+1)%interval != 0
	}
	return out, nil
}

// textSections checks the rope's sections (rope.dimension_sections): llama.cpp gives a text
// token the same position in the first three and 0 in the fourth, so the rope is plain NEOX
// rope as long as every rotated pair falls in one of the first three sections, as in every
// published file. Files that rotate some pairs by the fourth are refused.
func (l *loader) textSections() error {
	key := l.r.key(".rope.dimension_sections")
	secs := l.r.uints(".rope.dimension_sections")
	if len(secs) == 0 {
		return fmt.Errorf("metadata key %q is missing", key)
	}
	var s [4]int
	for i := 0; i < len(secs) && i < 4; i++ {
		s[i] = int(secs[i])
	}
	total := s[0] + s[1] + s[2] + s[3]
	if total == 0 {
		return fmt.Errorf("metadata key %q: every section is empty", key)
	}
	// ggml's interleaved M-RoPE (ggml_mrope_cache_init with imrope) picks a pair's section.
	for i := 0; i < l.c.Rope.Dims/2; i++ {
		sector := i % total
		text := sector%3 == 0 && sector < 3*s[0] || sector%3 == 1 && sector < 3*s[1] || sector%3 == 2 && sector < 3*s[2]
		if !text {
			return fmt.Errorf("metadata key %q: sections %v rotate pair %d by the fourth (vision) position, which text does not use", key, s, i)
		}
	}
	return nil
}

// deltaNet loads the DeltaNet layer of prefix p with the hyper-parameters of dn.
func (l *loader) deltaNet(p string, dn DeltaNet) *DeltaNet {
	c := l.c
	vd, ch := dn.VHeads*dn.HeadDim, dn.Channels()
	d := dn
	d.QKV = l.matrix(p+"attn_qkv.weight", c.Embd, ch)
	d.Gate = l.matrix(p+"attn_gate.weight", c.Embd, vd)
	d.Beta = l.matrix(p+"ssm_beta.weight", c.Embd, dn.VHeads)
	d.Alpha = l.matrix(p+"ssm_alpha.weight", c.Embd, dn.VHeads)
	d.Out = l.matrix(p+"ssm_out.weight", vd, c.Embd)
	if t := l.tensor(p+"ssm_conv1d.weight", dn.ConvK, ch); t != nil {
		d.Conv = t.Float32s()
	}
	d.DtBias = l.vec(p+"ssm_dt.bias", dn.VHeads, true)
	d.A = l.vec(p+"ssm_a", dn.VHeads, true)
	norm := l.norm(p+"ssm_norm", dn.HeadDim)
	d.NormW, d.NormB = norm.Weight, norm.Bias
	return &d
}

// gatedAttention loads block i's full attention: queries with their output gates, per-head
// q/k norms, no biases.
func (l *loader) gatedAttention(p string, i int, rope *Rope) *StdAttention {
	c := l.c
	h, hkv, hd := c.Heads[i], c.HeadsKV[i], c.HeadDimK
	return &StdAttention{
		Heads: h, HeadsKV: hkv, HeadDK: hd, HeadDV: hd,
		Q:       l.matrix(p+"attn_q.weight", c.Embd, 2*h*hd),
		K:       l.matrix(p+"attn_k.weight", c.Embd, hkv*hd),
		V:       l.matrix(p+"attn_v.weight", c.Embd, hkv*hd),
		O:       l.matrix(p+"attn_output.weight", h*hd, c.Embd),
		QKNorm:  QKNormPerHead,
		QNorm:   l.norm(p+"attn_q_norm", hd),
		KNorm:   l.norm(p+"attn_k_norm", hd),
		Scale:   defaultScale(l.r, hd),
		Eps:     c.NormEps,
		Rope:    rope,
		OutGate: true,
	}
}
