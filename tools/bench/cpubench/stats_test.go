package main

import (
	"math"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1}, 2},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{10, 10, 1, 10, 100}, 10},
	} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %g, want %g", c.xs, got, c.want)
		}
	}
	xs := []float64{3, 1, 2}
	median(xs)
	if xs[0] != 3 || xs[1] != 1 {
		t.Errorf("median reordered its input: %v", xs)
	}
}

func TestStddev(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 0},
		{[]float64{1, 3}, math.Sqrt2},
		{[]float64{2, 4, 4, 4, 5, 5, 7, 9}, math.Sqrt(32.0 / 7)},
	} {
		if got := stddev(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("stddev(%v) = %g, want %g", c.xs, got, c.want)
		}
	}
}

func TestRatio(t *testing.T) {
	for _, c := range []struct {
		a, b float64
		want *float64
	}{
		{10, 5, ptr(2)},
		{5, 10, ptr(0.5)},
		{0, 5, nil},
		{5, 0, nil},
		{-1, 5, nil},
	} {
		got := ratio(c.a, c.b)
		if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
			t.Errorf("ratio(%g, %g) = %v, want %v", c.a, c.b, deref(got), deref(c.want))
		}
	}
}

func ptr(x float64) *float64 { return &x }

func deref(x *float64) any {
	if x == nil {
		return nil
	}
	return *x
}

func TestEngineResultAdd(t *testing.T) {
	var e engineResult
	e.add(10, 100, nil)
	e.add(0, 300, errTest)
	e.add(30, 200, nil)
	e.add(20, 50, nil)
	if e.TokS != 20 || len(e.Samples) != 3 || len(e.Errors) != 1 || e.PeakRSS != 300 {
		t.Errorf("after three runs and a failure: %+v", e)
	}
}
