// Package sample chooses the next token from a model's logits: llama.cpp's sampler chain
// (a token filter, then repetition, frequency and presence penalties, top-k, temperature,
// top-p, in that order) drawn with a seeded generator of its own, the log-probabilities a
// server reports beside the token, and the stop strings that end a generation and never
// reach its text.
//
// The filter stage (Filter, set with SetFilter) runs first, so that every later stage,
// greedy or drawn, sees only the tokens it allows: a grammar that holds the output to JSON
// (package grammar's Matcher) is one. It comes before the penalties because they rescale
// logits the filter removes, and before top-k and top-p so that they keep the likeliest of
// the allowed tokens rather than leave none.
package sample

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/commit-run/commit-run/models"
)

// Options choose the next token from a distribution. The zero value is greedy.
type Options struct {
	// Temperature 0 (or Greedy) picks the most likely token.
	Temperature float32
	TopK        int     // 0 = off
	TopP        float32 // 0 or 1 = off
	// RepeatPenalty > 1 penalises tokens seen in the last RepeatLastN tokens (llama.cpp's rule:
	// positive logits divided, negative multiplied). 0 or 1 = off.
	RepeatPenalty float32
	RepeatLastN   int // 0 = 64
	// FrequencyPenalty and PresencePenalty lower the logit of each token in the same last
	// RepeatLastN tokens by FrequencyPenalty times its count there plus PresencePenalty
	// (OpenAI's rule, over llama.cpp's window). 0 = off; -100 to 100.
	FrequencyPenalty float32
	PresencePenalty  float32
	Seed             uint64
	Greedy           bool
}

// Sampler picks tokens from logits with llama.cpp's usual chain: repetition, frequency and
// presence penalties, top-k, temperature, top-p. It owns its RNG so a seed reproduces a run,
// and its scratch, so that a token allocates nothing; it is not safe for concurrent use.
type Sampler struct {
	o   Options
	rng *rand.Rand
	// scratch
	cand    []candidate
	scratch []float32     // top-k's heap, then its weights
	counts  map[int32]int // tokens of the penalty window
	filter  Filter
}

// Filter is a stage of the chain that allows only some tokens next, and follows the tokens
// drawn: a grammar. Mask runs before every other stage; Accept gets the token drawn.
type Filter interface {
	// Mask sets the logits of the tokens that may not come next to -Inf, and reports
	// whether any token may.
	Mask(logits []float32) bool
	// Accept moves past the token drawn, one Mask allowed.
	Accept(id int32)
}

// SetFilter makes f the chain's first stage (nil: none).
func (s *Sampler) SetFilter(f Filter) { s.filter = f }

type candidate struct {
	id int32
	p  float32
}

// Validate reports the first option out of its range.
func (o *Options) Validate() error {
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

// New makes a sampler with options o, which Validate accepts.
func New(o Options) *Sampler {
	return &Sampler{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x636f6d6d69742d72)), counts: map[int32]int{}}
}

// Sample picks the next token given the logits (modified in place) and the tokens so far,
// whose last RepeatLastN the penalties weigh. It returns -1 when the filter allows no token.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	if s.filter == nil {
		return s.sample(logits, history)
	}
	if !s.filter.Mask(logits) {
		return -1
	}
	id := s.sample(logits, history)
	s.filter.Accept(id)
	return id
}

func (s *Sampler) sample(logits []float32, history []int32) int32 {
	o := s.o
	s.penalize(logits, history)
	if o.Greedy || o.Temperature == 0 {
		return argmax(logits)
	}
	maxl := maxLogit(logits)
	topP := o.TopP > 0 && o.TopP < 1
	var c []candidate
	var sum float64
	if o.TopK > 0 && o.TopK < len(logits) {
		c, sum = s.topK(logits, maxl)
	} else {
		sum = s.weighAll(logits, maxl)
		if !topP {
			// Every token stays: the walk draws from the same distribution in any order,
			// so it walks the vocabulary in id order, unsorted.
			return s.walk(logits, nil, sum)
		}
		c = s.nucleus(logits, sum)
	}
	s.cand = c
	if topP {
		c, sum = cutTopP(c, sum, o.TopP)
	}
	return s.walk(nil, c, sum)
}

