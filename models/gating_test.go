package models

import (
	"math"
	"reflect"
	"testing"
)

func TestTopK(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		v    []float32
		k    int
		want []int
	}{
		{[]float32{0.1, 0.5, 0.2, 0.9}, 2, []int{3, 1}},
		{[]float32{1, 1, 1}, 2, []int{0, 1}}, // ties keep the lower index
		{[]float32{0.3}, 1, []int{0}},
		{[]float32{nan, 0.2, 0.1}, 1, []int{1}},
		{[]float32{-3, -1, -2, -0.5, -4}, 3, []int{3, 1, 2}},
	}
	for _, c := range cases {
		if got := TopK(c.v, c.k); !reflect.DeepEqual(got, c.want) {
			t.Errorf("TopK(%v, %d) = %v, want %v", c.v, c.k, got, c.want)
		}
	}
}
