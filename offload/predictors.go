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
// wrong prediction costs.
type Accuracy struct {
	P       float64
	Experts int
	rng     *rand.Rand
	counts  map[int][]float64
}

// NewAccuracy returns a deterministic Accuracy predictor.
func NewAccuracy(p float64, experts int, seed uint64) (*Accuracy, error) {
	if !(p >= 0 && p <= 1) || experts < 1 {
		return nil, fmt.Errorf("accuracy predictor: p %v over %d experts: want 0 <= p <= 1", p, experts)
	}
	return &Accuracy{P: p, Experts: experts, rng: rand.New(rand.NewPCG(seed, 0xacc))}, nil
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
	var wrong []int
	for _, e := range truth {
		if a.rng.Float64() < a.P {
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

// ParsePredictor reads the name of a modelled predictor: oracle, or accuracy=P. (prev-token
// and frequency are the engine offloader's own heuristics, which predict from the routing it
// has seen, not from the truth.)
func ParsePredictor(s string, experts int, seed uint64) (Predictor, error) {
	switch name, val, _ := strings.Cut(strings.TrimSpace(s), "="); name {
	case "oracle":
		return Oracle{}, nil
	case "accuracy":
		p, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("predictor %q: want accuracy=P with 0 <= P <= 1", s)
		}
		return NewAccuracy(p, experts, seed)
	}
	return nil, fmt.Errorf("unknown modelled predictor %q: want oracle or accuracy=P", s)
}
