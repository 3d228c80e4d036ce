package models

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/synth"
)

// The bundled Qwen2-MoE model's description: its shape and routing from the loaded model, and
// every tensor's bytes counted once, as an expert's or not.
func TestDescribe(t *testing.T) {
	f, err := Open("testdata/tinymoe-qwen2moe.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	info := Describe(f, m)
	if info.Architecture != "qwen2moe" || info.Layers != 4 || !slices.Equal(info.MoELayers, []int{0, 1, 2, 3}) ||
		info.Experts != 16 || info.ExpertsUsed != 4 || info.SharedExperts != 1 || info.Gating != "softmax" || info.Activation != "swiglu" ||
		info.DeltaNetLayers != 0 || info.GatedAttentionLayers != 0 || info.RecurrentStateBytes != 0 {
		t.Errorf("description %+v", info)
	}
	var bytes, types int64
	for _, tn := range f.Tensors {
		bytes += tn.Bytes()
	}
	for _, b := range info.TensorTypeBytes {
		types += b
	}
	if info.ExpertBytes+info.NonExpertBytes != bytes || types != bytes || info.ExpertBytes == 0 {
		t.Errorf("expert bytes %d + non-expert %d, by type %d; the file's tensors hold %d", info.ExpertBytes, info.NonExpertBytes, types, bytes)
	}
}

// A qwen35moe model's description tells its hybrid stack apart: of the golden base's 4 layers
// the first 3 are gated DeltaNet (2 key and 4 value heads of 32, a convolution of 4) and the
// fourth gated full attention; a sequence's recurrent state is each DeltaNet layer's last 3
// inputs of the 2*2*32+4*32 convolved channels and its 4 value heads' 32x32 state, in float32.
func TestDescribeQwen35MoE(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qwen35moe.gguf")
	if _, err := synth.WriteGolden("qwen35moe-q8_0", path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	info := Describe(f, m)
	if info.Architecture != "qwen35moe" || info.Layers != 4 || len(info.MoELayers) != 4 || info.SharedExperts != 1 ||
		info.DeltaNetLayers != 3 || info.DeltaNetKHeads != 2 || info.DeltaNetVHeads != 4 || info.DeltaNetHeadDim != 32 ||
		info.DeltaNetConvK != 4 || info.GatedAttentionLayers != 1 || info.SlidingWindow != 0 {
		t.Errorf("description %+v", info)
	}
	if want := int64(3 * (3*(2*2*32+4*32) + 4*32*32) * 4); info.RecurrentStateBytes != want {
		t.Errorf("recurrent state of %d bytes, want %d", info.RecurrentStateBytes, want)
	}
}
