package multigpu

import (
	"cmp"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// macsHand is the batch worked by hand below: 9 tokens, top-1 of 4 experts on 2 devices.
//
//	placement: expert 0 and 1 on device 0, expert 2 on both, expert 3 on device 1
//	classes:   0 visual, 1 shared, 2 text, 3 shared
//
//	token  modality  entropy  home  choice  score  gating scores of experts 0..3
//	0      text      -        0     2       0.8    0.05 0.1  0.8  0.05
//	1      text      -        1     2       0.5    0.2  0.1  0.5  0.2
//	2      text      -        0     2       0.7    0.1  0.1  0.7  0.1
//	3      image     1        0     0       0.6    0.6  0.2  0.1  0.1
//	4      image     3        1     0       0.9    0.9  0.03 0.05 0.02
//	5      image     1        1     0       0.5    0.5  0.2  0.2  0.1
//	6      image     3        0     0       0.7    0.7  0.1  0.15 0.05
//	7      text      -        1     3       0.9    0.02 0.03 0.05 0.9
//	8      text      -        1     3       0.6    0.1  0.1  0.2  0.6
//
// Text entropies are given (5) but play no part. The visual entropies 1, 3, 1, 3 have mean 2
// and standard deviation 1, so z = -+1/(1+eps) and, with delta 1.5, the informative patches
// (entropy 1) weigh a = sigmoid(1.5/(1+eps)) ~ 0.817574 and the background ones (entropy 3)
// b = 1 - a ~ 0.182426.
func macsHand() (Batch, Placement, MACS) {
	b := Batch{
		Routing: Routing{Experts: 4, K: 1,
			Choice: []int{2, 2, 2, 0, 0, 0, 0, 3, 3},
			Score:  []float32{0.8, 0.5, 0.7, 0.6, 0.9, 0.5, 0.7, 0.9, 0.6}},
		Probs: []float32{
			0.05, 0.1, 0.8, 0.05,
			0.2, 0.1, 0.5, 0.2,
			0.1, 0.1, 0.7, 0.1,
			0.6, 0.2, 0.1, 0.1,
			0.9, 0.03, 0.05, 0.02,
			0.5, 0.2, 0.2, 0.1,
			0.7, 0.1, 0.15, 0.05,
			0.02, 0.03, 0.05, 0.9,
			0.1, 0.1, 0.2, 0.6,
		},
		Home:     []int{0, 1, 0, 0, 1, 1, 0, 1, 1},
		Modality: []Modality{Text, Text, Text, Image, Image, Image, Image, Text, Text},
		Entropy:  []float32{5, 5, 5, 1, 3, 1, 3, 5, 5},
	}
	p := Placement{Devices: 2, Holders: [][]int{{0}, {0}, {0, 1}, {1}}}
	m := MACS{Gamma: 1, Delta: MACSDelta, Rho: MACSRho, Classes: []ExpertClass{Visual, Shared, TextExpert, Shared}, Reroute: true}
	return b, p, m
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9 }

func nearAll(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !near(a[i], b[i]) {
			return false
		}
	}
	return true
}

// macsLoads is the effective load each expert computes under s: the summed weight of every
// token it computes, top-k or rerouted.
func macsLoads(s Schedule, w []float64) []float64 {
	l := make([]float64, s.Experts)
	for _, a := range s.Assign {
		l[a.Expert] += w[a.Token]
	}
	return l
}

