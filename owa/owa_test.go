package owa

import (
	"math"
	"strings"
	"testing"
)

func TestAdjust(t *testing.T) {
	// Eight experts; the scores of the true top-4 (0, 1, 2, 3) sum to 1, as for a model that
	// renormalises.
	scores := []float32{0.4, 0.3, 0.2, 0.1, 0.05, 0.03, 0.02, 0.01}
	qwen := Params{Alpha1: 1.3, Alpha2: 1, MinCorrect: 2, MaxCorrect: 3}
	neutral := Params{Alpha1: 1, Alpha2: 1, MinCorrect: 1, MaxCorrect: 4}
	cases := []struct {
		name    string
		trueSet []int
		pred    []int
		p       Params
		want    []float64 // nil: OWA does not apply
	}{
		{
			// Correct 0, 1, 2 (mass 0.9), missed 3 (0.1), wrong 4 (0.05).
			// Eq. 5: correct ones x (1 + 0.1/0.9) x 1.3 = x 1.4444: 0.57778, 0.43333, 0.28889; wrong 0.05.
			// Sum 1.35; eq. 6 rescales to 1: / 1.35.
			name: "three of four, Qwen's alphas", trueSet: []int{0, 1, 2, 3}, pred: []int{0, 1, 2, 4}, p: qwen,
			want: []float64{0.57778 / 1.35, 0.43333 / 1.35, 0.28889 / 1.35, 0.05 / 1.35},
		},
		{
			// Neutral: correct 0, 3 (mass 0.5) x (1 + 0.5/0.5) = x2: 0.8, 0.2; wrong 5 and 6 keep
			// 0.03 and 0.02. Sum 1.05, rescaled to 1.
			name: "two of four, neutral", trueSet: []int{0, 1, 2, 3}, pred: []int{5, 0, 6, 3}, p: neutral,
			want: []float64{0.03 / 1.05, 0.8 / 1.05, 0.02 / 1.05, 0.2 / 1.05},
		},
		{
			// Alpha2 scales the total: the same as above, times 1.06.
			name: "alpha2", trueSet: []int{0, 1, 2, 3}, pred: []int{5, 0, 6, 3}, p: Params{Alpha1: 1, Alpha2: 1.06, MinCorrect: 1, MaxCorrect: 4},
			want: []float64{1.06 * 0.03 / 1.05, 1.06 * 0.8 / 1.05, 1.06 * 0.02 / 1.05, 1.06 * 0.2 / 1.05},
		},
		{
			// All correct: nothing missed; eq. 6 restores the true mass, so the weights are the
			// scores times alpha2 whatever alpha1.
			name: "all correct", trueSet: []int{0, 1, 2, 3}, pred: []int{3, 2, 1, 0}, p: Params{Alpha1: 1.4, Alpha2: 1, MinCorrect: 1, MaxCorrect: 4},
			want: []float64{0.1, 0.2, 0.3, 0.4},
		},
		{name: "all correct, outside the range", trueSet: []int{0, 1, 2, 3}, pred: []int{0, 1, 2, 3}, p: qwen},
		{name: "one correct, below the range", trueSet: []int{0, 1, 2, 3}, pred: []int{0, 4, 5, 6}, p: qwen},
		{name: "no correct prediction", trueSet: []int{0, 1, 2, 3}, pred: []int{4, 5, 6, 7}, p: Params{Alpha1: 1, Alpha2: 1, MinCorrect: 0, MaxCorrect: 4}},
	}
	for _, c := range cases {
		got, ok := Adjust(scores, c.trueSet, c.pred, c.p)
		if c.want == nil {
			if ok || got != nil {
				t.Errorf("%s: applied (%v), want OWA bypassed", c.name, got)
			}
			continue
		}
		if !ok || len(got) != len(c.want) {
			t.Errorf("%s: %v %v, want %v", c.name, got, ok, c.want)
			continue
		}
		for k := range got {
			if math.Abs(float64(got[k])-c.want[k]) > 1e-5 {
				t.Errorf("%s: weights %v, want %v", c.name, got, c.want)
				break
			}
		}
	}
}

// Zero gate mass on the correct experts (scores underflowed) bypasses OWA instead of
// dividing by zero.
func TestAdjustZeroMass(t *testing.T) {
	scores := []float32{0, 0, 0.7, 0.3}
	if got, ok := Adjust(scores, []int{0, 2}, []int{0, 3}, Params{Alpha1: 1, Alpha2: 1, MinCorrect: 1, MaxCorrect: 2}); ok {
		t.Errorf("applied with zero mass on the correct expert: %v", got)
	}
}

func TestDefaults(t *testing.T) {
	cases := []struct {
		arch          string
		experts, used int
		want          Params
	}{
		{"llama", 8, 2, Params{1.20, 1.06, 1, 1}},
		{"qwen2moe", 60, 4, Params{1.30, 1.00, 2, 3}},
		{"deepseek2", 64, 6, Params{1.15, 1.00, 4, 5}},
		{"olmoe", 64, 8, Params{1, 1, 4, 7}},
		{"qwen3moe", 128, 8, Params{1, 1, 4, 7}},
		{"qwen2moe", 16, 3, Params{1, 1, 2, 2}},
		{"llama", 8, 1, Params{1, 1, 1, 1}},
	}
	for _, c := range cases {
		got := Defaults(c.arch, c.experts, c.used)
		if got != c.want {
			t.Errorf("%s %d/%d: %+v, want %+v", c.arch, c.used, c.experts, got, c.want)
		}
		if err := got.Validate(c.used); err != nil {
			t.Errorf("%s %d/%d: the default is invalid: %v", c.arch, c.used, c.experts, err)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		p    Params
		want string
	}{
		{Params{0, 1, 1, 1}, "alpha1"},
		{Params{1, math.NaN(), 1, 1}, "alpha2"},
		{Params{1, 1, 0, 1}, "trigger range"},
		{Params{1, 1, 3, 2}, "trigger range"},
		{Params{1, 1, 1, 5}, "trigger range"},
	}
	for _, c := range cases {
		if err := c.p.Validate(4); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error mentioning %q", c.p, err, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	base := Params{Alpha1: 1.3, Alpha2: 1, MinCorrect: 2, MaxCorrect: 3}
	for _, c := range []struct {
		in   string
		want Params
		on   bool
		err  string
	}{
		{"", base, true, ""},
		{"off", base, false, ""},
		{"neutral", Params{1, 1, 2, 3}, true, ""},
		{"a1=1.1", Params{1.1, 1, 2, 3}, true, ""},
		{"a1=1.2, a2=1.05,range=1-3", Params{1.2, 1.05, 1, 3}, true, ""},
		{"range=2", Params{1.3, 1, 2, 2}, true, ""},
		{"range=0-2", Params{}, false, "trigger range"},
		{"range=3-5", Params{}, false, "trigger range"},
		{"a1=-1", Params{}, false, "alpha1"},
		{"a1=x", Params{}, false, "a1"},
		{"beta=1", Params{}, false, "unknown key"},
		{"on", Params{}, false, "not key=value"},
	} {
		got, on, err := Parse(c.in, base, 4)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Parse(%q) error %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want || on != c.on {
			t.Errorf("Parse(%q) = %+v, %v, %v; want %+v, %v", c.in, got, on, err, c.want, c.on)
		}
	}
}
