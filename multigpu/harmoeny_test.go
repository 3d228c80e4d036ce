package multigpu

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// harBatch is a batch of top-k choices (k = len of each row), homes in contiguous equal
// shards, scores falling with the choice index.
func harBatch(experts int, choices [][]int) Batch {
	b := Batch{Routing: Routing{Experts: experts, K: len(choices[0])}}
	for _, c := range choices {
		for i, e := range c {
			b.Choice = append(b.Choice, e)
			b.Score = append(b.Score, 1/float32(i+1))
		}
	}
	return b
}

// harFigure6 is seeds/004 Figure 6: 15 tokens, top-1 over three experts, expert d on GPU d. The
// text fixes what is checked: 5 tokens per GPU (the batch split evenly), GPU 0 receives 2
// tokens, GPU 2 receives 9 (so GPU 1 receives 4), rebalancing ends at 5/5/5, and GPUs 0 and 1
// take tokens of expert 2 and fetch it (§4.3; §4.2's "expert 0 is replicated to GPU 1"
// contradicts this and Algorithm 2, which only sheds GPU 2's expert 2). The figure's colours
// are not in the text, so which GPU holds which of the 9 expert-2 tokens is our choice:
// 2, 3 and 4 on GPUs 0, 1 and 2, which makes the second step pick a different source.
func harFigure6() (Batch, Placement) {
	b := harBatch(3, [][]int{
		{0}, {1}, {1}, {2}, {2}, // GPU 0
		{0}, {1}, {2}, {2}, {2}, // GPU 1
		{1}, {2}, {2}, {2}, {2}, // GPU 2
	})
	p, _ := RoundRobin(3, 3)
	return b, p
}

