package engine_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// goldenNamed writes the golden model of the given name and returns its fixture.
func goldenNamed(t *testing.T, name string) (string, *fixture.Fixture) {
	t.Helper()
	fxs, err := fixture.LoadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(fxs, func(fx *fixture.Fixture) bool { return fx.Name == name })
	if i < 0 {
		t.Fatalf("no fixture %s", name)
	}
	return goldenModel(t, fxs[i]), fxs[i]
}

// TestCUDARefusesGPTOSS: the CUDA device has no kernels for gpt-oss's sinks, sliding window,
// biased router and experts or its activation, so it must refuse the model, naming them, not
// compute another model's numbers; expert parallelism, whose ranks compute experts their own
// way, refuses it too.
func TestCUDARefusesGPTOSS(t *testing.T) {
	path, _ := goldenNamed(t, "gpt-oss-mxfp4")
	const missing = "sliding-window attention, attention sinks, router biases, expert biases, the SwiGLU-OAI activation"
	if m, err := engine.Open(path, engine.Options{Threads: 2, EP: &engine.EPOptions{Devices: 2}}); err == nil || !strings.Contains(err.Error(), "expert parallelism does not compute gpt-oss's "+missing) {
		t.Errorf("expert parallelism: %v", err)
		if m != nil {
			m.Close()
		}
	}
	lib := engine.GPUForTests(t)
	for _, o := range []engine.Options{
		{Device: "cuda:0", CUDALibrary: lib, Threads: 2},
		{Device: "cuda:0", CUDALibrary: lib, Threads: 2, Offload: &engine.OffloadOptions{GPUMem: 256 << 20}},
	} {
		m, err := engine.Open(path, o)
		if err == nil || !strings.Contains(err.Error(), "has no kernels for gpt-oss's "+missing+": run it on the CPU") {
			t.Errorf("offload %v: %v", o.Offload != nil, err)
			if m != nil {
				m.Close()
			}
		}
	}
}

// TestSimRunsGPTOSS: the simulated GPU computes with the CPU's operations, so it runs gpt-oss
// with the CPU's numbers.
func TestSimRunsGPTOSS(t *testing.T) {
	path, fx := goldenNamed(t, "gpt-oss-f32")
	base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
	want := runOn(t, path, base, fx.Prompt, 8)
	o := base
	o.Device = "sim:rtx2080ti"
	got := runOn(t, path, o, fx.Prompt, 8)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) != 0 {
		t.Errorf("sim: greedy %v, CPU %v; probabilities differ by %g", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
}
