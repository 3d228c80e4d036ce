package engine_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
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

// TestCUDARunsGPTOSS runs gpt-oss on the fake driver, in F32 and in the published files' mix
// (MXFP4 experts beside Q8_0 and F16): its sliding window and sinks in the attention kernel,
// its biased router and experts and its activation in the device's routed MoE kernels
// (resident) and the host-routed expert path's device operations (offloaded), every product
// on the GPU's kernels, with the CPU's greedy tokens and its probabilities within 2e-3. Expert parallelism, whose ranks compute experts their own
// way, refuses it, naming what it lacks.
func TestCUDARunsGPTOSS(t *testing.T) {
	path, _ := goldenNamed(t, "gpt-oss-f32")
	const missing = "sliding-window attention, attention sinks, router biases, expert biases, the SwiGLU-OAI activation"
	if m, err := engine.Open(path, engine.Options{Threads: 2, EP: &engine.EPOptions{Devices: 2}}); err == nil || !strings.Contains(err.Error(), "expert parallelism does not compute gpt-oss's "+missing) {
		t.Errorf("expert parallelism: %v", err)
		if m != nil {
			m.Close()
		}
	}
	lib := engine.GPUForTests(t)
	for _, name := range []string{"gpt-oss-f32", "gpt-oss-mxfp4"} {
		path, fx := goldenNamed(t, name)
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
		want := runOn(t, path, base, fx.Prompt, 6)
		// Resident; the first layer's experts on the host (static: the host expert path's
		// biases and activation in host memory); every expert copied into a slot when needed;
		// experts committed to ahead of the router (the previous token's), their weights from
		// the biased router computed on the device, against the CPU's committed routing.
		for _, off := range []*engine.OffloadOptions{nil, {Policy: offload.Static, HostLayers: 1, GPUMem: 1 << 30},
			{Policy: offload.OnDemand, GPUMem: 1 << 30}, {Policy: offload.Commit, Predictor: "prev-token", GPUMem: 1 << 30}} {
			run := name + ", resident"
			o := base
			o.Device, o.CUDALibrary, o.Offload = "cuda:0", lib, off
			if off != nil {
				run = name + ", " + off.Policy.String()
			}
			want := want
			if off != nil && off.Policy == offload.Commit {
				cpu := base
				cpu.Offload = off
				want = runOn(t, path, cpu, fx.Prompt, 6)
			}
			got := runOn(t, path, o, fx.Prompt, 6)
			if !slices.Equal(got.tokens, want.tokens) {
				t.Errorf("%s: greedy on the GPU %v, on the CPU %v", run, got.tokens, want.tokens)
			}
			if d := maxDiff(got.probs, want.probs); d > 2e-3 {
				t.Errorf("%s: probabilities differ from the CPU's by up to %g", run, d)
			}
			// Every product on the GPU's kernels (MXFP4's included), none on the host.
			if got.gpu.Launches == 0 || got.gpu.HostFallbacks != 0 || !got.resident {
				t.Errorf("%s: %+v, resident %v: want the whole pass on the GPU", run, got.gpu, got.resident)
			}
			// Resident, the device routes every layer itself (the router's bias, the experts'
			// biases and activation in its fused kernels): nothing is read back inside a
			// decode step, which is one CUDA graph.
			if off == nil && (got.graphs != "" || got.gpu.GraphLaunches == 0) {
				t.Errorf("%s: %+v, graph note %q: want decode steps replayed as graphs", run, got.gpu, got.graphs)
			}
			if off != nil && off.Policy == offload.Static && got.off.OnCPU == 0 {
				t.Errorf("%s: no expert computed on the host: %+v", run, got.off)
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
