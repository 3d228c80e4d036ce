package engine

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/cuda"
)

const bundledQwenPath = "../models/testdata/tinymoe-qwen2moe.gguf"

// decodeRun is what TestGPUDecodeSteps records of one way of running the bundled model.
type decodeRun struct {
	probs  [][]float32 // after each token, every token its own pass (a decode step)
	tokens []int32     // greedy tokens after the prompt
	step   cuda.GPUStats
	note   string
}

// runDecode evaluates seq one token per pass, records the device's counters of one more such
// pass, and generates greedily after prompt.
func runDecode(t *testing.T, o Options, seq, prompt []int32) decodeRun {
	t.Helper()
	m, err := Open(bundledQwenPath, o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var r decodeRun
	ctx := context.Background()
	if err := s.probs(ctx, seq, 1, func(_ int, p []float32) error {
		r.probs = append(r.probs, slices.Clone(p))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	before, _ := m.GPUStats()
	if err := s.probs(ctx, seq[:1], 1, func(int, []float32) error { return nil }); err != nil {
		t.Fatal(err)
	}
	after, _ := m.GPUStats()
	r.step = cuda.GPUStats{Launches: after.Launches - before.Launches, Kernels: after.Kernels - before.Kernels,
		Reads: after.Reads - before.Reads, GraphLaunches: after.GraphLaunches - before.GraphLaunches}
	res, err := s.Generate(ctx, prompt, GenerateOptions{MaxTokens: 10, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true}})
	if err != nil {
		t.Fatal(err)
	}
	r.tokens, r.note = res.Tokens, m.GraphNote()
	return r
}

// TestGPUDecodeSteps runs the bundled model with every expert on the (fake) GPU three ways:
// one kernel per operation as before the fused kernels, fused kernels launched eagerly, and
// decode steps replayed as CUDA graphs. Across 24 positions, each token's experts its own,
// all three give the same probabilities and greedy tokens to the bit; a decode step is one
// host launch and one read-back (the logits) on graphs, and at most 12 launches a layer
// eagerly.
func TestGPUDecodeSteps(t *testing.T) {
	lib := GPUForTests(t)
	base := Options{Threads: 2, ContextLength: 64, Device: "cuda:0", CUDALibrary: lib}
	m, err := Open(bundledQwenPath, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := m.Tokenize("The old prince said that", true)
	layers := m.Info().Layers
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	seq := append(slices.Clone(prompt), prompt...)
	for len(seq) < 24 {
		seq = append(seq, int32(len(seq)*37%500))
	}
	unfused := base
	unfused.NoGraphs = true
	eager := unfused
	unfused = UnfusedForTests(unfused)
	want := runDecode(t, unfused, seq, prompt)
	gotEager := runDecode(t, eager, seq, prompt)
	gotGraph := runDecode(t, base, seq, prompt)
	for _, c := range []struct {
		name string
		r    decodeRun
	}{{"fused, eager", gotEager}, {"graphs", gotGraph}} {
		if !slices.Equal(c.r.tokens, want.tokens) {
			t.Errorf("%s: greedy %v, unfused %v", c.name, c.r.tokens, want.tokens)
		}
		for i := range want.probs {
			for j, p := range want.probs[i] {
				if math.Float32bits(c.r.probs[i][j]) != math.Float32bits(p) {
					t.Fatalf("%s: position %d, token %d: probability %v, unfused %v", c.name, i, j, c.r.probs[i][j], p)
				}
			}
		}
	}
	t.Logf("one decode step: unfused %+v", want.step)
	t.Logf("one decode step: fused, eager %+v", gotEager.step)
	t.Logf("one decode step: graphs %+v", gotGraph.step)
	if s := gotGraph.step; s.Launches != 1 || s.GraphLaunches != 1 || s.Reads != 1 || s.Kernels != gotEager.step.Kernels || gotGraph.note != "" {
		t.Errorf("a replayed step: %+v (%q), want 1 launch, 1 read and the eager step's %d kernels", s, gotGraph.note, gotEager.step.Kernels)
	}
	if s := gotEager.step; s.Launches > int64(12*layers) || s.Launches != s.Kernels || s.Reads != 1 || s.GraphLaunches != 0 {
		t.Errorf("an eager fused step: %+v, want at most 12 launches a layer (%d layers) and 1 read", s, layers)
	}
}
