package engine

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/synth"
)

const bundledQwenPath = "../models/testdata/tinymoe-qwen2moe.gguf"

// decodeRun is what TestGPUDecodeSteps records of one way of running the bundled model.
type decodeRun struct {
	probs  [][]float32 // after each token, every token its own pass (a decode step)
	tokens []int32     // greedy tokens after the prompt
	step   cuda.GPUStats
	note   string
	// seq and prompt are what the run was given (set by checkDecodeSteps).
	seq, prompt []int32
}

// runDecode evaluates seq one token per pass, records the device's counters of one more such
// pass, and generates greedily after prompt.
func runDecode(t *testing.T, path string, o Options, seq, prompt []int32) decodeRun {
	t.Helper()
	m, err := Open(path, o)
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
		Reads: after.Reads - before.Reads, GraphLaunches: after.GraphLaunches - before.GraphLaunches, Pageable: after.Pageable - before.Pageable}
	res, err := s.Generate(ctx, prompt, GenerateOptions{MaxTokens: 10, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true}})
	if err != nil {
		t.Fatal(err)
	}
	r.tokens, r.note = res.Tokens, m.GraphNote()
	return r
}

// TestGPUDecodeSteps runs models with every expert on the (fake) GPU three ways: one kernel
// per operation as before the fused kernels, fused kernels launched eagerly, and decode steps
// replayed as CUDA graphs. Across 24 positions, each token's experts its own, all three give
// the same probabilities and greedy tokens to the bit: on the bundled model (F16 weights,
// float products) and on a Qwen2-MoE of Q4_K_M's mix (integer products of a quantized
// activation, the shared expert's down product of another type than the experts'), and on an
// OLMoE and a Qwen3-MoE, whose q/k norms run in the RoPE kernel where the device fuses. A decode
// step is one host launch and one read-back (the logits) on graphs, and on the bundled model
// at most 12 launches a layer eagerly.
//
// The Q4_K_M model's graphs run again with four warps a row of the integer products
// (GPURowWarps, which the GPU must hold: the kernels' combining waits, captured in a graph,
// beside a shared expert's launch of a float type that keeps a warp a row). Its rows are no
// longer than one warp reads in a step, so the other three warps add zeros and the bits must
// be a warp a row's; the kernel tests (cuda's TestKernels) check the sums of rows that every
// warp reads.
func TestGPUDecodeSteps(t *testing.T) {
	lib := GPUForTests(t)
	q4km := goldenModel(t, "qwen2moe-q4km")
	t.Run(filepath.Base(bundledQwenPath), func(t *testing.T) { checkDecodeSteps(t, bundledQwenPath, lib, true) })
	// The q/k norms in rope_kv_f32: OLMoE's over a token's every head, Qwen3's head by head.
	for _, name := range []string{"olmoe-q8_0", "qwen3moe-q5km"} {
		t.Run(name, func(t *testing.T) { checkDecodeSteps(t, goldenModel(t, name), lib, false) })
	}
	var one decodeRun
	t.Run(filepath.Base(q4km), func(t *testing.T) { one = checkDecodeSteps(t, q4km, lib, false) })
	t.Run(filepath.Base(q4km)+",warps=4", func(t *testing.T) {
		if one.probs == nil {
			t.Skip("no run with a warp a row to compare with")
		}
		o := Options{Threads: 2, ContextLength: 64, Device: "cuda:0", CUDALibrary: lib, GPURowWarps: 4}
		m, err := Open(q4km, o)
		if err != nil {
			t.Fatal(err)
		}
		g, ok := m.dev.(*cuda.GPU)
		if !ok || g.RowWarps() != 4 {
			t.Errorf("the device %T does not take the option's 4 warps a row", m.dev)
		}
		m.Close()
		r := runDecode(t, q4km, o, one.seq, one.prompt)
		if !slices.Equal(r.tokens, one.tokens) {
			t.Errorf("greedy %v, with a warp a row %v", r.tokens, one.tokens)
		}
		for i := range one.probs {
			for j, p := range one.probs[i] {
				if math.Float32bits(r.probs[i][j]) != math.Float32bits(p) {
					t.Fatalf("position %d, token %d: probability %v, with a warp a row %v", i, j, r.probs[i][j], p)
				}
			}
		}
		if s := r.step; s.Launches != 1 || s.Reads != 1 || s.Kernels != one.step.Kernels || r.note != "" {
			t.Errorf("a replayed step: %+v (%q), want 1 launch, 1 read and %d kernels, as with a warp a row", s, r.note, one.step.Kernels)
		}
	})
}

