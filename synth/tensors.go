package synth

import (
	"fmt"
	"math"
)

// init kinds: how a tensor's values are drawn.
const (
	initWeight = iota // normal(0, std)
	initNorm          // RMSNorm weight: around 1
	initBias          // normal(0, std)
	initRouter        // normal(0, std), each expert's row scaled by its own factor
	initDecay         // a DeltaNet's A (-e^A_log): uniform in [-1, -0.05]
)

// tensorDef is one tensor of a spec before its type is chosen.
type tensorDef struct {
	name  string
	shape []uint64 // ggml order: shape[0] is the row length
	role  string   // name without "blk.N." and ".weight"/".bias"
	layer int      // -1 outside the layers
	init  int
	std   float64
	// quantizable weights get their type from the recipe; the rest stay F32.
	quantizable bool
}

func (d *tensorDef) elements() uint64 {
	n := uint64(1)
	for _, v := range d.shape {
		n *= v
	}
	return n
}

// Gains of the weight families. Weights are drawn with std gain/sqrt(fan_in), so a gain of 1
// keeps activations at unit scale; the larger gains make distributions peaked:
//   - logitGain: logits have std ~3, so the top token of a 300-600 token vocabulary typically
//     has probability 0.1-0.6 rather than ~1/vocab;
//   - qkGain: attention scores have std ~qkGain^2 without q/k norms, so attention is not uniform;
//   - routerGain: router logits have std ~2.5, times a per-expert factor in [0.5, 1.7], so some
//     experts win much more often and top-k weights are far from equal.
const (
	logitGain  = 3.0
	qkGain     = 1.4
	ffnGain    = 1.5
	routerGain = 2.5
	biasStd    = 0.3
)

func gain(g float64, fanIn int) float64 { return g / math.Sqrt(float64(fanIn)) }

// tensorDefs lists a spec's tensors with llama.cpp's names and shapes (see each architecture's
// load_arch_tensors in llama.cpp's src/models/).
func (s *Spec) tensorDefs() ([]tensorDef, error) {
	var d defList
	n, v := s.Embd, s.Vocab
	embdStd := 1.0
	if s.Tied {
		// The tied LM head is token_embd itself, so its scale sets the logits' scale.
		embdStd = gain(logitGain, n)
	}
	d.weight("token_embd.weight", "token_embd", -1, embdStd, n, v)
	d.norm("output_norm.weight", "output_norm", -1, n)
	if !s.Tied {
		d.weight("output.weight", "output", -1, gain(logitGain, n), n, v)
	}
	for il := 0; il < s.Layers; il++ {
		b := blockDefs{defList: &d, prefix: fmt.Sprintf("blk.%d.", il), il: il}
		b.norm(b.prefix+"attn_norm.weight", "attn_norm", il, n)
		if s.Arch == ArchGLM4MoE || s.Arch == ArchGPTOSS || s.Arch == ArchQwen35MoE {
			b.norm(b.prefix+"post_attention_norm.weight", "post_attention_norm", il, n)
		} else {
			b.norm(b.prefix+"ffn_norm.weight", "ffn_norm", il, n)
		}
		switch s.Arch {
		case ArchDeepSeek2:
			s.mlaAttention(b)
		case ArchQwen35MoE:
			s.qwen35Layer(b)
		default:
			s.attention(b)
		}
		if s.moe(il) {
			s.moeFFN(b)
		} else {
			b.w("ffn_gate", gain(ffnGain, n), n, s.FFN)
			b.w("ffn_up", gain(ffnGain, n), n, s.FFN)
			b.w("ffn_down", gain(1, s.FFN), s.FFN, n)
		}
		if il >= s.Layers-s.NextN {
			// GLM's multi-token-prediction head: never run by llama.cpp's decoder, present
			// so that a loader must leave it out.
			b.w("nextn.eh_proj", gain(1, 2*n), 2*n, n)
			b.norm(b.prefix+"nextn.enorm.weight", "nextn.enorm", il, n)
			b.norm(b.prefix+"nextn.hnorm.weight", "nextn.hnorm", il, n)
			b.norm(b.prefix+"nextn.shared_head_norm.weight", "nextn.shared_head_norm", il, n)
		}
	}
	return d.ts, nil
}

// defList collects tensor definitions in file order, with one adder per init kind.
type defList struct{ ts []tensorDef }

func (d *defList) weight(name, role string, il int, std float64, shape ...int) {
	d.ts = append(d.ts, tensorDef{name: name, shape: u64(shape), role: role, layer: il, init: initWeight, std: std, quantizable: true})
}

func (d *defList) norm(name, role string, il int, n int) {
	d.ts = append(d.ts, tensorDef{name: name, shape: u64([]int{n}), role: role, layer: il, init: initNorm})
}

func (d *defList) bias(name, role string, il int, n int) {
	d.ts = append(d.ts, tensorDef{name: name, shape: u64([]int{n}), role: role, layer: il, init: initBias, std: biasStd})
}

// blockDefs adds the tensors of one layer, named "blk.N." + role.
type blockDefs struct {
	*defList
	prefix string
	il     int
}

// w adds the layer's weight role, named with ".weight" as llama.cpp spells it.
func (b blockDefs) w(role string, std float64, shape ...int) {
	b.weight(b.prefix+role+".weight", role, b.il, std, shape...)
}

