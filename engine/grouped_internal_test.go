package engine

import (
	"slices"
	"testing"

	"github.com/commit-run/commit-run/models"
)

// TestGroupLimitedChoice checks DeepSeek-V3's group-limited selection against cases worked
// by hand: a group scores the sum of its two best selection scores, only the best groups'
// experts compete for the top-k, and ties go to the lower index as in models.TopK.
func TestGroupLimitedChoice(t *testing.T) {
	sel := []float32{0.9, 0.1, 0.5, 0.45, 0.8, 0.05, 0.3, 0.3}
	for _, c := range []struct {
		name               string
		sel                []float32
		groups, used, topk int
		want               []int
	}{
		// Group sums 1.0, 0.95, 0.85, 0.6: expert 4 (0.8) loses with its weak partner.
		{"4 groups keep 2", sel, 4, 2, 3, []int{0, 2, 3}},
		{"4 groups keep 1", sel, 4, 1, 2, []int{0, 1}},
		// Group sums 1.4 (0.9+0.5) and 1.1 (0.8+0.3).
		{"2 groups keep 1", sel, 2, 1, 3, []int{0, 2, 3}},
		{"4 groups keep 3", sel, 4, 3, 3, []int{0, 4, 2}},
		{"no groups", sel, 0, 0, 3, []int{0, 4, 2}},
		{"one group", sel, 1, 1, 3, []int{0, 4, 2}},
		{"tied groups", []float32{0.5, 0.5, 0.5, 0.5}, 2, 1, 2, []int{0, 1}},
		// Kept groups hold fewer experts than the top-k: the masked ones fill it in index order.
		{"fewer than top-k", sel, 4, 1, 3, []int{0, 1, 2}},
	} {
		moe := &models.MoE{Experts: len(c.sel), Used: c.topk, Groups: c.groups, GroupsUsed: c.used}
		if got := moe.Choose(c.sel); !slices.Equal(got, c.want) {
			t.Errorf("%s: chose %v, want %v", c.name, got, c.want)
		}
	}
}

// TestSigmoidGroupedRoute is glm4moe's and DeepSeek-V3's routing end to end: sigmoid
// probabilities, the selection bias deciding the choice but not the weights, groups,
// renormalisation and the routed scale.
func TestSigmoidGroupedRoute(t *testing.T) {
	moe := &models.MoE{Experts: 8, Used: 3, Gating: models.GatingSigmoid, Groups: 4, GroupsUsed: 2,
		NormWeights: true, WeightsScale: 2.5,
		SelectionBias: []float32{0.9, 0.1, 0.5, 0.45, 0.8, 0.05, 0.3, 0.3}}
	// Equal logits: every probability is 0.5, so the bias alone chooses (as in the table
	// above) and the chosen experts weigh the same.
	rt := route(moe, make([]float32, 8))
	if !slices.Equal(rt.experts, []int{0, 2, 3}) {
		t.Fatalf("chose %v, want [0 2 3]", rt.experts)
	}
	w := float32(0.5) / float32(1.5) * 2.5
	for k, got := range rt.weights {
		if got != w {
			t.Errorf("weight %d = %v, want %v", k, got, w)
		}
	}
	// Unequal logits: biased scores 1.78 0.37 | 1.12 1.18 | 1.75 0.55 | 0.42 0.8 make group
	// sums 2.15, 2.30, 2.30, 1.22, so the best expert, 0, is left out with its group; the
	// weights are the chosen sigmoids over their sum, times the scale.
	logits := []float32{2, -1, 0.5, 1, 3, 0, -2, 0}
	rt = route(moe, logits)
	if !slices.Equal(rt.experts, []int{4, 3, 2}) {
		t.Fatalf("chose %v, want [4 3 2]", rt.experts)
	}
	p := []float32{models.Sigmoid(3), models.Sigmoid(1), models.Sigmoid(0.5)}
	sum := float32(float64(p[0]) + float64(p[1]) + float64(p[2]))
	for k := range p {
		if want := p[k] / sum * 2.5; rt.weights[k] != want {
			t.Errorf("weight %d = %v, want %v", k, rt.weights[k], want)
		}
	}
}
