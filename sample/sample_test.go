package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestStops(t *testing.T) {
	cases := []struct {
		stops  []string
		pieces []string
		want   string
		hit    bool
	}{
		{nil, []string{"ab", "cd"}, "abcd", false},
		{[]string{"</s>"}, []string{"hello", " <", "/s", ">", "x"}, "hello ", true},
		{[]string{"END"}, []string{"the E", "N", "D"}, "the ", true},
		{[]string{"END"}, []string{"the E", "NX"}, "the ENX", false},
		{[]string{"xyz", "b"}, []string{"a", "bxyz"}, "a", true},
	}
	for _, c := range cases {
		m := NewStops(c.stops)
		var out string
		hit := false
		for _, p := range c.pieces {
			o, h := m.Push(p)
			out += o
			if h {
				hit = true
				break
			}
		}
		if !hit {
			out += m.Flush()
		}
		if out != c.want || hit != c.hit {
			t.Errorf("stops %q pieces %q: got %q hit=%v, want %q hit=%v", c.stops, c.pieces, out, hit, c.want, c.hit)
		}
	}
}

// TestLogprobs: log-probabilities of a softmax, the chosen token's and the top ones in
// order, ties to the lower id.
func TestLogprobs(t *testing.T) {
	logits := []float32{1, 3, 3, 0}
	lp := Logprobs(logits, make([]float32, 4), 0, 3)
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l))
	}
	want := func(l float32) float32 { return float32(float64(l) - math.Log(sum)) }
	if math.Abs(float64(lp.Logprob-want(1))) > 1e-6 || len(lp.Top) != 3 || lp.Top[0].ID != 1 || lp.Top[1].ID != 2 || lp.Top[2].ID != 0 ||
		math.Abs(float64(lp.Top[0].Logprob-want(3))) > 1e-6 {
		t.Errorf("logprobs %+v", lp)
	}
	if lp := Logprobs(logits, make([]float32, 4), 3, 0); lp.Top != nil {
		t.Errorf("no top asked, got %v", lp.Top)
	}
}

func TestSampler(t *testing.T) {
	logits := func() []float32 { return []float32{0, 2, 1, 3, -1} }
	if got := New(Options{}).Sample(logits(), nil); got != 3 {
		t.Errorf("greedy picked %d, want 3", got)
	}
	// Repetition penalty: token 3 (logit 3) divided by 4 falls below token 1 (logit 2).
	if got := New(Options{RepeatPenalty: 4}).Sample(logits(), []int32{3}); got != 1 {
		t.Errorf("greedy with repetition penalty picked %d, want 1", got)
	}
	// top-k 1 is greedy whatever the temperature.
	for seed := uint64(0); seed < 20; seed++ {
		if got := New(Options{Temperature: 5, TopK: 1, Seed: seed}).Sample(logits(), nil); got != 3 {
			t.Fatalf("top-k 1 picked %d", got)
		}
	}
	// Same seed, same tokens; the distribution follows the temperature.
	counts := map[int32]int{}
	s1, s2 := New(Options{Temperature: 1, Seed: 7}), New(Options{Temperature: 1, Seed: 7})
	for i := 0; i < 2000; i++ {
		a, b := s1.Sample(logits(), nil), s2.Sample(logits(), nil)
		if a != b {
			t.Fatalf("same seed diverged at draw %d", i)
		}
		counts[a]++
	}
	if counts[3] < counts[1] || counts[1] < counts[2] || counts[4] > counts[0] {
		t.Errorf("draw counts %v do not follow the logits", counts)
	}
	// Untruncated draws follow softmax(logits/T): each token's share within 0.015 of its
	// probability over 40000 draws (a standard deviation is at most 0.0025).
	for _, temp := range []float32{1, 0.5} {
		s := New(Options{Temperature: temp, Seed: 11})
		var n [5]int
		const draws = 40000
		for range draws {
			n[s.Sample(logits(), nil)]++
		}
		var z float64
		for _, l := range logits() {
			z += math.Exp(float64(l / temp))
		}
		for i, l := range logits() {
			want := math.Exp(float64(l/temp)) / z
			if got := float64(n[i]) / draws; math.Abs(got-want) > 0.015 {
				t.Errorf("temperature %v: token %d drawn %.4f of the time, want %.4f", temp, i, got, want)
			}
		}
	}
	// Truncated draws follow the kept tokens' renormalised probabilities: here 0.5, 0.3,
	// 0.15 and 0.05 (in id order 2, 0, 3, 1), of which top-p 0.7 and top-k 2 keep the first
	// two (0.625 and 0.375 of the draws), top-p 0.9 the first three.
	probs := []float64{0.3, 0.05, 0.5, 0.15}
	peaked := func() []float32 {
		l := make([]float32, len(probs))
		for i, p := range probs {
			l[i] = float32(math.Log(p))
		}
		return l
	}
	for _, c := range []struct {
		o    Options
		want []float64
	}{
		{Options{Temperature: 1, TopP: 0.7, Seed: 5}, []float64{0.375, 0, 0.625, 0}},
		{Options{Temperature: 1, TopK: 2, Seed: 5}, []float64{0.375, 0, 0.625, 0}},
		{Options{Temperature: 1, TopP: 0.9, Seed: 5}, []float64{0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95}},
		{Options{Temperature: 1, TopK: 3, TopP: 0.7, Seed: 5}, []float64{0.375, 0, 0.625, 0}},
	} {
		s := New(c.o)
		var n [4]int
		const draws = 40000
		for range draws {
			n[s.Sample(peaked(), nil)]++
		}
		for i, want := range c.want {
			if got := float64(n[i]) / draws; math.Abs(got-want) > 0.015 {
				t.Errorf("%+v: token %d drawn %.4f of the time, want %.4f", c.o, i, got, want)
			}
		}
	}
	// top-p small enough keeps only the best token.
	if got := New(Options{Temperature: 1, TopP: 0.1, Seed: 3}).Sample(logits(), nil); got != 3 {
		t.Errorf("top-p 0.1 picked %d", got)
	}
	// Frequency and presence penalties: logit - count*frequency - presence over the window.
	l := logits()
	New(Options{FrequencyPenalty: 0.5, PresencePenalty: 0.25, RepeatLastN: 3}).Sample(l, []int32{3, 1, 3, 3, 0})
	if want := []float32{-0.75, 2, 1, 1.75, -1}; !slices.Equal(l, want) {
		t.Errorf("penalised logits %v, want %v (the last 3 tokens: 3 twice, 0 once)", l, want)
	}
	if got := New(Options{FrequencyPenalty: 2}).Sample(logits(), []int32{3}); got != 1 {
		t.Errorf("greedy with a frequency penalty picked %d, want 1", got)
	}
	bad := []Options{{Temperature: -1}, {TopK: -2}, {TopP: 1.5}, {RepeatPenalty: -1}, {Temperature: float32(math.NaN())},
		{FrequencyPenalty: float32(math.NaN())}, {PresencePenalty: 101}}
	for _, o := range bad {
		if o.Validate() == nil {
			t.Errorf("%+v validated", o)
		}
	}
}

