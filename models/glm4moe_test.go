package models

import (
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

// newTinyGLM is a glm4moe file small enough to write in a test: a dense layer, a MoE layer
// with expert groups, and a multi-token-prediction block.
func newTinyGLM() *tinySpec {
	const embd, ff, eff, vocab, experts, hd = 32, 48, 16, 16, 4, 8
	s := &tinySpec{kv: ggml.KV{
		"general.architecture":                     "glm4moe",
		"glm4moe.block_count":                      uint32(3),
		"glm4moe.embedding_length":                 uint32(embd),
		"glm4moe.feed_forward_length":              uint32(ff),
		"glm4moe.attention.head_count":             uint32(4),
		"glm4moe.attention.head_count_kv":          uint32(2),
		"glm4moe.attention.key_length":             uint32(hd),
		"glm4moe.attention.value_length":           uint32(hd),
		"glm4moe.attention.layer_norm_rms_epsilon": float32(1e-5),
		"glm4moe.rope.dimension_count":             uint32(hd / 2),
		"glm4moe.context_length":                   uint32(64),
		"glm4moe.expert_count":                     uint32(experts),
		"glm4moe.expert_used_count":                uint32(2),
		"glm4moe.expert_feed_forward_length":       uint32(eff),
		"glm4moe.expert_shared_count":              uint32(1),
		"glm4moe.expert_weights_scale":             float32(2.5),
		"glm4moe.expert_weights_norm":              true,
		"glm4moe.expert_gating_func":               uint32(2),
		"glm4moe.expert_group_count":               uint32(2),
		"glm4moe.expert_group_used_count":          uint32(1),
		"glm4moe.leading_dense_block_count":        uint32(1),
		"glm4moe.nextn_predict_layers":             uint32(1),
	}}
	s.tensors = []*ggml.Tensor{f32Tensor("token_embd.weight", embd, vocab), f32Tensor("output_norm.weight", embd)}
	for i, p := range []string{"blk.0.", "blk.1.", "blk.2."} {
		s.tensors = append(s.tensors,
			f32Tensor(p+"attn_norm.weight", embd),
			f32Tensor(p+"attn_q.weight", embd, 4*hd), f32Tensor(p+"attn_q.bias", 4*hd),
			f32Tensor(p+"attn_k.weight", embd, 2*hd), f32Tensor(p+"attn_k.bias", 2*hd),
			f32Tensor(p+"attn_v.weight", embd, 2*hd), f32Tensor(p+"attn_v.bias", 2*hd),
			f32Tensor(p+"attn_output.weight", 4*hd, embd),
			f32Tensor(p+"post_attention_norm.weight", embd))
		if i == 0 {
			s.tensors = append(s.tensors, f32Tensor(p+"ffn_gate.weight", embd, ff),
				f32Tensor(p+"ffn_up.weight", embd, ff), f32Tensor(p+"ffn_down.weight", ff, embd))
			continue
		}
		s.tensors = append(s.tensors,
			f32Tensor(p+"ffn_gate_inp.weight", embd, experts), f32Tensor(p+"exp_probs_b.bias", experts),
			f32Tensor(p+"ffn_gate_exps.weight", embd, eff, experts), f32Tensor(p+"ffn_up_exps.weight", embd, eff, experts),
			f32Tensor(p+"ffn_down_exps.weight", eff, embd, experts),
			f32Tensor(p+"ffn_gate_shexp.weight", embd, eff), f32Tensor(p+"ffn_up_shexp.weight", embd, eff),
			f32Tensor(p+"ffn_down_shexp.weight", eff, embd))
	}
	s.tensors = append(s.tensors, f32Tensor("blk.2.nextn.eh_proj.weight", 2*embd, embd),
		f32Tensor("blk.2.nextn.enorm.weight", embd), f32Tensor("blk.2.nextn.hnorm.weight", embd))
	return s
}

func (s *tinySpec) drop(name string) {
	for i, x := range s.tensors {
		if x.Name == name {
			s.tensors = append(s.tensors[:i], s.tensors[i+1:]...)
			return
		}
	}
}

func TestGLM4MoE(t *testing.T) {
	m, err := openAndLoad(newTinyGLM().write(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.File.Close()
	c := m.Config
	if c.Layers != 2 || c.NextN != 1 || len(m.Layers) != 2 || m.Layers[0].Dense == nil {
		t.Fatalf("%d layers (config %d, nextn %d), want a dense layer and a MoE layer", len(m.Layers), c.Layers, c.NextN)
	}
	moe := m.Layers[1].MoE
	if moe == nil || moe.Gating != GatingSigmoid || moe.SelectionBias == nil || moe.Groups != 2 || moe.GroupsUsed != 1 ||
		!moe.NormWeights || moe.WeightsScale != 2.5 || moe.Shared == nil || moe.SharedGate != nil {
		t.Errorf("MoE layer %+v", moe)
	}
	at, ok := m.Layers[1].Attn.(*StdAttention)
	if !ok || at.BQ == nil || at.BK == nil || at.BV == nil || !at.Rope.NeoX || at.Rope.Dims != 4 || at.HeadDK != 8 || at.QKNorm != QKNormNone {
		t.Errorf("attention %+v", at)
	}
	for name, want := range map[string]bool{"blk.2.attn_q.weight": true, "blk.2.nextn.eh_proj.weight": true,
		"blk.1.attn_q.weight": false, "token_embd.weight": false, "blk.3.attn_q.weight": false} {
		if c.Skipped(name) != want {
			t.Errorf("Skipped(%q) = %v", name, !want)
		}
	}
}

func TestGLM4MoEBadFiles(t *testing.T) {
	checkBadFiles(t, newTinyGLM, []badFile{
		{"missing selection bias", func(s *tinySpec) { s.drop("blk.1.exp_probs_b.bias") }, `"blk.1.exp_probs_b.bias" is missing`},
		{"missing k bias", func(s *tinySpec) { s.drop("blk.0.attn_k.bias") }, `"blk.0.attn_k.bias" is missing`},
		{"missing post-attention norm", func(s *tinySpec) { s.drop("blk.1.post_attention_norm.weight") }, `"blk.1.post_attention_norm.weight" is missing`},
		{"missing shared expert", func(s *tinySpec) { s.drop("blk.1.ffn_down_shexp.weight") }, `"blk.1.ffn_down_shexp.weight" is missing`},
		{"only a q norm", func(s *tinySpec) { s.tensors = append(s.tensors, f32Tensor("blk.1.attn_q_norm.weight", 8)) }, `"blk.1.attn_k_norm.weight" is missing`},
		{"wrong bias shape", func(s *tinySpec) { s.replace("blk.1.exp_probs_b.bias", f32Tensor("blk.1.exp_probs_b.bias", 5)) }, `"blk.1.exp_probs_b.bias" has shape`},
		{"wrong shared width", func(s *tinySpec) {
			s.replace("blk.1.ffn_gate_shexp.weight", f32Tensor("blk.1.ffn_gate_shexp.weight", 32, 24))
			s.replace("blk.1.ffn_up_shexp.weight", f32Tensor("blk.1.ffn_up_shexp.weight", 32, 24))
			s.replace("blk.1.ffn_down_shexp.weight", f32Tensor("blk.1.ffn_down_shexp.weight", 24, 32))
		}, `"blk.1.ffn_gate_shexp.weight" has 24 rows`},
		{"groups do not divide", func(s *tinySpec) { s.kv["glm4moe.expert_group_count"] = uint32(3) }, `"glm4moe.expert_group_count"`},
		{"as many groups as experts", func(s *tinySpec) { s.kv["glm4moe.expert_group_count"] = uint32(4) }, `"glm4moe.expert_group_count"`},
		{"every group used", func(s *tinySpec) { s.kv["glm4moe.expert_group_used_count"] = uint32(2) }, `"glm4moe.expert_group_used_count"`},
		{"no group used", func(s *tinySpec) { delete(s.kv, "glm4moe.expert_group_used_count") }, `"glm4moe.expert_group_used_count"`},
		{"all layers next-token prediction", func(s *tinySpec) { s.kv["glm4moe.nextn_predict_layers"] = uint32(3) }, `"glm4moe.nextn_predict_layers"`},
		{"no MoE layer", func(s *tinySpec) { s.kv["glm4moe.leading_dense_block_count"] = uint32(2) }, `"glm4moe.leading_dense_block_count"`},
		{"unknown gating", func(s *tinySpec) { s.kv["glm4moe.expert_gating_func"] = uint32(7) }, `"glm4moe.expert_gating_func"`},
		{"no shared count", func(s *tinySpec) { delete(s.kv, "glm4moe.expert_shared_count") }, `"glm4moe.expert_shared_count" is missing`},
		{"no expert width", func(s *tinySpec) { delete(s.kv, "glm4moe.expert_feed_forward_length") }, `"glm4moe.expert_feed_forward_length" is missing`},
		{"rope wider than a head", func(s *tinySpec) { s.kv["glm4moe.rope.dimension_count"] = uint32(16) }, "implausible head sizes"},
		{"M-RoPE sections", func(s *tinySpec) { s.kv["glm4moe.rope.dimension_sections"] = []uint32{2, 2, 0, 0} }, `"glm4moe.rope.dimension_sections"`},
	})
}
