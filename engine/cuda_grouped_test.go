package engine_test

import (
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/synth"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// TestCUDAGroupedRouting runs the models whose experts are chosen within groups (glm4moe,
// DeepSeek-V3-style deepseek2) on the fake driver: the device's routing kernel limits the
// choice to the best groups, so those layers are routed on the device, with the CPU's greedy
// tokens and its probabilities within 2e-3, and decode steps replay as graphs.
func TestCUDAGroupedRouting(t *testing.T) {
	lib := engine.GPUForTests(t)
	fxs, err := fixture.LoadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"glm4moe-q8_0", "deepseek2-v3-f32"} {
		i := slices.IndexFunc(fxs, func(fx *fixture.Fixture) bool { return fx.Name == name })
		if i < 0 {
			t.Fatalf("no fixture %s", name)
		}
		path := goldenModel(t, fxs[i])
		prompt := fxs[i].Prompt[:8]
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
		want := runOn(t, path, base, prompt, 6)
		o := base
		o.Device, o.CUDALibrary = "cuda:0", lib
		got := runOn(t, path, o, prompt, 6)
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%s: greedy on the GPU %v, on the CPU %v", name, got.tokens, want.tokens)
		}
		if d := maxDiff(got.probs, want.probs); d > 2e-3 {
			t.Errorf("%s: probabilities differ from the CPU's by up to %g", name, d)
		}
		if !got.resident || got.gpu.HostFallbacks != 0 || got.graphs != "" || got.gpu.GraphLaunches == 0 {
			t.Errorf("%s: %+v, resident %v, graph note %q: want the routing on the device and decode steps as graphs", name, got.gpu, got.resident, got.graphs)
		}
		// Committed routing weighs the grouped layers' committed experts on the device
		// (commit_weights_f32 with groups), against the CPU's committed routing.
		c := &engine.OffloadOptions{Policy: offload.Commit, Predictor: "prev-token", GPUMem: 1 << 30}
		o.Offload, base.Offload = c, c
		want, got = runOn(t, path, base, prompt, 6), runOn(t, path, o, prompt, 6)
		if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
			t.Errorf("%s, commit: greedy on the GPU %v, on the CPU %v; probabilities %g apart", name, got.tokens, want.tokens, maxDiff(got.probs, want.probs))
		}
		// Where the host weighs a grouped layer's experts it reads the layer's router logits
		// back at every decode step: 21 read-backs in this run, 9 with the device weighing.
		if got.gpu.Reads > 12 || got.gpu.HostFallbacks != 0 {
			t.Errorf("%s, commit: %+v: want committed routing weighed on the device", name, got.gpu)
		}
	}

	// GLM-4.5-Air itself has one group: the device routes it, sigmoid, bias, scale and all.
	path, prompt := goldenVariant(t, "glm4moe-q8_0", func(s *synth.Spec) { s.ExpertGroups, s.ExpertGroupsUsed = 0, 0 })
	want, got := cpuAndGPU(t, path, prompt, lib)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
		t.Errorf("ungrouped glm4moe: greedy on the GPU %v, on the CPU %v; probabilities %g apart", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
	if got.gpu.HostFallbacks != 0 || got.graphs != "" || got.gpu.GraphLaunches == 0 {
		t.Errorf("ungrouped glm4moe: %+v, graph note %q: want the routing on the device and decode steps as graphs", got.gpu, got.graphs)
	}
}

// goldenVariant writes the golden model name with change made to its spec, and returns its
// path and the first 8 tokens of a prompt for it.
func goldenVariant(t *testing.T, name string, change func(*synth.Spec)) (string, []int32) {
	t.Helper()
	spec, err := synth.GoldenSpec(name)
	if err != nil {
		t.Fatal(err)
	}
	change(&spec)
	path, prompt := writeSpec(t, spec, name+"-variant")
	return path, prompt[:8]
}

// cpuAndGPU generates 6 tokens after prompt on the CPU and on cuda:0 with the driver lib.
func cpuAndGPU(t *testing.T, path string, prompt []int32, lib string) (cpu, gpu gpuRun) {
	t.Helper()
	o := cpuAndGPUOptions(lib)
	o.Device, o.CUDALibrary = "", ""
	return runOn(t, path, o, prompt, 6), runOn(t, path, cpuAndGPUOptions(lib), prompt, 6)
}

// cpuAndGPUOptions are cpuAndGPU's options on cuda:0 of the CUDA driver lib ("": the
// machine's).
func cpuAndGPUOptions(lib string) engine.Options {
	return engine.Options{Threads: 2, KVType: "f32", ContextLength: 64, Device: "cuda:0", CUDALibrary: lib}
}