// The hand-worked batch, step by step.
//
// Weights: text 1; tokens 3, 5 a; tokens 4, 6 b. R_v = (2a + 2b) / (5 + 2a + 2b) = 2/7.
// C_base = floor(1 * 9 * 1 / 4) = 2; C_j = 2 * (1 + 0.6 * m_j * (2/7 - 1/2)) = 2 * (1 - 9/70 m_j):
// visual 122/70 ~ 1.742857, text 158/70 ~ 2.257143, shared 2.
// Effective loads: expert 0 2a + 2b = 2, expert 1 0, expert 2 3, expert 3 2.
//
// Expert 0 (2 > 1.742857) ranks its tokens by retention r = w * score: token 3 0.6a ~ 0.490545,
// token 5 0.5a ~ 0.408787, token 4 0.9b ~ 0.164183, token 6 0.7b ~ 0.127698. It keeps 3 and 5
// (2a ~ 1.635149); adding token 4 would make 2a + b ~ 1.817574 > 1.742857, so 4 and 6 leave.
// Token counting with capacity 2 would have kept 4 and 6, the background patches with the
// highest scores, and dropped the informative 3 and 5.
// Expert 2 (3 > 2.257143) keeps tokens 0 (0.8) and 2 (0.7), load 2, and token 1 (0.5) leaves.
// Experts 1 and 3 are within capacity.
//
// Rerouting, by retention: token 1 (0.5), 4 (0.164183), 6 (0.127698).
//   - Token 1 lives on device 1, which holds expert 2: it left device 1's copy, whose other
//     expert 3 is full (2 + 1 > 2). Dropped.
//   - Token 4 left expert 0 on device 0 (its home, device 1, has no copy): candidates expert 1
//     (0 + b <= 2, score 0.03) and expert 2 (2 + b ~ 2.182426 <= 2.257143, score 0.05). Expert 2
//     wins, computed on device 0, the copy on the device it was sent to.
//   - Token 6 left expert 0 on device 0: expert 2 scores 0.15 but 2 + 2b ~ 2.364851 >
//     2.257143; expert 1 takes it (0 + b <= 2, score 0.1).
//
// Final loads: expert 0 2a, 1 b, 2 2 + b, 3 2. Dropped 3 (tokens 1, 4, 6), rerouted 2.
func TestMACSByHand(t *testing.T) {
	a := 1 / (1 + math.Exp(-1.5/(1+macsEps)))
	bw := 1 / (1 + math.Exp(1.5/(1+macsEps)))
	b, _, m := macsHand()

	w := SemanticWeights(b, m.Delta)
	if want := []float64{1, 1, 1, a, bw, a, bw, 1, 1}; !nearAll(w, want) {
		t.Fatalf("weights %v, want %v", w, want)
	}
	if math.Abs(a-0.817574) > 1e-6 || !near(a+bw, 1) {
		t.Errorf("a = %v, b = %v; want ~0.817574 and 1 - a", a, bw)
	}
	if l := EffectiveLoads(b, w); !nearAll(l, []float64{2, 0, 3, 2}) {
		t.Errorf("effective loads %v, want [2 0 3 2]", l)
	}
	rv := VisualRatio(b, w)
	if !near(rv, 2.0/7) {
		t.Errorf("R_v = %v, want 2/7", rv)
	}
	c, err := m.Capacities(b, rv)
	if err != nil || !nearAll(c, []float64{122.0 / 70, 2, 158.0 / 70, 2}) {
		t.Errorf("capacities %v, %v; want [122/70 2 158/70 2]", c, err)
	}

	kept := []Assignment{
		{Token: 0, Expert: 2, From: 0, To: 0, Choice: 0, Score: 0.8},
		{Token: 2, Expert: 2, From: 0, To: 0, Choice: 0, Score: 0.7},
		{Token: 3, Expert: 0, From: 0, To: 0, Choice: 0, Score: 0.6},
		{Token: 5, Expert: 0, From: 1, To: 0, Choice: 0, Score: 0.5},
		{Token: 7, Expert: 3, From: 1, To: 1, Choice: 0, Score: 0.9},
		{Token: 8, Expert: 3, From: 1, To: 1, Choice: 0, Score: 0.6},
	}
	for _, tc := range []struct {
		name      string
		edit      func(*Batch, *MACS)
		assign    []Assignment
		dropped   int
		rerouted  int
		loads     []float64 // effective loads of the plan, by the weights of SemanticWeights
		capacity  []float64
		visualSum float64
	}{
		{
			name: "paper",
			edit: func(*Batch, *MACS) {},
			assign: append(slices.Clone(kept),
				Assignment{Token: 4, Expert: 2, From: 1, To: 0, Choice: -1, Score: 0.05},
				Assignment{Token: 6, Expert: 1, From: 0, To: 0, Choice: -1, Score: 0.1}),
			dropped: 3, rerouted: 2,
			loads: []float64{2 * a, bw, 2 + bw, 2},
		},
		{
			// Semantic affinity, eta 0.5, hidden states of dimension 2: token 4 (1, 0), token 6
			// (1, 1), the others 0; centroids expert 0 (0, 0), 1 (1, 0), 2 (0, 1), 3 (1, 0).
			// Token 4: expert 1 scores 0.5 * 0.03 + 0.5 * cos 0 = 0.515, expert 2 0.5 * 0.05 +
			// 0.5 * 0 = 0.025: expert 1 (load b). Token 6: expert 1 (2b <= 2) 0.5 * 0.1 +
			// 0.5/sqrt 2 ~ 0.403553, expert 2 (2 + b <= 2.257143) 0.5 * 0.15 + 0.5/sqrt 2 ~
			// 0.428553: expert 2. The affinity flips both decisions.
			name: "centroids",
			edit: func(b *Batch, m *MACS) {
				b.Dim = 2
				b.Features = make([]float32, 9*2)
				b.Features[4*2] = 1
				b.Features[6*2], b.Features[6*2+1] = 1, 1
				m.Eta = 0.5
				m.Centroids = []float32{0, 0, 1, 0, 0, 1, 1, 0}
			},
			assign: append(slices.Clone(kept),
				Assignment{Token: 4, Expert: 1, From: 1, To: 0, Choice: -1, Score: 0.03},
				Assignment{Token: 6, Expert: 2, From: 0, To: 0, Choice: -1, Score: 0.15}),
			dropped: 3, rerouted: 2,
			loads: []float64{2 * a, bw, 2 + bw, 2},
		},
		{
			// The same affinities as "centroids", given by the batch as the engine's ranks
			// send them: token 4 is 1 to experts 1 and 3, token 6 1/sqrt 2 to experts 1 to 3.
			name: "affinity",
			edit: func(b *Batch, m *MACS) {
				b.Affinity = make([]float32, 9*4)
				b.Affinity[4*4+1], b.Affinity[4*4+3] = 1, 1
				for k := 1; k < 4; k++ {
					b.Affinity[6*4+k] = float32(1 / math.Sqrt2)
				}
				m.Eta = 0.5
			},
			assign: append(slices.Clone(kept),
				Assignment{Token: 4, Expert: 1, From: 1, To: 0, Choice: -1, Score: 0.03},
				Assignment{Token: 6, Expert: 2, From: 0, To: 0, Choice: -1, Score: 0.15}),
			dropped: 3, rerouted: 2,
			loads: []float64{2 * a, bw, 2 + bw, 2},
		},
		{
			name:    "no rerouting",
			edit:    func(_ *Batch, m *MACS) { m.Reroute = false },
			assign:  kept,
			dropped: 3,
			loads:   []float64{2 * a, 0, 2, 2},
		},
		{
			name:    "no gating scores beyond the top-k",
			edit:    func(b *Batch, _ *MACS) { b.Probs = nil },
			assign:  kept,
			dropped: 3,
			loads:   []float64{2 * a, 0, 2, 2},
		},
		{
			// Without entropies every token weighs 1: R_v = 4/9, C_j = 2 * (1 - m_j/30): visual
			// 58/30 ~ 1.933333, text 62/30 ~ 2.066667, shared 2. Expert 0 keeps only token 4
			// (score 0.9; 2 > 1.933333), the background patch, and tokens 6, 3, 5 leave; expert 2
			// keeps 0 and 2 (2 <= 2.066667), token 1 leaves. Rerouting by score 0.7, 0.6, then
			// 0.5 for tokens 1 and 5, text first: token 6 to expert 1 (load 1; expert 2 would be
			// 3), token 3 to expert 1 (load 2 <= 2), token 1 nowhere (expert 3 full), token 5
			// nowhere (expert 1 at capacity, expert 2 over).
			name: "no entropies",
			edit: func(b *Batch, _ *MACS) { b.Entropy = nil },
			assign: []Assignment{
				{Token: 0, Expert: 2, From: 0, To: 0, Choice: 0, Score: 0.8},
				{Token: 2, Expert: 2, From: 0, To: 0, Choice: 0, Score: 0.7},
				{Token: 4, Expert: 0, From: 1, To: 0, Choice: 0, Score: 0.9},
				{Token: 7, Expert: 3, From: 1, To: 1, Choice: 0, Score: 0.9},
				{Token: 8, Expert: 3, From: 1, To: 1, Choice: 0, Score: 0.6},
				{Token: 6, Expert: 1, From: 0, To: 0, Choice: -1, Score: 0.1},
				{Token: 3, Expert: 1, From: 0, To: 0, Choice: -1, Score: 0.2},
			},
			dropped: 4, rerouted: 2,
			loads:    []float64{1, 2, 2, 2},
			capacity: []float64{58.0 / 30, 2, 62.0 / 30, 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, p, m := macsHand()
			tc.edit(&b, &m)
			s, err := m.Plan(b, p)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(b, p); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.Assign, tc.assign) {
				t.Errorf("assignments\n%+v\nwant\n%+v", s.Assign, tc.assign)
			}
			if s.Dropped != tc.dropped || s.Rerouted != tc.rerouted {
				t.Errorf("dropped %d, rerouted %d; want %d, %d", s.Dropped, s.Rerouted, tc.dropped, tc.rerouted)
			}
			w := SemanticWeights(b, m.Delta)
			if l := macsLoads(s, w); !nearAll(l, tc.loads) {
				t.Errorf("loads %v, want %v", l, tc.loads)
			}
			if tc.capacity != nil {
				c, _ := m.Capacities(b, VisualRatio(b, w))
				if !nearAll(c, tc.capacity) {
					t.Errorf("capacities %v, want %v", c, tc.capacity)
				}
			}
		})
	}
}

