package multigpu

import (
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomBatch is a routing of T tokens, top-k of E experts, with full gating scores whose
// top-k is the choice.
func randomBatch(rng *rand.Rand, T, E, K int) Batch {
	sk := Skew{Experts: E, K: K, Tokens: T, Alpha: rng.Float64(), Hot: 1 + rng.IntN(E), Seed: rng.Uint64()}
	b, err := sk.Batch(rng.IntN(4), rng.IntN(4))
	if err != nil {
		panic(err)
	}
	return b
}

func TestRoundRobin(t *testing.T) {
	p, err := RoundRobin(8, 3)
	if err != nil {
		t.Fatal(err)
	}
	for d, want := range [][]int{{0, 3, 6}, {1, 4, 7}, {2, 5}} {
		if got := p.Local(d); !slices.Equal(got, want) {
			t.Errorf("device %d holds %v, want %v", d, got, want)
		}
	}
	for _, c := range [][2]int{{0, 1}, {8, 0}, {-1, 2}} {
		if _, err := RoundRobin(c[0], c[1]); err == nil {
			t.Errorf("RoundRobin(%d, %d): no error", c[0], c[1])
		}
	}
}

// With one device, capacity-aware token drop as a policy keeps exactly what Drop keeps.
func TestCapacityDropMatchesDrop(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p, _ := RoundRobin(8, 1)
	for range 50 {
		b := randomBatch(rng, 1+rng.IntN(200), 8, 1+rng.IntN(3))
		gamma := rng.Float64() * 2
		for m := ByScore; m <= ByRandom; m++ {
			c, _ := Capacity(b.Tokens(), b.K, b.Experts, gamma)
			want, err := Drop(b.Routing, c, m, 9)
			if err != nil {
				t.Fatal(err)
			}
			s, err := CapacityDrop{Gamma: gamma, Metric: m, Seed: 9}.Plan(b, p)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(b, p); err != nil {
				t.Fatal(err)
			}
			got := make([]bool, len(b.Choice))
			for _, a := range s.Assign {
				got[a.Token*b.K+a.Choice] = true
			}
			if !slices.Equal(got, want.Kept) || s.Dropped != want.Dropped {
				t.Fatalf("%v, gamma %v: policy keeps %v (%d dropped), Drop keeps %v (%d)", m, gamma, got, s.Dropped, want.Kept, want.Dropped)
			}
		}
	}
}

// A hand-computed expanded drop: 4 tokens, top-1 of 4 experts on 2 devices (round-robin:
// device 0 holds 0 and 2, device 1 holds 1 and 3), tokens 0-1 on device 0 and 2-3 on device
// 1, gamma 2: capacity per device floor(2 * 2 * 1 / 4) = 1.
func TestExpandedDropByHand(t *testing.T) {
	probs := []float32{
		0.6, 0.1, 0.2, 0.1, // token 0 chooses 0; local alternative 2 at 0.2
		0.5, 0.1, 0.3, 0.1, // token 1 chooses 0; local alternative 2 at 0.3
		0.1, 0.7, 0.1, 0.1, // token 2 chooses 1; local alternative 3 at 0.1
		0.1, 0.2, 0.1, 0.6, // token 3 chooses 3; local alternative 1 at 0.2
	}
	b := Batch{Routing: Routing{Experts: 4, K: 1, Choice: []int{0, 0, 1, 3}, Score: []float32{0.6, 0.5, 0.7, 0.6}}, Probs: probs}
	p, _ := RoundRobin(4, 2)
	// Device 0: expert 0 gets tokens 0 (0.6) and 1 (0.5): keeps token 0, drops token 1's
	// choice. Expert 2 gets the local offers of tokens 0 (0.2) and 1 (0.3): keeps token 1.
	// Device 1: expert 1 gets token 2 (0.7) and token 3's offer (0.2): keeps token 2; expert 3
	// gets token 3 (0.6) and token 2's offer (0.1): keeps token 3.
	s, err := CapacityDrop{Gamma: 2, Expand: true}.Plan(b, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(b, p); err != nil {
		t.Fatal(err)
	}
	want := []Assignment{
		{Token: 0, Expert: 0, From: 0, To: 0, Choice: 0, Score: 0.6},
		{Token: 1, Expert: 2, From: 0, To: 0, Choice: -1, Score: 0.3},
		{Token: 2, Expert: 1, From: 1, To: 1, Choice: 0, Score: 0.7},
		{Token: 3, Expert: 3, From: 1, To: 1, Choice: 0, Score: 0.6},
	}
	if !slices.Equal(s.Assign, want) || s.Dropped != 1 || s.Rerouted != 1 {
		t.Errorf("expanded drop:\n got %+v (dropped %d, extra %d)\nwant %+v (dropped 1, extra 1)", s.Assign, s.Dropped, s.Rerouted, want)
	}
	// Token drop alone loses token 1 entirely.
	s, _ = CapacityDrop{Gamma: 2}.Plan(b, p)
	if len(s.Assign) != 3 || s.Dropped != 1 || s.Rerouted != 0 {
		t.Errorf("token drop: %+v", s)
	}
	// Device-level capacity: device 0 may take 2 * 1 tokens over its experts 0 and 2, so
	// token 1 keeps expert 0.
	s, _ = CapacityDrop{Gamma: 2, DeviceLevel: true}.Plan(b, p)
	if len(s.Assign) != 4 || s.Dropped != 0 {
		t.Errorf("device-level token drop: %+v", s)
	}
	if _, err := (CapacityDrop{Gamma: 1, Expand: true}).Plan(Batch{Routing: b.Routing}, p); err == nil {
		t.Error("expanded drop without gating scores: no error")
	}
}

// Invariants of capacity-aware drop on random batches: each device sends an expert (under
// DeviceLevel, a device) no more than its capacity; device-level never drops more than
// expert-level; expansion only ever adds experts on the token's own device and keeps exactly
// the top-k choices token drop keeps.
func TestCapacityDropInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 200 {
		E := 2 + rng.IntN(16)
		D := 1 + rng.IntN(min(E, 8))
		b := randomBatch(rng, 1+rng.IntN(300), E, 1+rng.IntN(min(E, 4)))
		p, _ := RoundRobin(E, D)
		gamma := rng.Float64() * 3
		m := DropMetric(rng.IntN(4))
		var dropped [2]int
		var keptTopK [2]map[[2]int]bool
		for i, dev := range []bool{false, true} {
			for _, expand := range []bool{false, true} {
				pol := CapacityDrop{Gamma: gamma, Metric: m, Seed: 1, Expand: expand, DeviceLevel: dev}
				s, err := pol.Plan(b, p)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Check(b, p); err != nil {
					t.Fatalf("%s: %v", pol.Name(), err)
				}
				shard := make([]int, D)
				for tk := range b.Tokens() {
					shard[b.HomeOf(tk, D)]++
				}
				sent := map[[2]int]int{}
				for _, a := range s.Assign {
					g := a.Expert
					if dev {
						g = a.To
					}
					sent[[2]int{a.From, g}]++
					if a.Choice < 0 && a.To != a.From {
						t.Fatalf("%s: extra expert %d of token %d computed off its device", pol.Name(), a.Expert, a.Token)
					}
				}
				for k, n := range sent {
					c, _ := Capacity(shard[k[0]], b.K, E, gamma)
					if dev {
						c *= len(p.Local(k[1]))
					}
					if n > c {
						t.Fatalf("%s: device %d sends %d tokens to %d, capacity %d", pol.Name(), k[0], n, k[1], c)
					}
				}
				kept := map[[2]int]bool{}
				for _, a := range s.Assign {
					if a.Choice >= 0 {
						kept[[2]int{a.Token, a.Choice}] = true
					}
				}
				if !expand {
					dropped[i] = s.Dropped
					keptTopK[i] = kept
				} else if !maps.Equal(kept, keptTopK[i]) {
					t.Fatalf("%s keeps other top-k choices than without expansion", pol.Name())
				}
			}
		}
		if dropped[1] > dropped[0] {
			t.Fatalf("device-level capacity drops %d, expert-level %d", dropped[1], dropped[0])
		}
	}
}

// EPLB learns a skewed layer's load over its window and re-plans: the hot expert gets
// replicas on several devices and the straggler falls; other layers keep their own windows.
func TestEPLBReplans(t *testing.T) {
	x, err := NewEPLB(16, 4, 4)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := RoundRobin(8, 4)
	sk := Skew{Experts: 8, K: 2, Tokens: 512, Alpha: 0.6, Seed: 2}
	var before, after float64
	place := p
	replans := 0
	for step := range 8 {
		b, _ := sk.Batch(step, 0)
		s, err := x.Plan(b, place)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Check(b, place); err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			before = Straggler(s.DeviceLoad())
		}
		after = Straggler(s.DeviceLoad())
		if np, ok := x.Replace(0, place); ok {
			if err := np.Check(8); err != nil {
				t.Fatal(err)
			}
			place = np
			replans++
		}
		if _, ok := x.Replace(1, p); ok {
			t.Fatal("layer 1 re-planned without any load")
		}
	}
	if replans != 2 {
		t.Errorf("%d re-plans in 8 batches every 4, want 2", replans)
	}
	if hot := len(place.Holders[0]); hot < 2 {
		t.Errorf("hot expert 0 on %d devices after re-planning", hot)
	}
	if after >= before*0.8 {
		t.Errorf("straggler %v before EPLB, %v after: want a clear cut", before, after)
	}
	for _, c := range [][3]int{{0, 4, 4}, {8, -1, 2}, {8, 2, -1}} {
		if _, err := NewEPLB(c[0], c[1], c[2]); err == nil {
			t.Errorf("NewEPLB%v: no error", c)
		}
	}
}

