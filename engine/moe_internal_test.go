package engine

import (
	"math"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/models"
)

// Committing to the router's own choice gives the router's weights; committing to other
// experts weights them by the router's probabilities of them, renormalised as the model does.
func TestCommitRoute(t *testing.T) {
	logits := []float32{2, 1, 0, -1}
	var z float64
	for _, l := range logits {
		z += math.Exp(float64(l))
	}
	p := func(i int) float64 { return math.Exp(float64(logits[i])) / z }
	cases := []struct {
		name    string
		moe     models.MoE
		experts []int
		want    []float64
	}{
		{"softmax, renormalised", models.MoE{Experts: 4, Used: 2, NormWeights: true}, []int{3, 1}, []float64{p(3) / (p(3) + p(1)), p(1) / (p(3) + p(1))}},
		{"softmax, raw", models.MoE{Experts: 4, Used: 2}, []int{2, 3}, []float64{p(2), p(3)}},
		{"softmax, scaled", models.MoE{Experts: 4, Used: 1, WeightsScale: 2.5}, []int{1}, []float64{2.5 * p(1)}},
		{"sigmoid", models.MoE{Experts: 4, Used: 2, Gating: models.GatingSigmoid}, []int{2, 0}, []float64{0.5, 1 / (1 + math.Exp(-2))}},
	}
	for _, c := range cases {
		got := commitRoute(&c.moe, logits, c.experts)
		if !slices.Equal(got.experts, c.experts) {
			t.Errorf("%s: experts %v, want %v", c.name, got.experts, c.experts)
		}
		for k := range c.want {
			if math.Abs(float64(got.weights[k])-c.want[k]) > 1e-6 {
				t.Errorf("%s: weights %v, want %v", c.name, got.weights, c.want)
				break
			}
		}
		// The router's own choice, committed, is the routed result bit for bit.
		r := route(&c.moe, logits)
		if cr := commitRoute(&c.moe, logits, r.experts); !slices.Equal(cr.weights, r.weights) {
			t.Errorf("%s: committing to the router's choice gives %v, routing %v", c.name, cr.weights, r.weights)
		}
	}
}

// OWA's scores are in the units of the mixing weights: the router's own top-k gets exactly
// the weights routing gives it, under every gating the models use; and OWA applied to a
// prediction that is all right (outside its trigger range) leaves routing's weights.
func TestOWAScores(t *testing.T) {
	logits := []float32{0.3, 2, -1, 1.2, 0.7, -0.4}
	for _, c := range []struct {
		name string
		moe  models.MoE
	}{
		{"softmax", models.MoE{Experts: 6, Used: 3}},
		{"softmax, renormalised", models.MoE{Experts: 6, Used: 2, NormWeights: true}},
		{"softmax, scaled", models.MoE{Experts: 6, Used: 3, WeightsScale: 2.5}},
		{"sigmoid, renormalised, scaled", models.MoE{Experts: 6, Used: 3, Gating: models.GatingSigmoid, NormWeights: true, WeightsScale: 1.8}},
		{"softmax over the chosen", models.MoE{Experts: 6, Used: 2, Gating: models.GatingSoftmaxWeight}},
	} {
		r := route(&c.moe, logits)
		s := c.moe.OWAScores(logits, r.experts)
		for k, e := range r.experts {
			if math.Abs(float64(s[e]-r.weights[k])) > 1e-6 {
				t.Errorf("%s: score of expert %d = %v, routing's weight %v", c.name, e, s[e], r.weights[k])
			}
		}
		// A non-chosen expert scores below every chosen one, as its probability is lower.
		for e := range logits {
			if !slices.Contains(r.experts, e) && s[e] >= s[r.experts[len(r.experts)-1]] {
				t.Errorf("%s: unchosen expert %d scores %v, above the chosen %v", c.name, e, s[e], s)
			}
		}
		m := &Model{info: Info{Architecture: "qwen2moe", Experts: 6, ExpertsUsed: c.moe.Used}}
		if got := m.commitRouting(0, &c.moe, logits, r, r.experts); !slices.Equal(got.weights, r.weights) {
			t.Errorf("%s: committing to the router's own choice gives %v, routing %v", c.name, got.weights, r.weights)
		}
	}
}
