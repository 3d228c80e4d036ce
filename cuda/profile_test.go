package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// TestKernelProfile checks that a profiled GPU accounts for every launch by its kernel's
// name, that the numbers stay those of an unprofiled GPU, and that an unprofiled one keeps
// no profile.
func TestKernelProfile(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	w32 := randMatrix(t, quant.F32, 40, 64, r)
	w8 := randMatrix(t, quant.Q8_0, 24, 64, r)
	x := make([]float32, 2*64)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	run := func(g *GPU) [][]float32 {
		var outs [][]float32
		for _, w := range []quant.Matrix{w32, w8} {
			if err := g.Upload(w.Data, w.Type.String()); err != nil {
				t.Fatal(err)
			}
			for _, T := range []int{1, 2} {
				out := make([]float32, T*w.Rows)
				g.MatMul(w, x, T, out)
				outs = append(outs, out)
			}
		}
		return outs
	}
	plain := openFakeGPU(t, GPUOptions{})
	want := run(plain)
	if p := plain.KernelProfile(); p != nil {
		t.Errorf("a GPU opened without ProfileKernels keeps a profile: %+v", p)
	}

	g := openFakeGPU(t, GPUOptions{ProfileKernels: true})
	if p := g.KernelProfile(); len(p) != 0 {
		t.Errorf("a profile before any launch: %+v", p)
	}
	got := run(g)
	for i := range want {
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("product %d, out[%d]: %v profiled, %v not", i, j, got[i][j], want[i][j])
			}
		}
	}
	prof := g.KernelProfile()
	calls := map[string]int64{}
	var sum int64
	for i, k := range prof {
		if i > 0 && prof[i-1].Name >= k.Name {
			t.Errorf("profile not in name order: %q before %q", prof[i-1].Name, k.Name)
		}
		if k.Seconds < 0 {
			t.Errorf("%s: %v s", k.Name, k.Seconds)
		}
		calls[k.Name] = k.Calls
		sum += k.Calls
	}
	// Two float products of F32, then for Q8_0 a quantization and an integer product each
	// (one token's on its own kernel).
	wantCalls := map[string]int64{mmvKernels[quant.F32]: 2, "quantize_q8_f32": 2, mmvqKernels[quant.Q8_0]: 1, mmvq1Kernels[quant.Q8_0]: 1}
	for name, n := range wantCalls {
		if calls[name] != n {
			t.Errorf("%s: %d calls profiled, want %d (profile %+v)", name, calls[name], n, prof)
		}
	}
	if s := g.Stats(); sum != s.Launches {
		t.Errorf("%d calls profiled, %d launches counted", sum, s.Launches)
	}
	// A later profile adds to the earlier one.
	run(g)
	for _, k := range g.KernelProfile() {
		if k.Calls != 2*calls[k.Name] {
			t.Errorf("%s: %d calls after running twice, want %d", k.Name, k.Calls, 2*calls[k.Name])
		}
	}
}