// A hand-computed layer: 2 devices, experts of 1 MB at 1e12 B/s (1 us to read) and 1e6 FLOPs
// per token at 1e12 FLOP/s (1 us per token), tokens of 1 kB over a 1e9 B/s link (1 us each).
func TestClusterTimeByHand(t *testing.T) {
	c := Cluster{Devices: 2, FLOPS: 1e12, MemBW: 1e12, LinkBW: 1e9, HostBW: 1e9 / 2, LinkLatency: 1e-6}
	x := ExpertCost{WeightBytes: 1e6, FLOPsPerToken: 1e6, TokenBytes: 1e3}
	s := Schedule{Devices: 2, Experts: 2, Assign: []Assignment{
		{Token: 0, Expert: 0, From: 0, To: 0}, {Token: 1, Expert: 0, From: 0, To: 0}, {Token: 2, Expert: 0, From: 0, To: 0},
		{Token: 3, Expert: 1, From: 0, To: 1}, // 1 token sent each way: dispatch 1 us + 1 us latency
		{Token: 4, Expert: 0, From: 1, To: 1}, // device 1 computes expert 0 after fetching it
	}, Fetches: []Fetch{{Expert: 0, From: Host, To: 1}}}
	lt, err := c.Time(s, x)
	if err != nil {
		t.Fatal(err)
	}
	// Device 0: expert 0 with 3 tokens: max(1 us read, 3 us compute) = 3 us.
	// Device 1: expert 1 (1 token): 1 us, ends at 3 us from the layer's start; then expert 0,
	// whose 1 MB fetch at 0.5e9 B/s lands at 2000 us: starts then, 1 us: 2001 us from the
	// start, 1999 us of compute after the 2 us dispatch.
	want := LayerTime{Dispatch: 2e-6, Combine: 2e-6, Compute: []float64{3e-6, 1999e-6}, Straggler: 1999e-6, Total: 2003e-6}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }
	if !near(lt.Dispatch, want.Dispatch) || !near(lt.Combine, want.Combine) || !near(lt.Compute[0], want.Compute[0]) ||
		!near(lt.Compute[1], want.Compute[1]) || !near(lt.Straggler, want.Straggler) || !near(lt.Total, want.Total) {
		t.Errorf("Time = %+v, want %+v", lt, want)
	}
	if _, err := (Cluster{Devices: 2, FLOPS: 1, MemBW: 1, LinkBW: 0, HostBW: 1}).Time(s, x); err == nil {
		t.Error("zero link bandwidth: no error")
	}
}

