package models

import (
	"slices"
	"testing"
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
		info.Experts != 16 || info.ExpertsUsed != 4 || info.SharedExperts != 1 || info.Gating != "softmax" || info.Activation != "swiglu" {
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
