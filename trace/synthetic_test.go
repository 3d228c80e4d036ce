package trace

import (
	"bytes"
	"slices"
	"testing"
)

func synth(t *testing.T, o SynthOptions) *SynthRouter {
	t.Helper()
	r, err := NewSynthRouter(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func loadMaxOverMean(r *SynthRouter, tokens, layer int) float64 {
	counts := make([]int, r.o.Experts)
	for i := 0; i < tokens; i++ {
		for _, e := range r.Next().Layers[layer].Experts {
			counts[e]++
		}
	}
	return float64(slices.Max(counts)) / (float64(tokens*r.o.Used) / float64(r.o.Experts))
}

func TestSynthSkew(t *testing.T) {
	base := SynthOptions{Layers: 2, Experts: 16, Used: 2, Seed: 1}
	uniform := loadMaxOverMean(synth(t, base), 20000, 0)
	base.Skew = 1.2
	skewed := loadMaxOverMean(synth(t, base), 20000, 0)
	if uniform > 1.15 || skewed < 2.5 {
		t.Errorf("busiest expert over mean: uniform %.2f (want ~1), Zipf 1.2 %.2f (want > 2.5)", uniform, skewed)
	}
}

func TestSynthCorrelations(t *testing.T) {
	r := synth(t, SynthOptions{Layers: 3, Experts: 8, Used: 2, CrossLayer: 1, Seed: 2})
	for i := 0; i < 100; i++ {
		tok := r.Next()
		for l := 1; l < 3; l++ {
			want := []int{r.partner[l-1][tok.Layers[l-1].Experts[0]], r.partner[l-1][tok.Layers[l-1].Experts[1]]}
			got := slices.Clone(tok.Layers[l].Experts)
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("cross-layer 1: layer %d chose %v, partners are %v", l, got, want)
			}
		}
	}
	r = synth(t, SynthOptions{Layers: 2, Experts: 8, Used: 3, Temporal: 1, Seed: 3})
	first := r.Next()
	for i := 0; i < 50; i++ {
		tok := r.Next()
		for l := range tok.Layers {
			a, b := slices.Clone(tok.Layers[l].Experts), slices.Clone(first.Layers[l].Experts)
			slices.Sort(a)
			slices.Sort(b)
			if !slices.Equal(a, b) {
				t.Fatalf("temporal 1: token %d layer %d chose %v, the first token %v", i, l, a, b)
			}
		}
	}
}

func TestSynthDeterministicAndWritable(t *testing.T) {
	o := SynthOptions{Layers: 4, Experts: 60, Used: 4, Skew: 0.8, CrossLayer: 0.5, Temporal: 0.2, Seed: 9}
	a, b := synth(t, o), synth(t, o)
	var buf bytes.Buffer
	w, err := NewWriter(&buf, a.Header("qwen1.5-moe shape"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500; i++ {
		ta, tb := a.Next(), b.Next()
		for l := range ta.Layers {
			if !slices.Equal(ta.Layers[l].Experts, tb.Layers[l].Experts) {
				t.Fatalf("token %d: same seed, different routing", i)
			}
		}
		if err := w.Write(ta); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Header().Synthetic {
		t.Error("synthetic trace not labelled as such")
	}
}

func TestSynthOptionErrors(t *testing.T) {
	good := SynthOptions{Layers: 2, Experts: 8, Used: 2}
	for name, mod := range map[string]func(*SynthOptions){
		"no layers":   func(o *SynthOptions) { o.Layers = 0 },
		"no experts":  func(o *SynthOptions) { o.Experts = 0 },
		"k > E":       func(o *SynthOptions) { o.Used = 9 },
		"neg skew":    func(o *SynthOptions) { o.Skew = -1 },
		"cross > 1":   func(o *SynthOptions) { o.CrossLayer = 1.5 },
		"temporal<0":  func(o *SynthOptions) { o.Temporal = -0.1 },
		"huge expert": func(o *SynthOptions) { o.Experts = 1 << 20 },
	} {
		o := good
		mod(&o)
		if _, err := NewSynthRouter(o); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
