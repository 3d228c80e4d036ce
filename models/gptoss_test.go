package models

import (
	"slices"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/ollama/ollama/fs/ggml"
)

// newTinyGPTOSS is a gpt-oss file small enough to write in a test: two layers, the first
// sliding-window, the second full, with MXFP4 experts.
func newTinyGPTOSS() *tinySpec {
	const embd, eff, vocab, experts, hd, heads, kv = 32, 32, 16, 4, 8, 8, 2
	s := &tinySpec{kv: ggml.KV{
		"general.architecture":                         "gpt-oss",
		"gpt-oss.block_count":                          uint32(2),
		"gpt-oss.embedding_length":                     uint32(embd),
		"gpt-oss.feed_forward_length":                  uint32(eff),
		"gpt-oss.attention.head_count":                 uint32(heads),
		"gpt-oss.attention.head_count_kv":              uint32(kv),
		"gpt-oss.attention.key_length":                 uint32(hd),
		"gpt-oss.attention.value_length":               uint32(hd),
		"gpt-oss.attention.layer_norm_rms_epsilon":     float32(1e-5),
		"gpt-oss.attention.sliding_window":             uint32(4),
		"gpt-oss.rope.dimension_count":                 uint32(hd),
		"gpt-oss.rope.freq_base":                       float32(150000),
		"gpt-oss.rope.scaling.type":                    "yarn",
		"gpt-oss.rope.scaling.factor":                  float32(32),
		"gpt-oss.rope.scaling.original_context_length": uint32(4096),
		"gpt-oss.context_length":                       uint32(64),
		"gpt-oss.expert_count":                         uint32(experts),
		"gpt-oss.expert_used_count":                    uint32(2),
		"gpt-oss.expert_feed_forward_length":           uint32(eff),
	}}
	s.tensors = []*ggml.Tensor{f32Tensor("token_embd.weight", embd, vocab), f32Tensor("output_norm.weight", embd),
		f32Tensor("output.weight", embd, vocab)}
	for _, p := range []string{"blk.0.", "blk.1."} {
		s.tensors = append(s.tensors,
			f32Tensor(p+"attn_norm.weight", embd),
			f32Tensor(p+"attn_q.weight", embd, heads*hd), f32Tensor(p+"attn_q.bias", heads*hd),
			f32Tensor(p+"attn_k.weight", embd, kv*hd), f32Tensor(p+"attn_k.bias", kv*hd),
			f32Tensor(p+"attn_v.weight", embd, kv*hd), f32Tensor(p+"attn_v.bias", kv*hd),
			f32Tensor(p+"attn_output.weight", heads*hd, embd), f32Tensor(p+"attn_output.bias", embd),
			f32Tensor(p+"attn_sinks.weight", heads),
			f32Tensor(p+"post_attention_norm.weight", embd),
			f32Tensor(p+"ffn_gate_inp.weight", embd, experts), f32Tensor(p+"ffn_gate_inp.bias", experts),
			mxfp4Tensor(p+"ffn_gate_exps.weight", embd, eff, experts), f32Tensor(p+"ffn_gate_exps.bias", eff, experts),
			mxfp4Tensor(p+"ffn_up_exps.weight", embd, eff, experts), f32Tensor(p+"ffn_up_exps.bias", eff, experts),
			mxfp4Tensor(p+"ffn_down_exps.weight", eff, embd, experts), f32Tensor(p+"ffn_down_exps.bias", embd, experts))
	}
	return s
}

func TestGPTOSS(t *testing.T) {
	m, err := openAndLoad(newTinyGPTOSS().write(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.File.Close()
	for i, l := range m.Layers {
		a := l.Attn.(*StdAttention)
		if want := []int{4, 0}[i]; a.Window != want {
			t.Errorf("layer %d: window %d, want %d (llama.cpp's swa pattern 2: the even layers)", i, a.Window, want)
		}
		if len(a.Sinks) != 8 || a.BO == nil || !a.Rope.NeoX || a.Rope.ExtFactor != 1 {
			t.Errorf("layer %d: sinks %d, output bias %v, rope %+v", i, len(a.Sinks), a.BO != nil, a.Rope)
		}
		moe := l.MoE
		if moe == nil || moe.Gating != GatingSoftmaxWeight || moe.NormWeights || moe.OAI == nil || moe.OAI.Limit != 7 || moe.OAI.Alpha != 1.702 {
			t.Fatalf("layer %d: MoE %+v", i, moe)
		}
		g, u, d := moe.ExpertBiases(3)
		if len(moe.RouterBias) != 4 || len(g) != 32 || len(u) != 32 || len(d) != 32 || &g[0] != &moe.GateBias[3*32] {
			t.Errorf("layer %d: router bias %d, expert 3's biases %d %d %d", i, len(moe.RouterBias), len(g), len(u), len(d))
		}
	}
	want := []device.Feature{device.SlidingWindow, device.AttentionSinks, device.RouterBiases, device.ExpertBiases, device.SwiGLUOAI}
	if got := m.Features(); !slices.Equal(got, want) {
		t.Errorf("Features = %q, want %q", got, want)
	}
}

// TestGPTOSSMalformed: a gpt-oss file without what llama.cpp requires is an error naming the
// tensor or key, never a model that runs without it.
func TestGPTOSSMalformed(t *testing.T) {
	checkBadFiles(t, newTinyGPTOSS, []badFile{
		{"", func(s *tinySpec) { s.drop("blk.1.attn_sinks.weight") }, `tensor "blk.1.attn_sinks.weight" is missing`},
		{"", func(s *tinySpec) { s.replace("blk.0.attn_sinks.weight", f32Tensor("blk.0.attn_sinks.weight", 4)) }, `tensor "blk.0.attn_sinks.weight" has shape [4]`},
		{"", func(s *tinySpec) { s.drop("blk.0.ffn_down_exps.bias") }, `tensor "blk.0.ffn_down_exps.bias" is missing`},
		{"", func(s *tinySpec) { s.drop("blk.1.ffn_gate_inp.bias") }, `tensor "blk.1.ffn_gate_inp.bias" is missing`},
		{"", func(s *tinySpec) { s.drop("blk.0.attn_output.bias") }, `tensor "blk.0.attn_output.bias" is missing`},
		{"", func(s *tinySpec) { s.drop("output.weight") }, `tensor "output.weight" is missing`},
		{"", func(s *tinySpec) { delete(s.kv, "gpt-oss.attention.sliding_window") }, `metadata key "gpt-oss.attention.sliding_window" is missing`},
		{"", func(s *tinySpec) { s.kv["gpt-oss.attention.sliding_window"] = uint32(0) }, `"gpt-oss.attention.sliding_window": a sliding window of 0`},
		{"", func(s *tinySpec) { s.kv["gpt-oss.attention.sliding_window_pattern"] = uint32(3) }, `"gpt-oss.attention.sliding_window_pattern": 3`},
		{"", func(s *tinySpec) { s.kv["gpt-oss.rope.dimension_count"] = uint32(4) }, `differ from the rope dimension 4`},
		{"", func(s *tinySpec) {
			bad := mxfp4Tensor("blk.0.ffn_up_exps.weight", 32, 32, 4)
			bad.Shape = []uint64{40, 32, 4}
			s.replace("blk.0.ffn_up_exps.weight", bad)
		}, `"blk.0.ffn_up_exps.weight": MXFP4 row of 40 elements is not a whole number of 32-element blocks`},
	})
}
