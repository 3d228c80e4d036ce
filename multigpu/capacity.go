package multigpu

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Routing is one MoE layer's routing of a batch: for every token its top-k experts and their
// router scores (the gating probabilities after softmax and top-k), in top-k order.
type Routing struct {
	Experts int
	K       int
	Choice  []int     // tokens*K expert ids
	Score   []float32 // tokens*K scores
}

// Tokens is the batch size.
func (r Routing) Tokens() int {
	if r.K == 0 {
		return 0
	}
	return len(r.Choice) / r.K
}

func (r Routing) check() error {
	switch {
	case r.Experts < 1 || r.K < 1 || r.K > r.Experts:
		return fmt.Errorf("routing: %d experts, top-%d: want 1 <= k <= experts", r.Experts, r.K)
	case len(r.Choice)%r.K != 0 || len(r.Score) != len(r.Choice):
		return fmt.Errorf("routing: %d choices and %d scores for top-%d", len(r.Choice), len(r.Score), r.K)
	}
	for i, e := range r.Choice {
		if e < 0 || e >= r.Experts {
			return fmt.Errorf("routing: choice %d of token %d is expert %d of %d", i%r.K, i/r.K, e, r.Experts)
		}
		if s := float64(r.Score[i]); math.IsNaN(s) || math.IsInf(s, 0) {
			return fmt.Errorf("routing: score %d of token %d is %v", i%r.K, i/r.K, s)
		}
	}
	return nil
}

// Capacity is the most tokens one expert takes from a batch of tokens routed top-k over
// experts: floor(gamma * tokens * k / experts), the capacity factor gamma times the mean load
// (seeds/000 §3.1, seeds/002).
func Capacity(tokens, k, experts int, gamma float64) (int, error) {
	if tokens < 0 || k < 1 || experts < 1 || k > experts {
		return 0, fmt.Errorf("capacity: %d tokens, top-%d of %d experts", tokens, k, experts)
	}
	if !(gamma >= 0) || math.IsInf(gamma, 0) {
		return 0, fmt.Errorf("capacity factor %v: want 0 or more", gamma)
	}
	c := math.Floor(gamma * float64(tokens) * float64(k) / float64(experts))
	return int(min(c, math.MaxInt32)), nil
}

// DropMetric says which tokens an expert over capacity keeps (seeds/000 §3.1).
type DropMetric int

const (
	// ByScore keeps the tokens with the highest router scores: stable under reordering of
	// the batch, and the best for quality in the paper's Table 1.
	ByScore        DropMetric = iota
	ByOrder                   // keeps the first tokens of the batch
	ByReverseOrder            // keeps the last
	ByRandom                  // keeps a random subset (seeded)
)

func (m DropMetric) String() string {
	switch m {
	case ByScore:
		return "score"
	case ByOrder:
		return "order"
	case ByReverseOrder:
		return "reverse"
	case ByRandom:
		return "random"
	}
	return fmt.Sprintf("DropMetric(%d)", int(m))
}

// Valid says whether m is one of the metrics.
func (m DropMetric) Valid() bool { return m >= ByScore && m <= ByRandom }

// ParseDropMetric reads score, order, reverse or random.
func ParseDropMetric(s string) (DropMetric, error) {
	for m := ByScore; m <= ByRandom; m++ {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("drop metric %q: want score, order, reverse or random", s)
}

// DropPlan is what capacity-aware token drop keeps of a batch.
type DropPlan struct {
	// Kept[t*K+i] says whether token t's i-th choice is computed; a dropped choice
	// contributes nothing, and a token with every choice dropped passes through the
	// residual unchanged.
	Kept []bool
	// Load is the tokens each expert computes; Dropped the choices dropped.
	Load    []int
	Dropped int
}

// Drop enforces capacity on every expert: an expert chosen by more tokens keeps capacity of
// them by metric (seed draws ByRandom) and drops the others' choice of it.
func Drop(r Routing, capacity int, metric DropMetric, seed uint64) (DropPlan, error) {
	if err := r.check(); err != nil {
		return DropPlan{}, err
	}
	if capacity < 0 {
		return DropPlan{}, fmt.Errorf("token drop: capacity %d", capacity)
	}
	byExpert := make([][]int, r.Experts) // entries t*K+i, in batch order
	for i, e := range r.Choice {
		byExpert[e] = append(byExpert[e], i)
	}
	rng := rand.New(rand.NewPCG(seed, 0xd209))
	p := DropPlan{Kept: make([]bool, len(r.Choice)), Load: make([]int, r.Experts)}
	for e, slots := range byExpert {
		switch metric {
		case ByScore:
			// Highest score first; ties keep batch order, so the plan is deterministic.
			slices.SortStableFunc(slots, func(a, b int) int { return cmp.Compare(r.Score[b], r.Score[a]) })
		case ByOrder:
		case ByReverseOrder:
			slices.Reverse(slots)
		case ByRandom:
			rng.Shuffle(len(slots), func(i, j int) { slots[i], slots[j] = slots[j], slots[i] })
		default:
			return DropPlan{}, fmt.Errorf("token drop: unknown metric %v", metric)
		}
		n := min(capacity, len(slots))
		for _, s := range slots[:n] {
			p.Kept[s] = true
		}
		p.Load[e] = n
		p.Dropped += len(slots) - n
	}
	return p, nil
}
