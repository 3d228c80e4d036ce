package predictor

import (
	"math"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// WarmStart is the Commit Router's warm start for a model of arch whose MoE layers are
// layers: for MoE layer j's net, the router of the layer it predicts (j+1, or the first for
// the last net) with each input column scaled by the ratio of that layer's FFN norm weight to
// layer j's. Adjacent layers' hidden states point
// the same way (CommitMoE §4.2, after Zhong et al.), and a router input is that state times
// its layer's norm weight, so the rescaled next router applied to h(j) approximates the next
// router applied to h(j+1): a predictor that starts where a good one is near.
func WarmStart(arch *models.Model, layers []int) [][]float32 {
	d := arch.Config.Embd
	init := make([][]float32, len(layers))
	for j, l := range layers {
		t := layers[(j+1)%len(layers)]
		r := arch.Layers[t].MoE.Router.Matrix()
		w := make([]float32, r.Rows*d)
		for e := 0; e < r.Rows; e++ {
			quant.DequantizeRow(r.Type, r.Row(e), w[e*d:(e+1)*d])
		}
		from, to := arch.Layers[l].FFNNorm.Weight, arch.Layers[t].FFNNorm.Weight
		if len(from) == d && len(to) == d {
			var mean float64
			for _, g := range from {
				mean += math.Abs(float64(g))
			}
			mean /= float64(d)
			for i := 0; i < d; i++ {
				ratio := float32(0)
				if math.Abs(float64(from[i])) > 1e-3*mean {
					ratio = to[i] / from[i]
				}
				for e := 0; e < r.Rows; e++ {
					w[e*d+i] *= ratio
				}
			}
		}
		init[j] = w
	}
	return init
}
