package models

import (
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

// newTinyQwen35 is a qwen35moe file small enough to write in a test: two DeltaNet layers
// (2 key heads under 4 value heads of 8) and a full-attention layer (interval 3).
func newTinyQwen35() *tinySpec {
	const embd, eff, vocab, experts, hd, dh, kh, vh, conv = 32, 16, 16, 4, 8, 8, 2, 4, 4
	const ch = (2*kh + vh) * dh
	s := &tinySpec{kv: ggml.KV{
		"general.architecture":                        "qwen35moe",
		"qwen35moe.block_count":                       uint32(3),
		"qwen35moe.embedding_length":                  uint32(embd),
		"qwen35moe.attention.head_count":              uint32(2),
		"qwen35moe.attention.head_count_kv":           uint32(1),
		"qwen35moe.attention.key_length":              uint32(hd),
		"qwen35moe.attention.value_length":            uint32(hd),
		"qwen35moe.attention.layer_norm_rms_epsilon":  float32(1e-6),
		"qwen35moe.rope.dimension_count":              uint32(4),
		"qwen35moe.rope.dimension_sections":           []int32{1, 1, 0, 0},
		"qwen35moe.context_length":                    uint32(64),
		"qwen35moe.expert_count":                      uint32(experts),
		"qwen35moe.expert_used_count":                 uint32(2),
		"qwen35moe.expert_feed_forward_length":        uint32(eff),
		"qwen35moe.expert_shared_feed_forward_length": uint32(eff),
		"qwen35moe.ssm.conv_kernel":                   uint32(conv),
		"qwen35moe.ssm.state_size":                    uint32(dh),
		"qwen35moe.ssm.group_count":                   uint32(kh),
		"qwen35moe.ssm.time_step_rank":                uint32(vh),
		"qwen35moe.ssm.inner_size":                    uint32(vh * dh),
		"qwen35moe.full_attention_interval":           uint32(3),
	}}
	s.tensors = []*ggml.Tensor{f32Tensor("token_embd.weight", embd, vocab), f32Tensor("output_norm.weight", embd)}
	for i, p := range []string{"blk.0.", "blk.1.", "blk.2."} {
		s.tensors = append(s.tensors, f32Tensor(p+"attn_norm.weight", embd), f32Tensor(p+"post_attention_norm.weight", embd))
		if i < 2 {
			s.tensors = append(s.tensors,
				f32Tensor(p+"attn_qkv.weight", embd, ch), f32Tensor(p+"attn_gate.weight", embd, vh*dh),
				f32Tensor(p+"ssm_conv1d.weight", conv, ch), f32Tensor(p+"ssm_dt.bias", vh), f32Tensor(p+"ssm_a", vh),
				f32Tensor(p+"ssm_beta.weight", embd, vh), f32Tensor(p+"ssm_alpha.weight", embd, vh),
				f32Tensor(p+"ssm_norm.weight", dh), f32Tensor(p+"ssm_out.weight", vh*dh, embd))
		} else {
			s.tensors = append(s.tensors,
				f32Tensor(p+"attn_q.weight", embd, 2*2*hd), f32Tensor(p+"attn_k.weight", embd, hd),
				f32Tensor(p+"attn_v.weight", embd, hd), f32Tensor(p+"attn_output.weight", 2*hd, embd),
				f32Tensor(p+"attn_q_norm.weight", hd), f32Tensor(p+"attn_k_norm.weight", hd))
		}
		s.tensors = append(s.tensors,
			f32Tensor(p+"ffn_gate_inp.weight", embd, experts),
			f32Tensor(p+"ffn_gate_exps.weight", embd, eff, experts), f32Tensor(p+"ffn_up_exps.weight", embd, eff, experts),
			f32Tensor(p+"ffn_down_exps.weight", eff, embd, experts), f32Tensor(p+"ffn_gate_inp_shexp.weight", embd),
			f32Tensor(p+"ffn_gate_shexp.weight", embd, eff), f32Tensor(p+"ffn_up_shexp.weight", embd, eff),
			f32Tensor(p+"ffn_down_shexp.weight", eff, embd))
	}
	return s
}

func TestQwen35MoE(t *testing.T) {
	m, err := openAndLoad(newTinyQwen35().write(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.File.Close()
	for i, l := range m.Layers[:2] {
		d, ok := l.Attn.(*DeltaNet)
		if !ok || d.KHeads != 2 || d.VHeads != 4 || d.HeadDim != 8 || d.ConvK != 4 || len(d.Conv) != 4*64 {
			t.Errorf("layer %d: %+v, want a DeltaNet layer", i, l.Attn)
			continue
		}
		if conv, state := d.StateDims(); conv != 3*64 || state != 4*8*8 {
			t.Errorf("layer %d: state dims %d, %d", i, conv, state)
		}
	}
	at, ok := m.Layers[2].Attn.(*StdAttention)
	if !ok || !at.OutGate || at.QKNorm != QKNormPerHead || !at.Rope.NeoX || at.Rope.Dims != 4 {
		t.Errorf("layer 2: %+v, want gated full attention", m.Layers[2].Attn)
	}
	moe := m.Layers[0].MoE
	if moe == nil || moe.Gating != GatingSoftmax || !moe.NormWeights || moe.Shared == nil || moe.SharedGate == nil || !moe.SharedSigmoid {
		t.Errorf("MoE %+v", moe)
	}
	kv, err := NewKVCache(m, KVOptions{Positions: 16}, HostAlloc)
	if err != nil {
		t.Fatal(err)
	}
	if kv.Layers[0].Rec == nil || kv.Layers[2].Rec != nil || kv.Layers[2].K == nil {
		t.Errorf("cache: recurrent layers get a state, the attention layer keys")
	}
}

func TestQwen35MoEBadFiles(t *testing.T) {
	checkBadFiles(t, newTinyQwen35, []badFile{
		{"state size does not match the inner size", func(s *tinySpec) { s.kv["qwen35moe.ssm.inner_size"] = uint32(40) }, `"qwen35moe.ssm.inner_size"`},
		{"state size does not match the tensors", func(s *tinySpec) {
			s.kv["qwen35moe.ssm.state_size"] = uint32(4)
			s.kv["qwen35moe.ssm.inner_size"] = uint32(16)
		}, `"blk.0.attn_qkv.weight" has shape`},
		{"key heads do not divide value heads", func(s *tinySpec) { s.kv["qwen35moe.ssm.group_count"] = uint32(3) }, `"qwen35moe.ssm.group_count"`},
		{"no conv kernel", func(s *tinySpec) { delete(s.kv, "qwen35moe.ssm.conv_kernel") }, `"qwen35moe.ssm.conv_kernel" is missing`},
		{"conv of another kernel", func(s *tinySpec) { s.replace("blk.1.ssm_conv1d.weight", f32Tensor("blk.1.ssm_conv1d.weight", 3, 64)) }, `"blk.1.ssm_conv1d.weight" has shape`},
		{"missing decay", func(s *tinySpec) { s.drop("blk.0.ssm_a") }, `"blk.0.ssm_a" is missing`},
		{"missing dt bias", func(s *tinySpec) { s.drop("blk.1.ssm_dt.bias") }, `"blk.1.ssm_dt.bias" is missing`},
		{"missing output gate projection", func(s *tinySpec) { s.drop("blk.0.attn_gate.weight") }, `"blk.0.attn_gate.weight" is missing`},
		{"queries without gates", func(s *tinySpec) { s.replace("blk.2.attn_q.weight", f32Tensor("blk.2.attn_q.weight", 32, 16)) }, `"blk.2.attn_q.weight" has shape`},
		{"missing shared gate", func(s *tinySpec) { s.drop("blk.2.ffn_gate_inp_shexp.weight") }, `"blk.2.ffn_gate_inp_shexp.weight" is missing`},
		{"no rope sections", func(s *tinySpec) { delete(s.kv, "qwen35moe.rope.dimension_sections") }, `"qwen35moe.rope.dimension_sections" is missing`},
		{"a pair rotated by the vision section", func(s *tinySpec) { s.kv["qwen35moe.rope.dimension_sections"] = []int32{1, 0, 0, 1} }, `"qwen35moe.rope.dimension_sections"`},
		{"zero interval", func(s *tinySpec) { s.kv["qwen35moe.full_attention_interval"] = uint32(0) }, `"qwen35moe.full_attention_interval"`},
	})
}

// TestRecStateRewind: a recurrent state resumes at its position, at a snapshot or at 0, the
// longest every layer allows, and forgets the snapshots after where it resumed.
func TestRecStateRewind(t *testing.T) {
	newState := func(conv, state int) *RecState {
		r, err := newRecState(conv, state, HostAlloc, "layer 0")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	mk := func(pos int, snaps ...int) *RecState {
		r := newState(2, 3)
		for _, p := range snaps {
			s := r.snapshot(p)
			s.Conv[0], s.S[0] = float32(p), float32(p)
		}
		r.Pos = pos
		r.Conv[0], r.S[0] = float32(pos), float32(pos)
		return r
	}
	for _, tc := range []struct {
		name    string
		layers  []*RecState
		p, want int
	}{
		{"at its position", []*RecState{mk(20, 10, 19)}, 20, 20},
		{"before its position: the last snapshot", []*RecState{mk(20, 10, 19)}, 19, 19},
		{"between snapshots", []*RecState{mk(20, 10, 19)}, 15, 10},
		{"before every snapshot", []*RecState{mk(20, 10, 19)}, 9, 0},
		{"past its position", []*RecState{mk(20, 10, 19)}, 30, 20},
		{"layers disagree: the longest both have", []*RecState{mk(20, 10, 19), mk(25, 10, 19)}, 30, 19},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := &KVCache{}
			for _, r := range tc.layers {
				kv.Layers = append(kv.Layers, LayerCache{Rec: r})
			}
			if got := kv.Rewind(tc.p, HostOps{}); got != tc.want {
				t.Fatalf("Rewind(%d) = %d, want %d", tc.p, got, tc.want)
			}
			for i, r := range tc.layers {
				if r.Pos != tc.want || r.Conv[0] != float32(tc.want) || r.S[0] != float32(tc.want) {
					t.Errorf("layer %d at %d holds %v %v", i, r.Pos, r.Conv[0], r.S[0])
				}
				for _, s := range r.snaps {
					if s.pos > tc.want {
						t.Errorf("layer %d keeps a snapshot at %d after rewinding to %d", i, s.pos, tc.want)
					}
				}
			}
			if err := kv.CheckPass(tc.want, 1); err != nil {
				t.Error(err)
			}
			if err := kv.CheckPass(tc.want+1, 1); err == nil {
				t.Errorf("CheckPass(%d, 1) passed, the state is at %d", tc.want+1, tc.want)
			}
		})
	}
	r := newState(1, 1)
	for p := 1; p <= MaxSnapshots+2; p++ {
		r.snapshot(p)
	}
	if len(r.snaps) != MaxSnapshots || r.snaps[0].pos != 3 {
		t.Errorf("%d snapshots from %d, want the last %d", len(r.snaps), r.snaps[0].pos, MaxSnapshots)
	}
}

// TestQwen35MoENextN: files with the multi-token-prediction block (block_count 41 for the
// 35B-A3B) load the 40 decoder layers and leave the block out, as llama.cpp's decoder does.
func TestQwen35MoENextN(t *testing.T) {
	s := newTinyQwen35()
	s.kv["qwen35moe.block_count"] = uint32(4)
	s.kv["qwen35moe.nextn_predict_layers"] = uint32(1)
	const embd, hd = 32, 8
	p := "blk.3."
	s.tensors = append(s.tensors, f32Tensor(p+"attn_norm.weight", embd), f32Tensor(p+"post_attention_norm.weight", embd),
		f32Tensor(p+"attn_q.weight", embd, 4*hd), f32Tensor(p+"attn_k.weight", embd, hd),
		f32Tensor(p+"attn_v.weight", embd, hd), f32Tensor(p+"attn_output.weight", 2*hd, embd),
		f32Tensor(p+"nextn.eh_proj.weight", 2*embd, embd), f32Tensor(p+"nextn.enorm.weight", embd),
		f32Tensor(p+"nextn.hnorm.weight", embd))
	m, err := openAndLoad(s.write(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.File.Close()
	if c := m.Config; c.Layers != 3 || c.NextN != 1 || len(m.Layers) != 3 || !c.Skipped("blk.3.attn_q.weight") || c.Skipped("blk.2.attn_q.weight") {
		t.Errorf("%d layers (config %d, nextn %d)", len(m.Layers), c.Layers, c.NextN)
	}
	if _, ok := m.Layers[2].Attn.(*StdAttention); !ok {
		t.Errorf("layer 2 is %T, want full attention", m.Layers[2].Attn)
	}
}
