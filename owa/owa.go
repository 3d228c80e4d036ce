// Package owa is Output Weight Adjustment (CommitMoE §4.3, equations 5 and 6): when a layer
// computes with predicted experts instead of the router's, it repairs the mixing weights from
// the router's own scores. Pure functions and per-model settings; it knows nothing of devices
// or of how the experts were chosen.
//
// Scores are in the units of the model's mixing weights: for every expert, the weight the
// model would give it alongside the router's true top-k (its gating probability, divided by
// the true top-k's probability mass for models that renormalise, times the model's weight
// scale), so that the true top-k's scores are exactly the weights the model would use.
package owa

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Params are one model's OWA settings.
type Params struct {
	// Alpha1 scales the mass moved from missed experts onto the correctly predicted ones
	// (equation 5); Alpha2 scales the total after rescaling to the true top-k's mass
	// (equation 6). 1 and 1 is the neutral setting.
	Alpha1, Alpha2 float64
	// OWA applies only when the number of correct predictions is in [MinCorrect,
	// MaxCorrect]: with fewer, the model is robust to the choice (low router certainty); with
	// all correct there is nothing to repair.
	MinCorrect, MaxCorrect int
}

// Validate checks p for a model that routes to used experts per token.
func (p Params) Validate(used int) error {
	for _, a := range []struct {
		name string
		v    float64
	}{{"alpha1", p.Alpha1}, {"alpha2", p.Alpha2}} {
		if !(a.v > 0) || a.v > 10 || math.IsInf(a.v, 0) {
			return fmt.Errorf("owa: %s = %v: want a positive factor (the paper tunes 1.0 to 1.4)", a.name, a.v)
		}
	}
	if p.MinCorrect < 1 || p.MaxCorrect < p.MinCorrect || p.MaxCorrect > used {
		return fmt.Errorf("owa: trigger range %d-%d of correct predictions: want 1 <= min <= max <= %d (top-k)", p.MinCorrect, p.MaxCorrect, used)
	}
	return nil
}

// Defaults are the paper's settings for the models it tuned (§5, Table 3 setup), keyed by
// the GGUF architecture and the experts per token, and neutral weights with a trigger range
// of k/2 to k-1 correct predictions for the others (the paper's ranges follow that pattern
// for k = 4 and k = 6). The paper recommends OWA for models with four or more experts per
// token; with k = 2 only its Mixtral setting exists.
func Defaults(arch string, experts, used int) Params {
	switch {
	case arch == "llama" && experts == 8 && used == 2: // Mixtral-8x7B
		return Params{Alpha1: 1.20, Alpha2: 1.06, MinCorrect: 1, MaxCorrect: 1}
	case arch == "qwen2moe" && used == 4: // Qwen1.5-MoE-A2.7B
		return Params{Alpha1: 1.30, Alpha2: 1.00, MinCorrect: 2, MaxCorrect: 3}
	case arch == "deepseek2" && used == 6: // DeepSeek-V2-Lite
		return Params{Alpha1: 1.15, Alpha2: 1.00, MinCorrect: 4, MaxCorrect: 5}
	}
	lo := max((used+1)/2, 1)
	return Params{Alpha1: 1, Alpha2: 1, MinCorrect: lo, MaxCorrect: max(used-1, lo)}
}

// Correct counts the predicted experts the router also chose.
func Correct(trueSet, pred []int) int {
	n := 0
	for _, e := range pred {
		if slices.Contains(trueSet, e) {
			n++
		}
	}
	return n
}

// Adjust returns the mixing weights of the predicted experts pred, in its order, and true,
// when OWA applies: the number of correct predictions is in p's range and they carry some
// score. Otherwise it returns nil and false, and the caller weights the predicted experts
// as it would without OWA.
//
// Equation 5 gives each correctly predicted expert its score times 1 + (the missed experts'
// score) / (the correct experts' score), times Alpha1; a wrongly predicted expert keeps its
// own score. Equation 6 then rescales them all so that they sum to the true top-k's score,
// times Alpha2. scores holds every expert's score (see the package comment).
func Adjust(scores []float32, trueSet, pred []int, p Params) ([]float32, bool) {
	c := Correct(trueSet, pred)
	if c < p.MinCorrect || c > p.MaxCorrect || c == 0 {
		return nil, false
	}
	var correct, missed float64
	for _, e := range trueSet {
		if slices.Contains(pred, e) {
			correct += float64(scores[e])
		} else {
			missed += float64(scores[e])
		}
	}
	if !(correct > 0) {
		return nil, false // zero gate mass: nothing to scale
	}
	g := make([]float64, len(pred))
	var sum float64
	for k, e := range pred {
		g[k] = float64(scores[e])
		if slices.Contains(trueSet, e) {
			g[k] *= (1 + missed/correct) * p.Alpha1
		}
		sum += g[k]
	}
	out := make([]float32, len(pred))
	scale := (correct + missed) / sum * p.Alpha2
	for k := range g {
		out[k] = float32(g[k] * scale)
	}
	return out, true
}

// Parse reads a user's override of the settings p for a model with used experts per token:
// Syntax checks s as Parse reads it, without a model's parameters to check the values
// against: a caller can refuse a typo before it loads a model.
func Syntax(s string) error {
	_, _, err := parseFields(s, Params{})
	return err
}

// "" keeps p, "off" turns OWA off (on is false), "neutral" sets alpha1 = alpha2 = 1 and
// keeps p's range, and a comma-separated list of a1=F, a2=F and range=MIN-MAX (or a single
// N) replaces those fields of p.
func Parse(s string, p Params, used int) (_ Params, on bool, _ error) {
	p, on, err := parseFields(s, p)
	if err != nil || !on {
		return p, on, err
	}
	return p, true, p.Validate(used)
}

// parseFields reads s into p without validating the values.
func parseFields(s string, p Params) (_ Params, on bool, _ error) {
	switch s = strings.TrimSpace(s); s {
	case "":
		return p, true, nil
	case "off":
		return p, false, nil
	case "neutral":
		p.Alpha1, p.Alpha2 = 1, 1
		return p, true, nil
	}
	for _, f := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok {
			return p, false, fmt.Errorf("owa %q: %q is not key=value (a1, a2, range), off or neutral", s, f)
		}
		var err error
		want := "a number"
		switch k {
		case "a1", "alpha1":
			p.Alpha1, err = strconv.ParseFloat(v, 64)
		case "a2", "alpha2":
			p.Alpha2, err = strconv.ParseFloat(v, 64)
		case "range":
			want = "N or MIN-MAX, whole numbers"
			lo, hi, two := strings.Cut(v, "-")
			if p.MinCorrect, err = strconv.Atoi(lo); err == nil {
				p.MaxCorrect = p.MinCorrect
				if two {
					p.MaxCorrect, err = strconv.Atoi(hi)
				}
			}
		default:
			return p, false, fmt.Errorf("owa %q: unknown key %q: want a1, a2 or range", s, k)
		}
		if err != nil {
			return p, false, fmt.Errorf("owa %q: %s=%s: want %s", s, k, v, want)
		}
	}
	return p, true, nil
}
