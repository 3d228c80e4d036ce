package offload

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func overlap(a, b []int) int {
	n := 0
	for _, e := range a {
		if slices.Contains(b, e) {
			n++
		}
	}
	return n
}

func TestAccuracyPredictor(t *testing.T) {
	for _, p := range []float64{0, 0.3, 0.8, 1} {
		a, err := NewAccuracy(p, 64, 1)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(2, 2))
		hits, total := 0, 0
		for i := 0; i < 5000; i++ {
			truth := r.Perm(64)[:6]
			pred := a.Predict(i, 0, truth)
			if err := distinctExperts(pred, 64, 6); err != nil {
				t.Fatalf("p %v: %v", p, err)
			}
			hits += overlap(pred, truth)
			total += 6
		}
		if got := float64(hits) / float64(total); math.Abs(got-p) > 0.02 {
			t.Errorf("accuracy %v measured as %.3f", p, got)
		}
	}
	// With every expert chosen, any prediction is right.
	a, _ := NewAccuracy(0, 2, 1)
	if got := a.Predict(0, 0, []int{1, 0}); overlap(got, []int{0, 1}) != 2 {
		t.Errorf("top-2 of 2: predicted %v", got)
	}
	if _, err := NewAccuracy(1.5, 8, 1); err == nil {
		t.Error("p 1.5: no error")
	}
}

func TestParsePredictor(t *testing.T) {
	if got := MostUsed([]int{1, 4, 0, 4}, 3); !slices.Equal(got, []int{1, 3, 0}) {
		t.Errorf("most used: %v", got)
	}
	for _, s := range []string{"oracle", "accuracy=0.5"} {
		if _, err := ParsePredictor(s, 8, 1); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{"", "accuracy", "accuracy=x", "accuracy=2", "crystal-ball", "prev-token"} {
		if _, err := ParsePredictor(s, 8, 1); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}

// distinctExperts checks a prediction: used distinct experts of [0, experts).
func distinctExperts(ex []int, experts, used int) error {
	if len(ex) != used {
		return fmt.Errorf("%d experts predicted, want %d", len(ex), used)
	}
	for i, e := range ex {
		if e < 0 || e >= experts || slices.Contains(ex[:i], e) {
			return fmt.Errorf("experts %v: out of range or repeated", ex)
		}
	}
	return nil
}