func TestSemanticWeights(t *testing.T) {
	sig := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	routing := func(T int) Routing {
		return Routing{Experts: 1, K: 1, Choice: make([]int, T), Score: make([]float32, T)}
	}
	for _, c := range []struct {
		name     string
		modality []Modality
		entropy  []float32
		delta    float64
		want     []float64
	}{
		{"no entropy", []Modality{Image, Text}, nil, 1.5, []float64{1, 1}},
		{"all text", nil, []float32{1, 2}, 1.5, []float64{1, 1}},
		// One visual token, or visual tokens of one entropy: sigma 0, z 0, weight 1/2.
		{"one visual token", []Modality{Text, Image}, []float32{0, 4}, 1.5, []float64{1, 0.5}},
		{"equal entropies", []Modality{Video, Image, Text}, []float32{2, 2, 9}, 1.5, []float64{0.5, 0.5, 1}},
		// Video counts as visual: entropies 0 and 4 (image, video), mean 2, sigma 2, z -+1/(1+eps/2).
		{"image and video", []Modality{Image, Video, Text}, []float32{0, 4, 7}, 2,
			[]float64{sig(2 * 2 / (2 + macsEps)), sig(-2 * 2 / (2 + macsEps)), 1}},
		// delta 0: every visual token weighs 1/2, whatever its entropy.
		{"delta 0", []Modality{Image, Image}, []float32{0, 4}, 0, []float64{0.5, 0.5}},
		// Entropies 1, 2, 6: mean 3, variance (4 + 1 + 9)/3, sigma sqrt(14/3) ~ 2.160247.
		{"three", []Modality{Image, Image, Image}, []float32{1, 2, 6}, 1.5, []float64{
			sig(1.5 * 2 / (math.Sqrt(14.0/3) + macsEps)),
			sig(1.5 * 1 / (math.Sqrt(14.0/3) + macsEps)),
			sig(-1.5 * 3 / (math.Sqrt(14.0/3) + macsEps)),
		}},
	} {
		b := Batch{Routing: routing(max(len(c.modality), len(c.entropy))), Modality: c.modality, Entropy: c.entropy}
		if err := b.Check(1); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := SemanticWeights(b, c.delta); !nearAll(got, c.want) {
			t.Errorf("%s: weights %v, want %v", c.name, got, c.want)
		}
	}
}

