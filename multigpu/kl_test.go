package multigpu

import (
	"math"
	"testing"
)

func TestKLFromUniform(t *testing.T) {
	cases := []struct {
		name   string
		logits []float32
		want   float64
	}{
		{"uniform", []float32{0.3, 0.3, 0.3, 0.3}, 0},
		{"certain", []float32{0, -1000, -1000, -1000}, math.Log(4)},
		// p = (2/3, 1/3): KL = ln 2 - H = ln 2 + (2/3)ln(2/3) + (1/3)ln(1/3)
		{"two to one", []float32{float32(math.Log(2)), 0}, math.Log(2) + 2.0/3*math.Log(2.0/3) + 1.0/3*math.Log(1.0/3)},
		{"shift invariant", []float32{50 + float32(math.Log(2)), 50}, math.Log(2) + 2.0/3*math.Log(2.0/3) + 1.0/3*math.Log(1.0/3)},
	}
	for _, c := range cases {
		got := KLFromUniform(c.logits, make([]float64, len(c.logits)))
		if math.Abs(got-c.want) > 1e-5 {
			t.Errorf("%s: KL %v, want %v", c.name, got, c.want)
		}
	}
}