// penalize applies llama.cpp's penalties over the last n tokens: the repetition penalty,
// then frequency and presence. Each token's change is its own, so the map's order does not
// matter.
func (s *Sampler) penalize(logits []float32, history []int32) {
	o := s.o
	repeat := o.RepeatPenalty > 0 && o.RepeatPenalty != 1
	if !repeat && o.FrequencyPenalty == 0 && o.PresencePenalty == 0 {
		return
	}
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

// maxLogit is the largest logit, which the weights are taken relative to so that exp cannot
// overflow.
func maxLogit(logits []float32) float32 {
	maxl := logits[0]
	for _, l := range logits {
		if l > maxl { // not the builtin max, whose NaN rules cost a branch chain per value
			maxl = l
		}
	}
	return maxl
}

// topK keeps the K most likely, ties to the lower id: those at or above the K-th largest
// logit, sorted and cut to K. Only they are weighed, exp((l - max)/T), so the rest of the
// vocabulary costs one pass.
func (s *Sampler) topK(logits []float32, maxl float32) ([]candidate, float64) {
	inv := 1 / s.o.Temperature
	kth := s.kthLargest(logits, s.o.TopK)
	c := s.cand[:0]
	for i, l := range logits {
		if l >= kth {
			c = append(c, candidate{int32(i), l})
		}
	}
	sortCandidates(c)
	c = c[:s.o.TopK]
	w := s.scratch[:0]
	for _, x := range c {
		w = append(w, (x.p-maxl)*inv)
	}
	models.ExpInPlace(w)
	var sum float64
	for i := range c {
		c[i].p = w[i]
		sum += float64(w[i])
	}
	s.scratch = w
	return c, sum
}

// weighAll turns every logit into its weight at the temperature, exp((l - max)/T), in place,
// and returns their sum.
func (s *Sampler) weighAll(logits []float32, maxl float32) float64 {
	inv := 1 / s.o.Temperature
	for i, l := range logits {
		logits[i] = (l - maxl) * inv
	}
	models.ExpInPlace(logits)
	return sum64(logits)
}

// nucleus returns, sorted, the tokens top-p can keep out of weights summing to sum. The most
// likely tokens whose probabilities first reach p lie among those of weight at least some
// threshold: it falls until they hold p, so that only they are sorted, not the whole
// vocabulary.
func (s *Sampler) nucleus(weights []float32, sum float64) []candidate {
	var c []candidate
	for thr := float32(sum) / 1024; ; thr /= 1024 {
		if thr < float32(sum)*1e-30 {
			thr = 0
		}
		c = s.cand[:0]
		var mass float64
		for i, e := range weights {
			if e >= thr {
				c = append(c, candidate{int32(i), e})
				mass += float64(e)
			}
		}
		if thr == 0 || mass >= float64(s.o.TopP)*sum {
			break
		}
	}
	sortCandidates(c)
	return c
}

// cutTopP cuts the sorted candidates c, whose weights sum to sum, after the first whose
// cumulative weight reaches p of it, and returns them with their own sum.
func cutTopP(c []candidate, sum float64, p float32) ([]candidate, float64) {
	var cum float64
	for i := range c {
		if cum += float64(c[i].p); cum >= float64(p)*sum {
			c = c[:i+1]
			break
		}
	}
	sum = 0
	for _, x := range c {
		sum += float64(x.p)
	}
	return c, sum
}

// sum64 sums v in float64, in four running sums so that the additions do not wait on each
// other.
func sum64(v []float32) float64 {
	var a, b, c, d float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a += float64(v[i])
		b += float64(v[i+1])
		c += float64(v[i+2])
		d += float64(v[i+3])
	}
	for ; i < len(v); i++ {
		a += float64(v[i])
	}
	return (a + b) + (c + d)
}

// sortCandidates puts the most likely first, ties to the lower id.
func sortCandidates(c []candidate) {
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

// walk draws a token from weights (by id), or from the candidates c where weights is nil,
// whose weights sum to sum.
func (s *Sampler) walk(weights []float32, c []candidate, sum float64) int32 {
	r := s.rng.Float64() * sum
	if weights == nil {
		for _, x := range c {
			if r -= float64(x.p); r < 0 {
				return x.id
			}
		}
		// r's rounding left it at the sum: the last token of any weight, never one a filter
		// removed (top-k may have kept such tokens, at weight 0).
		for i := len(c) - 1; i > 0; i-- {
			if c[i].p > 0 {
				return c[i].id
			}
		}
		return c[0].id
	}
	last := 0
	for i, e := range weights {
		if r -= float64(e); r < 0 {
			return int32(i)
		}
		if e > 0 {
			last = i
		}
	}
	return int32(last)
}

// kthLargest returns the k-th largest of the logits (0 < k < len(logits)) in one pass over
// them, through a min-heap of the k largest so far.
func (s *Sampler) kthLargest(logits []float32, k int) float32 {
	h := s.scratch[:0]
	for _, l := range logits {
		switch {
		case len(h) < k:
			h = append(h, l)
			for j := len(h) - 1; j > 0 && h[(j-1)/2] > h[j]; j = (j - 1) / 2 {
				h[j], h[(j-1)/2] = h[(j-1)/2], h[j]
			}
		case l > h[0]:
			h[0] = l
			for j := 0; ; {
				m := j
				if a := 2*j + 1; a < k && h[a] < h[m] {
					m = a
				}
				if b := 2*j + 2; b < k && h[b] < h[m] {
					m = b
				}
				if m == j {
					break
				}
				h[j], h[m] = h[m], h[j]
				j = m
			}
		}
	}
	s.scratch = h
	return h[0]
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
