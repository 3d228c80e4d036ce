package engine_test

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
)

// fakeCUDA builds the fake CUDA driver, or skips without a C compiler.
func fakeCUDA(t *testing.T) string {
	t.Helper()
	return engine.FakeGPUForTests(t)
}

type gpuRun struct {
	probs    [][]float32
	tokens   []int32
	gpu      engine.GPUStats
	off      engine.OffloadStats
	resident bool
	graphs   string           // the model's GraphNote
	kernels  map[string]int64 // calls by kernel, where o.ProfileKernels asked for them
}

// runOn opens path with o and returns the next-token probabilities along prompt, n greedy
// tokens after it, and the device's and offloader's figures; it checks that the device
// memory never went over its budget.
func runOn(t *testing.T, path string, o engine.Options, prompt []int32, n int) gpuRun {
	t.Helper()
	m, s := openSession(t, path, o)
	defer m.Close()
	defer s.Close()
	var r gpuRun
	r.probs, r.tokens = probsThenGreedy(t, s, prompt, n)
	r.gpu, _ = m.GPUStats()
	r.resident = m.Resident()
	r.graphs = m.GraphNote()
	r.off, _ = m.Offload()
	if p, ok := m.KernelProfile(); ok {
		r.kernels = map[string]int64{}
		for _, k := range p {
			r.kernels[k.Name] += k.Calls
		}
	}
	if r.off.PeakDeviceMem > r.off.DeviceMemLimit {
		t.Fatalf("peak device memory %d over the %d budget", r.off.PeakDeviceMem, r.off.DeviceMemLimit)
	}
	return r
}

