package sample

import (
	"math"
	"slices"
)

// Logprob is a generated token's log-probability and the most likely tokens at its position,
// most likely first.
type Logprob struct {
	ID      int32
	Logprob float32
	Top     []TokenLogprob
}

// TokenLogprob is one token's log-probability.
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Logprobs returns the log-probability of id under logits and the top most likely tokens,
// most likely first (ties to the lower id); lp is scratch of len(logits).
func Logprobs(logits, lp []float32, id int32, top int) Logprob {
	maxl := float32(math.Inf(-1))
	for _, l := range logits {
		maxl = max(maxl, l)
	}
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l - maxl))
	}
	lse := float64(maxl) + math.Log(sum)
	for i, l := range logits {
		lp[i] = float32(float64(l) - lse)
	}
	out := Logprob{ID: id, Logprob: lp[id]}
	if top <= 0 {
		return out
	}
	// One pass, keeping the best top in order: a later token enters only when it beats the
	// last kept one, so ties keep the lower id.
	out.Top = make([]TokenLogprob, 0, top+1)
	for i, v := range lp {
		if len(out.Top) == top && v <= out.Top[top-1].Logprob {
			continue
		}
		pos := len(out.Top)
		for pos > 0 && out.Top[pos-1].Logprob < v {
			pos--
		}
		out.Top = slices.Insert(out.Top, pos, TokenLogprob{ID: int32(i), Logprob: v})
		if len(out.Top) > top {
			out.Top = out.Top[:top]
		}
	}
	return out
}

// Softmax writes the probabilities of logits into p (float64 sum, max subtracted).
func Softmax(p, logits []float32) {
	maxl := float32(math.Inf(-1))
	for _, l := range logits {
		maxl = max(maxl, l)
	}
	var sum float64
	for i, l := range logits {
		e := math.Exp(float64(l - maxl))
		p[i] = float32(e)
		sum += e
	}
	inv := 1 / sum
	for i := range p {
		p[i] = float32(float64(p[i]) * inv)
	}
}
