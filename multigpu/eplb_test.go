package multigpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// minMakespan is the optimal straggler over every assignment of slots to devices.
func minMakespan(slots []float64, devices int) float64 {
	best := math.Inf(1)
	load := make([]float64, devices)
	var rec func(i int)
	rec = func(i int) {
		if i == len(slots) {
			best = min(best, Straggler(load))
			return
		}
		for d := range devices {
			load[d] += slots[i]
			rec(i + 1)
			load[d] -= slots[i]
		}
	}
	rec(0)
	return best
}

func TestBalancedness(t *testing.T) {
	for _, c := range []struct {
		load []float64
		want float64
	}{
		{[]float64{10, 10, 10, 10}, 1},
		{[]float64{5, 3, 4, 8}, 0.625},
		{[]float64{0, 0}, 1},
		{[]float64{100, 1, 1, 1}, 103.0 / 4 / 100},
	} {
		if got := Balancedness(c.load); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Balancedness(%v) = %v, want %v", c.load, got, c.want)
		}
	}
}

// seeds/002: expert 0 carries 90 of 120 on 4 devices. One spare slot replicates it and the
// straggler halves, 90 -> 45; total load is conserved; no plan beats 120/4 or its heaviest
// slot.
func TestEPLBReplicatesTheHotExpert(t *testing.T) {
	load := []float64{90, 10, 10, 10}
	base, err := PlanEPLB(load, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	p, err := PlanEPLB(load, 5, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Replicas, []int{2, 1, 1, 1}) {
		t.Errorf("replicas %v, want the spare on the hot expert", p.Replicas)
	}
	if Straggler(base.DeviceLoad) != 90 || Straggler(p.DeviceLoad) != 45 {
		t.Errorf("straggler %v -> %v, want 90 -> 45", Straggler(base.DeviceLoad), Straggler(p.DeviceLoad))
	}
	if Balancedness(p.DeviceLoad) <= Balancedness(base.DeviceLoad) {
		t.Errorf("balancedness %v -> %v", Balancedness(base.DeviceLoad), Balancedness(p.DeviceLoad))
	}
	for slots := 4; slots < 10; slots++ {
		q, err := PlanEPLB(load, slots, 4)
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, v := range q.DeviceLoad {
			sum += v
		}
		sl, _ := SplitReplicas(load, q.Replicas)
		if math.Abs(sum-120) > 1e-9 || Straggler(q.DeviceLoad) < 30-1e-9 || Straggler(q.DeviceLoad) < slices.Max(sl)-1e-9 {
			t.Errorf("%d slots: device loads %v", slots, q.DeviceLoad)
		}
	}
}

// seeds/002's adversarial case: going from 6 to 7 slots gives the hot expert a fourth replica
// (90/4 = 22.5) and strands the three cold ones, so even the optimal straggler rises from 30
// to 32.5: replica counts alone do not balance, the packing must.
func TestEPLBOverReplication(t *testing.T) {
	load := []float64{90, 10, 10, 10}
	r6, _ := AllocateReplicas(load, 6)
	r7, _ := AllocateReplicas(load, 7)
	s6, _ := SplitReplicas(load, r6)
	s7, _ := SplitReplicas(load, r7)
	if o6, o7 := minMakespan(s6, 4), minMakespan(s7, 4); o6 != 30 || o7 != 32.5 {
		t.Errorf("optimal straggler with 6 and 7 slots: %v, %v; want 30, 32.5", o6, o7)
	}
}

// LPT is never better than the optimum and never worse than 4/3 of it.
func TestLPTWithinFourThirds(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 3))
	for range 300 {
		slots := make([]float64, 4+rng.IntN(4))
		for i := range slots {
			slots[i] = float64(1 + rng.IntN(11))
		}
		devices := 2 + rng.IntN(2)
		_, dl, err := PackLPT(slots, devices)
		if err != nil {
			t.Fatal(err)
		}
		greedy, opt := Straggler(dl), minMakespan(slots, devices)
		if greedy < opt-1e-9 || greedy > 4.0/3.0*opt+1e-9 {
			t.Fatalf("%v on %d devices: LPT %v, optimum %v", slots, devices, greedy, opt)
		}
	}
}

func TestEPLBBadInput(t *testing.T) {
	if _, err := PlanEPLB([]float64{1, 2}, 1, 1); err == nil {
		t.Error("fewer slots than experts: no error")
	}
	if _, err := PlanEPLB([]float64{1, 2}, 2, 3); err == nil {
		t.Error("fewer slots than devices: no error")
	}
	if _, err := PlanEPLB([]float64{1, math.NaN()}, 2, 1); err == nil {
		t.Error("a NaN load: no error")
	}
	if _, _, err := PackLPT([]float64{1}, 0); err == nil {
		t.Error("no devices: no error")
	}
}
