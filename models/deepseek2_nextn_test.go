package models_test

import (
	"fmt"
	"testing"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/synth"
)

// virtualLoad loads a virtual file of spec with its metadata changed by kv (nil values delete).
func virtualLoad(t *testing.T, spec synth.Spec, kv map[string]any) (*models.Model, error) {
	t.Helper()
	b, err := synth.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range kv {
		if v == nil {
			delete(b.KV, k)
		} else {
			b.KV[k] = v
		}
	}
	ts := make([]models.TensorInfo, len(b.Tensors))
	for i, x := range b.Tensors {
		ts[i] = models.TensorInfo{Name: x.Name, Type: x.Type, Shape: x.Shape}
	}
	f, err := models.NewVirtualFile("shape:"+spec.Name, b.KV, ts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return models.Load(f)
}

// GLM-4.7-Flash is a deepseek2 file with a multi-token-prediction block at the end, which is
// no layer of the model, and files without expert_gating_func route by sigmoid, as llama.cpp
// decides by the layer count and vocabulary.
func TestDeepseek2GLM47Flash(t *testing.T) {
	spec, err := synth.GoldenSpec("deepseek2-v3-q4km")
	if err != nil {
		t.Fatal(err)
	}
	m, err := virtualLoad(t, spec, map[string]any{"deepseek2.nextn_predict_layers": uint32(1)})
	if err != nil {
		t.Fatal(err)
	}
	if c := m.Config; c.Layers != spec.Layers-1 || c.NextN != 1 || len(m.Layers) != spec.Layers-1 ||
		!c.Skipped(fmt.Sprintf("blk.%d.attn_kv_a_mqa.weight", spec.Layers-1)) || c.Skipped(fmt.Sprintf("blk.%d.attn_kv_a_mqa.weight", spec.Layers-2)) {
		t.Errorf("%d layers (config %d, nextn %d), want the last block left out", len(m.Layers), c.Layers, c.NextN)
	}
	if _, err := virtualLoad(t, spec, map[string]any{"deepseek2.nextn_predict_layers": uint32(spec.Layers)}); err == nil {
		t.Errorf("every block next-token prediction: no error")
	}

	// Without the key: sigmoid at GLM-4.7-Flash's 47 layers and 154880 tokens, else softmax.
	for _, c := range []struct {
		layers, vocab int
		want          models.Gating
	}{{48, 154880, models.GatingSigmoid}, {27, 154880, models.GatingSoftmax}, {48, 440, models.GatingSoftmax}} {
		s := spec
		s.Layers, s.Vocab = c.layers, c.vocab
		m, err := virtualLoad(t, s, map[string]any{"deepseek2.expert_gating_func": nil, "deepseek2.nextn_predict_layers": uint32(1)})
		if err != nil {
			t.Fatal(err)
		}
		if g := m.Layers[len(m.Layers)-1].MoE.Gating; g != c.want {
			t.Errorf("%d+1 layers, %d tokens: gating %d, want %d", c.layers-1, c.vocab, g, c.want)
		}
	}
}
