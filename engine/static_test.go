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

// TestStatic runs llama.cpp's split, plain and with its cache, on both bundled models, with
// none, half and all of their MoE layers' experts on the host, on the CPU and a simulated
// GPU: the numbers are those of the run without offloading, bit for bit; the host computes
// the host layers' top-k of every token (static-cache: those its cache misses); once the
// model is open static copies nothing while it decodes (nor in prompts when the device
// layers leave no slot), and static-cache on the CPU, which cannot weigh a copy, copies each
// expert the host computed into its cache.
func TestStatic(t *testing.T) {
	for _, path := range []string{"../models/testdata/tinymoe-qwen2moe.gguf", "../models/testdata/tinymoe-mixtral.gguf"} {
		info, L := inspectMoE(t, path)
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64, HostRates: engine.HostRates{Bandwidth: 20e9, FLOPS: 200e9}}
		want := runOn(t, path, base, staticPrompt, 6)
		for _, c := range []struct {
			pol   offload.Policy
			dev   string
			cache int // slots beside the device layers' experts
		}{{offload.Static, "cpu", 0}, {offload.Static, "sim:rtx2080ti", 0}, {offload.StaticCache, "cpu", info.ExpertsUsed}, {offload.StaticCache, "sim:rtx2080ti", 2 * info.ExpertsUsed}} {
			for _, N := range []int{0, L / 2, L} {
				dev := c.pol.String() + " on " + c.dev
				o := base
				o.Device = c.dev
				o.Offload = &engine.OffloadOptions{Policy: c.pol, HostLayers: N}
				st := offloadProbe(t, path, o)
				o.Offload.GPUMem = st.Resident + int64(max(1, (L-N)*info.Experts)+c.cache)*st.SlotBytes
				m, err := engine.Open(path, o)
				if err != nil {
					t.Fatalf("%s, %d host layers: %v", dev, N, err)
				}
				opened, _ := m.Offload()
				if got := opened.BytesCopied; got != int64((L-N)*info.Experts)*st.SlotBytes {
					t.Errorf("%s, %d host layers: %d bytes copied at open, want every device layer's experts", dev, N, got)
				}
				s, err := m.NewSession()
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				var probs [][]float32
				if err := s.Probs(ctx, staticPrompt, func(_ int, p []float32) error {
					probs = append(probs, slices.Clone(p))
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				before, _ := m.Offload()
				var decoding engine.OffloadStats // after the prompt's pass
				res, err := s.Generate(ctx, staticPrompt, engine.GenerateOptions{MaxTokens: 6, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true},
					OnToken: func(tok engine.Token) error {
						if decoding.Slots == 0 {
							decoding, _ = m.Offload()
						}
						return nil
					}})
				if err != nil {
					t.Fatal(err)
				}
				after, _ := m.Offload()
				s.Close()
				m.Close()
				if !slices.Equal(res.Tokens, want.tokens) {
					t.Fatalf("%s, %d host layers: greedy %v, without offloading %v", dev, N, res.Tokens, want.tokens)
				}
				for pos := range want.probs {
					for i, p := range want.probs[pos] {
						if math.Float32bits(probs[pos][i]) != math.Float32bits(p) {
							t.Fatalf("%s, %d host layers: position %d token %d: %v, without offloading %v", dev, N, pos, i, probs[pos][i], p)
						}
					}
				}
				copied := after.BytesCopied - opened.BytesCopied
				hostExperts := after.OnCPU - before.OnCPU
				// The prompt's pass, then 5 single-token passes (the sixth token is sampled).
				passes := int64(len(staticPrompt) + 5)
				switch {
				case c.pol == offload.Static && (after.BytesCopied != decoding.BytesCopied || N < L && copied != 0):
					// A prompt may copy a host layer's experts into a slot the device layers
					// leave (N = L leaves one), as llama.cpp copies them for a large batch.
					t.Errorf("%s, %d host layers: %d bytes copied after open, %d while decoding", dev, N, copied, after.BytesCopied-decoding.BytesCopied)
				case c.pol == offload.StaticCache && c.dev == "cpu" && after.BytesCopied-before.BytesCopied != hostExperts*st.SlotBytes:
					t.Errorf("%s, %d host layers: %d bytes copied while generating, for %d host experts", dev, N, after.BytesCopied-before.BytesCopied, hostExperts)
				}
				if N == 0 && hostExperts != 0 || c.pol == offload.Static && N > 0 && hostExperts < 5*int64(N*info.ExpertsUsed) {
					t.Errorf("%s, %d host layers: the host computed %d experts over %d tokens", dev, N, hostExperts, passes)
				}
				if c.pol == offload.StaticCache && N > 0 && hostExperts == 0 {
					t.Errorf("%s, %d host layers: the host computed nothing", dev, N)
				}
			}
		}
	}
}

