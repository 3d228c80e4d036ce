package engine

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/commit-run/commit-run/offload"
)

// TestCUDACommitOnDevice: on a GPU, committed routing is weighed on the device, so a decode
// pass reads back only its output logits (and the routing of the layers the router decides),
// not every committed layer's router logits and router input. It computes what the GPU
// computes when the host reads the routing, to the bit, counts the same router choices,
// predictions and OWA decisions, and agrees with the CPU's committed routing. With the Commit
// Router, with and without offloading, and with the prev-token heuristic, which reads this
// token's first-layer choice at its last layer.
func TestCUDACommitOnDevice(t *testing.T) {
	lib := GPUForTests(t)
	raw, err := os.ReadFile("../models/testdata/war-and-peace-heldout.txt")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw[:2000])
	po := PerplexityOptions{Window: 32, MaxTokens: 64, Decode: true}
	const passes = 64 // MaxTokens in windows of Window: one pass per token
	type result struct {
		rep      PerplexityResult
		commit   CommitStats
		off      OffloadStats
		gpu      GPUStats
		onDevice bool
		moe      int64         // MoE layers
		wall     time.Duration // the passes, without opening the model
	}
	// run opens path with o, on the host-read path when hostRead is set, and evaluates text
	// one token per pass.
	run := func(path string, o Options, hostRead bool) result {
		t.Helper()
		m, err := Open(path, o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if hostRead {
			m.commitDev = nil
		}
		r := result{onDevice: m.commitDev != nil, moe: int64(len(m.info.MoELayers))}
		start := time.Now()
		if r.rep, err = m.PerplexityWith(context.Background(), text, po); err != nil {
			t.Fatal(err)
		}
		r.wall = time.Since(start)
		r.commit, _ = m.CommitStats()
		r.off, _ = m.Offload()
		r.gpu, _ = m.GPUStats()
		return r
	}
	// budget is a device budget that holds two layers' top-k of expert slots and no more.
	budget := func(path string, o Options) int64 {
		t.Helper()
		oo := *o.Offload
		oo.GPUMem = 512 << 20
		o.Offload = &oo
		m, err := Open(path, o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		st, _ := m.Offload()
		return st.Resident + 2*int64(m.info.ExpertsUsed)*st.SlotBytes + st.SlotBytes/2
	}
	const qwen, mixtral = "../models/testdata/tinymoe-qwen2moe.gguf", "../models/testdata/tinymoe-mixtral.gguf"
	for _, c := range []struct {
		name string
		path string
		o    Options
		// reads is the read-backs a pass makes: its output logits, and the router logits and
		// router input of the first MoE layer, which the router decides unless the Commit
		// Router predicts across tokens.
		reads int64
	}{
		{"qwen2moe, Commit Router", qwen, Options{Commit: &CommitOptions{}}, 3},
		{"mixtral, Commit Router across tokens", mixtral, Options{Commit: &CommitOptions{CrossToken: true}}, 1},
		{"qwen2moe, offloaded, Commit Router", qwen, Options{Offload: &OffloadOptions{Policy: offload.Commit}}, 3},
		{"mixtral, offloaded, prev-token", mixtral, Options{Offload: &OffloadOptions{Policy: offload.Commit, Predictor: "prev-token"}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.o
			o.Threads, o.KVType, o.ContextLength = 2, "f32", 64
			g := o
			g.Device, g.CUDALibrary = "cuda:0", lib
			// The host priced so slow that commit's first-layer weighing (weighedMisses) never
			// picks it: it would decide by the wall clock, and the host's kernels round
			// differently from the card's, so the two runs would not be comparable bit for bit.
			g.HostRates = HostRates{Bandwidth: 1}
			if o.Offload != nil {
				oo := *o.Offload
				oo.GPUMem = budget(c.path, g)
				o.Offload, g.Offload = &oo, &oo
			}
			cpu, host, dev := run(c.path, o, false), run(c.path, g, true), run(c.path, g, false)
			if !dev.onDevice || host.onDevice {
				t.Fatalf("committed routing on the device: %v, and %v with the host reading the routing", dev.onDevice, host.onDevice)
			}
			if dev.rep != host.rep || !slices.Equal(dev.commit.Layers, host.commit.Layers) || dev.off.Predicted != host.off.Predicted || dev.off.Correct != host.off.Correct {
				t.Errorf("weighed on the device: %+v, %+v, %d of %d predicted; read by the host: %+v, %+v, %d of %d",
					dev.rep, dev.commit, dev.off.Correct, dev.off.Predicted, host.rep, host.commit, host.off.Correct, host.off.Predicted)
			}
			if dev.rep.Tokens != cpu.rep.Tokens || math.Abs(dev.rep.NLL/cpu.rep.NLL-1) > 1e-3 {
				t.Errorf("GPU: %d tokens, NLL %v; CPU: %d tokens, NLL %v", dev.rep.Tokens, dev.rep.NLL, cpu.rep.Tokens, cpu.rep.NLL)
			}
			if !slices.Equal(dev.commit.Layers, cpu.commit.Layers) || dev.off.Predicted != cpu.off.Predicted || dev.off.Correct != cpu.off.Correct {
				t.Errorf("GPU: %+v, %d of %d predicted; CPU: %+v, %d of %d", dev.commit, dev.off.Correct, dev.off.Predicted, cpu.commit, cpu.off.Correct, cpu.off.Predicted)
			}
			var owa int64
			for _, l := range dev.commit.Layers {
				owa += l.OWA
			}
			if o.Offload == nil || o.Offload.Predictor == "" {
				if owa == 0 {
					t.Errorf("commit counts %+v: OWA never applied", dev.commit)
				}
			} else if dev.off.Predicted == 0 || dev.off.BytesCopied == 0 {
				t.Errorf("offload %+v: want experts copied and predictions scored", dev.off)
			}
			// The first token has nothing predicted: every layer's routing is read.
			// On a real GPU (-gpu=system) the wall times say what the read-backs cost.
			t.Logf("%d decode passes: %d read-backs and %.3f ms a pass with committed routing on the device, %d and %.3f ms with the host reading the routing",
				passes, dev.gpu.Reads, dev.wall.Seconds()*1e3/passes, host.gpu.Reads, host.wall.Seconds()*1e3/passes)
			// The committed experts go through the fused kernels as the host-read path's
			// do: weighing them on the device costs a launch a layer, not a launch an expert.
			t.Logf("launches: %d with committed routing on the device, %d with the host reading the routing", dev.gpu.Launches, host.gpu.Launches)
			if limit := host.gpu.Launches + passes*dev.moe; dev.gpu.Launches > limit {
				t.Errorf("%d launches with committed routing on the device, want at most the host-read path's %d and one a layer a pass: %d",
					dev.gpu.Launches, host.gpu.Launches, limit)
			}
			if limit := c.reads*passes + 2*dev.moe; dev.gpu.Reads > limit || host.gpu.Reads <= limit {
				t.Errorf("%d read-backs in %d decode passes with committed routing on the device, %d with the host reading the routing: want at most %d, and more",
					dev.gpu.Reads, passes, host.gpu.Reads, limit)
			}
		})
	}
}