// attention adds the q, k, v and output projections of the non-MLA architectures, with the
// biases or q/k norms their family carries.
func (s *Spec) attention(b blockDefs) {
	n, p, il := s.Embd, b.prefix, b.il
	hd, hkv := s.headDim(), s.headsKV()
	b.w("attn_q", gain(qkGain, n), n, s.Heads*hd)
	b.w("attn_k", gain(qkGain, n), n, hkv*hd)
	b.w("attn_v", gain(1, n), n, hkv*hd)
	b.w("attn_output", gain(1, s.Heads*hd), s.Heads*hd, n)
	switch s.Arch {
	case ArchQwen2, ArchQwen2MoE, ArchGLM4MoE:
		b.bias(p+"attn_q.bias", "attn_q.bias", il, s.Heads*hd)
		b.bias(p+"attn_k.bias", "attn_k.bias", il, hkv*hd)
		b.bias(p+"attn_v.bias", "attn_v.bias", il, hkv*hd)
	case ArchQwen3, ArchQwen3MoE:
		b.norm(p+"attn_q_norm.weight", "attn_q_norm", il, hd)
		b.norm(p+"attn_k_norm.weight", "attn_k_norm", il, hd)
	case ArchOLMoE:
		b.norm(p+"attn_q_norm.weight", "attn_q_norm", il, s.Heads*hd)
		b.norm(p+"attn_k_norm.weight", "attn_k_norm", il, hkv*hd)
	case ArchGPTOSS:
		s.gptossAttention(b)
	}
}

// mlaAttention adds DeepSeek2's multi-head latent attention: q through an optional LoRA, k
// and v through the compressed kv_lora, in the MLA layout or the older single attn_kv_b.
func (s *Spec) mlaAttention(b blockDefs) {
	n, p, il := s.Embd, b.prefix, b.il
	qk := s.QKNopeDim + s.RopeDim
	if s.QLoraRank > 0 {
		b.w("attn_q_a", 1/math.Sqrt(float64(n)), n, s.QLoraRank)
		b.norm(p+"attn_q_a_norm.weight", "attn_q_a_norm", il, s.QLoraRank)
		b.w("attn_q_b", gain(qkGain, s.QLoraRank), s.QLoraRank, s.Heads*qk)
	} else {
		b.w("attn_q", gain(qkGain, n), n, s.Heads*qk)
	}
	b.w("attn_kv_a_mqa", gain(qkGain, n), n, s.KVLoraRank+s.RopeDim)
	b.norm(p+"attn_kv_a_norm.weight", "attn_kv_a_norm", il, s.KVLoraRank)
	if s.MLA {
		// attn_k_b is stored transposed per head ({nope, kv_lora, head}) so that it can
		// be applied to q ("absorbed") rather than to the cache.
		b.w("attn_k_b", gain(1, s.KVLoraRank), s.QKNopeDim, s.KVLoraRank, s.Heads)
		b.w("attn_v_b", gain(1, s.KVLoraRank), s.KVLoraRank, s.VHeadDim, s.Heads)
	} else {
		b.w("attn_kv_b", gain(1, s.KVLoraRank), s.KVLoraRank, s.Heads*(s.QKNopeDim+s.VHeadDim))
	}
	b.w("attn_output", gain(1, s.Heads*s.VHeadDim), s.Heads*s.VHeadDim, n)
}

// moeFFN adds an MoE layer's router and stacked experts, and the shared expert of the
// families that have one.
func (s *Spec) moeFFN(b blockDefs) {
	n, p, il := s.Embd, b.prefix, b.il
	e, f := s.Experts, s.ExpertFFN
	b.ts = append(b.ts, tensorDef{name: p + "ffn_gate_inp.weight", shape: u64([]int{n, e}), role: "ffn_gate_inp",
		layer: il, init: initRouter, std: gain(routerGain, n)})
	if s.Arch == ArchGPTOSS {
		s.gptossExperts(b)
		return
	}
	b.w("ffn_gate_exps", gain(ffnGain, n), n, f, e)
	b.w("ffn_up_exps", gain(ffnGain, n), n, f, e)
	b.w("ffn_down_exps", gain(1, f), f, n, e)
	if s.Arch == ArchGLM4MoE || s.SigmoidGating {
		// The selection bias: on the scale of sigmoid probabilities, enough to change the
		// choice often, never the weights.
		b.bias(p+"exp_probs_b.bias", "exp_probs_b.bias", il, e)
	}
	shared := 0
	switch s.Arch {
	case ArchQwen2MoE, ArchQwen35MoE:
		shared = s.SharedFFN
		// The sigmoid gate of the shared expert: one logit per token, stored as a vector.
		b.ts = append(b.ts, tensorDef{name: p + "ffn_gate_inp_shexp.weight", shape: u64([]int{n}),
			role: "ffn_gate_inp_shexp", layer: il, init: initWeight, std: gain(2, n)})
	case ArchDeepSeek2, ArchGLM4MoE:
		shared = s.SharedExperts * s.ExpertFFN
	}
	if shared > 0 {
		b.w("ffn_gate_shexp", gain(ffnGain, n), n, shared)
		b.w("ffn_up_shexp", gain(ffnGain, n), n, shared)
		b.w("ffn_down_shexp", gain(1, shared), shared, n)
	}
}

func u64(v []int) []uint64 {
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = uint64(x)
	}
	return out
}
