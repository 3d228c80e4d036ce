package engine_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/synth"
)

// TestCUDAFakeDriverMLA runs DeepSeek-V2's multi-head latent attention on cuda:0 of the fake
// driver, in both file layouts (the absorbed attn_k_b/attn_v_b form and the legacy attn_kv_b
// form), with F32 and F16 caches and weights of several types: the pass stays in device memory
// (resident, no product left to the host), its decode steps replay as CUDA graphs, and it gives
// the CPU's greedy tokens and its next-token probabilities within 2e-3.
//
// The CPU runs the weights as the GPU multiplies them (floatReference): the CPU rounds each
// product's activations to the weights' dot type (Q8_0, Q8_K, F16), as llama.cpp does, and so
// do the GPU's products of quantized weights, but not its products of F16 weights nor MLA's
// per-head products (mla.cu): those tensors are widened to F32 for the CPU. The rounding alone
// moves probabilities by up to 0.1 on these small random models, which would hide any error of
// MLA's own; with it the same on both, the CPU computes what the GPU's kernels compute, up to
// float32 rounding.
//
// Up to float32 rounding, but not within it where the activations are quantized: a float32
// difference of an ulp moves one of an activation's quants by a step now and then (an
// activation of a few thousand values has a value within an ulp of a rounding boundary in
// about one token in ten), the step then weighs in every later position through the KV cache,
// and on these small random models that moves probabilities by a few hundredths. Files with
// quantized products are held to 0.1, the size of the rounding itself, and to the greedy tokens
// only where no such step came first; the F32 and F16 files to 2e-3 and every token.
func TestCUDAFakeDriverMLA(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, c := range []struct {
		name, kv  string
		quantized bool // products of quantized weights, on a quantized activation
	}{
		{"deepseek2-mla-f32", "f32", false},
		{"deepseek2-mla-f32", "f16", false},
		{"deepseek2-mla-f16", "f16", false}, // F16 k_b and v_b
		{"deepseek2-mla-q4km", "f32", true}, // Q5_0 k_b, Q8_0 v_b (Q4_K and Q6_K's fallbacks at 32 and 128 columns)
		{"deepseek2-legacy-f32", "f16", false},
		{"deepseek2-legacy-q5_1", "f32", true}, // Q5_1 kv_b
	} {
		t.Run(c.name+"/kv-"+c.kv, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, c.name+".gguf")
			if _, err := synth.WriteGolden(c.name, path); err != nil {
				t.Fatal(err)
			}
			ref := floatReference(t, path, filepath.Join(dir, c.name+"-ref.gguf"))
			m, err := engine.Open(path, engine.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			prompt, err := m.Tokenize("The old prince said that", true)
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
			base := engine.Options{Threads: 2, KVType: c.kv, ContextLength: 64}
			want := runOn(t, ref, base, prompt, 10)
			o := base
			o.Device, o.CUDALibrary = "cuda:0", lib
			got := runOn(t, path, o, prompt, 10)
			tol := 2e-3
			if c.quantized {
				tol = 0.1
			}
			if maxDiff(got.probs, want.probs) <= 2e-3 && !slices.Equal(got.tokens, want.tokens) {
				t.Errorf("greedy on the GPU %v, on the CPU %v", got.tokens, want.tokens)
			}
			d := maxDiff(got.probs, want.probs)
			if d > tol {
				t.Errorf("probabilities differ from the CPU's by up to %g", d)
			}
			if got.gpu.Launches == 0 || got.gpu.HostFallbacks != 0 || !got.resident {
				t.Errorf("%+v, resident %v: want the whole pass on the GPU", got.gpu, got.resident)
			}
			if got.gpu.GraphLaunches == 0 || got.graphs != "" {
				t.Errorf("%+v, %q: want the decode steps replayed as CUDA graphs", got.gpu, got.graphs)
			}
			t.Logf("%d prompt tokens, max |p GPU - p CPU| %.3g, %+v, %q", len(prompt), d, got.gpu, got.graphs)
		})
	}
}

// floatReference writes the model at path to out with the tensors the GPU multiplies by float
// activations decoded to F32 (F16 and BF16 weights, MLA's attn_k_b and attn_v_b), the others
// as they are, and returns out.
func floatReference(t *testing.T, path, out string) string {
	t.Helper()
	f, err := models.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []*ggml.Tensor
	for _, tn := range f.Tensors {
		shape := make([]uint64, len(tn.Ne))
		for i, n := range tn.Ne {
			shape[i] = uint64(n)
		}
		float := tn.Type == quant.F16 || tn.Type == quant.BF16 || strings.HasSuffix(tn.Name, "attn_k_b.weight") || strings.HasSuffix(tn.Name, "attn_v_b.weight")
		if !float {
			ts = append(ts, &ggml.Tensor{Name: tn.Name, Kind: uint32(tn.Type), Shape: shape, WriterTo: bytes.NewReader(tn.Data)})
			continue
		}
		v := make([]float32, tn.Elements())
		quant.DequantizeRow(tn.Type, tn.Data, v)
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
		ts = append(ts, &ggml.Tensor{Name: tn.Name, Kind: uint32(quant.F32), Shape: shape, WriterTo: bytes.NewReader(b)})
	}
	w, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := ggml.WriteGGUF(w, f.KV, ts); err != nil {
		t.Fatal(err)
	}
	return out
}