func TestClassifyExperts(t *testing.T) {
	// 100 text, 60 image and 40 video tokens (100 visual).
	tokens := [3]float64{100, 60, 40}
	counts := [][3]float64{
		{10, 30, 10}, // f_vis 0.4, f_txt 0.1: +0.3, visual
		{50, 10, 0},  // 0.1 - 0.5 = -0.4, text
		{20, 15, 10}, // 0.25 - 0.2 = +0.05, shared
		{40, 20, 13}, // 0.33 - 0.4 = -0.07, shared
		{0, 0, 0},    // never active: shared
	}
	got, err := ClassifyExperts(counts, tokens, MACSClassThreshold)
	if want := []ExpertClass{Visual, TextExpert, Shared, Shared, Shared}; err != nil || !slices.Equal(got, want) {
		t.Errorf("classes %v, %v; want %v", got, err, want)
	}
	// A lower threshold makes expert 2 visual and expert 3 text.
	got, _ = ClassifyExperts(counts, tokens, 0.04)
	if want := []ExpertClass{Visual, TextExpert, Visual, TextExpert, Shared}; !slices.Equal(got, want) {
		t.Errorf("threshold 0.04: classes %v, want %v", got, want)
	}
	for _, c := range []struct {
		counts    [][3]float64
		tokens    [3]float64
		threshold float64
		want      string
	}{
		{nil, tokens, 0.1, "no experts"},
		{counts, [3]float64{0, 60, 40}, 0.1, "want both"},
		{counts, [3]float64{100, 0, 0}, 0.1, "want both"},
		{counts, [3]float64{100, -1, 40}, 0.1, "image"},
		{counts, tokens, 0, "threshold"},
		{counts, tokens, math.NaN(), "threshold"},
		{[][3]float64{{1, math.NaN(), 0}}, tokens, 0.1, "expert 0"},
		{[][3]float64{{1, 2, -3}}, tokens, 0.1, "video"},
	} {
		if _, err := ClassifyExperts(c.counts, c.tokens, c.threshold); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ClassifyExperts(%v, %v, %v): %v, want an error mentioning %q", c.counts, c.tokens, c.threshold, err, c.want)
		}
	}
}

func TestActivationCountsAndCentroids(t *testing.T) {
	b, _, _ := macsHand()
	counts, tokens, err := ActivationCounts(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][3]float64{{0, 4, 0}, {0, 0, 0}, {3, 0, 0}, {2, 0, 0}}; !slices.Equal(counts, want) || tokens != [3]float64{5, 4, 0} {
		t.Errorf("counts %v, tokens %v", counts, tokens)
	}
	// Top-2 of 4 experts, dimension 2: token 0 (1, 2) chooses experts 0 and 1, token 1 (3, 4)
	// 2 and 0, token 2 (-1, 0) 1 and 2. Centroids: expert 0 (2, 3), expert 1 (0, 1), expert 2
	// (1, 2), expert 3, chosen by none, zero.
	c := Batch{
		Routing:  Routing{Experts: 4, K: 2, Choice: []int{0, 1, 2, 0, 1, 2}, Score: make([]float32, 6)},
		Features: []float32{1, 2, 3, 4, -1, 0},
		Dim:      2,
	}
	mu, err := ExpertCentroids(c)
	if want := []float32{2, 3, 0, 1, 1, 2, 0, 0}; err != nil || !slices.Equal(mu, want) {
		t.Errorf("centroids %v, %v; want %v", mu, err, want)
	}
	if _, err := ExpertCentroids(b); err == nil {
		t.Error("centroids without hidden states: no error")
	}
	if _, _, err := ActivationCounts(Batch{Routing: Routing{Experts: 2, K: 1, Choice: []int{2}, Score: []float32{1}}}); err == nil {
		t.Error("counts of a bad batch: no error")
	}
}

