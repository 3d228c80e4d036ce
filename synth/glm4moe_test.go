package synth

import (
	"strings"
	"testing"
)

// TestGLM4MoESpec checks what the glm4moe and grouped deepseek2 golden models must carry for
// llama.cpp to load them as GLM-4.5 and DeepSeek-V3 files, and the specs Validate refuses.
func TestGLM4MoESpec(t *testing.T) {
	s, err := GoldenSpec("glm4moe-q4km")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	a := s.Arch + "."
	for k, want := range map[string]any{a + "nextn_predict_layers": uint32(1), a + "expert_group_count": uint32(4),
		a + "expert_group_used_count": uint32(2), a + "expert_gating_func": uint32(2), a + "rope.dimension_count": uint32(64),
		a + "leading_dense_block_count": uint32(1), a + "expert_weights_norm": true} {
		if m.KV[k] != want {
			t.Errorf("%s = %v, want %v", k, m.KV[k], want)
		}
	}
	names := map[string]bool{}
	for _, tn := range m.Tensors {
		names[tn.Name] = true
	}
	for _, n := range []string{"blk.1.exp_probs_b.bias", "blk.0.attn_q.bias", "blk.0.post_attention_norm.weight",
		"blk.3.nextn.eh_proj.weight", "blk.3.ffn_gate_exps.weight", "blk.2.ffn_gate_shexp.weight", "blk.0.ffn_gate.weight"} {
		if !names[n] {
			t.Errorf("no %s", n)
		}
	}
	for _, n := range []string{"blk.0.ffn_norm.weight", "blk.0.exp_probs_b.bias", "blk.2.nextn.eh_proj.weight"} {
		if names[n] {
			t.Errorf("unexpected %s", n)
		}
	}
	v3, _ := GoldenSpec("deepseek2-v3-f32")
	if m, err := Build(v3); err != nil || m.KV["deepseek2.expert_gating_func"] != uint32(2) {
		t.Errorf("deepseek2-v3: %v, gating %v", err, m.KV["deepseek2.expert_gating_func"])
	}

	for _, bad := range []struct {
		change func(*Spec)
		want   string
	}{
		{func(s *Spec) { s.NextN = 3 }, "no MoE layer"},
		{func(s *Spec) { s.RopeDim = 130 }, "rope dimension"},
		{func(s *Spec) { s.ExpertGroups = 3 }, "expert groups"},
		{func(s *Spec) { s.ExpertGroupsUsed = 4 }, "expert groups"},
		{func(s *Spec) { s.SharedExperts = 0 }, "shared experts"},
		{func(s *Spec) { s.Arch = ArchQwen3MoE }, "only glm4moe and deepseek2"},
	} {
		b := s
		bad.change(&b)
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Validate = %v, want an error containing %q", err, bad.want)
		}
	}
}