// A token allocates nothing once the sampler's scratch has grown, down every stage of the
// chain: Sample runs on every generated token.
func TestSampleAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]float32, 2048)
	for i := range src {
		src[i] = float32(r.NormFloat64() * 3)
	}
	logits := make([]float32, len(src))
	history := []int32{1, 5, 9, 5, 3000, -1, 7}
	for _, o := range []Options{{}, {Temperature: 1}, {Temperature: 1, TopP: 0.95}, {Temperature: 1, TopK: 40},
		{Temperature: 1, TopK: 40, TopP: 0.9}, {Temperature: 0.8, TopP: 0.9, RepeatPenalty: 1.1, FrequencyPenalty: 0.5, PresencePenalty: 0.2}} {
		s := New(o)
		if n := testing.AllocsPerRun(50, func() { copy(logits, src); s.Sample(logits, history) }); n != 0 {
			t.Errorf("%+v: %v allocations per token", o, n)
		}
	}
}

// BenchmarkSample draws a token at temperature 1 from the bundled model's vocabulary and
// from Qwen's, untruncated (a chat client's defaults) and with top-p. The logits are drawn
// from N(0, 9): flatter than a language model's, so top-p keeps most of the vocabulary, its
// worst case.
func BenchmarkSample(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, vocab := range []int{2048, 151936} {
		src := make([]float32, vocab)
		for i := range src {
			src[i] = float32(r.NormFloat64() * 3)
		}
		logits := make([]float32, vocab)
		for _, o := range []Options{{Temperature: 1}, {Temperature: 1, TopP: 0.95}} {
			s := New(o)
			b.Run(fmt.Sprintf("vocab=%d/top-p=%v", vocab, o.TopP), func(b *testing.B) {
				for b.Loop() {
					copy(logits, src)
					s.Sample(logits, nil)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// evenFilter allows the even tokens only, and records what it was given.
type evenFilter struct{ accepted []int32 }

func (f *evenFilter) Mask(logits []float32) bool {
	for i := 1; i < len(logits); i += 2 {
		logits[i] = float32(math.Inf(-1))
	}
	return len(logits) > 0
}

func (f *evenFilter) Accept(id int32) { f.accepted = append(f.accepted[:0], id) }

// TestFilter: the filter runs before every stage, greedy or drawn, so that no option draws a
// token it removed, even where top-k keeps more tokens than it allows; the token drawn is
// what it accepts; a filter that allows nothing makes Sample return -1.
func TestFilter(t *testing.T) {
	logits := func() []float32 { return []float32{0, 9, 1, 8, 0.5, 7} }
	for _, o := range []Options{{}, {Temperature: 1}, {Temperature: 3, TopK: 5}, {Temperature: 1, TopP: 0.99},
		{Temperature: 2, TopK: 4, TopP: 0.9, RepeatPenalty: 1.3, FrequencyPenalty: 1, PresencePenalty: 1}} {
		f := &evenFilter{}
		s := New(o)
		s.SetFilter(f)
		for range 500 {
			id := s.Sample(logits(), []int32{2, 1})
			if id%2 != 0 || len(f.accepted) != 1 || f.accepted[0] != id {
				t.Fatalf("%+v: drew %d, filter accepted %v", o, id, f.accepted)
			}
		}
	}
	s := New(Options{})
	s.SetFilter(&evenFilter{})
	if got := s.Sample(logits()[:1], nil); got != 0 {
		t.Errorf("greedy with one token allowed: %d", got)
	}
	s.SetFilter(nothing{})
	if got := s.Sample(logits(), nil); got != -1 {
		t.Errorf("a filter allowing nothing: got %d, want -1", got)
	}
}

type nothing struct{}

func (nothing) Mask([]float32) bool { return false }
func (nothing) Accept(int32)        {}
