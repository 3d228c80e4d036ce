package engine

import (
	"math"
	"reflect"
	"testing"

	"github.com/commit-run/commit-run/models"
)

func TestRoute(t *testing.T) {
	logits := []float32{1, 3, 2, 0}
	p := append([]float32(nil), logits...)
	models.Softmax(p)
	cases := []struct {
		name string
		moe  models.MoE
		want routing
	}{
		{"softmax", models.MoE{Used: 2, Gating: models.GatingSoftmax},
			routing{experts: []int{1, 2}, weights: []float32{p[1], p[2]}}},
		{"softmax renormalised", models.MoE{Used: 2, Gating: models.GatingSoftmax, NormWeights: true},
			routing{experts: []int{1, 2}, weights: []float32{p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])}}},
		{"scaled", models.MoE{Used: 1, Gating: models.GatingSoftmax, WeightsScale: 2},
			routing{experts: []int{1}, weights: []float32{2 * p[1]}}},
		{"selection bias changes choice, not weight", models.MoE{Used: 1, Gating: models.GatingSoftmax, SelectionBias: []float32{0, 0, 0, 1}},
			routing{experts: []int{3}, weights: []float32{p[3]}}},
		{"sigmoid", models.MoE{Used: 1, Gating: models.GatingSigmoid},
			routing{experts: []int{1}, weights: []float32{models.Sigmoid(3)}}},
		{"softmax over chosen weights", models.MoE{Used: 2, Gating: models.GatingSoftmaxWeight},
			routing{experts: []int{1, 2}, weights: []float32{float32(math.E / (math.E + 1)), float32(1 / (math.E + 1))}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := route(&c.moe, logits)
			if !reflect.DeepEqual(got.experts, c.want.experts) {
				t.Fatalf("experts %v, want %v", got.experts, c.want.experts)
			}
			for k := range got.weights {
				if math.Abs(float64(got.weights[k]-c.want.weights[k])) > 1e-6 {
					t.Fatalf("weights %v, want %v", got.weights, c.want.weights)
				}
			}
		})
	}
}