// probsThenGreedy computes the next-token probabilities at every position of prompt in s,
// then n greedy tokens after it.
func probsThenGreedy(t *testing.T, s *engine.Session, prompt []int32, n int) ([][]float32, []int32) {
	t.Helper()
	var probs [][]float32
	ctx := context.Background()
	if err := s.Probs(ctx, prompt, func(_ int, p []float32) error {
		probs = append(probs, slices.Clone(p))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Generate(ctx, prompt, engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
	if err != nil {
		t.Fatal(err)
	}
	return probs, res.Tokens
}

// openSession opens path with o and a session on it, or fails the test; the caller closes
// both.
func openSession(t *testing.T, path string, o engine.Options) (*engine.Model, *engine.Session) {
	t.Helper()
	m, err := engine.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.NewSession()
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	return m, s
}

func maxDiff(a, b [][]float32) float64 {
	var d float64
	for i := range a {
		for j := range a[i] {
			d = max(d, math.Abs(float64(a[i][j]-b[i][j])))
		}
	}
	return d
}

// TestCUDAFakeDriver runs the bundled models on cuda:0 of the fake driver (the machine's with
// -gpu=system), which runs the project's kernels with every CUDA thread emulated: the engine's
// GPU path (weights uploaded, expert slots in device buffers filled on the copy stream, kernels
// waiting on its events) gives the CPU's greedy tokens and its next-token probabilities within
// 2e-3, and offloading with any policy leaves the GPU's numbers as they were.
func TestCUDAFakeDriver(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, path := range []string{bundledQwen, bundledMixtral} {
		m, err := engine.Open(path, engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		prompt, err := m.Tokenize("The old prince said that", true)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
		want := runOn(t, path, base, prompt, 12)
		o := base
		o.Device, o.CUDALibrary = "cuda:0", lib
		got := runOn(t, path, o, prompt, 12)
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%s: greedy on the GPU %v, on the CPU %v", path, got.tokens, want.tokens)
		}
		if d := maxDiff(got.probs, want.probs); d > 2e-3 {
			t.Errorf("%s: probabilities differ from the CPU's by up to %g", path, d)
		}
		if got.gpu.Launches == 0 || got.gpu.HostFallbacks != 0 || !got.resident {
			t.Errorf("%s: %+v, resident %v: want the whole pass on the GPU", path, got.gpu, got.resident)
		}
		if got.gpu.GraphLaunches == 0 || got.graphs != "" {
			t.Errorf("%s: %+v, %q: want the decode steps replayed as CUDA graphs", path, got.gpu, got.graphs)
		}

		for _, pol := range []offload.Policy{offload.OnDemand, offload.Prefetch, offload.Commit, offload.CPUMiss} {
			oo := o
			oo.Offload = &engine.OffloadOptions{Policy: pol, Predictor: map[offload.Policy]string{offload.Prefetch: "prev-token", offload.Commit: "oracle"}[pol]}
			// The resident bytes (activations included) and the slot size.
			probe := o
			probe.Offload = &engine.OffloadOptions{Policy: pol, GPUMem: 512 << 20, Predictor: oo.Offload.Predictor}
			pm, err := engine.Open(path, probe)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := pm.Offload()
			info := pm.Info()
			pm.Close()
			oo.Offload.GPUMem = st.Resident + 2*int64(info.ExpertsUsed)*st.SlotBytes
			if pol != offload.CPUMiss {
				// prefetch and commit weigh a prompt's and a first layer's misses as cpu-miss
				// does; priced this slow, the host takes none, and what is checked is that
				// the copies change nothing. cpu-miss checks the host's arithmetic.
				oo.HostRates = engine.HostRates{Bandwidth: 1}
			}
			r := runOn(t, path, oo, prompt, 12)
			if pol == offload.CPUMiss {
				// Misses are computed on the host, in the CPU's arithmetic.
				if d := maxDiff(r.probs, got.probs); d > 2e-3 || !slices.Equal(r.tokens, got.tokens) {
					t.Errorf("%s %s: probabilities %g from the GPU's, greedy %v vs %v", path, pol, d, r.tokens, got.tokens)
				}
				continue
			}
			if !slices.Equal(r.tokens, got.tokens) || maxDiff(r.probs, got.probs) != 0 {
				t.Errorf("%s %s: offloading changed the GPU's numbers (greedy %v vs %v)", path, pol, r.tokens, got.tokens)
			}
			if r.off.BytesCopied == 0 || r.gpu.CopyBytes != r.off.BytesCopied || r.gpu.HostFallbacks != 0 {
				t.Errorf("%s %s: offload %+v, GPU %+v: want the copies measured on the copy stream", path, pol, r.off, r.gpu)
			}
		}
	}
}

func TestCUDADeviceErrors(t *testing.T) {
	lib := fakeCUDA(t)
	cases := []struct {
		o    engine.Options
		want string
	}{
		{engine.Options{Device: "cuda:0", CUDALibrary: "/nonexistent/libcuda.so.1"}, "device cuda:0: no CUDA driver found"},
		{engine.Options{Device: "cuda:1", CUDALibrary: lib}, "device cuda:1: no CUDA device 1: the driver"},
		{engine.Options{Device: "cuda:x"}, `device "cuda:x": want cuda:N`},
		{engine.Options{Device: "cuda:-1"}, `device "cuda:-1": want cuda:N`},
		{engine.Options{Device: "cuda:0", CUDALibrary: lib, Offload: &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: 2 << 30}}, "a device memory budget of 2.00 GiB"},
		{engine.Options{Device: "cuda:0", CUDALibrary: lib, EP: &engine.EPOptions{Devices: 2}}, "one GPU per rank, cuda:0 to cuda:1: device cuda:1: no CUDA device 1"},
		{engine.Options{Device: "gpu"}, "want cpu, cuda:N, auto or sim:<profile>"},
	}
	for _, c := range cases {
		if m, err := engine.Open(bundledQwen, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open on %s = %v, want %q", c.o.Device, err, c.want)
			if m != nil {
				m.Close()
			}
		}
	}

	// auto takes the GPU when there is one, and says why when it runs on the CPU.
	m, err := engine.Open(bundledQwen, engine.Options{Device: "auto", CUDALibrary: lib, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if m.Device() != "cuda:0" || m.DeviceNote() != "" {
		t.Errorf("auto with a GPU: %s, %q", m.Device(), m.DeviceNote())
	}
	m.Close()
	m, err = engine.Open(bundledQwen, engine.Options{Device: "auto", CUDALibrary: "/nonexistent/libcuda.so.1", Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if note := m.DeviceNote(); m.Device() != "cpu" || !strings.Contains(note, "device auto: running on the CPU (no CUDA driver found)") {
		t.Errorf("auto without a driver: %s, %q", m.Device(), note)
	}
}

// TestCUDAHeadInChunks scores a window longer than the output logits the GPU holds at once
// (headRows): the rows computed and read back in chunks give the CPU's perplexity.
func TestCUDAHeadInChunks(t *testing.T) {
	lib := engine.GPUForTests(t)
	text := heldOutPrefix(t, 1500)
	po := engine.PerplexityOptions{Window: 150, MaxTokens: 150}
	nll := func(o engine.Options) engine.PerplexityResult {
		t.Helper()
		o.Threads, o.KVType, o.ContextLength = 2, "f32", 256
		m, err := engine.Open(bundledQwen, o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		r, err := m.PerplexityWith(context.Background(), text, po)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want, got := nll(engine.Options{}), nll(engine.Options{Device: "cuda:0", CUDALibrary: lib})
	if got.Tokens != 149 || got.Tokens != want.Tokens || math.Abs(got.NLL/want.NLL-1) > 1e-4 {
		t.Errorf("GPU: %d tokens, NLL %v; CPU: %d tokens, NLL %v", got.Tokens, got.NLL, want.Tokens, want.NLL)
	}
}

// TestAutoPlacementFakeGPU: on a real driver's card too small for the model (the fake
// driver's, with 12 MiB free beside the driver's 256 MiB reserve), Open describes the card from the driver and a measured copy, places
// the experts itself, and the greedy tokens stay the GPU's.
func TestAutoPlacementFakeGPU(t *testing.T) {
	lib := fakeCUDA(t) // the fake's memory is what FAKECUDA_MEM says, even with -gpu=system
	prompt := []int32{1, 5, 9, 14, 3, 27, 8, 2, 11, 6}
	o := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64, Device: "cuda:0", CUDALibrary: lib}
	want := runOn(t, bundledQwen, o, prompt, 8)
	t.Setenv("FAKECUDA_MEM", "281018368") // 256 + 12 MiB
	m, err := engine.Open(bundledQwen, o)
	if err != nil {
		t.Fatal(err)
	}
	plan, ok := m.AutoPlan()
	m.Close()
	if !ok {
		t.Fatalf("no automatic placement on a 12 MiB card: %q", m.DeviceNote())
	}
	t.Log(plan.Summary())
	got := runOn(t, bundledQwen, o, prompt, 8)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
		t.Errorf("auto placement (%s): greedy %v, resident %v; probabilities %g apart", plan.Chosen, got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
	// bench --policy auto on the card: bench's TestRunAutoFakeGPU.
}
