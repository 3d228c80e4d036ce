package offload

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// The predictors below stand in for the Commit Router (issue 5) in timing runs. Each is
// called once per (token, MoE layer), in order, before that layer routes; the truth it is
// given is the route it is predicting, which only Oracle and Accuracy may look at (to model
// a predictor of known quality) and which the heuristics only remember for later tokens.

// Oracle predicts exactly what the router will choose.
type Oracle struct{}

func (Oracle) Predict(_, _ int, truth []int) []int { return slices.Clone(truth) }

// Accuracy models a predictor whose top-k overlaps the router's in a share p of experts on
// average: each chosen expert is kept with probability p, else replaced by one the router
// did not choose. A learnt predictor's mistakes are plausible experts, not random ones, so a
// replacement is drawn in proportion to how often the layer has chosen each expert so far
// (plus one): uniform replacements would be mostly cold experts and overstate the bytes a
// wrong prediction costs. First, when set (0 to 1), is the share for each token's first MoE
// layer instead: the Commit Router predicts it from the previous token, and gets 0.44 to
// 0.47 of it right where it gets 0.73 to 0.93 of the later layers (issue 5).
type Accuracy struct {
	P       float64
	First   float64 // <0: P
	Experts int
	rng     *rand.Rand
	counts  map[int][]float64
}

// NewAccuracy returns a deterministic Accuracy predictor.
func NewAccuracy(p float64, experts int, seed uint64) (*Accuracy, error) {
	if !(p >= 0 && p <= 1) || experts < 1 {
		return nil, fmt.Errorf("accuracy predictor: p %v over %d experts: want 0 <= p <= 1", p, experts)
	}
	return &Accuracy{P: p, First: -1, Experts: experts, rng: rand.New(rand.NewPCG(seed, 0xacc))}, nil
}

func (a *Accuracy) Predict(_, j int, truth []int) []int {
	if a.counts == nil {
		a.counts = map[int][]float64{}
	}
	c := a.counts[j]
	if c == nil {
		c = make([]float64, a.Experts)
		for i := range c {
			c[i] = 1
		}
		a.counts[j] = c
	}
	defer func() {
		for _, e := range truth {
			c[e]++
		}
	}()
	var total float64
	for _, v := range c {
		total += v
	}
	out := make([]int, 0, len(truth))
	p := a.P
	if j == 0 && a.First >= 0 {
		p = a.First
	}
	var wrong []int
	for _, e := range truth {
		if a.rng.Float64() < p {
			out = append(out, e)
		} else {
			wrong = append(wrong, e)
		}
	}
	for range wrong {
		if len(truth) >= a.Experts {
			break // no expert outside the truth to pick
		}
		for {
			e := drawWeighted(a.rng, c, total)
			if !slices.Contains(truth, e) && !slices.Contains(out, e) {
				out = append(out, e)
				break
			}
		}
	}
	for _, e := range wrong { // only when every expert is chosen anyway
		if len(out) == len(truth) {
			break
		}
		out = append(out, e)
	}
	return out
}

// drawWeighted draws an index in proportion to w (whose sum is total).
func drawWeighted(r *rand.Rand, w []float64, total float64) int {
	u := r.Float64() * total
	for i, v := range w {
		if u < v {
			return i
		}
		u -= v
	}
	return len(w) - 1
}

// MostUsed returns the k experts with the highest counts, most used first, ties to the lower
// id.
func MostUsed(counts []int, k int) []int {
	idx := make([]int, len(counts))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(counts[b], counts[a]) })
	return idx[:min(k, len(idx))]
}

// ParsePredictor reads the name of a modelled predictor: oracle, or accuracy=P[,first=Q] (Q
// for each token's first MoE layer, P for the others). (prev-token and frequency are the
// engine offloader's own heuristics, which predict from the routing it has seen, not from
// the truth.)
func ParsePredictor(s string, experts int, seed uint64) (Predictor, error) {
	name, val, _ := strings.Cut(strings.TrimSpace(s), "=")
	switch name {
	case "oracle":
		return Oracle{}, nil
	case "accuracy":
		val, first, hasFirst := strings.Cut(val, ",")
		bad := fmt.Errorf("predictor %q: want accuracy=P or accuracy=P,first=Q with 0 <= P, Q <= 1", s)
		p, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, bad
		}
		a, err := NewAccuracy(p, experts, seed)
		if err != nil || !hasFirst {
			return a, err
		}
		q, ok := strings.CutPrefix(first, "first=")
		if a.First, err = strconv.ParseFloat(q, 64); !ok || err != nil || !(a.First >= 0 && a.First <= 1) {
			return nil, bad
		}
		return a, nil
	}
	return nil, fmt.Errorf("unknown modelled predictor %q: want oracle or accuracy=P[,first=Q]", s)
}