// macsRandom is a random batch, placement and MACS: any number of devices, replicated experts,
// homes given or not, mixed modalities, entropies, hidden states and centroids or not.
func macsRandom(rng *rand.Rand) (Batch, Placement, MACS) {
	E := 2 + rng.IntN(7)
	D := 1 + rng.IntN(4)
	K := 1 + rng.IntN(min(E, 3))
	T := rng.IntN(41)
	p := Placement{Devices: D, Holders: make([][]int, E)}
	for e := range p.Holders {
		p.Holders[e] = rng.Perm(D)[:1+rng.IntN(D)]
	}
	b := Batch{Routing: Routing{Experts: E, K: K}, Probs: make([]float32, T*E)}
	for t := range T {
		row := b.Probs[t*E : (t+1)*E]
		var sum float32
		for e := range row {
			row[e] = float32(rng.ExpFloat64())
			sum += row[e]
		}
		for e := range row {
			row[e] /= sum
		}
		for _, e := range topIndicesMACS(row, K) {
			b.Choice = append(b.Choice, e)
			b.Score = append(b.Score, row[e])
		}
	}
	if rng.IntN(4) == 0 {
		b.Probs = nil
	}
	if rng.IntN(2) == 0 {
		b.Home = make([]int, T)
		for t := range b.Home {
			b.Home[t] = rng.IntN(D)
		}
	}
	if rng.IntN(5) != 0 {
		b.Modality = make([]Modality, T)
		for t := range b.Modality {
			b.Modality[t] = Modality(rng.IntN(3))
		}
	}
	if rng.IntN(4) != 0 {
		b.Entropy = make([]float32, T)
		for t := range b.Entropy {
			b.Entropy[t] = float32(5 * rng.Float64())
		}
	}
	m := MACS{Gamma: 2 * rng.Float64(), Delta: 3 * rng.Float64(), Rho: 2 * rng.Float64(), Eta: rng.Float64(), Reroute: rng.IntN(4) != 0}
	if rng.IntN(2) == 0 {
		m.MinCapacity = 2 * rng.Float64()
	}
	if rng.IntN(3) != 0 {
		m.Classes = make([]ExpertClass, E)
		for j := range m.Classes {
			m.Classes[j] = ExpertClass(rng.IntN(3) - 1)
		}
	}
	if rng.IntN(2) == 0 {
		b.Dim = 1 + rng.IntN(4)
		b.Features = make([]float32, T*b.Dim)
		for i := range b.Features {
			b.Features[i] = float32(rng.NormFloat64())
		}
		m.Centroids = make([]float32, E*b.Dim)
		for i := range m.Centroids {
			if i/b.Dim != 0 { // expert 0's centroid stays zero: no direction
				m.Centroids[i] = float32(rng.NormFloat64())
			}
		}
	}
	return b, p, m
}

func topIndicesMACS(v []float32, k int) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(v[b], v[a]) })
	return idx[:k]
}

// keptSlots says which top-k choices (t*K+i) a schedule computes.
func keptSlots(s Schedule, b Batch) []bool {
	kept := make([]bool, len(b.Choice))
	for _, a := range s.Assign {
		if a.Choice >= 0 {
			kept[a.Token*b.K+a.Choice] = true
		}
	}
	return kept
}

