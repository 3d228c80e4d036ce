package engine_test

import (
	"context"
	"slices"
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
// on the GPU's kernels, with the CPU's greedy tokens and its probabilities within 2e-3.
func TestCUDARunsGPTOSS(t *testing.T) {
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

// TestGPTOSSSlidingWindowRing: where the context is long enough, gpt-oss's sliding-window
// layers keep a ring of their window and a pass (models.RingPeriod: 384 slots for the
// golden's window of 8 and passes of 256) instead of every position, in less memory and with
// the numbers of a cache of every position, to the bit on the CPU and within the GPU tests'
// 2e-3 on the fake GPU: prompts whose passes wrap around the ring, decode steps that go
// round it again, and prefix reuse from the ring and from its snapshots, against fresh
// sessions.
func TestGPTOSSSlidingWindowRing(t *testing.T) {
	path, fx := goldenNamed(t, "gpt-oss-f32")
	tokens := func(n, salt int) []int32 { // n tokens of the golden prompt's, varied
		var p []int32
		for i := 0; len(p) < n; i++ {
			p = append(p, (fx.Prompt[i%len(fx.Prompt)]+int32(i/len(fx.Prompt)+salt))%440)
		}
		return p
	}
	prompt := tokens(300, 0)
	// A context of 768 positions is too short for a ring (models.RingPeriod): every position
	// is kept there. The CPU decodes around the ring (300 + 399 positions), the slower fake
	// GPU past its end.
	full := engine.Options{Threads: 2, KVType: "f32", ContextLength: 768}
	want := runOn(t, path, full, prompt, 400)
	fm, err := engine.Open(path, full)
	if err != nil {
		t.Fatal(err)
	}
	info := fm.Info()
	perPos := fm.KVCacheBytes() / 768 / int64(info.Layers) // a layer's keys and values of a position
	fm.Close()

	gpu := engine.Options{Threads: 2, KVType: "f32", ContextLength: 4096, Device: "cuda:0", CUDALibrary: engine.GPUForTests(t)}
	for _, o := range []engine.Options{{Threads: 2, KVType: "f32", ContextLength: 4096}, gpu} {
		name, n, tol := o.Device, 400, 0.0
		if name == "" {
			name = "cpu"
		} else {
			n, tol = 100, 2e-3
		}
		t.Run(name, func(t *testing.T) {
			m, s := openSession(t, path, o)
			defer m.Close()
			defer s.Close()
			var probs [][]float32
			ctx := context.Background()
			if err := s.Probs(ctx, prompt, func(_ int, p []float32) error { probs = append(probs, slices.Clone(p)); return nil }); err != nil {
				t.Fatal(err)
			}
			if d := maxDiff(probs, want.probs); d > tol {
				t.Errorf("probabilities with the ring differ by %g from those without", d)
			}
			greedy := engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}
			res, err := s.Generate(ctx, prompt, greedy)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Tokens, want.tokens[:n]) || res.CachedTokens != len(prompt)-1 {
				t.Errorf("greedy %v with the ring (%d tokens reused), %v without", res.Tokens, res.CachedTokens, want.tokens[:n])
			}
			// The ring no longer holds position 15's window (its slots hold 384..398); the
			// snapshot after the prompt's first pass does (restored on the device, on the GPU).
			edit := slices.Concat(prompt[:15], tokens(5, 3))
			greedy.MaxTokens = 4
			if res, err = s.Generate(ctx, edit, greedy); err != nil || res.CachedTokens != 15 {
				t.Errorf("edit: %d tokens reused, want 15 (%v)", res.CachedTokens, err)
			}
			f, err := m.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if fr, err := f.Generate(ctx, edit, greedy); err != nil || !slices.Equal(res.Tokens, fr.Tokens) {
				t.Errorf("edit: resumed session generates %v, a fresh one %v (%v)", res.Tokens, fr.Tokens, err)
			}
			// The windowed layers hold 2*384 slots each; on the GPU, the rings' snapshots
			// beside them.
			rings := int64(info.SlidingLayers) * 2 * 384 * perPos
			if o.Device != "" {
				rings *= 5
			}
			if b, w := m.KVCacheBytes(), int64(info.Layers-info.SlidingLayers)*4096*perPos+rings; b != w {
				t.Errorf("KV cache of %d bytes, want %d", b, w)
			}
			if o.Device == "" { // the fake GPU's prompts are slow: it has been through the same code
				ringReuse(t, m, prompt, tokens(400, 7), tokens(800, 13))
			}
		})
	}
}

// ringReuse checks prefix reuse on a session of gpt-oss with a ring against fresh sessions:
// a conversation that grows by more and more, and edits that take it back.
func ringReuse(t *testing.T, m *engine.Model, p1, more, most []int32) {
	ctx := context.Background()
	gen := func(s *engine.Session, prompt []int32) engine.Result {
		t.Helper()
		res, err := s.Generate(ctx, prompt, engine.GenerateOptions{MaxTokens: 4, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	first := gen(s, p1) // prompt passes of 256 and 44 tokens: snapshots after each
	p2 := slices.Concat(p1, first.Tokens, more)
	p3 := slices.Concat(p1, first.Tokens[:2], p1[:5])
	var p4 []int32
	for _, c := range []struct {
		name   string
		prompt func() []int32
		cached int
	}{
		// Everything so far: the ring holds the window before it.
		{"next turn", func() []int32 { return p2 }, len(p1) + len(first.Tokens) - 1},
		// p2 took the ring to position 707: it no longer holds the window before 302, and
		// the snapshot after p1's last pass goes on from 300.
		{"answer edited", func() []int32 { return p3 }, len(p1) + 2},
		// From the ring restored, after more than its period of new tokens.
		{"long turn", func() []int32 { p4 = slices.Concat(p3, most); return p4 }, len(p3)},
		// Neither the ring nor any snapshot (the last four passes') holds the window before
		// position 100: from the start.
		{"early edit", func() []int32 { return slices.Concat(p1[:100], p1[:5]) }, 0},
	} {
		prompt := c.prompt()
		if got := s.Shared(prompt); got != c.cached {
			t.Errorf("%s: Shared %d, want %d", c.name, got, c.cached)
		}
		res := gen(s, prompt)
		if res.CachedTokens != c.cached {
			t.Errorf("%s: %d tokens reused, want %d", c.name, res.CachedTokens, c.cached)
		}
		f, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if want := gen(f, prompt); !slices.Equal(res.Tokens, want.Tokens) {
			t.Errorf("%s: resumed session generates %v, a fresh one %v", c.name, res.Tokens, want.Tokens)
		}
		f.Close()
	}
}
