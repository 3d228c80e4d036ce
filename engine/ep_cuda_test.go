package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

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
		return generated(t, m, prompt, engine.GenerateOptions{MaxTokens: 8, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
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
		t.Logf("%s: perplexity %.6f (one GPU %.6f, CPU %.6f), %s, %d launches and %d bytes copied on rank 0", name, got.Perplexity, wantGPU.Perplexity, want.Perplexity, st.Transport, gs.Launches, gs.CopyBytes)
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

// Expert parallelism over processes: each rank its own Model, as separate processes would
// have (here goroutines of one test process, since the fake NCCL moves bytes within one
// process), meeting at a rendezvous. Rank 0 runs the passes, the others serve their experts
// until it closes; the numbers are those of the in-process group on the same GPUs.
func TestEPProcesses(t *testing.T) {
	cudaLib, ncclLib := fakeCUDA(t), fakeNCCL(t)
	const N = 3
	t.Setenv("FAKECUDA_DEVICES", fmt.Sprint(N))
	text := heldOutPrefix(t, 1500)
	po := engine.PerplexityOptions{Window: 64, MaxTokens: 192}
	ctx := context.Background()
	ep := engine.EPOptions{Devices: N, Policy: "eplb", NCCLLibrary: ncclLib}
	in, err := engine.Open(bundledQwen, engine.Options{Device: "cuda:0", CUDALibrary: cudaLib, Threads: 1, EP: &ep})
	if err != nil {
		t.Fatal(err)
	}
	want, err := in.PerplexityWith(ctx, text, po)
	in.Close()
	if err != nil {
		t.Fatal(err)
	}

	addr := freeAddr(t)
	served := make(chan error, N)
	var rank0 *engine.Model
	opened := make(chan error, N)
	for r := range N {
		go func() {
			o := ep
			o.Rendezvous, o.Rank = addr, r
			m, err := engine.Open(bundledQwen, engine.Options{Device: fmt.Sprintf("cuda:%d", r), CUDALibrary: cudaLib, Threads: 1, EP: &o})
			if r == 0 {
				rank0 = m
				opened <- err
				return
			}
			if err != nil {
				opened <- err
				served <- err
				return
			}
			opened <- nil
			served <- errors.Join(m.ServeEP(ctx), m.Close())
		}()
	}
	for range N {
		if err := <-opened; err != nil {
			t.Fatal(err)
		}
	}
	got, err := rank0.PerplexityWith(ctx, text, po)
	if err != nil {
		t.Fatal(err)
	}
	// The windows run one at a time on rank 0 here, N at a time in the group of one
	// process: EPLB re-plans from other batches, and an expert's product of more tokens may
	// take the batched kernel, which rounds differently; without drops the numbers agree to
	// float32 rounding.
	if math.Abs(got.Perplexity/want.Perplexity-1) > 1e-6 {
		t.Errorf("over processes: perplexity %v, in one process %v", got.Perplexity, want.Perplexity)
	}
	st, _ := rank0.EPStats()
	if !strings.Contains(st.Transport, "3 processes") || st.Steps == 0 {
		t.Errorf("stats %+v", st)
	}
	if err := rank0.ServeEP(ctx); !errors.Is(err, engine.ErrNotServing) {
		t.Errorf("ServeEP on rank 0: %v", err)
	}
	if err := rank0.Close(); err != nil {
		t.Errorf("closing rank 0: %v", err)
	}
	for range N - 1 {
		if err := <-served; err != nil {
			t.Errorf("a serving rank: %v", err)
		}
	}
}

// A process that joins the wrong group is refused at the rendezvous, and every process of
// the group fails at Open with the reason.
func TestEPProcessesMismatch(t *testing.T) {
	cudaLib, ncclLib := fakeCUDA(t), fakeNCCL(t)
	t.Setenv("FAKECUDA_DEVICES", "2")
	addr := freeAddr(t)
	errs := make(chan error, 2)
	for r, policy := range []string{"round-robin", "eplb"} {
		go func() {
			o := engine.EPOptions{Devices: 2, Policy: policy, NCCLLibrary: ncclLib, Rendezvous: addr, Rank: r, RendezvousTimeout: 20 * time.Second}
			m, err := engine.Open(bundledQwen, engine.Options{Device: fmt.Sprintf("cuda:%d", r), CUDALibrary: cudaLib, Threads: 1, EP: &o})
			if err == nil {
				m.Close()
			}
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), "planner") {
			t.Errorf("mismatched planners: %v", err)
		}
	}
	for _, c := range []struct {
		dev  string
		o    engine.EPOptions
		want string
	}{
		{"cuda:0", engine.EPOptions{Devices: 2, Rank: 1}, "needs the rendezvous address"},
		{"cuda:0", engine.EPOptions{Devices: 2, Rank: 2, Rendezvous: addr}, "want 0 to 1"},
		{"cpu", engine.EPOptions{Devices: 2, Rendezvous: addr}, "runs on CUDA GPUs"},
		{"cuda:0", engine.EPOptions{Devices: 2, Rendezvous: addr, Transport: "local"}, "exchange tokens with NCCL"},
		{"cuda:1", engine.EPOptions{Devices: 2, Rank: 1, Rendezvous: addr, NCCLLibrary: ncclLib, RendezvousTimeout: 300 * time.Millisecond}, "rank 0 never answered"},
	} {
		m, err := engine.Open(bundledQwen, engine.Options{Device: c.dev, CUDALibrary: cudaLib, Threads: 1, EP: &c.o})
		if err == nil {
			m.Close()
			t.Errorf("%s %+v: opened", c.dev, c.o)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want %q", c.dev, c.o, err, c.want)
		}
	}
}

// freeAddr is a loopback address with a port nobody listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
