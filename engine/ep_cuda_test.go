package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/internal/fakenccl"
)

// fakeNCCL builds the fake NCCL library, or skips without a C compiler.
func fakeNCCL(t *testing.T) string {
	t.Helper()
	lib, err := fakenccl.Build()
	if errors.Is(err, fakenccl.ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// Expert parallelism over CUDA GPUs, one per rank, with NCCL moving the tokens: the fake
// driver's emulated GPUs and the fake NCCL. A plan that drops nothing computes what one device
// computes: the same greedy tokens as the CPU, the perplexity within 1e-5 relative of one GPU
// (the ranks compute norms and attention on the host, where one GPU uses kernels) and 1e-3 of
// the CPU (the GPU's products keep activations in float32 where the CPU's quantize them, as
// llama.cpp's do); every product runs on the GPUs.
func TestEPCUDANCCL(t *testing.T) {
	cudaLib, ncclLib := fakeCUDA(t), fakeNCCL(t)
	t.Setenv("FAKECUDA_DEVICES", "4")
	text := heldOutPrefix(t, 3000)
	po := engine.PerplexityOptions{Window: 128, MaxTokens: 384}
	ctx := context.Background()
	one := openEP(t, bundledQwen, "cpu", nil)
	want, err := one.PerplexityWith(ctx, text, po)
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := one.Tokenize("The old prince", true)
	if err != nil {
		t.Fatal(err)
	}
	gen := func(m *engine.Model) []int32 {
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		res, err := s.Generate(ctx, prompt, engine.GenerateOptions{MaxTokens: 8, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens
	}
	wantGen := gen(one)
	gpu, err := engine.Open(bundledQwen, engine.Options{Device: "cuda:0", CUDALibrary: cudaLib, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantGPU, err := gpu.PerplexityWith(ctx, text, po)
	gpu.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n      int
		policy string
	}{{4, "round-robin"}, {3, "harmoeny"}, {4, "eplb"}} {
		name := fmt.Sprintf("%d x cuda %s", c.n, c.policy)
		m, err := engine.Open(bundledQwen, engine.Options{Device: "cuda:0", CUDALibrary: cudaLib, Threads: 2,
			EP: &engine.EPOptions{Devices: c.n, Policy: c.policy, HarMoEnyThreshold: 2, Transport: "nccl", NCCLLibrary: ncclLib}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := m.PerplexityWith(ctx, text, po)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if math.Abs(got.Perplexity/wantGPU.Perplexity-1) > 1e-5 || math.Abs(got.Perplexity/want.Perplexity-1) > 1e-3 {
			t.Errorf("%s: perplexity %v, one GPU %v, one CPU %v", name, got.Perplexity, wantGPU.Perplexity, want.Perplexity)
		}
		if g := gen(m); fmt.Sprint(g) != fmt.Sprint(wantGen) {
			t.Errorf("%s: generated %v, one CPU %v", name, g, wantGen)
		}
		st, _ := m.EPStats()
		gs, _ := m.GPUStats()
		if !strings.HasPrefix(st.Transport, "NCCL 2.") || st.Steps == 0 {
			t.Errorf("%s: stats %+v", name, st)
		}
		if gs.Launches == 0 || gs.HostFallbacks != 0 {
			t.Errorf("%s: rank 0 launched %d kernels and left %d products to the host", name, gs.Launches, gs.HostFallbacks)
		}
		var fetches, bytes int64
		for _, l := range st.Layers {
			fetches, bytes = fetches+l.Fetches, bytes+l.Bytes
		}
		if bytes == 0 || c.policy == "harmoeny" && fetches == 0 || c.policy == "eplb" && st.Replans == 0 {
			t.Errorf("%s: %d bytes moved, %d fetches, %d replans", name, bytes, fetches, st.Replans)
		}
		t.Logf("%s: perplexity %.6f (one GPU %.6f, CPU %.6f), %s, %d launches on rank 0", name, got.Perplexity, wantGPU.Perplexity, want.Perplexity, st.Transport, gs.Launches)
		if err := m.Close(); err != nil {
			t.Errorf("%s: close: %v", name, err)
		}
	}
}

// What can go wrong in choosing the ranks' GPUs and the transport is said at Open; without
// NCCL the default transport falls back to host memory and says why.
func TestEPCUDATransports(t *testing.T) {
	cudaLib, ncclLib := fakeCUDA(t), fakeNCCL(t)
	t.Setenv("FAKECUDA_DEVICES", "2")
	open := func(dev string, ep engine.EPOptions) (*engine.Model, error) {
		return engine.Open(bundledQwen, engine.Options{Device: dev, CUDALibrary: cudaLib, Threads: 2, EP: &ep})
	}
	m, err := open("cuda:0", engine.EPOptions{Devices: 2, NCCLLibrary: "/nonexistent/libnccl.so.2"})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.EPStats()
	if !strings.Contains(st.Transport, "in-process") || !strings.Contains(st.Transport, "no NCCL library found") {
		t.Errorf("auto without NCCL: transport %q", st.Transport)
	}
	if _, err := m.PerplexityWith(context.Background(), heldOutPrefix(t, 600), engine.PerplexityOptions{Window: 64, MaxTokens: 64}); err != nil {
		t.Errorf("in-process transport between GPUs: %v", err)
	}
	m.Close()
	m, err = open("cuda:0", engine.EPOptions{Devices: 2, NCCLLibrary: ncclLib})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := m.EPStats(); !strings.HasPrefix(st.Transport, "NCCL") {
		t.Errorf("auto with NCCL: transport %q", st.Transport)
	}
	m.Close()
	for _, c := range []struct {
		dev  string
		ep   engine.EPOptions
		want string
	}{
		{"cuda:0", engine.EPOptions{Devices: 3, NCCLLibrary: ncclLib}, "one GPU per rank, cuda:0 to cuda:2"},
		{"cuda:1", engine.EPOptions{Devices: 2, NCCLLibrary: ncclLib}, "one GPU per rank, cuda:1 to cuda:2"},
		{"cuda:0", engine.EPOptions{Devices: 2, Transport: "nccl", NCCLLibrary: "/nonexistent/libnccl.so.2"}, "no NCCL library found"},
		{"cpu", engine.EPOptions{Devices: 2, Transport: "nccl"}, "moves tokens between CUDA GPUs"},
		{"cuda:0", engine.EPOptions{Devices: 2, Transport: "carrier-pigeon"}, `transport "carrier-pigeon": want nccl, local or auto`},
	} {
		m, err := open(c.dev, c.ep)
		if err == nil {
			m.Close()
			t.Errorf("%s %+v: opened", c.dev, c.ep)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want %q", c.dev, c.ep, err, c.want)
		}
	}
}