// Every plan of a random batch is a valid schedule, and:
//   - capacity: every expert's effective load, the summed weight w of all the tokens it
//     computes, its top-k tokens and those rerouted to it alike, is at most C_j (to rounding);
//   - retention order: the top-k tokens an expert keeps are a prefix of its tokens ranked by
//     retention score (then weight, text first, batch order), and the first it does not keep
//     would have taken it over C_j;
//   - locality: a rerouted token goes to the device that computes an expert it left, at most
//     once per choice it left, and only where rerouting is on and the batch has Probs;
//   - rerouting changes no top-k decision, and a batch with no expert over capacity loses
//     nothing;
//   - the plan is deterministic.
func TestMACSInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 14))
	drops, reroutes := 0, 0
	for iter := range 3000 {
		b, p, m := macsRandom(rng)
		s, err := m.Plan(b, p)
		if err != nil {
			t.Fatalf("%d: %v", iter, err)
		}
		if err := s.Check(b, p); err != nil {
			t.Fatalf("%d: %v", iter, err)
		}
		if again, _ := m.Plan(b, p); !reflect.DeepEqual(s, again) {
			t.Fatalf("%d: two plans of one batch differ", iter)
		}
		drops += s.Dropped
		reroutes += s.Rerouted
		K := b.K
		w := SemanticWeights(b, m.Delta)
		c, err := m.Capacities(b, VisualRatio(b, w))
		if err != nil {
			t.Fatal(err)
		}
		for e, l := range macsLoads(s, w) {
			if l > c[e]+1e-9 {
				t.Fatalf("%d: expert %d computes effective load %v over its capacity %v", iter, e, l, c[e])
			}
		}
		kept := keptSlots(s, b)
		visual := func(t int) int { // text first
			if b.ModalityOf(t).Visual() {
				return 1
			}
			return 0
		}
		retention := func(t int) float64 {
			return w[t] * float64(slices.Max(b.Score[t*K:(t+1)*K]))
		}
		for e := range b.Experts {
			var slots []int
			for i, x := range b.Choice {
				if x == e {
					slots = append(slots, i)
				}
			}
			slices.SortFunc(slots, func(x, y int) int {
				tx, ty := x/K, y/K
				if c := cmp.Compare(retention(ty), retention(tx)); c != 0 {
					return c
				}
				if c := cmp.Compare(w[ty], w[tx]); c != 0 {
					return c
				}
				if c := cmp.Compare(visual(tx), visual(ty)); c != 0 {
					return c
				}
				return cmp.Compare(x, y)
			})
			var sum float64
			for n, i := range slots {
				if !kept[i] {
					if sum+w[i/K] <= c[e]-1e-9 {
						t.Fatalf("%d: expert %d drops token %d (weight %v) with load %v of %v", iter, e, i/K, w[i/K], sum, c[e])
					}
					for _, j := range slots[n:] {
						if kept[j] {
							t.Fatalf("%d: expert %d keeps token %d after dropping the better-ranked %d", iter, e, j/K, i/K)
						}
					}
					break
				}
				sum += w[i/K]
			}
		}
		// Locality: each token's reroutes pair off with the devices of the choices it left.
		left := map[[2]int]int{} // (token, device) -> choices left there
		for i, k := range kept {
			if !k {
				home := b.HomeOf(i/K, p.Devices)
				left[[2]int{i / K, macsHolder(p, b.Choice[i], home)}]++
			}
		}
		for _, a := range s.Assign {
			if a.Choice >= 0 {
				continue
			}
			if !m.Reroute || b.Probs == nil {
				t.Fatalf("%d: rerouted %+v with rerouting off or no Probs", iter, a)
			}
			if left[[2]int{a.Token, a.To}] == 0 {
				t.Fatalf("%d: rerouted %+v to a device it left no choice on", iter, a)
			}
			left[[2]int{a.Token, a.To}]--
		}
		off := m
		off.Reroute = false
		s2, err := off.Plan(b, p)
		if err != nil || s2.Dropped != s.Dropped || s2.Rerouted != 0 || !slices.Equal(keptSlots(s2, b), kept) {
			t.Fatalf("%d: without rerouting: %v, dropped %d, top-k decisions differ", iter, err, s2.Dropped)
		}
		over := false
		for e, l := range EffectiveLoads(b, w) {
			over = over || l > c[e]-1e-9
		}
		if !over && s.Dropped != 0 {
			t.Fatalf("%d: no expert over capacity, yet %d choices dropped", iter, s.Dropped)
		}
	}
	if drops == 0 || reroutes == 0 {
		t.Errorf("the random batches never dropped (%d) or rerouted (%d): the test tests nothing", drops, reroutes)
	}
}

// A text token is never dropped before a visual token of the same router score: a text token
// weighs 1 and any visual token less (sigmoid < 1), so at equal (positive) top score the visual
// token's retention is lower and it leaves first; low-entropy image tokens, weighing nearly 1,
// are the closest call. Whenever a text token's choice of an expert is not computed (dropped
// or rerouted away), every visual token of the same top score that chose the expert has lost
// its choice too.
func TestMACSTextNotDroppedBeforeVisual(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 92))
	scores := []float32{0.2, 0.4, 0.6}
	checked := 0
	for iter := range 2000 {
		E := 2 + rng.IntN(5)
		K := 1 + rng.IntN(2)
		T := 4 + rng.IntN(30)
		D := 1 + rng.IntN(3)
		p, err := RoundRobin(E, D)
		if err != nil {
			t.Fatal(err)
		}
		b := Batch{Routing: Routing{Experts: E, K: K}, Modality: make([]Modality, T), Entropy: make([]float32, T)}
		for t := range T {
			for _, e := range rng.Perm(E)[:K] {
				b.Choice = append(b.Choice, e)
				b.Score = append(b.Score, scores[rng.IntN(len(scores))])
			}
			b.Modality[t] = Modality(rng.IntN(3))
			// Low entropies for most visual tokens, some high.
			b.Entropy[t] = float32(rng.Float64())
			if rng.IntN(4) == 0 {
				b.Entropy[t] = float32(3 + 2*rng.Float64())
			}
		}
		if rng.IntN(2) == 0 {
			b.Probs = make([]float32, T*E)
			for i := range b.Probs {
				b.Probs[i] = float32(rng.Float64())
			}
			for i, e := range b.Choice {
				b.Probs[i/K*E+e] = b.Score[i]
			}
		}
		m := MACS{Gamma: 0.3 + 0.8*rng.Float64(), Delta: MACSDelta, Rho: MACSRho, Reroute: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			m.Classes = make([]ExpertClass, E)
			for j := range m.Classes {
				m.Classes[j] = ExpertClass(rng.IntN(3) - 1)
			}
		}
		s, err := m.Plan(b, p)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Check(b, p); err != nil {
			t.Fatal(err)
		}
		kept := keptSlots(s, b)
		top := func(t int) float32 { return slices.Max(b.Score[t*K : (t+1)*K]) }
		for i, e := range b.Choice {
			if kept[i] || b.ModalityOf(i/K) != Text {
				continue
			}
			for j, f := range b.Choice {
				if f == e && b.ModalityOf(j/K).Visual() && top(j/K) == top(i/K) {
					checked++
					if kept[j] {
						t.Fatalf("%d: text token %d lost expert %d while visual token %d (entropy %v) of the same score %v kept it",
							iter, i/K, e, j/K, b.Entropy[j/K], top(i/K))
					}
				}
			}
		}
	}
	if checked < 100 {
		t.Errorf("only %d text/visual pairs checked", checked)
	}
}

