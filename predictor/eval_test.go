package predictor

import (
	"math"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/trace"
)

// A router that ignores its input (zero weights, fixed biases) on four tokens whose routing
// is known: every number of the report can be counted by hand.
func TestEvaluateHandBuilt(t *testing.T) {
	var toks []*trace.Token
	for id := range int32(4) {
		toks = append(toks, tok(0, int(id), id, true))
	}
	ds, err := load(t, encode(t, tinyHeader, toks), DataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id := IdentityOf(ds.h)
	r := &Router{ID: id, Nets: []*Net{
		{In: 2, Out: 4, W1: make([]float32, 8), B1: []float32{4, 3, 2, 1}}, // always {0, 1}
		{In: 2, Out: 4, W1: make([]float32, 8), B1: []float32{1, 2, 3, 4}}, // always {3, 2}
	}}
	rep, err := Evaluate(r, ds, All)
	if err != nil {
		t.Fatal(err)
	}
	// Token i's layer j chose {(i+j)%4, (i+j+1)%4}.
	// Net 0 (layer 1 of tokens 0..3): {1,2} {2,3} {3,0} {0,1} against {0,1}: 1 0 1 2 correct.
	// Experts used: each twice, so the frequency baseline is {0, 1} too.
	// Net 1 (layer 0 of tokens 1..3): {1,2} {2,3} {3,0} against {3,2}: 1 2 1 correct.
	// Experts used: 0 1 once, 2 3 twice: the baseline is {2, 3}, the same.
	// Every token's logits are a permutation of [5 3 0 0]: one certainty for all.
	p := softmax64([]float64{5, 3, 0, 0})
	cert := math.Log(4)
	for _, v := range p {
		cert += v * math.Log(v)
	}
	type want struct {
		samples     int
		acc, freq   float64
		buckets     []int
		targetLayer int
		target      string
		loss        float64
	}
	wants := []want{
		{4, 4.0 / 8, 4.0 / 8, []int{1, 2, 1}, 3, "MoE layer 1 (block 3)", meanKL([]int{0, 1, 2, 3}, 1, []float64{4, 3, 2, 1})},
		{3, 4.0 / 6, 4.0 / 6, []int{0, 2, 1}, 1, "next token's first MoE layer (block 1)", meanKL([]int{1, 2, 3}, 0, []float64{1, 2, 3, 4})},
	}
	for j, w := range wants {
		ne := rep.Nets[j]
		if ne.Net != j || ne.Samples != w.samples || !near(ne.Accuracy, w.acc) || !near(ne.FreqAccuracy, w.freq) ||
			ne.TargetLayer != w.targetLayer || ne.Target != w.target || !near(ne.Loss, w.loss) {
			t.Errorf("net %d: %+v, want %+v", j, ne, w)
		}
		for c, b := range ne.Buckets {
			wantKL := 0.0
			if w.buckets[c] > 0 {
				wantKL = cert
			}
			if b.Correct != c || b.Samples != w.buckets[c] || !near(b.Share, float64(w.buckets[c])/float64(w.samples)) || !near(b.MeanKL, wantKL) {
				t.Errorf("net %d bucket %d: %+v, want %d samples, KL %v", j, c, b, w.buckets[c], wantKL)
			}
		}
	}
	if rep.Samples != 7 || rep.Used != 2 || !near(rep.Accuracy, 8.0/14) || !near(rep.FreqAccuracy, 8.0/14) {
		t.Errorf("overall: %+v", rep)
	}
	for c, n := range []int{1, 4, 2} {
		if b := rep.Buckets[c]; b.Samples != n || !near(b.Share, float64(n)/7) || !near(b.MeanKL, cert) {
			t.Errorf("overall bucket %d: %+v, want %d samples", c, b, n)
		}
	}

	// With a fifth token the counts are no longer tied: net 0's targets are {1,2} {2,3}
	// {3,0} {0,1} {1,2}, the baseline {1, 2} scores 2 1 0 1 2 and {0, 1} 1 0 1 2 1.
	ds5, err := load(t, encode(t, tinyHeader, append(toks, tok(0, 4, 4, true))), DataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err = Evaluate(r, ds5, All)
	if err != nil {
		t.Fatal(err)
	}
	if ne := rep.Nets[0]; !near(ne.Accuracy, 5.0/10) || !near(ne.FreqAccuracy, 6.0/10) {
		t.Errorf("net 0: accuracy %v, baseline %v; want 0.5 and 0.6", ne.Accuracy, ne.FreqAccuracy)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

func softmax64(v []float64) []float64 {
	var s float64
	p := make([]float64, len(v))
	for i, x := range v {
		p[i] = math.Exp(x)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}

// meanKL is the mean over tokens ids of KL(softmax(layer j's logits of tok(id)) || softmax(y)).
func meanKL(ids []int, j int, y []float64) float64 {
	q := softmax64(y)
	var sum float64
	for _, id := range ids {
		t := make([]float64, 4)
		t[(id+j)%4], t[(id+j+1)%4] = 5, 3
		p := softmax64(t)
		for i := range p {
			sum += p[i] * math.Log(p[i]/q[i])
		}
	}
	return sum / float64(len(ids))
}

func TestEvaluateSplits(t *testing.T) {
	ds, _ := synth{m: 2, e: 4, k: 2, d: 4, seqs: 5, seqLen: 20, seed: 8}.dataset(t)
	r, err := NewRouter(IdentityOf(ds.h), nil, 3)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[Split]int{}
	for _, s := range []Split{Validation, Training, All} {
		rep, err := Evaluate(r, ds, s)
		if err != nil {
			t.Fatal(err)
		}
		counts[s] = rep.Samples
		if rep.Split != s || len(rep.Buckets) != 3 || len(rep.Nets) != 2 {
			t.Errorf("%v: %+v", s, rep)
		}
	}
	if counts[Validation]+counts[Training] != counts[All] || counts[All] != 100+95 || counts[Validation] < 30 || counts[Validation] > 50 {
		t.Errorf("samples per split: %v", counts)
	}
	other := IdentityOf(ds.h)
	other.Embd = 5
	r2, _ := NewRouter(other, nil, 3)
	if _, err := Evaluate(r2, ds, All); err == nil || !strings.Contains(err.Error(), "embd 5 != 4") {
		t.Errorf("mismatched router: %v", err)
	}
	if _, err := Evaluate(r, ds, Split(7)); err == nil {
		t.Error("unknown split: no error")
	}
	// A trace without one pair of consecutive tokens: the cross-token net has nothing to score.
	var toks []*trace.Token
	for q := range 3 {
		toks = append(toks, tok(q, 0, int32(q), true))
	}
	single, err := load(t, encode(t, tinyHeader, toks), DataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r3, _ := NewRouter(IdentityOf(single.h), nil, 1)
	rep, err := Evaluate(r3, single, All)
	if err != nil || rep.Nets[1].Samples != 0 || rep.Nets[0].Samples != 3 || rep.Samples != 3 {
		t.Errorf("no cross-token pairs: %+v, %v", rep, err)
	}
}
