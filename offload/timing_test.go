package offload

import (
	"math"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/sim"
)

// Round numbers so that every time below is worked out by hand: a 1 MB expert takes 10 ms to
// copy and 1 ms to compute, attention 1 ms, everything else is free.
func testProfile() *sim.Profile {
	return &sim.Profile{Name: "test", MemoryBytes: 1 << 30, MemoryBandwidth: 1e9, PeakFLOPS: 1e12,
		PCIeBandwidth: 1e8, PCIeEffective: 1e8}
}

func testShape() *Shape {
	return &Shape{Name: "test", MoELayers: 2, Experts: 2, Used: 1, ExpertBytes: 1e6, Attn: Cost{Bytes: 1e6}}
}

type oracle struct{}

func (oracle) Predict(_, _ int, truth []int) []int { return truth }

type fixedWrong struct{ experts int }

func (f fixedWrong) Predict(_, _ int, truth []int) []int { return []int{(truth[0] + 1) % f.experts} }

const ms = 1e-3

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func timeRun(t *testing.T, c *Timing, tokens [][][]int) []TokenStats {
	t.Helper()
	st, err := c.Run(sim.NewTimeline(), tokens)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestTimingOnDemand(t *testing.T) {
	c := &Timing{Shape: testShape(), Profile: testProfile(), Policy: OnDemand, Slots: 2}
	st := timeRun(t, c, [][][]int{{{0}, {1}}, {{0}, {1}}})
	// Token 0: attn [0,1], host learns the route at 1, copy [1,11], expert [11,12]; attn
	// [12,13], copy [13,23], expert [23,24].
	a := st[0]
	if !near(a.Latency, 24*ms) || !near(a.Stall, 20*ms) || !near(a.Compute, 4*ms) || a.Misses != 2 || a.Hits != 0 ||
		a.Moved != 2e6 || a.Needed != 2e6 || !near(a.Limit, 20*ms) {
		t.Errorf("cold token: %+v", a)
	}
	// Token 1 finds both experts: compute only.
	if b := st[1]; !near(b.Latency, 4*ms) || b.Hits != 2 || b.Moved != 0 || b.Stall != 0 || !near(b.Limit, 4*ms) {
		t.Errorf("warm token: %+v", b)
	}
}

func TestTimingCommitOverlapsTheNextLayer(t *testing.T) {
	c := &Timing{Shape: testShape(), Profile: testProfile(), Policy: Commit, Slots: 2, Predict: oracle{}}
	st := timeRun(t, c, [][][]int{{{0}, {1}}})
	// Layer 0 loads on demand, copy [1,11]; layer 1's expert is predicted at time 1 and copied
	// [11,21] behind it; expert L0 [11,12]; attn L1 [12,13]; expert L1 waits for 21: [21,22].
	a := st[0]
	if !near(a.Latency, 22*ms) || !near(a.Stall, 18*ms) || a.Correct != 1 || a.Predicted != 1 || a.Hits != 1 || a.Misses != 1 {
		t.Errorf("commit: %+v", a)
	}
}

func TestTimingCommitNeverFallsBack(t *testing.T) {
	// Always wrong: prefetch repairs with an on-demand load, commit computes with the wrong
	// expert and moves nothing more.
	for _, p := range []Policy{Prefetch, Commit} {
		c := &Timing{Shape: testShape(), Profile: testProfile(), Policy: p, Slots: 2, Predict: fixedWrong{2}}
		st := timeRun(t, c, [][][]int{{{0}, {0}}})
		a := st[0]
		switch p {
		case Prefetch:
			// L0 on demand [1,11]; predicted L1E1 copied [11,21]; L1 truth E0 on demand [21,31].
			if a.Correct != 0 || a.Moved != 3e6 || !near(a.Latency, 32*ms) {
				t.Errorf("prefetch: %+v", a)
			}
		case Commit:
			if a.Correct != 0 || a.Moved != 2e6 || !near(a.Latency, 22*ms) {
				t.Errorf("commit: %+v", a)
			}
		}
	}
}

func TestTimingCPUMiss(t *testing.T) {
	c := &Timing{Shape: testShape(), Profile: testProfile(), Policy: CPUMiss, Slots: 2, CPU: CPUCost{Bandwidth: 5e8}}
	st := timeRun(t, c, [][][]int{{{0}, {1}}})
	// L0: route known at 1, the host finishes the expert at 3, before a copy would (11); attn
	// L1 waits for it: [3,4]; host [4,6]; logits at 6. Nothing is copied.
	a := st[0]
	if !near(a.Latency, 6*ms) || a.OnCPU != 2 || a.Misses != 2 || a.Needed != 0 || a.Moved != 0 {
		t.Errorf("cpu-miss: %+v", a)
	}
	// Two misses in a layer: E0 goes to the host (done at 1+7=8, before a copy at 11), E1 is
	// copied (done at 11, before the busy host at 15); its kernel [11,12].
	two := &Timing{Shape: &Shape{Name: "two", MoELayers: 1, Experts: 4, Used: 2, ExpertBytes: 1e6, Attn: Cost{Bytes: 1e6}},
		Profile: testProfile(), Policy: CPUMiss, Slots: 4, CPU: CPUCost{Bandwidth: 1e6 / 7e-3}}
	if st := timeRun(t, two, [][][]int{{{0, 1}}}); st[0].OnCPU != 1 || st[0].Moved != 1e6 || !near(st[0].Latency, 12*ms) {
		t.Errorf("two misses: %+v", st[0])
	}
	// A host slower than the link falls back to loading.
	c.CPU = CPUCost{Bandwidth: 1e7}
	if st := timeRun(t, c, [][][]int{{{0}, {1}}}); st[0].OnCPU != 0 || !near(st[0].Latency, 24*ms) {
		t.Errorf("slow host: %+v", st[0])
	}
}

func TestTimingErrors(t *testing.T) {
	base := func() *Timing {
		return &Timing{Shape: testShape(), Profile: testProfile(), Policy: OnDemand, Slots: 2}
	}
	cases := []struct {
		name   string
		mod    func(*Timing)
		tokens [][][]int
		want   string
	}{
		{"layers", func(*Timing) {}, [][][]int{{{0}}}, "routes 1 MoE layers"},
		{"range", func(*Timing) {}, [][][]int{{{0}, {2}}}, "out of range"},
		{"top-k", func(*Timing) {}, [][][]int{{{0, 1}, {1}}}, "top-1"},
		{"no predictor", func(c *Timing) { c.Policy = Commit }, [][][]int{{{0}, {1}}}, "predictor"},
		{"no host", func(c *Timing) { c.Policy = CPUMiss }, [][][]int{{{0}, {1}}}, "host"},
		{"no slots", func(c *Timing) { c.Slots = 0 }, [][][]int{{{0}, {1}}}, "slots"},
	}
	for _, cs := range cases {
		c := base()
		cs.mod(c)
		if _, err := c.Run(sim.NewTimeline(), cs.tokens); err == nil || !strings.Contains(err.Error(), cs.want) {
			t.Errorf("%s: %v, want an error mentioning %q", cs.name, err, cs.want)
		}
	}
}

func TestShapeSlots(t *testing.T) {
	s := testShape()
	s.Resident = 5e6
	if n, err := s.Slots(5e6+3.5e6, OnDemand); err != nil || n != 3 {
		t.Errorf("slots %d, %v; want 3", n, err)
	}
	if n, err := s.Slots(1e9, OnDemand); err != nil || n != 4 {
		t.Errorf("a budget above the model: %d slots, %v; want every expert (4)", n, err)
	}
	if _, err := s.Slots(5e6+1.5e6, Commit); err == nil || !strings.Contains(err.Error(), "needs at least") {
		t.Errorf("commit needs two layers' experts: %v", err)
	}
	for _, b := range []float64{0, -1, math.Inf(1), math.NaN()} {
		if _, err := s.Slots(b, OnDemand); err == nil {
			t.Errorf("budget %v: no error", b)
		}
	}
}

// A prompt of two tokens is one batch: each layer loads the union of its tokens' experts,
// computing each as soon as it lands, and the decode after it starts with a warm cache.
func TestTimingPrefill(t *testing.T) {
	c := &Timing{Shape: testShape(), Profile: testProfile(), Policy: OnDemand, Slots: 4}
	ttft, st, err := c.RunPrompt(sim.NewTimeline(), [][][]int{{{0}, {1}}, {{1}, {1}}}, [][][]int{{{0}, {1}}})
	if err != nil {
		t.Fatal(err)
	}
	// Layer 0: attn [0,1], route read at 1, copy E0 [1,11], E0 [11,12], copy E1 [11,21],
	// E1 [21,22]. Layer 1: attn [22,23], copy E1 [23,33], E1 for both tokens [33,34].
	if !near(ttft, 34*ms) {
		t.Errorf("time to first token %v ms, want 34", ttft/ms)
	}
	if d := st[0]; !near(d.Latency, 4*ms) || d.Hits != 2 || d.Moved != 0 {
		t.Errorf("decode after the prompt: %+v, want 4 ms from a warm cache", d)
	}
	// The prompt's expert flops scale with the tokens that chose the expert.
	sh := testShape()
	sh.ExpertFLOPs = 1e9 // 1 ms per token at 1e12 FLOP/s: two tokens take 2 ms, not 1
	c = &Timing{Shape: sh, Profile: testProfile(), Policy: OnDemand, Slots: 4}
	if ttft, _, err = c.RunPrompt(sim.NewTimeline(), [][][]int{{{0}, {1}}, {{1}, {1}}}, nil); err != nil || !near(ttft, 35*ms) {
		t.Errorf("time to first token %v ms (%v), want 35", ttft/ms, err)
	}
	if _, _, err := c.RunPrompt(sim.NewTimeline(), [][][]int{{{0}}}, nil); err == nil || !strings.Contains(err.Error(), "prompt token 0") {
		t.Errorf("a prompt token routing one layer of two: %v", err)
	}
}

// A token's first MoE layer commits to the cross-token prediction only with CrossToken;
// otherwise it waits for its router and computes the router's experts, loading a miss.
func TestTimingCommitCrossToken(t *testing.T) {
	tokens := [][][]int{{{0}, {1}}, {{0}, {1}}}
	for _, cross := range []bool{false, true} {
		c := &Timing{Shape: testShape(), Profile: testProfile(), Policy: Commit, Slots: 3, Predict: fixedWrong{2}, CrossToken: cross}
		b := timeRun(t, c, tokens)[1]
		if cross {
			// Token 2's L0 computes with the predicted L0E1, whose copy token 1's last layer
			// issued (10 ms) just before: it waits 8 ms for it.
			if !near(b.Latency, 12*ms) || !near(b.Stall, 8*ms) {
				t.Errorf("cross-token commit: %+v", b)
			}
		} else if !near(b.Latency, 4*ms) || b.Stall != 0 || b.Hits != 2 {
			// L0 computes the router's L0E0, resident since token 1: four 1 ms kernels.
			t.Errorf("commit within a token: %+v", b)
		}
	}
}