// With rho 0 and a text-only batch every weight is 1 and every capacity the base: MACS without
// rerouting is capacity-aware token drop by router score, ties by batch order, for top-1
// routing where the retention score (the token's top score) is the score of its one choice.
func TestMACSReducesToTokenDrop(t *testing.T) {
	rng := rand.New(rand.NewPCG(65, 35))
	for iter := range 500 {
		b, p, m := macsRandom(rng)
		if b.K != 1 {
			continue
		}
		b.Modality = nil // all text; the entropies stay and must not matter
		// Few distinct scores, so that ties (broken by batch order in both) abound.
		b.Probs = nil
		for i := range b.Score {
			b.Score[i] = float32(1+rng.IntN(3)) / 4
		}
		m.Rho, m.MinCapacity, m.Reroute = 0, 0, false
		s, err := m.Plan(b, p)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Capacity(b.Tokens(), b.K, b.Experts, m.Gamma)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Drop(b.Routing, c, ByScore, 0)
		if err != nil {
			t.Fatal(err)
		}
		load := s.ExpertLoad()
		if !slices.Equal(keptSlots(s, b), d.Kept) || s.Dropped != d.Dropped || !slices.Equal(load, d.Load) {
			t.Fatalf("%d: MACS keeps %v (dropped %d, loads %v), token drop %v (%d, %v)",
				iter, keptSlots(s, b), s.Dropped, load, d.Kept, d.Dropped, d.Load)
		}
	}
}

// A batch that carries its tokens' affinities plans exactly as one that carries their hidden
// states beside MACS's centroids: the engine's ranks send the former.
func TestMACSAffinityAsFeatures(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 21))
	n := 0
	for iter := range 1000 {
		b, p, m := macsRandom(rng)
		if b.Features == nil || b.Probs == nil || !m.Reroute {
			continue
		}
		want, err := m.Plan(b, p)
		if err != nil {
			t.Fatal(err)
		}
		a := b
		a.Features, a.Dim = nil, 0
		a.Affinity = make([]float32, b.Tokens()*b.Experts)
		norms := CentroidNorms(m.Centroids, b.Dim)
		for t := range b.Tokens() {
			Affinities(b.Features[t*b.Dim:(t+1)*b.Dim], m.Centroids, norms, a.Affinity[t*b.Experts:(t+1)*b.Experts])
		}
		mc := m
		mc.Centroids = nil
		got, err := mc.Plan(a, p)
		if err != nil {
			t.Fatalf("%d: %v", iter, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%d: with affinities %+v, with features %+v", iter, got, want)
		}
		n += want.Rerouted
	}
	if n == 0 {
		t.Fatal("no token was rerouted: the comparison tested nothing")
	}
}

