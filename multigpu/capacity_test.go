package multigpu

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestCapacity(t *testing.T) {
	for _, c := range []struct {
		tokens, k, experts int
		gamma              float64
		want               int
	}{
		{1024, 2, 8, 1.25, 320}, // seeds/002: mean 256, floor(1.25 * 256)
		{1024, 2, 8, 1.0, 256},
		{1024, 1, 4, 1.5, 384},
		{1000, 1, 8, 1.2, 150},
		{1000, 1, 8, 0, 0},
		{7, 2, 3, 1, 4}, // floor(14/3)
	} {
		got, err := Capacity(c.tokens, c.k, c.experts, c.gamma)
		if err != nil || got != c.want {
			t.Errorf("Capacity(%d, %d, %d, %v) = %d, %v; want %d", c.tokens, c.k, c.experts, c.gamma, got, err, c.want)
		}
	}
	for _, c := range []struct {
		tokens, k, experts int
		gamma              float64
	}{{10, 0, 8, 1}, {10, 9, 8, 1}, {-1, 1, 8, 1}, {10, 1, 8, -1}} {
		if _, err := Capacity(c.tokens, c.k, c.experts, c.gamma); err == nil {
			t.Errorf("Capacity(%d, %d, %d, %v): no error", c.tokens, c.k, c.experts, c.gamma)
		}
	}
}

// top1 is a top-1 routing with the given experts and scores.
func top1(experts int, choice []int, score []float32) Routing {
	if score == nil {
		score = make([]float32, len(choice))
		for i := range score {
			score[i] = 1
		}
	}
	return Routing{Experts: experts, K: 1, Choice: choice, Score: score}
}

// seeds/002's skewed batch: 900 tokens to expert 0, 100 spread over 1..7, capacity 300:
// exactly the hot expert's 600 overflow is dropped, the cold experts keep all of theirs; and
// raising the capacity factor never drops more.
func TestDropSkewed(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	choice := make([]int, 1000)
	for i := 900; i < 1000; i++ {
		choice[i] = 1 + rng.IntN(7)
	}
	rng.Shuffle(len(choice), func(i, j int) { choice[i], choice[j] = choice[j], choice[i] })
	r := top1(8, choice, nil)
	for m := ByScore; m <= ByRandom; m++ {
		p, err := Drop(r, 300, m, 7)
		if err != nil {
			t.Fatal(err)
		}
		if p.Dropped != 600 || p.Load[0] != 300 {
			t.Errorf("%v: dropped %d, hot expert computes %d; want 600 and 300", m, p.Dropped, p.Load[0])
		}
		kept := 0
		for _, k := range p.Kept {
			if k {
				kept++
			}
		}
		if kept+p.Dropped != len(choice) {
			t.Errorf("%v: %d kept + %d dropped != %d", m, kept, p.Dropped, len(choice))
		}
		for e := 1; e < 8; e++ {
			n := 0
			for _, c := range choice {
				if c == e {
					n++
				}
			}
			if p.Load[e] != n {
				t.Errorf("%v: cold expert %d computes %d of its %d", m, e, p.Load[e], n)
			}
		}
	}
	prev := len(choice) + 1
	for _, g := range []float64{0, 0.5, 1, 1.25, 1.5, 2, 4, 8} {
		c, _ := Capacity(len(choice), 1, 8, g)
		p, _ := Drop(r, c, ByScore, 0)
		if p.Dropped > prev {
			t.Errorf("capacity factor %v drops %d, more than the smaller factor's %d", g, p.Dropped, prev)
		}
		prev = p.Dropped
		if g == 0 && p.Dropped != len(choice) {
			t.Errorf("capacity 0 keeps %d tokens", len(choice)-p.Dropped)
		}
	}
	if prev != 0 {
		t.Errorf("capacity factor 8 still drops %d", prev)
	}
}

// Each metric keeps the tokens it says it keeps.
func TestDropMetrics(t *testing.T) {
	// Five tokens on expert 0 (top-1), capacity 2.
	r := top1(2, []int{0, 0, 0, 0, 0}, []float32{0.2, 0.9, 0.5, 0.9, 0.1})
	for _, c := range []struct {
		m    DropMetric
		want []bool
	}{
		{ByScore, []bool{false, true, false, true, false}},
		{ByOrder, []bool{true, true, false, false, false}},
		{ByReverseOrder, []bool{false, false, false, true, true}},
	} {
		p, err := Drop(r, 2, c.m, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Kept, c.want) {
			t.Errorf("%v keeps %v, want %v", c.m, p.Kept, c.want)
		}
	}
	a, _ := Drop(r, 2, ByRandom, 3)
	b, _ := Drop(r, 2, ByRandom, 3)
	if a.Dropped != 3 || !slices.Equal(a.Kept, b.Kept) {
		t.Errorf("random: %+v and %+v with one seed", a, b)
	}
	// Top-2: a token's two choices are judged independently, by expert.
	r2 := Routing{Experts: 3, K: 2, Choice: []int{0, 1, 0, 2, 0, 1}, Score: []float32{0.6, 0.4, 0.7, 0.3, 0.5, 0.5}}
	p, _ := Drop(r2, 2, ByScore, 0)
	if want := []bool{true, true, true, true, false, true}; !slices.Equal(p.Kept, want) || p.Load[0] != 2 || p.Load[1] != 2 || p.Load[2] != 1 {
		t.Errorf("top-2: %+v", p)
	}
}

func TestDropBadInput(t *testing.T) {
	for _, c := range []struct {
		r    Routing
		want string
	}{
		{Routing{Experts: 2, K: 1, Choice: []int{2}, Score: []float32{1}}, "expert 2 of 2"},
		{Routing{Experts: 2, K: 1, Choice: []int{0}, Score: nil}, "scores"},
		{Routing{Experts: 2, K: 3}, "top-3"},
	} {
		if _, err := Drop(c.r, 1, ByScore, 0); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error mentioning %q", c.r, err, c.want)
		}
	}
	if _, err := ParseDropMetric("best"); err == nil {
		t.Error("ParseDropMetric(best): no error")
	}
	for m := ByScore; m <= ByRandom; m++ {
		if got, err := ParseDropMetric(m.String()); err != nil || got != m {
			t.Errorf("ParseDropMetric(%q) = %v, %v", m.String(), got, err)
		}
	}
}