// TestStaticCardMemory opens llama.cpp's split with no budget, as its --n-cpu-moe runs: on a
// card the budget is the card's memory (every device layer's experts in a slot, the numbers
// those of the run without offloading), the caller's options are left as they were, and on
// the CPU, which has no card's memory to fill, Open says to give a budget.
func TestStaticCardMemory(t *testing.T) {
	path := "../models/testdata/tinymoe-qwen2moe.gguf"
	info, L := inspectMoE(t, path)
	base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
	want := runOn(t, path, base, staticPrompt, 4)

	o := base
	o.Device = "sim:rtx2080ti"
	o.Offload = &engine.OffloadOptions{Policy: offload.Static, HostLayers: L / 2}
	got := runOn(t, path, o, staticPrompt, 4)
	if o.Offload.GPUMem != 0 {
		t.Errorf("Open changed the caller's budget to %d", o.Offload.GPUMem)
	}
	if !slices.Equal(got.tokens, want.tokens) {
		t.Errorf("greedy %v, without offloading %v", got.tokens, want.tokens)
	}
	if n := (L - L/2) * info.Experts; got.off.Slots < n || got.off.OnCPU == 0 {
		t.Errorf("%d slots and %d experts on the host: want the %d device layers' experts in slots (%d) and the host computing its layers'",
			got.off.Slots, got.off.OnCPU, L-L/2, n)
	}

	o.Device = "cpu"
	if _, err := engine.Open(path, o); err == nil || !strings.Contains(err.Error(), "give a device memory budget") {
		t.Errorf("static with no budget on the CPU: %v, want an error asking for a budget", err)
	}
	o.Offload = &engine.OffloadOptions{Policy: offload.Static, GPUMem: -1}
	if _, err := engine.Open(path, o); err == nil || !strings.Contains(err.Error(), "want a positive size") {
		t.Errorf("a budget of -1 byte: %v, want an error", err)
	}
}