func TestSkew(t *testing.T) {
	sk := Skew{Experts: 16, K: 2, Tokens: 4000, Alpha: 0.9, Seed: 1}
	b, err := sk.Batch(0, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Check(1); err != nil {
		t.Fatal(err)
	}
	hot := 0
	for i, e := range b.Choice {
		if e == 3 {
			hot++
		}
		// The draw is the token's top-k of its gating scores, in order.
		tk := i / b.K
		if got := topIndices(b.Probs[tk*16:(tk+1)*16], 2); !slices.Equal(got, b.Choice[tk*2:tk*2+2]) {
			t.Fatalf("token %d: top-2 of its scores %v, choice %v", tk, got, b.Choice[tk*2:tk*2+2])
		}
	}
	// Every token takes the hot expert first with probability 0.9, or second: about
	// 0.9 + 0.1 * 0.9 ... of tokens hold it; at least the first draws.
	if share := float64(hot) / 4000; share < 0.88 {
		t.Errorf("hot expert in %.3f of tokens, want about 0.9 or more", share)
	}
	for _, bad := range []Skew{{Experts: 4, K: 5, Tokens: 1}, {Experts: 4, K: 1, Tokens: 0}, {Experts: 4, K: 1, Tokens: 1, Alpha: 1.5},
		{Experts: 4, K: 1, Tokens: 1, Hot: 5}, {Experts: 4, K: 1, Tokens: 1, Visual: -1}} {
		if _, err := bad.Batch(0, 0); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

func topIndices(v []float32, k int) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case v[a] > v[b]:
			return -1
		case v[a] < v[b]:
			return 1
		}
		return 0
	})
	return idx[:k]
}