// checkDecodeSteps runs path the three ways and checks that they agree; it returns the graphs'
// run.
func checkDecodeSteps(t *testing.T, path, lib string, launches bool) decodeRun {
	base := Options{Threads: 2, ContextLength: 64, Device: "cuda:0", CUDALibrary: lib}
	m, err := Open(path, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := m.Tokenize("The old prince said that", true)
	layers, vocab := m.Info().Layers, m.Info().Vocab
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	seq := append(slices.Clone(prompt), prompt...)
	for len(seq) < 24 {
		seq = append(seq, int32(len(seq)*37%vocab))
	}
	unfused := base
	unfused.NoGraphs = true
	eager := unfused
	unfused = UnfusedForTests(unfused)
	want := runDecode(t, path, unfused, seq, prompt)
	gotEager := runDecode(t, path, eager, seq, prompt)
	gotGraph := runDecode(t, path, base, seq, prompt)
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
	if s := gotGraph.step; s.Launches != 1 || s.GraphLaunches != 1 || s.Reads != 1 || s.Pageable != 0 || s.Kernels != gotEager.step.Kernels ||
		gotGraph.note != "" {
		t.Errorf("a replayed step: %+v (%q), want 1 launch, 1 read into pinned memory and the eager step's %d kernels", s,
			gotGraph.note, gotEager.step.Kernels)
	}
	if s := gotEager.step; launches && s.Launches > int64(12*layers) || s.Launches != s.Kernels || s.Reads != 1 || s.Pageable != 0 ||
		s.GraphLaunches != 0 {
		t.Errorf("an eager fused step: %+v, want at most 12 launches a layer (%d layers) and 1 read into pinned memory", s, layers)
	}
	gotGraph.seq, gotGraph.prompt = seq, prompt
	return gotGraph
}

// TestStepLogitsReused checks that a replayed step's logits come back into pinned memory that
// the session keeps for its passes (no read staged by the driver), and that a closed session's
// memory goes to the next session rather than each session pinning its own for the device's
// life.
func TestStepLogitsReused(t *testing.T) {
	lib := GPUForTests(t)
	m, err := Open(bundledQwenPath, Options{Threads: 2, ContextLength: 64, Device: "cuda:0", CUDALibrary: lib})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.graphs == nil {
		t.Fatalf("no decode steps as graphs: %s", m.GraphNote())
	}
	ctx := context.Background()
	seq := []int32{1, 2, 3, 4}
	host := func() *float32 {
		t.Helper()
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		before, _ := m.GPUStats()
		if err := s.probs(ctx, seq, 1, func(int, []float32) error { return nil }); err != nil {
			t.Fatal(err)
		}
		after, _ := m.GPUStats()
		if n, r := after.Pageable-before.Pageable, after.GraphLaunches-before.GraphLaunches; n != 0 || r != int64(len(seq)) {
			t.Errorf("%d tokens' passes: %d graph launches and %d reads staged by the driver, want %d and 0", len(seq), r, n, len(seq))
		}
		m.graphs.mu.Lock()
		defer m.graphs.mu.Unlock()
		sg := m.graphs.steps[s.kv]
		if sg == nil || len(sg.host) != m.Info().Vocab {
			t.Fatalf("the session's step: %+v, want its logits' host memory", sg)
		}
		return &sg.host[0]
	}
	first := host()
	if second := host(); second != first {
		t.Error("the second session's step took new host memory where the closed first session's was free")
	}
	if n := len(m.logitsHost.free); n != 1 {
		t.Errorf("%d sessions' logits memory free after both sessions closed, want 1", n)
	}
}

// goldenModel writes synth's golden model called name (synth.GoldenSpec) into a temporary
// folder and returns its path.
func goldenModel(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".gguf")
	if _, err := synth.WriteGolden(name, path); err != nil {
		t.Fatal(err)
	}
	return path
}
