package engine

import (
	"context"
	"math"
	"os"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/offload"
)

// ratePlanner is a Planner on a clock that stands still: a copy costs copy seconds a byte,
// the host host seconds a byte of weights and flop seconds a flop of the further tokens, so
// that hostPlan's queue accounting decides alone.
type ratePlanner struct{ copy, host, flop float64 }

func (p ratePlanner) CopyDone(n int64) float64 { return float64(n) * p.copy }
func (p ratePlanner) HostDone(w device.HostWork) float64 {
	return float64(w.Bytes)*p.host + w.FLOPs*p.flop
}

var _ device.Planner = ratePlanner{}

// openCPUMiss opens the bundled Qwen1.5-MoE model with cpu-miss on dev.
func openCPUMiss(t *testing.T, o Options) *Model {
	t.Helper()
	o.Threads, o.KVType, o.ContextLength = 2, "f32", 64
	if o.Offload == nil {
		o.Offload = &OffloadOptions{Policy: offload.CPUMiss, GPUMem: 1 << 40}
	}
	m, err := Open("../models/testdata/tinymoe-qwen2moe.gguf", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestCUDACPUMiss runs cpu-miss on cuda:0 (the fake driver, or -gpu=system): the host computes
// the misses it is given while the device computes the rest, from the layer's input read back
// with the router's logits, and the numbers are the CPU's. With the GPU's own Planner and with planners that send every
// miss, none, and every other one to the host.
func TestCUDACPUMiss(t *testing.T) {
	lib := GPUForTests(t)
	raw, err := os.ReadFile("../models/testdata/war-and-peace-heldout.txt")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw[:1500])
	po := PerplexityOptions{Window: 24, MaxTokens: 48, Decode: true}
	want, err := openCPUMiss(t, Options{Offload: &OffloadOptions{Policy: offload.OnDemand, GPUMem: 1 << 40}}).PerplexityWith(context.Background(), text, po)
	if err != nil {
		t.Fatal(err)
	}
	probe := openCPUMiss(t, Options{Device: "cuda:0", CUDALibrary: lib, Offload: &OffloadOptions{Policy: offload.CPUMiss, GPUMem: 512 << 20}})
	st, _ := probe.Offload()
	budget := st.Resident + 2*int64(probe.info.ExpertsUsed)*st.SlotBytes
	probe.Close()

	var noHost, noHostPageable int64 // the read-backs with every expert on the device, and those staged by the driver
	for _, c := range []struct {
		name    string
		planner device.Planner // nil: the GPU's
		check   func(OffloadStats) bool
	}{
		{"no miss on the host", ratePlanner{0, 1, 0}, func(s OffloadStats) bool { return s.OnCPU == 0 && s.BytesCopied > 0 }},
		{"the GPU's planner", nil, func(s OffloadStats) bool { return s.Misses > 0 }},
		{"every miss on the host", ratePlanner{1, 0, 0}, func(s OffloadStats) bool {
			return s.OnCPU > 0 && s.OnCPU == s.Misses && s.BytesCopied == int64(s.Slots)*s.SlotBytes
		}}, // the slots filled at open
		{"every other miss", ratePlanner{1, 1, 0}, func(s OffloadStats) bool { return s.OnCPU > 0 && s.OnCPU < s.Misses && s.BytesCopied > 0 }},
	} {
		m := openCPUMiss(t, Options{Device: "cuda:0", CUDALibrary: lib, Offload: &OffloadOptions{Policy: offload.CPUMiss, GPUMem: budget}})
		if _, ok := m.off.Planner().(interface{ Stats() GPUStats }); !ok {
			t.Fatalf("%s: the offloader's planner is %T, want the GPU", c.name, m.off.Planner())
		}
		if c.planner != nil {
			m.off.UsePlanner(c.planner)
		}
		got, err := m.PerplexityWith(context.Background(), text, po)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := m.Offload()
		g, _ := m.GPUStats()
		t.Logf("%s: perplexity %.6f (CPU %.6f), %d hits, %d misses, %d on the host, %d bytes copied, %d read-backs",
			c.name, got.Perplexity, want.Perplexity, s.Hits, s.Misses, s.OnCPU, s.BytesCopied, g.Reads)
		if math.Abs(got.Perplexity-want.Perplexity) > 1e-3*want.Perplexity || !c.check(s) {
			t.Errorf("%s: perplexity %v, the CPU's %v; %+v", c.name, got.Perplexity, want.Perplexity, s)
		}
		if noHost == 0 {
			noHost, noHostPageable = g.Reads, g.Pageable
		}
		// The host's experts take their input and give their outputs through pinned memory.
		if g.Pageable != noHostPageable || s.OnCPU > 0 && (g.Writes == 0 || g.Writes > s.OnCPU) {
			t.Errorf("%s: %d copies from pageable memory (%d without host experts), %d writes for %d host experts",
				c.name, g.Pageable, noHostPageable, g.Writes, s.OnCPU)
		}
		// The host reads a decoded token's input to a layer ahead, with the router's logits,
		// however many experts it computes: no read-back of its own.
		if g.Reads != noHost {
			t.Errorf("%s: %d read-backs, %d without host experts", c.name, g.Reads, noHost)
		}
		if g.HostFallbacks != 0 {
			t.Errorf("%s: %d products fell back to the host", c.name, g.HostFallbacks)
		}
		m.Close()
	}
}
