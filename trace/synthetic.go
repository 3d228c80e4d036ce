package trace

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// SynthOptions describe a synthetic router: routing drawn at random with a stated skew and
// correlation, for timing the offloading pipeline on model shapes no machine here can run.
// Figures made from it must say so (Header.Synthetic).
type SynthOptions struct {
	Layers  int // MoE layers
	Experts int
	Used    int // top-k
	// Skew is the Zipf exponent of expert popularity within a layer (0 = uniform; real MoE
	// layers measure roughly 0.3-1.2). Each layer ranks its experts in its own random order.
	Skew float64
	// CrossLayer is the probability that an expert chosen at layer i+1 is the fixed partner of
	// one chosen at layer i (each layer pairs its experts with the next layer's at random),
	// which is the correlation a next-layer predictor exploits.
	CrossLayer float64
	// Temporal is the probability that a token keeps an expert the previous token chose at the
	// same layer.
	Temporal float64
	Seed     uint64
}

// SynthRouter draws tokens from SynthOptions. It is deterministic for a seed.
type SynthRouter struct {
	o       SynthOptions
	rng     *rand.Rand
	cdf     [][]float64 // per layer: cumulative popularity over experts
	partner [][]int     // per layer i < L-1: expert at i -> its partner at i+1
	prev    [][]int     // previous token's experts per layer
	pos     int
}

// NewSynthRouter checks o and returns a router.
func NewSynthRouter(o SynthOptions) (*SynthRouter, error) {
	switch {
	case o.Layers < 1 || o.Layers > maxLayers:
		return nil, fmt.Errorf("synthetic router: %d layers", o.Layers)
	case o.Experts < 1 || o.Experts > maxExperts:
		return nil, fmt.Errorf("synthetic router: %d experts", o.Experts)
	case o.Used < 1 || o.Used > o.Experts:
		return nil, fmt.Errorf("synthetic router: top-%d of %d experts", o.Used, o.Experts)
	case !(o.Skew >= 0 && o.Skew <= 10):
		return nil, fmt.Errorf("synthetic router: skew %v: want 0 to 10", o.Skew)
	case !(o.CrossLayer >= 0 && o.CrossLayer <= 1) || !(o.Temporal >= 0 && o.Temporal <= 1):
		return nil, fmt.Errorf("synthetic router: correlations %v, %v: want 0 to 1", o.CrossLayer, o.Temporal)
	}
	r := &SynthRouter{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x5eed))}
	for l := 0; l < o.Layers; l++ {
		rank := r.rng.Perm(o.Experts)
		w := make([]float64, o.Experts)
		var sum float64
		for e := range w {
			w[e] = 1 / math.Pow(float64(rank[e]+1), o.Skew)
			sum += w[e]
		}
		cdf := make([]float64, o.Experts)
		acc := 0.0
		for e := range w {
			acc += w[e] / sum
			cdf[e] = acc
		}
		cdf[len(cdf)-1] = 1
		r.cdf = append(r.cdf, cdf)
		if l+1 < o.Layers {
			r.partner = append(r.partner, r.rng.Perm(o.Experts))
		}
	}
	return r, nil
}

// Header is the trace header for the router's tokens.
func (r *SynthRouter) Header(model string) Header {
	moe := make([]int, r.o.Layers)
	for i := range moe {
		moe[i] = i
	}
	return Header{
		Model: model, Arch: "synthetic", Layers: r.o.Layers, MoELayers: moe, Experts: r.o.Experts, Used: r.o.Used,
		Embd: 1, Synthetic: true,
		Source: fmt.Sprintf("synthetic router: skew %g, cross-layer %g, temporal %g, seed %d", r.o.Skew, r.o.CrossLayer, r.o.Temporal, r.o.Seed),
	}
}

// Next draws the next token's routing.
func (r *SynthRouter) Next() *Token {
	o := r.o
	t := &Token{Pos: r.pos, Decode: true, Layers: make([]LayerRoute, o.Layers)}
	r.pos++
	cur := make([][]int, o.Layers)
	for l := 0; l < o.Layers; l++ {
		chosen := make([]int, 0, o.Used)
		has := func(e int) bool { return slices.Contains(chosen, e) }
		for len(chosen) < o.Used {
			var e int
			switch u := r.rng.Float64(); {
			case r.prev != nil && u < o.Temporal:
				e = r.prev[l][r.rng.IntN(o.Used)]
			case l > 0 && u < o.Temporal+(1-o.Temporal)*o.CrossLayer:
				e = r.partner[l-1][cur[l-1][r.rng.IntN(o.Used)]]
			default:
				e, _ = slices.BinarySearch(r.cdf[l], r.rng.Float64())
				e = min(e, o.Experts-1)
			}
			if !has(e) {
				chosen = append(chosen, e)
			}
		}
		cur[l] = chosen
		w := make([]float32, o.Used)
		var sum float32
		for i := range w {
			w[i] = float32(o.Used - i) // top-k order: decreasing weights
			sum += w[i]
		}
		for i := range w {
			w[i] /= sum
		}
		t.Layers[l] = LayerRoute{Layer: l, Experts: chosen, Weights: w}
	}
	r.prev = cur
	return t
}