func TestHarMoEnyFigure6(t *testing.T) {
	b, p := harFigure6()
	static, err := HarMoEny{Threshold: math.MaxInt}.Plan(b, p)
	if err != nil {
		t.Fatal(err)
	}
	// S_initial[from][expert][to]: every token to its expert's only GPU.
	initial := [][][]int{
		{{1, 0, 0}, {0, 2, 0}, {0, 0, 2}},
		{{1, 0, 0}, {0, 1, 0}, {0, 0, 3}},
		{{0, 0, 0}, {0, 1, 0}, {0, 0, 4}},
	}
	if got := static.Matrix(); !reflect.DeepEqual(got, initial) {
		t.Fatalf("initial S %v, want %v", got, initial)
	}
	if got := static.DeviceLoad(); !slices.Equal(got, []float64{2, 4, 9}) {
		t.Errorf("initial loads %v, want 2 4 9", got)
	}
	if len(static.Fetches) != 0 {
		t.Errorf("no rebalancing fetches %v", static.Fetches)
	}

	// Algorithm 2 with q = 1, t_avg = 5. Step 1: GPU 2 is the most loaded, GPU 2 itself sends
	// it the most (4), t_move = 4, GPU 0 has room for 3: 3 move. Step 2: loads 5/4/6, GPU 1
	// now sends GPU 2 the most (3 against 2 and 1), GPU 1 has room for 1: 1 moves. 5/5/5.
	S := static.Matrix()
	steps := rebalance(S, 1)
	want := []harMove{{from: 2, expert: 2, src: 2, dst: 0, n: 3}, {from: 1, expert: 2, src: 2, dst: 1, n: 1}}
	if !slices.Equal(steps, want) {
		t.Errorf("steps %+v, want %+v", steps, want)
	}

	s, err := HarMoEny{Threshold: 1}.Plan(b, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(b, p); err != nil {
		t.Fatal(err)
	}
	final := [][][]int{
		{{1, 0, 0}, {0, 2, 0}, {0, 0, 2}},
		{{1, 0, 0}, {0, 1, 0}, {0, 1, 2}},
		{{0, 0, 0}, {0, 1, 0}, {3, 0, 1}},
	}
	if got := s.Matrix(); !reflect.DeepEqual(got, final) || !reflect.DeepEqual(S, final) {
		t.Errorf("final S %v (rebalance %v), want %v", got, S, final)
	}
	if got := s.DeviceLoad(); !slices.Equal(got, []float64{5, 5, 5}) {
		t.Errorf("loads %v, want 5 5 5", got)
	}
	// The last tokens of a group move: GPU 2's tokens 12-14 and GPU 1's token 9.
	to := make([]int, len(s.Assign))
	for _, a := range s.Assign {
		to[a.Token] = a.To
	}
	if w := []int{0, 1, 1, 2, 2, 0, 1, 2, 2, 1, 1, 2, 0, 0, 0}; !slices.Equal(to, w) {
		t.Errorf("tokens go to %v, want %v", to, w)
	}
	if w := []Fetch{{Expert: 2, From: Host, To: 0}, {Expert: 2, From: Host, To: 1}}; !slices.Equal(s.Fetches, w) {
		t.Errorf("fetches %v, want %v", s.Fetches, w)
	}
	if s.Dropped != 0 || s.Rerouted != 0 {
		t.Errorf("dropped %d, rerouted %d", s.Dropped, s.Rerouted)
	}
}

// Algorithm 2 stops at the threshold: on a move of fewer than q tokens (line 14), or when the
// least loaded device has no room for q (line 19), leaving the imbalance.
func TestHarMoEnyThresholdStops(t *testing.T) {
	fig, fp := harFigure6()
	// Two devices, experts 0 and 2 on device 0: every token of both homes wants them, 5 per
	// (home, expert), so a move is 5 tokens while device 1 has room for 10.
	var rows [][]int
	for range 2 {
		rows = append(rows, [][]int{{0}, {0}, {0}, {0}, {0}, {2}, {2}, {2}, {2}, {2}}...)
	}
	two := harBatch(4, rows)
	tp, _ := RoundRobin(4, 2)
	for _, c := range []struct {
		name    string
		b       Batch
		p       Placement
		q       int
		want    []float64
		fetches int
	}{
		{"fig6 q=1", fig, fp, 1, []float64{5, 5, 5}, 2},
		{"fig6 q=2: GPU 1 lacks room for 2", fig, fp, 2, []float64{5, 4, 6}, 1},
		{"fig6 q=3", fig, fp, 3, []float64{5, 4, 6}, 1},
		{"fig6 q=4: GPU 0 lacks room for 4", fig, fp, 4, []float64{2, 4, 9}, 0},
		{"two q=5", two, tp, 5, []float64{10, 10}, 1},
		{"two q=6: a move of 5 < q", two, tp, 6, []float64{20, 0}, 0},
	} {
		s, err := HarMoEny{Threshold: c.q}.Plan(c.b, c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := s.Check(c.b, c.p); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if got := s.DeviceLoad(); !slices.Equal(got, c.want) {
			t.Errorf("%s: loads %v, want %v", c.name, got, c.want)
		}
		if len(s.Fetches) != c.fetches {
			t.Errorf("%s: fetches %v, want %d", c.name, s.Fetches, c.fetches)
		}
	}

	// Ties go to the lower index, as torch's argmax does: both homes send device 0 ten tokens
	// and each expert five, so home 0's expert 0 moves first, then home 1's.
	static, _ := HarMoEny{Threshold: math.MaxInt}.Plan(two, tp)
	want := []harMove{{from: 0, expert: 0, src: 0, dst: 1, n: 5}, {from: 1, expert: 0, src: 0, dst: 1, n: 5}}
	if got := rebalance(static.Matrix(), 5); !slices.Equal(got, want) {
		t.Errorf("steps %+v, want %+v", got, want)
	}
}

// A device that holds a replica of the expert it takes tokens for needs no fetch; two groups
// moving one expert to one device fetch it once.
func TestHarMoEnyFetches(t *testing.T) {
	var rows [][]int
	for range 8 {
		rows = append(rows, []int{0})
	}
	b := harBatch(2, rows) // 4 tokens on each of 2 devices, all for expert 0
	s, err := HarMoEny{Threshold: 1}.Plan(b, Placement{Devices: 2, Holders: [][]int{{0, 1}, {1}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.DeviceLoad(); !slices.Equal(got, []float64{4, 4}) || len(s.Fetches) != 0 {
		t.Errorf("replicated: loads %v, fetches %v; want 4 4 and none", got, s.Fetches)
	}

	// Three devices, expert 0 on device 0 only, every token wants it: devices 1 and 2 each
	// take tokens of two homes and fetch expert 0 once.
	rows = nil
	for range 12 {
		rows = append(rows, []int{0})
	}
	b = harBatch(3, rows)
	p, _ := RoundRobin(3, 3)
	s, err = HarMoEny{Threshold: 1}.Plan(b, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(b, p); err != nil {
		t.Fatal(err)
	}
	if got := s.DeviceLoad(); !slices.Equal(got, []float64{4, 4, 4}) {
		t.Errorf("loads %v, want 4 4 4", got)
	}
	if w := []Fetch{{0, Host, 1}, {0, Host, 2}}; !slices.Equal(s.Fetches, w) {
		t.Errorf("fetches %v, want %v", s.Fetches, w)
	}
}

// harRandomBatch draws a skewed batch (low experts are hot), with homes either sharded or
// random, on a round-robin or a random replicated placement.
func harRandomBatch(rng *rand.Rand) (Batch, Placement) {
	E, D := 1+rng.IntN(12), 1+rng.IntN(6)
	K, T := 1+rng.IntN(min(E, 4)), rng.IntN(120)
	b := Batch{Routing: Routing{Experts: E, K: K}}
	for range T {
		var c []int
		for len(c) < K {
			if e := min(rng.IntN(E), rng.IntN(E)); !slices.Contains(c, e) {
				c = append(c, e)
			}
		}
		b.Choice = append(b.Choice, c...)
		for range K {
			b.Score = append(b.Score, rng.Float32())
		}
	}
	if rng.IntN(2) == 0 {
		b.Home = make([]int, T)
		for t := range b.Home {
			b.Home[t] = rng.IntN(D)
		}
	}
	p, _ := RoundRobin(E, D)
	if rng.IntN(2) == 0 {
		for e := range p.Holders {
			p.Holders[e] = rng.Perm(D)[:1+rng.IntN(D)]
		}
	}
	return b, p
}

// Tokens are conserved, schedules valid and deterministic; devices over the average only
// shed and the rest only gain up to it, so the straggler never exceeds the static plan's; with
// q = 1 every device ends between the floor average and it plus the remainder.
func TestHarMoEnyConserves(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 0x4a2))
	for it := range 1000 {
		b, p := harRandomBatch(rng)
		q := 1
		if it%2 == 1 {
			q = 1 + rng.IntN(10)
		}
		h := HarMoEny{Threshold: q}
		s, err := h.Plan(b, p)
		if err != nil {
			t.Fatalf("batch %d: %v", it, err)
		}
		if err := s.Check(b, p); err != nil {
			t.Fatalf("batch %d: %v", it, err)
		}
		if again, _ := h.Plan(b, p); !reflect.DeepEqual(s, again) {
			t.Fatalf("batch %d: two plans differ", it)
		}
		N := len(b.Choice)
		if len(s.Assign) != N || s.Dropped != 0 || s.Rerouted != 0 {
			t.Fatalf("batch %d: %d assignments of %d, %d dropped, %d rerouted", it, len(s.Assign), N, s.Dropped, s.Rerouted)
		}
		for _, f := range s.Fetches {
			used := slices.ContainsFunc(s.Assign, func(a Assignment) bool { return a.Expert == f.Expert && a.To == f.To })
			if f.From != Host || !used {
				t.Fatalf("batch %d: fetch %+v (used %v)", it, f, used)
			}
		}
		st, err := Static{}.Plan(b, p)
		if err != nil {
			t.Fatal(err)
		}
		static, load := st.DeviceLoad(), s.DeviceLoad()
		if Straggler(load) > Straggler(static) {
			t.Fatalf("batch %d: straggler %v above the static %v", it, Straggler(load), Straggler(static))
		}
		avg := float64(N / p.Devices)
		for d := range load {
			if static[d] > avg && load[d] > static[d] || static[d] <= avg && (load[d] < static[d] || load[d] > avg) {
				t.Fatalf("batch %d: device %d from %v to %v, average %v", it, d, static[d], load[d], avg)
			}
			if q == 1 && (load[d] < avg || load[d] > avg+float64(N%p.Devices)) {
				t.Fatalf("batch %d, q=1: loads %v, average %v", it, load, avg)
			}
		}
	}
}

func TestHarMoEnyThreshold(t *testing.T) {
	// H100 SXM: 989 TFLOP/s dense BF16, PCIe 5 x16 at 64 GB/s. BF16: 989e12*2/128e9 =
	// 15453.125 -> 15454 tokens; Q4_K (4.5 bits): 989e12*0.5625/128e9 = 4346.19 -> 4347.
	h100 := Cluster{Devices: 8, FLOPS: 989e12, HostBW: 64e9}
	for _, c := range []struct {
		c    Cluster
		x    ExpertCost
		want int
	}{
		{h100, ExpertCost{ElementBytes: 2}, 15454},
		{h100, ExpertCost{ElementBytes: 4.5 / 8}, 4347},
		{Cluster{FLOPS: 100, HostBW: 25}, ExpertCost{ElementBytes: 1}, 3}, // exactly 2: strictly more
		{Cluster{FLOPS: 1, HostBW: 1e9}, ExpertCost{ElementBytes: 1}, 1},
	} {
		got, err := HarMoEnyThreshold(c.c, c.x)
		if err != nil || got != c.want {
			t.Errorf("HarMoEnyThreshold(%+v, %+v) = %d, %v; want %d", c.c, c.x, got, err, c.want)
		}
	}
	for _, c := range []struct {
		c Cluster
		x ExpertCost
	}{
		{Cluster{HostBW: 64e9}, ExpertCost{ElementBytes: 2}},
		{Cluster{FLOPS: 989e12}, ExpertCost{ElementBytes: 2}},
		{h100, ExpertCost{}},
		{Cluster{FLOPS: -1, HostBW: 64e9}, ExpertCost{ElementBytes: 2}},
		{Cluster{FLOPS: math.NaN(), HostBW: 64e9}, ExpertCost{ElementBytes: 2}},
		{Cluster{FLOPS: math.Inf(1), HostBW: 64e9}, ExpertCost{ElementBytes: 2}},
		{h100, ExpertCost{ElementBytes: math.Inf(1)}},
		{Cluster{FLOPS: 1e300, HostBW: 1e-300}, ExpertCost{ElementBytes: 2}}, // overflows
		{Cluster{FLOPS: 1e30, HostBW: 1}, ExpertCost{ElementBytes: 2}},       // beyond an int's reach
	} {
		if q, err := HarMoEnyThreshold(c.c, c.x); err == nil {
			t.Errorf("HarMoEnyThreshold(%+v, %+v) = %d, want an error", c.c, c.x, q)
		}
	}

	// Threshold 0 takes eq. 4's: q = 3 plans Figure 6 as Threshold 3 does.
	b, p := harFigure6()
	s, err := HarMoEny{Cluster: Cluster{FLOPS: 100, HostBW: 25}, Cost: ExpertCost{ElementBytes: 1}}.Plan(b, p)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := (HarMoEny{Threshold: 3}).Plan(b, p); !reflect.DeepEqual(s, want) {
		t.Errorf("derived threshold plans %v, want %v", s.DeviceLoad(), want.DeviceLoad())
	}
}

func TestHarMoEnyErrors(t *testing.T) {
	b, p := harFigure6()
	short := b
	short.Score = short.Score[1:]
	home := b
	home.Home = make([]int, b.Tokens())
	home.Home[3] = 3
	for _, c := range []struct {
		name string
		h    HarMoEny
		b    Batch
		p    Placement
	}{
		{"negative threshold", HarMoEny{Threshold: -1}, b, p},
		{"no threshold, no hardware", HarMoEny{}, b, p},
		{"scores short", HarMoEny{Threshold: 1}, short, p},
		{"home off the devices", HarMoEny{Threshold: 1}, home, p},
		{"placement of other experts", HarMoEny{Threshold: 1}, b, Placement{Devices: 3, Holders: [][]int{{0}, {1}}}},
		{"expert nowhere", HarMoEny{Threshold: 1}, b, Placement{Devices: 3, Holders: [][]int{{0}, {1}, {}}}},
		{"no devices", HarMoEny{Threshold: 1}, b, Placement{Holders: [][]int{{0}, {1}, {2}}}},
	} {
		if _, err := c.h.Plan(c.b, c.p); err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
	if (HarMoEny{}).Name() != "harmoeny" {
		t.Errorf("name %q", HarMoEny{}.Name())
	}
	// An empty batch plans to nothing.
	s, err := HarMoEny{Threshold: 1}.Plan(Batch{Routing: Routing{Experts: 3, K: 1}}, p)
	if err != nil || len(s.Assign) != 0 || len(s.Fetches) != 0 {
		t.Errorf("empty batch: %+v, %v", s, err)
	}
}