// TestCUDAStatic runs llama.cpp's split on cuda:0 (the fake driver, or -gpu=system) with none,
// half and all of the bundled model's MoE layers on the host. The device routes its own
// layers from the experts' slots, as it routes a resident model's: with no host layer a
// decoded token is the resident model's launches, kernels and one read-back, and its numbers
// the resident model's to the bit. A host layer adds one read-back, its router's logits,
// which its input, read back ahead, rides with (as llama.cpp's split waits once a host
// layer), and one write of its experts' outputs; the input, the router's logits, the outputs
// and the token's logits all travel through pinned memory: nothing is staged by the driver.
// The device layers' experts count as hits.
func TestCUDAStatic(t *testing.T) {
	lib := engine.GPUForTests(t)
	path := "../models/testdata/tinymoe-qwen2moe.gguf"
	info, L := inspectMoE(t, path)
	base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64, Device: "cuda:0", CUDALibrary: lib, NoGraphs: true}
	want, wantTok, _ := decodeCounters(t, path, base, staticPrompt)
	for _, N := range []int{0, L / 2, L} {
		o := base
		o.Offload = &engine.OffloadOptions{Policy: offload.Static, HostLayers: N}
		got, tok, hits := decodeCounters(t, path, o, staticPrompt)
		t.Logf("%d host layers: per token %+v; resident %+v", N, tok, wantTok)
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%d host layers: greedy %v, resident %v", N, got.tokens, want.tokens)
		}
		d, bound := maxDiff(got.probs, want.probs), 2e-3
		if N == 0 {
			bound = 0
		}
		if d > bound {
			t.Errorf("%d host layers: probabilities differ from the resident model's by up to %g, want at most %g", N, d, bound)
		}
		if tok.Reads != wantTok.Reads+float64(N) || tok.Writes != float64(N) || tok.Pageable != 0 {
			t.Errorf("%d host layers: per token %v read-backs, %v writes, %v from pageable memory; want %d, %d and 0",
				N, tok.Reads, tok.Writes, tok.Pageable, int(wantTok.Reads)+N, N)
		}
		if N == 0 && tok.Launches != wantTok.Launches {
			t.Errorf("no host layer: %v launches a token, the resident model %v", tok.Launches, wantTok.Launches)
		}
		if want := float64((L - N) * info.ExpertsUsed); hits != want {
			t.Errorf("%d host layers: %v hits a decoded token, want the device layers' %v", N, hits, want)
		}
	}
	// With no host layer the offloader decides nothing during a decoded token, which then
	// replays a CUDA graph as the resident model's does, its experts still counted as hits.
	base.NoGraphs = false
	want, wantTok, _ = decodeCounters(t, path, base, staticPrompt)
	o := base
	o.Offload = &engine.OffloadOptions{Policy: offload.Static}
	got, tok, hits := decodeCounters(t, path, o, staticPrompt)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) != 0 {
		t.Errorf("no host layer, graphs: greedy %v, resident %v; probabilities differ by %g", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
	if tok.Launches != 1 || tok != wantTok || got.graphs != "" {
		t.Errorf("no host layer, graphs: per token %+v, the resident model %+v (%q)", tok, wantTok, got.graphs)
	}
	if want := float64(L * info.ExpertsUsed); hits != want {
		t.Errorf("no host layer, graphs: %v hits a decoded token, want %v", hits, want)
	}
}

// staticPrompt is the static tests' prompt, on both bundled models.
var staticPrompt = []int32{1, 5, 9, 14, 3, 27, 8, 2, 11, 6}

// inspectMoE returns path's model information and its MoE layers.
func inspectMoE(t *testing.T, path string) (*engine.Info, int) {
	t.Helper()
	info, err := engine.Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	return info, len(info.MoELayers)
}

// decodeCounters runs prompt on path and 6 greedy tokens after it (runOn), and returns the
// device's counters and the offloader's hits per decoded token, over the 5 passes after the
// first token.
func decodeCounters(t *testing.T, path string, o engine.Options, prompt []int32) (gpuRun, engine.GPUTokenStats, float64) {
	t.Helper()
	m, s := openSession(t, path, o)
	defer m.Close()
	defer s.Close()
	var r gpuRun
	if err := s.Probs(context.Background(), prompt, func(_ int, p []float32) error {
		r.probs = append(r.probs, slices.Clone(p))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var first, last engine.GPUStats
	var hits0, hits1 int64
	n := 0
	res, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: 6, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true},
		OnToken: func(engine.Token) error {
			g, _ := m.GPUStats()
			off, _ := m.Offload()
			if n == 0 {
				first, hits0 = g, off.Hits
			}
			last, hits1 = g, off.Hits
			n++
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	r.tokens = res.Tokens
	r.off, _ = m.Offload()
	r.graphs = m.GraphNote()
	k := float64(n - 1)
	return r, engine.GPUTokenStats{Launches: float64(last.Launches-first.Launches) / k, Kernels: float64(last.Kernels-first.Kernels) / k,
			Reads: float64(last.Reads-first.Reads) / k, Writes: float64(last.Writes-first.Writes) / k, Pageable: float64(last.Pageable-first.Pageable) / k},
		float64(hits1-hits0) / k
}
