package tracerec

import (
	"context"
	"math"
	"slices"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/multigpu"
)

// LayerRouting summarises one MoE layer's routing over a text.
type LayerRouting struct {
	Layer   int
	Experts int
	Used    int
	Tokens  int
	// Load counts how often each expert was chosen (Tokens*Used in all).
	Load []int
	// MaxOverMean is the busiest expert's load over the mean load (1 = perfectly balanced);
	// Balancedness is its inverse, mean/max, as the expert-parallel literature defines it.
	MaxOverMean  float64
	Balancedness float64
	// Router certainty: KL(softmax(router logits) || uniform) per token, in nats; 0 for a
	// router that cannot tell experts apart, ln(Experts) for one that is certain.
	KLMean, KLStd       float64
	KLP10, KLP50, KLP90 float64
	KLMax               float64 // ln(Experts)
}

// RoutingReport is the outcome of Routing.
type RoutingReport struct {
	Tokens int // tokens evaluated
	Layers []LayerRouting
}

// Routing evaluates text on m in consecutive windows of window tokens (0 = the context
// length), as Perplexity does, and summarises every MoE layer's expert load and router
// certainty.
func Routing(ctx context.Context, m *engine.Model, text string, window int) (RoutingReport, error) {
	type acc struct {
		load []int
		kl   []float64
		e, k int
	}
	layers := map[int]*acc{}
	probs := []float64{}
	n, err := m.Observe(ctx, text, window, func(ev *engine.RouteEvent) {
		a := layers[ev.Layer]
		if a == nil {
			a = &acc{load: make([]int, ev.Experts), e: ev.Experts, k: ev.Used}
			layers[ev.Layer] = a
		}
		for _, e := range ev.Selected {
			a.load[e]++
		}
		for t := 0; t < ev.Tokens; t++ {
			if len(probs) < ev.Experts {
				probs = make([]float64, ev.Experts)
			}
			a.kl = append(a.kl, multigpu.KLFromUniform(ev.Logits[t*ev.Experts:(t+1)*ev.Experts], probs[:ev.Experts]))
		}
	})
	rep := RoutingReport{Tokens: n}
	if err != nil {
		return rep, err
	}
	keys := make([]int, 0, len(layers))
	for l := range layers {
		keys = append(keys, l)
	}
	slices.Sort(keys)
	for _, l := range keys {
		a := layers[l]
		lr := LayerRouting{Layer: l, Experts: a.e, Used: a.k, Tokens: len(a.kl), Load: a.load, KLMax: math.Log(float64(a.e))}
		busiest := slices.Max(a.load)
		mean := float64(len(a.kl)*a.k) / float64(a.e)
		if mean > 0 {
			lr.MaxOverMean = float64(busiest) / mean
			lr.Balancedness = mean / float64(busiest)
		}
		var sum, sq float64
		for _, v := range a.kl {
			sum += v
			sq += v * v
		}
		n := float64(len(a.kl))
		lr.KLMean = sum / n
		lr.KLStd = math.Sqrt(max(0, sq/n-lr.KLMean*lr.KLMean))
		sorted := slices.Clone(a.kl)
		slices.Sort(sorted)
		q := func(p float64) float64 { return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))] }
		lr.KLP10, lr.KLP50, lr.KLP90 = q(0.1), q(0.5), q(0.9)
		rep.Layers = append(rep.Layers, lr)
	}
	return rep, nil
}
