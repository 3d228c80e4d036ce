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
