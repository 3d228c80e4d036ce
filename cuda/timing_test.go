package cuda

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/commit-run/commit-run/quant"
)

// TestGPUTiming marks the compute stream around kernels that wait for copies, on the fake
// driver (whose events take the host's clock when recorded): the marks' device time and the
// stalls only grow, the compute stream's waits on the copy stream are timed and the copy
// stream's on the compute stream are not, and every timing event goes back to the pool.
func TestGPUTiming(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	r := rand.New(rand.NewPCG(3, 4))
	w := randMatrix(t, quant.F32, 16, 32, r)
	slot, err := g.Buffer(int64(len(w.Data)), "a slot")
	if err != nil {
		t.Fatal(err)
	}
	x, out := make([]float32, w.Cols), make([]float32, w.Rows)
	ws := quant.Matrix{Type: w.Type, Rows: w.Rows, Cols: w.Cols, Data: slot}

	// step copies the expert in, makes the kernels wait for it and runs one.
	step := func() {
		g.Copy().Wait(g.Compute().Record()) // the slot is free: not a stall
		g.CopyIn(slot, w.Data)
		g.Compute().Wait(g.Copy().Record())
		g.MatMul(ws, x, 1, out)
	}
	pending := func() int {
		g.timing.mu.Lock()
		defer g.timing.mu.Unlock()
		return len(g.timing.waits)
	}

	prev := g.Mark()
	if prev.Marks != 1 || prev.DeviceSeconds != 0 || prev.StallSeconds != 0 {
		t.Fatalf("first mark: %+v", prev)
	}
	var made int
	for tok := 1; tok <= 12; tok++ {
		for range 5 {
			step()
		}
		if n := pending(); n != 5 {
			t.Fatalf("token %d: %d waits pending, want the compute stream's 5", tok, n)
		}
		time.Sleep(time.Millisecond)
		s := g.Mark()
		dev, stall := s.DeviceSeconds-prev.DeviceSeconds, s.StallSeconds-prev.StallSeconds
		if s.Marks != int64(tok+1) || dev < 1e-3 || stall < 0 || stall > dev || s.CopyBytes != int64(5*tok*len(w.Data)) {
			t.Fatalf("token %d: device %g s, stall %g s: %+v after %+v", tok, dev, stall, s, prev)
		}
		if n := pending(); n != 0 {
			t.Fatalf("token %d: %d waits left after the mark", tok, n)
		}
		prev = s
		g.timing.mu.Lock()
		if tok == 2 {
			made = g.timing.made
		} else if tok > 2 && g.timing.made != made {
			t.Errorf("token %d: %d timing events made, %d after token 2: the pool does not serve", tok, g.timing.made, made)
		}
		g.timing.mu.Unlock()
	}
	if prev.StallSeconds <= 0 {
		t.Errorf("60 timed waits stalled %g s", prev.StallSeconds)
	}

	// A long run of waits without a mark is read as it goes.
	for range 300 {
		step()
	}
	if n := pending(); n >= 256 {
		t.Errorf("%d waits pending: the backlog is not read", n)
	}
	s := g.Stats()
	if s.StallSeconds < prev.StallSeconds || s.DeviceSeconds != prev.DeviceSeconds || s.Launches != 360 || s.HostFallbacks != 0 {
		t.Errorf("stats %+v after %+v", s, prev)
	}
	g.timing.mu.Lock()
	if len(g.timing.waits) != 0 || len(g.timing.free)+1 != g.timing.made {
		t.Errorf("%d waits pending, %d events free of %d made (one the last mark): an event leaked", len(g.timing.waits), len(g.timing.free), g.timing.made)
	}
	g.timing.mu.Unlock()
	if err := g.Err(); err != nil {
		t.Error(err)
	}
}
