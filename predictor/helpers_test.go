package predictor

import (
	"bytes"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/commit-run/commit-run/trace"
)

// synth describes a synthetic trace whose routing is a known function of the router inputs:
// MoE layer j+1's logits are A[j] h(j) (plus noise), and the next token's first layer's are
// A[M-1] h(M-1) of the token before it in the sequence. With noiseOnly every logit is noise.
type synth struct {
	m, e, k, d   int
	seqs, seqLen int
	noise        float64 // standard deviation of the noise added to the logits
	noiseOnly    bool
	f16          bool
	decodeFrom   int // positions >= decodeFrom are decode tokens
	seed         uint64
}

func (s synth) header() trace.Header {
	moe := make([]int, s.m)
	for j := range moe {
		moe[j] = 2*j + 1
	}
	in := trace.InputsF32
	if s.f16 {
		in = trace.InputsF16
	}
	return trace.Header{Model: "synthetic", Arch: "test", Layers: 2*s.m + 1, MoELayers: moe,
		Experts: s.e, Used: s.k, Embd: s.d, Inputs: in, Logits: true, Source: "helpers_test", Synthetic: true}
}

// tokens draws the trace's tokens and the maps.
func (s synth) tokens() ([]*trace.Token, [][]float32) {
	rng := rand.New(rand.NewPCG(s.seed, 1))
	a := make([][]float32, s.m)
	scale := 3 / math.Sqrt(float64(s.d)) // logits of standard deviation about 3
	for j := range a {
		a[j] = make([]float32, s.e*s.d)
		for i := range a[j] {
			a[j][i] = float32(rng.NormFloat64() * scale)
		}
	}
	h := s.header()
	var toks []*trace.Token
	for q := range s.seqs {
		var prev *trace.Token
		for p := range s.seqLen {
			t := &trace.Token{Seq: q, Pos: p, ID: int32(p), Decode: p >= s.decodeFrom, Layers: make([]trace.LayerRoute, s.m)}
			for j := range t.Layers {
				in := make([]float32, s.d)
				for i := range in {
					in[i] = float32(rng.NormFloat64())
				}
				t.Layers[j] = trace.LayerRoute{Layer: h.MoELayers[j], Input: in}
			}
			for j := range t.Layers {
				logits := make([]float32, s.e)
				var src []float32
				var mat []float32
				switch {
				case j > 0:
					src, mat = t.Layers[j-1].Input, a[j-1]
				case prev != nil:
					src, mat = prev.Layers[s.m-1].Input, a[s.m-1]
				}
				for o := range logits {
					v := rng.NormFloat64() * s.noise
					if s.noiseOnly || src == nil {
						v = rng.NormFloat64() * 3
					} else {
						for i, x := range src {
							v += float64(mat[o*s.d+i] * x)
						}
					}
					logits[o] = float32(v)
				}
				route(&t.Layers[j], logits, s.k)
			}
			toks = append(toks, t)
			prev = t
		}
	}
	return toks, a
}

// route fills in the experts (top k of logits) and their softmax weights.
func route(l *trace.LayerRoute, logits []float32, k int) {
	l.Logits = logits
	l.Experts = topK(logits, k, nil)
	l.Weights = make([]float32, k)
	var sum float64
	for i, e := range l.Experts {
		w := math.Exp(float64(logits[e] - logits[l.Experts[0]]))
		l.Weights[i] = float32(w)
		sum += w
	}
	for i := range l.Weights {
		l.Weights[i] /= float32(sum)
	}
}

// encode writes tokens as a trace with header h.
func encode(t testing.TB, h trace.Header, toks []*trace.Token) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := trace.NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if err := w.Write(tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func load(t testing.TB, b []byte, o DataOptions) (*Dataset, error) {
	t.Helper()
	r, err := trace.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return LoadDataset(r, o)
}

// dataset builds the synthetic trace of s and loads it.
func (s synth) dataset(t testing.TB) (*Dataset, [][]float32) {
	t.Helper()
	toks, a := s.tokens()
	ds, err := load(t, encode(t, s.header(), toks), DataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ds, a
}

// sortedInts is for comparing expert sets.
func sortedInts(s []int) []int {
	c := append([]int(nil), s...)
	sort.Ints(c)
	return c
}
