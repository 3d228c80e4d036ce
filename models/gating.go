package models

import "math"

// A MoE block's gating, as llama.cpp's build_moe_ffn computes it: the router's logits become
// probabilities (softmax, sigmoid, or a softmax over the chosen logits), the top-k of them
// plus the selection bias (among the best groups, where the block groups its experts) are
// chosen, and their weights are renormalised and scaled. The engine routes every token with
// it; expanded drop, expert parallelism and committed routing weigh experts beyond the choice
// on the same scale.

// Route applies the block's gating to one token's router logits (llama.cpp build_moe_ffn):
// probabilities, selection by top-k of probability plus selection bias, then the weights'
// optional softmax, renormalisation and scale. It returns the chosen experts in top-k order
// and their mixing weights.
func (moe *MoE) Route(logits []float32) (experts []int, weights []float32) {
	probs, sel := moe.GateProbs(logits)
	experts = moe.Choose(sel)
	return experts, moe.gateWeights(probs, experts)
}

// Choose returns the experts selection scores sel pick: the top-k, among the best groups
// where the model groups its experts.
func (moe *MoE) Choose(sel []float32) []int {
	if moe.Groups > 1 {
		sel = groupLimited(sel, moe.Groups, moe.GroupsUsed)
	}
	return TopK(sel, moe.Used)
}

// groupLimited returns sel with every expert outside the used best of its groups at -inf,
// as llama.cpp's build_moe_ffn masks them: a group scores the sum of its two best
// selection scores (the sum of two floats rounds the same in float32 as in ggml_sum_rows'
// float64). The loader ensures groups divides len(sel) into groups of at least two.
func groupLimited(sel []float32, groups, used int) []float32 {
	per := len(sel) / groups
	scores := make([]float32, groups)
	for g := range scores {
		s := sel[g*per : (g+1)*per]
		top := TopK(s, 2)
		scores[g] = s[top[0]] + s[top[1]]
	}
	out := make([]float32, len(sel))
	for i := range out {
		out[i] = float32(math.Inf(-1))
	}
	for _, g := range TopK(scores, used) {
		copy(out[g*per:(g+1)*per], sel[g*per:(g+1)*per])
	}
	return out
}

// WeightsOf are the mixing weights of experts chosen ahead of the router (commit), as if it had
// chosen them: its own probabilities of them, through the same softmax, renormalisation and
// scale as a routed choice.
func (moe *MoE) WeightsOf(logits []float32, experts []int) []float32 {
	probs, _ := moe.GateProbs(logits)
	return moe.gateWeights(probs, experts)
}

// GateProbs returns the gating probabilities of every expert and the scores selection
// ranks them by (the probabilities plus the selection bias, if the model has one).
func (moe *MoE) GateProbs(logits []float32) (probs, sel []float32) {
	n := len(logits)
	probs = make([]float32, n)
	copy(probs, logits)
	switch moe.Gating {
	case GatingSigmoid:
		for i, v := range probs {
			probs[i] = Sigmoid(v)
		}
	case GatingSoftmaxWeight:
		// selection uses the raw logits; the weights are a softmax over the chosen ones
	default:
		Softmax(probs)
	}
	sel = probs
	if moe.SelectionBias != nil {
		sel = make([]float32, n)
		for i := range sel {
			sel[i] = probs[i] + moe.SelectionBias[i]
		}
	}
	return probs, sel
}

// gateWeights returns the mixing weights of the chosen experts.
func (moe *MoE) gateWeights(probs []float32, experts []int) []float32 {
	w := make([]float32, len(experts))
	for k, e := range experts {
		w[k] = probs[e]
	}
	if moe.Gating == GatingSoftmaxWeight {
		Softmax(w)
	}
	var sum64 float64
	for _, v := range w {
		sum64 += float64(v)
	}
	moe.normalise(w, sum64)
	return w
}

// normalise applies the gating's renormalisation by sum64, the chosen experts' summed weight
// (ggml_sum_rows adds in float64), and its scale to weights w.
func (moe *MoE) normalise(w []float32, sum64 float64) {
	if moe.NormWeights {
		sum := max(float32(sum64), 6.103515625e-5)
		for k := range w {
			w[k] /= sum
		}
	}
	if moe.WeightsScale != 0 {
		for k := range w {
			w[k] *= moe.WeightsScale
		}
	}
}

// TopK returns the indices of the k largest values, largest first; ties keep the lower index.
func TopK(v []float32, k int) []int {
	idx := make([]int, 0, k)
	for i, x := range v {
		if math.IsNaN(float64(x)) {
			continue
		}
		pos := len(idx)
		for pos > 0 && v[idx[pos-1]] < x {
			pos--
		}
		if pos >= k {
			continue
		}
		if len(idx) < k {
			idx = append(idx, 0)
		}
		copy(idx[pos+1:], idx[pos:len(idx)-1])
		idx[pos] = i
	}
	for len(idx) < k { // all NaN: any choice is as good
		idx = append(idx, len(idx))
	}
	return idx
}

// ExtraWeights fills w with the mixing weight each expert would have beside a token's top-k
// choice (experts, with their weights), on the scale of its top-k weights (the same softmax,
// normalisation by the top-k's sum, and scale), so that an expert expanded drop adds weighs
// what the router says of it and the top-k keep theirs exactly.
func (moe *MoE) ExtraWeights(logits []float32, experts []int, weights []float32, w []float32) {
	probs, _ := moe.GateProbs(logits)
	if moe.Gating == GatingSoftmaxWeight {
		// The weights are a softmax over the chosen logits: extend its denominator's terms.
		mx := float32(math.Inf(-1))
		for _, e := range experts {
			mx = max(mx, logits[e])
		}
		var den float64
		for _, e := range experts {
			den += math.Exp(float64(logits[e] - mx))
		}
		for e := range w {
			w[e] = float32(math.Exp(float64(logits[e]-mx)) / den)
		}
	} else {
		copy(w, probs)
	}
	var sum64 float64
	for _, e := range experts {
		sum64 += float64(w[e])
	}
	moe.normalise(w, sum64)
	for k, e := range experts {
		w[e] = weights[k]
	}
}

// OWAScores are every expert's scores in the units of the block's mixing weights (package
// owa): the weight it would get beside the router's true top-k, so that the true top-k's
// scores are exactly the weights Route gives them.
func (moe *MoE) OWAScores(logits []float32, trueSet []int) []float32 {
	probs, _ := moe.GateProbs(logits)
	if moe.Gating == GatingSoftmaxWeight {
		// The weights are a softmax over the chosen experts' logits.
		mx := float32(math.Inf(-1))
		for _, e := range trueSet {
			mx = max(mx, logits[e])
		}
		for e, l := range logits {
			probs[e] = float32(math.Exp(float64(l - mx)))
		}
		normalizeBy(probs, trueSet)
	}
	if moe.NormWeights {
		normalizeBy(probs, trueSet)
	}
	if moe.WeightsScale != 0 {
		for e := range probs {
			probs[e] *= moe.WeightsScale
		}
	}
	return probs
}

// normalizeBy divides v by the sum of its entries at idx, as gateWeights renormalises.
func normalizeBy(v []float32, idx []int) {
	var sum64 float64
	for _, e := range idx {
		sum64 += float64(v[e])
	}
	sum := max(float32(sum64), 6.103515625e-5)
	for e := range v {
		v[e] /= sum
	}
}
