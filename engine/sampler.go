package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// sampler picks tokens from logits with llama.cpp's usual chain: repetition penalty, top-k,
// temperature, top-p. It owns its RNG so a seed reproduces a run.
type sampler struct {
	o   SamplerOptions
	rng *rand.Rand
	// scratch
	cand   []candidate
	counts map[int32]int // tokens of the penalty window
}

type candidate struct {
	id int32
	p  float32
}

func (o *SamplerOptions) validate() error {
	switch {
	case o.Temperature < 0 || o.Temperature > 100 || isNaN(o.Temperature):
		return fmt.Errorf("temperature %g: want 0 to 100", o.Temperature)
	case o.TopK < 0:
		return fmt.Errorf("top-k %d: want 0 (off) or more", o.TopK)
	case o.TopP < 0 || o.TopP > 1 || isNaN(o.TopP):
		return fmt.Errorf("top-p %g: want 0 to 1", o.TopP)
	case o.RepeatPenalty < 0 || o.RepeatPenalty > 100 || isNaN(o.RepeatPenalty):
		return fmt.Errorf("repeat penalty %g: want 0 to 100 (1 = off)", o.RepeatPenalty)
	case o.RepeatLastN < 0:
		return fmt.Errorf("repeat-last-n %d: want 0 or more", o.RepeatLastN)
	case !(o.FrequencyPenalty >= -100 && o.FrequencyPenalty <= 100):
		return fmt.Errorf("frequency penalty %g: want -100 to 100 (0 = off)", o.FrequencyPenalty)
	case !(o.PresencePenalty >= -100 && o.PresencePenalty <= 100):
		return fmt.Errorf("presence penalty %g: want -100 to 100 (0 = off)", o.PresencePenalty)
	}
	return nil
}

func isNaN(f float32) bool { return f != f }

func newSampler(o SamplerOptions) *sampler {
	return &sampler{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x636f6d6d69742d72)), counts: map[int32]int{}}
}

// sample picks the next token given the logits (modified in place) and the recent history.
func (s *sampler) sample(logits []float32, history []int32) int32 {
	o := s.o
	repeat := o.RepeatPenalty > 0 && o.RepeatPenalty != 1
	if repeat || o.FrequencyPenalty != 0 || o.PresencePenalty != 0 {
		// llama.cpp's penalties over the last n tokens: the repetition penalty, then
		// frequency and presence. Each token's change is its own, so the map's order does
		// not matter.
		n := o.RepeatLastN
		if n == 0 {
			n = 64
		}
		clear(s.counts)
		for _, id := range history[max(0, len(history)-n):] {
			if int(id) < len(logits) && id >= 0 {
				s.counts[id]++
			}
		}
		for id, c := range s.counts {
			if repeat {
				if logits[id] > 0 {
					logits[id] /= o.RepeatPenalty
				} else {
					logits[id] *= o.RepeatPenalty
				}
			}
			logits[id] -= float32(c)*o.FrequencyPenalty + o.PresencePenalty
		}
	}
	if o.Greedy || o.Temperature == 0 {
		return argmax(logits)
	}
	c := s.cand[:0]
	for i, l := range logits {
		c = append(c, candidate{int32(i), l})
	}
	topK := o.TopK > 0 && o.TopK < len(c)
	sorted := topK || o.TopP > 0 && o.TopP < 1
	if sorted {
		// Truncation keeps the most likely tokens: sort them first (ties to the lower id).
		// Without it every token stays and the walk below draws from the same distribution in
		// any order, so the vocabulary is not sorted for each token.
		slices.SortFunc(c, func(a, b candidate) int {
			switch {
			case a.p > b.p || a.p == b.p && a.id < b.id:
				return -1
			case a.p == b.p && a.id == b.id:
				return 0
			}
			return 1
		})
	}
	if topK {
		c = c[:o.TopK]
	}
	// softmax with temperature
	maxl := c[0].p // the largest, once sorted
	if !sorted {
		for _, x := range c {
			maxl = max(maxl, x.p)
		}
	}
	var sum float64
	for i := range c {
		e := math.Exp(float64((c[i].p - maxl) / o.Temperature))
		c[i].p = float32(e)
		sum += e
	}
	for i := range c {
		c[i].p = float32(float64(c[i].p) / sum)
	}
	if o.TopP > 0 && o.TopP < 1 {
		var cum float32
		for i := range c {
			cum += c[i].p
			if cum >= o.TopP {
				c = c[:i+1]
				break
			}
		}
	}
	var total float32
	for _, x := range c {
		total += x.p
	}
	r := s.rng.Float32() * total
	s.cand = c
	for _, x := range c {
		r -= x.p
		if r < 0 {
			return x.id
		}
	}
	return c[len(c)-1].id
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// logprobsOf returns the log-probability of id under logits and the top most likely tokens,
// most likely first (ties to the lower id); lp is scratch of len(logits).
func logprobsOf(logits, lp []float32, id int32, top int) Logprob {
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

// softmaxInto writes the probabilities of logits into p (float64 sum, max subtracted).
func softmaxInto(p, logits []float32) {
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
