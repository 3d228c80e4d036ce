package main

import (
	"math"
	"slices"
)

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// stddev is the sample standard deviation of xs; 0 for fewer than two.
func stddev(xs []float64) float64 {
	if len(xs) < 2 {
		return 0
	}
	var mean float64
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss / float64(len(xs)-1))
}

// ratio is a/b, or nil when either is missing (0: the engine failed or was not run).
func ratio(a, b float64) *float64 {
	if a <= 0 || b <= 0 {
		return nil
	}
	r := a / b
	return &r
}
