package synth

import (
	"fmt"

	"github.com/ollama/ollama/fs/ggml"
)

// Qwen3.5/3.6-MoE (llama.cpp's qwen35moe): the tensors and keys of its loader, for a stack
// of gated DeltaNet layers with a full-attention layer every DeltaNet.Interval.

// DeltaNet is the shape of qwen35moe's linear-attention layers.
type DeltaNet struct {
	ConvK    int // ssm.conv_kernel
	HeadDim  int // ssm.state_size: the key and value head size
	KHeads   int // ssm.group_count
	VHeads   int // ssm.time_step_rank
	Interval int // full_attention_interval: every Interval-th layer is full attention
	// Sections is rope.dimension_sections: the rotated pairs of a head in the time, height,
	// width and extra sections of M-RoPE (text uses the first three alike).
	Sections [4]int
}

// recurrent reports whether layer il is a DeltaNet layer.
func (s *Spec) recurrent(il int) bool {
	return s.DeltaNet != nil && (il+1)%s.DeltaNet.Interval != 0
}

func (s *Spec) validateQwen35() error {
	if s.Arch != ArchQwen35MoE {
		if s.DeltaNet != nil {
			return fmt.Errorf("only qwen35moe has DeltaNet layers")
		}
		return nil
	}
	d := s.DeltaNet
	switch {
	case d == nil || d.ConvK < 2 || d.HeadDim <= 0 || d.KHeads <= 0 || d.VHeads%d.KHeads != 0 || d.Interval < 1:
		return fmt.Errorf("qwen35moe needs a DeltaNet shape: conv kernel, head size, key heads dividing value heads, an interval")
	case s.SharedFFN <= 0 || s.HeadDim == 0 || s.RopeDim <= 0 || s.RopeDim > s.HeadDim:
		return fmt.Errorf("qwen35moe needs a shared expert, a head size and a partial rope")
	case d.Sections[0]+d.Sections[1]+d.Sections[2] != s.RopeDim/2:
		return fmt.Errorf("qwen35moe's rope sections %v do not cover its %d rotated pairs", d.Sections, s.RopeDim/2)
	case s.LeadingDense != 0 || s.SharedExperts != 0 || s.SigmoidGating || s.ExpertGroups > 1 || s.Tied:
		return fmt.Errorf("qwen35moe has neither dense layers, counted shared experts, sigmoid gating, groups nor tied output")
	}
	return nil
}

// qwen35Layer adds layer b's attention: a DeltaNet's projections, convolution, decay and
// norm, or the full attention's queries with their gates and per-head q/k norms.
func (s *Spec) qwen35Layer(b blockDefs) {
	n, p, il := s.Embd, b.prefix, b.il
	if !s.recurrent(il) {
		hd, hkv := s.HeadDim, s.headsKV()
		b.w("attn_q", gain(qkGain, n), n, 2*s.Heads*hd)
		b.w("attn_k", gain(qkGain, n), n, hkv*hd)
		b.w("attn_v", gain(1, n), n, hkv*hd)
		b.w("attn_output", gain(1, s.Heads*hd), s.Heads*hd, n)
		b.norm(p+"attn_q_norm.weight", "attn_q_norm", il, hd)
		b.norm(p+"attn_k_norm.weight", "attn_k_norm", il, hd)
		return
	}
	d := s.DeltaNet
	vd := d.VHeads * d.HeadDim
	ch := 2*d.KHeads*d.HeadDim + vd
	b.w("attn_qkv", gain(1, n), n, ch)
	b.w("attn_gate", gain(1, n), n, vd)
	// The convolution's taps stay F32, as llama.cpp's quantizer leaves them.
	b.ts = append(b.ts, tensorDef{name: p + "ssm_conv1d.weight", shape: u64([]int{d.ConvK, ch}), role: "ssm_conv1d",
		layer: il, init: initWeight, std: gain(1, d.ConvK)})
	b.bias(p+"ssm_dt.bias", "ssm_dt.bias", il, d.VHeads)
	b.ts = append(b.ts, tensorDef{name: p + "ssm_a", shape: u64([]int{d.VHeads}), role: "ssm_a", layer: il, init: initDecay})
	b.w("ssm_beta", gain(1, n), n, d.VHeads)
	b.w("ssm_alpha", gain(1, n), n, d.VHeads)
	b.norm(p+"ssm_norm.weight", "ssm_norm", il, d.HeadDim)
	b.w("ssm_out", gain(1, vd), vd, n)
}

// qwen35Metadata adds qwen35moe's keys.
func (s *Spec) qwen35Metadata(kv ggml.KV) {
	a, d := s.Arch+".", s.DeltaNet
	kv[a+"expert_feed_forward_length"] = uint32(s.ExpertFFN)
	kv[a+"expert_shared_feed_forward_length"] = uint32(s.SharedFFN)
	kv[a+"rope.dimension_count"] = uint32(s.RopeDim)
	kv[a+"rope.dimension_sections"] = []int32{int32(d.Sections[0]), int32(d.Sections[1]), int32(d.Sections[2]), int32(d.Sections[3])}
	kv[a+"ssm.conv_kernel"] = uint32(d.ConvK)
	kv[a+"ssm.state_size"] = uint32(d.HeadDim)
	kv[a+"ssm.group_count"] = uint32(d.KHeads)
	kv[a+"ssm.time_step_rank"] = uint32(d.VHeads)
	kv[a+"ssm.inner_size"] = uint32(d.VHeads * d.HeadDim)
	kv[a+"full_attention_interval"] = uint32(d.Interval)
}
