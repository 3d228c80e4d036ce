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

// TestAccuracyFirstLayer checks that first=Q sets the first MoE layer's share and leaves the
// others at P.
func TestAccuracyFirstLayer(t *testing.T) {
	pred, err := ParsePredictor("accuracy=0.9,first=0.45", 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 3))
	hits, total := [2]int{}, 0
	for i := 0; i < 5000; i++ {
		for j := range 2 {
			truth := r.Perm(64)[:6]
			hits[j] += overlap(pred.Predict(i, j, truth), truth)
		}
		total += 6
	}
	for j, want := range []float64{0.45, 0.9} {
		if got := float64(hits[j]) / float64(total); math.Abs(got-want) > 0.02 {
			t.Errorf("layer %d: accuracy %.3f, want %v", j, got, want)
		}
	}
}

func TestParsePredictor(t *testing.T) {
	if got := MostUsed([]int{1, 4, 0, 4}, 3); !slices.Equal(got, []int{1, 3, 0}) {
		t.Errorf("most used: %v", got)
	}
	for _, s := range []string{"oracle", "accuracy=0.5", "accuracy=0.8,first=0.45", "accuracy=1,first=0"} {
		if _, err := ParsePredictor(s, 8, 1); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{"", "accuracy", "accuracy=x", "accuracy=2", "crystal-ball", "prev-token",
		"accuracy=0.8,", "accuracy=0.8,first", "accuracy=0.8,first=", "accuracy=0.8,first=1.5", "accuracy=0.8,first=-0.1",
		"accuracy=0.8,last=0.4", "accuracy=0.8,first=0.4,first=0.3", "accuracy=0.8,first=NaN"} {
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
