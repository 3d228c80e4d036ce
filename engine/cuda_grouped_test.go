package engine_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
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
	}

	// GLM-4.5-Air itself has one group: the device routes it, sigmoid, bias, scale and all.
	spec, err := synth.GoldenSpec("glm4moe-q8_0")
	if err != nil {
		t.Fatal(err)
	}
	spec.ExpertGroups, spec.ExpertGroupsUsed = 0, 0
	path := filepath.Join(t.TempDir(), "glm4moe-ungrouped.gguf")
	if _, err := synth.WriteFile(spec, path); err != nil {
		t.Fatal(err)
	}
	prompts, err := synth.Prompts(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	prompt := prompts[0][:8]
	base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
	want := runOn(t, path, base, prompt, 6)
	o := base
	o.Device, o.CUDALibrary = "cuda:0", lib
	got := runOn(t, path, o, prompt, 6)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
		t.Errorf("ungrouped glm4moe: greedy on the GPU %v, on the CPU %v; probabilities %g apart", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
	if got.gpu.HostFallbacks != 0 || got.graphs != "" || got.gpu.GraphLaunches == 0 {
		t.Errorf("ungrouped glm4moe: %+v, graph note %q: want the routing on the device and decode steps as graphs", got.gpu, got.graphs)
	}
}