func TestMACSBadInput(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*Batch, *Placement, *MACS)
		want string
	}{
		{"bad choice", func(b *Batch, _ *Placement, _ *MACS) { b.Choice[0] = 4 }, "expert 4 of 4"},
		{"bad home", func(b *Batch, _ *Placement, _ *MACS) { b.Home[0] = 2 }, "device 2 of 2"},
		{"NaN entropy", func(b *Batch, _ *Placement, _ *MACS) { b.Entropy[3] = float32(math.NaN()) }, "entropy"},
		{"short probs", func(b *Batch, _ *Placement, _ *MACS) { b.Probs = b.Probs[1:] }, "gating scores"},
		{"placement", func(_ *Batch, p *Placement, _ *MACS) { p.Holders = p.Holders[:3] }, "placement"},
		{"no holder", func(_ *Batch, p *Placement, _ *MACS) { p.Holders[1] = nil }, "no device holds expert 1"},
		{"classes", func(_ *Batch, _ *Placement, m *MACS) { m.Classes = m.Classes[:2] }, "2 expert classes"},
		{"class value", func(_ *Batch, _ *Placement, m *MACS) { m.Classes[1] = 2 }, "ExpertClass(2)"},
		{"gamma NaN", func(_ *Batch, _ *Placement, m *MACS) { m.Gamma = math.NaN() }, "capacity factor"},
		{"gamma negative", func(_ *Batch, _ *Placement, m *MACS) { m.Gamma = -1 }, "capacity factor"},
		{"gamma Inf", func(_ *Batch, _ *Placement, m *MACS) { m.Gamma = math.Inf(1) }, "capacity factor"},
		{"delta", func(_ *Batch, _ *Placement, m *MACS) { m.Delta = -1.5 }, "delta"},
		{"rho", func(_ *Batch, _ *Placement, m *MACS) { m.Rho = math.Inf(1) }, "rho"},
		{"eta", func(_ *Batch, _ *Placement, m *MACS) { m.Eta = 1.5 }, "eta"},
		{"min capacity", func(_ *Batch, _ *Placement, m *MACS) { m.MinCapacity = math.NaN() }, "minimum capacity"},
		{"twice", func(b *Batch, _ *Placement, _ *MACS) {
			b.K = 2
			b.Choice = b.Choice[:8]
			b.Score = b.Score[:8]
			b.Choice[1] = b.Choice[0]
			b.Probs, b.Home, b.Modality, b.Entropy = nil, nil, nil, nil
		}, "twice"},
		{"centroids size", func(_ *Batch, _ *Placement, m *MACS) { m.Centroids = make([]float32, 6) }, "centroid values"},
		{"centroids dimension", func(b *Batch, _ *Placement, m *MACS) {
			b.Dim, b.Features = 2, make([]float32, 18)
			m.Centroids = make([]float32, 12)
		}, "dimension 2"},
		{"centroids NaN", func(_ *Batch, _ *Placement, m *MACS) {
			m.Centroids = make([]float32, 8)
			m.Centroids[5] = float32(math.NaN())
		}, "centroid of expert 2"},
		{"affinity size", func(b *Batch, _ *Placement, _ *MACS) { b.Affinity = make([]float32, 35) }, "35 affinities for 9 tokens of 4 experts"},
		{"affinity NaN", func(b *Batch, _ *Placement, _ *MACS) {
			b.Affinity = make([]float32, 36)
			b.Affinity[6] = float32(math.NaN())
		}, "affinity of token 1 for expert 2"},
		{"affinity not a cosine", func(b *Batch, _ *Placement, _ *MACS) {
			b.Affinity = make([]float32, 36)
			b.Affinity[0] = 2
		}, "want a cosine"},
		{"features NaN", func(b *Batch, _ *Placement, m *MACS) {
			b.Dim, b.Features = 2, make([]float32, 18)
			b.Features[9] = float32(math.Inf(-1))
			m.Centroids = make([]float32, 8)
		}, "hidden state of token 4"},
	} {
		b, p, m := macsHand()
		c.edit(&b, &p, &m)
		if s, err := m.Plan(b, p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %+v, %v; want an error mentioning %q", c.name, s, err, c.want)
		}
	}
	b, _, m := macsHand()
	if _, err := m.Capacities(b, math.NaN()); err == nil {
		t.Error("Capacities at R_v NaN: no error")
	}
	if (MACS{}).Name() != "macs" || DefaultMACS(1).Delta != MACSDelta || DefaultMACS(1).Rho != MACSRho {
		t.Error("name or defaults")
	}
	// The default plans the hand batch: nothing in it is degenerate.
	_, p, _ := macsHand()
	if s, err := DefaultMACS(1).Plan(b, p); err != nil || s.Check(b, p) != nil {
		t.Errorf("default: %v", err)
	}
}

// Local expansion (appendix A.5) only adds: the top-k choices computed and dropped are those
// of MACS without it, every added expert is on the token's own device (no extra traffic),
// and no expert exceeds its capacity. With capacity to spare it puts idle experts to work.
func TestMACSLocalExpansion(t *testing.T) {
	p, err := RoundRobin(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(40) {
		sk := Skew{Experts: 16, K: 4, Tokens: 96, Alpha: 0.5, Hot: 2, Seed: seed}
		b, err := sk.Batch(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, gamma := range []float64{0.7, 1, 3} {
			plain := DefaultMACS(gamma)
			exp := plain
			exp.Expand = true
			s0, err := plain.Plan(b, p)
			if err != nil {
				t.Fatal(err)
			}
			s1, err := exp.Plan(b, p)
			if err != nil {
				t.Fatal(err)
			}
			if err := s1.Check(b, p); err != nil {
				t.Fatalf("seed %d, gamma %v: %v", seed, gamma, err)
			}
			if s1.Dropped != s0.Dropped || s1.Rerouted < s0.Rerouted {
				t.Errorf("seed %d, gamma %v: expansion dropped %d (without %d), added %d (without %d)", seed, gamma, s1.Dropped, s0.Dropped, s1.Rerouted, s0.Rerouted)
			}
			for i, a := range s0.Assign {
				if s1.Assign[i] != a {
					t.Fatalf("seed %d, gamma %v: assignment %d changed from %+v to %+v", seed, gamma, i, a, s1.Assign[i])
				}
			}
			caps, err := exp.Capacities(b, VisualRatio(b, SemanticWeights(b, exp.Delta)))
			if err != nil {
				t.Fatal(err)
			}
			load := make([]float64, 16)
			for _, a := range s1.Assign {
				load[a.Expert]++ // text only: every weight is 1
			}
			for i, a := range s1.Assign[len(s0.Assign):] {
				if a.From != a.To || !p.Holds(a.To, a.Expert) || a.Choice != -1 {
					t.Errorf("seed %d, gamma %v: added assignment %d %+v leaves the token's device", seed, gamma, i, a)
				}
			}
			for e, l := range load {
				if l > caps[e] {
					t.Errorf("seed %d, gamma %v: expert %d computes %v tokens, capacity %v", seed, gamma, e, l, caps[e])
				}
			}
			if gamma == 3 && s1.Rerouted-s0.Rerouted < 96 {
				t.Errorf("seed %d: ample capacity added only %d experts for 96 tokens", seed, s1.Rerouted-s0.Rerouted)
			}
		}
	}
}
