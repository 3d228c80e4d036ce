package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/owa"
)

// commitRef is committed routing as the engine computes it on the host (engine/commit.go's
// commitRouting, owaScores and commitRoute, engine/moe.go's gating), with package owa's own
// Adjust: the reference of commit_weights_f32. g.Bias is in host memory.
func commitRef(logits []float32, g device.Gating, pred []int32, o device.OWA) (w []float32, truth []int32, adjusted bool) {
	k := len(pred)
	bias, gt, normalize, scale := g.Bias, g.Func, g.Normalize, g.Scale
	probs := slices.Clone(logits)
	switch gt {
	case device.GatingSoftmax:
		models.Softmax(probs)
	case device.GatingSigmoid:
		for i, v := range probs {
			probs[i] = models.Sigmoid(v)
		}
	}
	truth, _ = topkRef(probs, bias, k)
	if g.Groups > 1 {
		truth = groupedRef(probs, bias, k, g.Groups, g.GroupsUsed)
	}
	ints := func(v []int32) []int {
		out := make([]int, len(v))
		for i, x := range v {
			out[i] = int(x)
		}
		return out
	}
	trueSet, predSet := ints(truth), ints(pred)
	normalizeBy := func(v []float32) {
		var s float64
		for _, e := range trueSet {
			s += float64(v[e])
		}
		sum := max(float32(s), 6.103515625e-5)
		for e := range v {
			v[e] /= sum
		}
	}
	if o.On {
		scores := slices.Clone(probs)
		if gt == device.GatingSoftmaxWeight {
			mx := float32(math.Inf(-1))
			for _, e := range trueSet {
				mx = max(mx, logits[e])
			}
			for e, l := range logits {
				scores[e] = float32(math.Exp(float64(l - mx)))
			}
			normalizeBy(scores)
		}
		if normalize {
			normalizeBy(scores)
		}
		if scale != 0 {
			for e := range scores {
				scores[e] *= scale
			}
		}
		p := owa.Params{Alpha1: o.Alpha1, Alpha2: o.Alpha2, MinCorrect: o.MinCorrect, MaxCorrect: o.MaxCorrect}
		if w, ok := owa.Adjust(scores, trueSet, predSet, p); ok {
			return w, truth, true
		}
	}
	w = make([]float32, k)
	for j, e := range predSet {
		w[j] = probs[e]
	}
	gateWeightsRef(w, gt == device.GatingSoftmaxWeight, normalize, scale)
	return w, truth, false
}

// groupedRef is the k experts group-limited routing chooses from the probabilities p plus
// bias (or nil) among the used best of groups groups (models.MoE.Choose).
func groupedRef(p, bias []float32, k, groups, used int) []int32 {
	sel := slices.Clone(p)
	for i := range sel {
		if bias != nil {
			sel[i] += bias[i]
		}
	}
	var ids []int32
	for _, e := range (&models.MoE{Used: k, Groups: groups, GroupsUsed: used}).Choose(sel) {
		ids = append(ids, int32(e))
	}
	return ids
}

// commitPred returns k experts of n of which correct are in truth, in a random order.
func commitPred(r *rand.Rand, n int, truth []int32, correct int) []int32 {
	pred := slices.Clone(truth[:correct])
	for len(pred) < len(truth) {
		e := int32(r.IntN(n))
		if !slices.Contains(truth, e) && !slices.Contains(pred, e) {
			pred = append(pred, e)
		}
	}
	r.Shuffle(len(pred), func(i, j int) { pred[i], pred[j] = pred[j], pred[i] })
	return pred
}

