package models_test

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/synth"
)

// A virtual file of a real shape, Mixtral-8x7B's 28.4 GB at Q4_K_M, loads as a model whose tensors have
// the shapes and types synth gave them, with no memory behind its weights.
func TestVirtualFile(t *testing.T) {
	spec, err := synth.Bench(synth.ArchLlama, synth.BenchOptions{Types: synth.Q4KM})
	if err != nil {
		t.Fatal(err)
	}
	spec.Name = "mixtral-8x7b"
	b, err := synth.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	ts := make([]models.TensorInfo, len(b.Tensors))
	for i, x := range b.Tensors {
		ts[i] = models.TensorInfo{Name: x.Name, Type: x.Type, Shape: x.Shape}
	}
	f, err := models.NewVirtualFile("shape:mixtral-8x7b", b.KV, ts)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Size < 20<<30 {
		t.Errorf("%d bytes of weights, want Mixtral's 28 GB or so at Q4_K_M", f.Size)
	}
	m, err := models.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if c := m.Config; c.Layers != 32 || c.Experts != 8 || c.ExpertsUsed != 2 || c.Embd != 4096 {
		t.Errorf("config %+v, want Mixtral's", c)
	}
	for _, x := range b.Tensors {
		got := f.Tensor(x.Name)
		if got == nil || got.Type != x.Type || int64(len(got.Data)) != got.Bytes() {
			t.Fatalf("tensor %s: %+v, want type %v with its bytes", x.Name, got, x.Type)
		}
	}
	if got := f.Tensor("output.weight").Data[:8]; string(got) != "\x00\x00\x00\x00\x00\x00\x00\x00" {
		t.Errorf("weights read %v, want zeros", got)
	}
}

func TestVirtualFileBadInput(t *testing.T) {
	for _, c := range []struct {
		name string
		ts   []models.TensorInfo
		want string
	}{
		{"type", []models.TensorInfo{{Name: "a", Type: quant.Type(200), Shape: []uint64{32}}}, "does not support"},
		{"dims", []models.TensorInfo{{Name: "a", Type: quant.F32}}, "dimensions"},
		{"zero", []models.TensorInfo{{Name: "a", Type: quant.F32, Shape: []uint64{4, 0}}}, "is 0"},
		{"blocks", []models.TensorInfo{{Name: "a", Type: quant.Q4_K, Shape: []uint64{100}}}, "whole number of 256-element blocks"},
		{"huge", []models.TensorInfo{{Name: "a", Type: quant.F32, Shape: []uint64{1 << 30, 1 << 30, 1 << 30}}}, "absurdly large"},
		{"twice", []models.TensorInfo{{Name: "a", Type: quant.F32, Shape: []uint64{4}}, {Name: "a", Type: quant.F32, Shape: []uint64{4}}}, "twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := models.NewVirtualFile("shape:bad", nil, c.ts)
			if err == nil {
				f.Close()
				t.Fatalf("no error, want one about %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to mention %q", err, c.want)
			}
		})
	}
}
