package engine_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
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
// (resident, no product left to the host) and gives the CPU's greedy tokens and its
// next-token probabilities within 2e-3.
//
// The CPU runs the same weights dequantised to F32. On quantized and F16 weights the CPU
// rounds each product's activations to the weights' dot type (Q8_0, Q8_K, F16), as llama.cpp
// does, and the GPU's kernels do not: on these small random models that alone moves
// probabilities by up to 0.1 in every architecture (Mixtral's and OLMoE's quantized golden
// models as much as DeepSeek's), which would hide any error of MLA's own. Against F32 weights
// the CPU computes what the GPU's kernels compute, up to float32 rounding.
func TestCUDAFakeDriverMLA(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, c := range []struct {
		name, kv string
	}{
		{"deepseek2-mla-f32", "f32"},
		{"deepseek2-mla-f32", "f16"},
		{"deepseek2-mla-f16", "f16"},  // F16 k_b and v_b
		{"deepseek2-mla-q4km", "f32"}, // Q5_0 k_b, Q8_0 v_b (Q4_K and Q6_K's fallbacks at 32 and 128 columns)
		{"deepseek2-legacy-f32", "f16"},
		{"deepseek2-legacy-q5_1", "f32"}, // Q5_1 kv_b
	} {
		t.Run(c.name+"/kv-"+c.kv, func(t *testing.T) {
			spec, err := synth.GoldenSpec(c.name)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			path := filepath.Join(dir, c.name+".gguf")
			if _, err := synth.WriteFile(spec, path); err != nil {
				t.Fatal(err)
			}
			ref := dequantized(t, path, filepath.Join(dir, c.name+"-f32.gguf"))
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
			if !slices.Equal(got.tokens, want.tokens) {
				t.Errorf("greedy on the GPU %v, on the CPU %v", got.tokens, want.tokens)
			}
			d := maxDiff(got.probs, want.probs)
			if d > 2e-3 {
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

// dequantized writes the model at path to out with every tensor decoded to F32, and returns
// out.
func dequantized(t *testing.T, path, out string) string {
	t.Helper()
	f, err := models.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []*ggml.Tensor
	for _, tn := range f.Tensors {
		v := make([]float32, tn.Elements())
		quant.DequantizeRow(tn.Type, tn.Data, v)
		shape := make([]uint64, len(tn.Ne))
		for i, n := range tn.Ne {
			shape[i] = uint64(n)
		}
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