func commitCases() []kernelCase {
	var cs []kernelCase
	// The router shapes of Mixtral (8, 2), Qwen1.5-MoE (60, 4), OLMoE (64, 8),
	// DeepSeek-V2-Lite (64, 6) and Qwen3-30B-A3B (128, 8) and a DeepSeek-V3-like sigmoid
	// router (256, 8), each gating with and without renormalisation, a scale and a selection
	// bias, and for every number of correct predictions, so that OWA's trigger range is hit
	// and missed; and OWA off. Logits within 6 of 0 keep the softmax's float64 sum exact in any order
	// (see softmax_rows_f32's cases), so every weight is compared to the bit.
	type shape struct{ n, k int }
	for _, c := range []struct {
		shape
		gt        device.GatingFunc
		normalize bool
		scale     float32
		bias      bool
		owa       device.OWA
		groups    [2]int // groups used of groups (0: none)
	}{
		{shape{8, 2}, device.GatingSoftmax, true, 0, false, device.OWA{On: true, Alpha1: 1.2, Alpha2: 1.06, MinCorrect: 1, MaxCorrect: 1}, [2]int{}},
		{shape{60, 4}, device.GatingSoftmax, false, 0, false, device.OWA{On: true, Alpha1: 1.3, Alpha2: 1, MinCorrect: 2, MaxCorrect: 3}, [2]int{}},
		{shape{64, 8}, device.GatingSoftmax, false, 0, false, device.OWA{On: true, Alpha1: 1, Alpha2: 1, MinCorrect: 4, MaxCorrect: 7}, [2]int{}},
		{shape{64, 6}, device.GatingSoftmax, false, 1.5, false, device.OWA{On: true, Alpha1: 1.15, Alpha2: 1, MinCorrect: 4, MaxCorrect: 5}, [2]int{}},
		{shape{128, 8}, device.GatingSoftmax, true, 0, false, device.OWA{On: true, Alpha1: 1.1, Alpha2: 0.95, MinCorrect: 1, MaxCorrect: 7}, [2]int{}},
		{shape{64, 6}, device.GatingSigmoid, true, 2.5, true, device.OWA{On: true, Alpha1: 1.2, Alpha2: 1, MinCorrect: 2, MaxCorrect: 5}, [2]int{}},
		{shape{256, 8}, device.GatingSigmoid, true, 2.5, true, device.OWA{On: true, Alpha1: 1, Alpha2: 1, MinCorrect: 1, MaxCorrect: 7}, [2]int{}},
		// The kernel's bounds, device.CommitMaxExperts and CommitMaxUsed, which its shared
		// arrays must hold.
		{shape{device.CommitMaxExperts, device.CommitMaxUsed}, device.GatingSigmoid, true, 0, false, device.OWA{On: true, Alpha1: 1.1, Alpha2: 1, MinCorrect: 4, MaxCorrect: 12}, [2]int{}},
		{shape{32, 4}, device.GatingSoftmaxWeight, false, 0, false, device.OWA{On: true, Alpha1: 1.3, Alpha2: 1.1, MinCorrect: 1, MaxCorrect: 3}, [2]int{}},
		{shape{32, 4}, device.GatingSoftmaxWeight, true, 2, false, device.OWA{On: true, Alpha1: 1, Alpha2: 1, MinCorrect: 2, MaxCorrect: 3}, [2]int{}},
		{shape{60, 4}, device.GatingSoftmax, true, 0, false, device.OWA{}, [2]int{}},
		{shape{1, 1}, device.GatingSoftmax, true, 0, false, device.OWA{On: true, Alpha1: 1, Alpha2: 1, MinCorrect: 1, MaxCorrect: 1}, [2]int{}},
		// Group-limited routing (DeepSeek-V3's and GLM's with groups): 8 groups of 32, 4 used;
		// 4 groups of 4, 1 used, where every choice lies in one group.
		{shape{256, 8}, device.GatingSigmoid, true, 2.5, true, device.OWA{On: true, Alpha1: 1, Alpha2: 1, MinCorrect: 1, MaxCorrect: 7}, [2]int{4, 8}},
		{shape{16, 3}, device.GatingSoftmax, false, 0, false, device.OWA{On: true, Alpha1: 1.2, Alpha2: 1, MinCorrect: 1, MaxCorrect: 2}, [2]int{1, 4}},
	} {
		cs = append(cs, kernelCase{"commit_weights_f32", fmt.Sprintf("n=%d,k=%d,gating=%d,normalize=%v,scale=%v,bias=%v,owa=%v,groups=%d/%d", c.n, c.k, c.gt, c.normalize, c.scale, c.bias, c.owa.On, c.groups[0], c.groups[1]),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				var bias []float32
				dbias := DevicePtr(0)
				if c.bias {
					bias = randUniform(r, c.n, 0, 0.25)
					dbias = k.putF32(t, bias)
				}
				for correct := 0; correct <= c.k; correct++ {
					if c.k-correct > c.n-c.k {
						continue // not enough experts outside the top-k to predict wrongly
					}
					logits := randUniform(r, c.n, -6, 6)
					g := device.Gating{Func: c.gt, Bias: bias, Normalize: c.normalize, Scale: c.scale, Groups: c.groups[1], GroupsUsed: c.groups[0]}
					_, truth, _ := commitRef(logits, g, make([]int32, c.k), device.OWA{})
					pred := commitPred(r, c.n, truth, correct)
					want, _, adjusted := commitRef(logits, g, pred, c.owa)
					dl, dw, drec := k.putF32(t, logits), k.alloc(t, 4*c.k), k.alloc(t, 4*(c.k+1))
					dpred := k.put(t, i32bytes(pred))
					var args Args
					args.Ptr(dl).Ptr(dbias).Int(c.n).Int(c.k).Int(int(c.gt)).Int(b2i(c.normalize)).Float(c.scale).
						Ptr(dpred).Int(b2i(c.owa.On)).Float64(c.owa.Alpha1).Float64(c.owa.Alpha2).Int(c.owa.MinCorrect).Int(c.owa.MaxCorrect).
						Ptr(dw).Ptr(drec).Int(c.groups[1]).Int(c.groups[0])
					k.run(t, "commit_weights_f32", Dim3{X: 1}, Dim3{X: 32}, &args)
					what := fmt.Sprintf("%d correct of %v, truth %v", correct, pred, truth)
					checkBits(t, what+": w", k.getF32(t, dw, c.k), want)
					rec := k.getF32(t, drec, c.k+1)
					for j, e := range truth {
						if rec[j] != float32(e) {
							t.Errorf("%s: rec %v, want the router's top-k %v first", what, rec, truth)
							break
						}
					}
					if rec[c.k] != float32(b2i(adjusted)) {
						t.Errorf("%s: rec[k] = %v, want %v (OWA applied: %v)", what, rec[c.k], b2i(adjusted), adjusted)
					}
				}
			}})
	}
	return cs
}
