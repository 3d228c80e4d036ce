package predictor

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/trace"
)

// tok is a token of a 2-layer, 4-expert, top-2, 2-wide trace whose values identify it: input
// h(j) = [id, j], layer j's logits have expert (id+j)%4 on top.
func tok(seq, pos int, id int32, decode bool) *trace.Token {
	t := &trace.Token{Seq: seq, Pos: pos, ID: id, Decode: decode, Layers: make([]trace.LayerRoute, 2)}
	for j := range t.Layers {
		logits := make([]float32, 4)
		logits[(int(id)+j)%4] = 5
		logits[(int(id)+j+1)%4] = 3
		t.Layers[j] = trace.LayerRoute{Layer: []int{1, 3}[j], Input: []float32{float32(id), float32(j)}}
		route(&t.Layers[j], logits, 2)
	}
	return t
}

var tinyHeader = trace.Header{Model: "t", Arch: "test", Layers: 4, MoELayers: []int{1, 3}, Experts: 4, Used: 2, Embd: 2,
	Inputs: trace.InputsF16, Logits: true}

func TestLoadDatasetPairs(t *testing.T) {
	toks := []*trace.Token{
		tok(0, 0, 10, false), tok(0, 1, 11, false), tok(0, 2, 12, true), tok(0, 3, 13, true),
		tok(1, 0, 20, false), // a new sequence: no pair from 13
		tok(1, 1, 21, true),
		tok(1, 3, 23, true), // a gap: no pair from 21
		tok(2, 4, 34, true), // another sequence that happens to continue the position: no pair
	}
	b := encode(t, tinyHeader, toks)
	tests := []struct {
		name  string
		o     DataOptions
		ids   []int32    // tokens kept
		pairs [][2]int32 // cross-token pairs, by token id
		dec   int        // decode tokens
	}{
		{"all", DataOptions{}, []int32{10, 11, 12, 13, 20, 21, 23, 34}, [][2]int32{{10, 11}, {11, 12}, {12, 13}, {20, 21}}, 5},
		{"decode only", DataOptions{DecodeOnly: true}, []int32{12, 13, 21, 23, 34}, [][2]int32{{12, 13}}, 5},
		{"max tokens", DataOptions{MaxTokens: 3}, []int32{10, 11, 12}, [][2]int32{{10, 11}, {11, 12}}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := load(t, b, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if ds.Tokens() != len(tc.ids) || ds.DecodeTokens() != tc.dec || ds.Nets() != 2 || ds.Samples(0) != len(tc.ids) || ds.Samples(1) != len(tc.pairs) {
				t.Fatalf("%d tokens, %d nets, samples %d and %d", ds.Tokens(), ds.Nets(), ds.Samples(0), ds.Samples(1))
			}
			x := make([]float32, 2)
			// Net 0: h(0) of a token -> layer 1 of the same token.
			for i, id := range tc.ids {
				ds.input(0, i, x)
				logits, ex := ds.target(0, i)
				if !slices.Equal(x, []float32{float32(id), 0}) || logits[(id+1)%4] != 5 || int(ex[0]) != int(id+1)%4 {
					t.Errorf("net 0 sample %d: input %v, logits %v, experts %v; want token %d", i, x, logits, ex, id)
				}
			}
			// Net 1: h(1) of a token -> layer 0 of the next.
			for i, p := range tc.pairs {
				ds.input(1, i, x)
				logits, ex := ds.target(1, i)
				if !slices.Equal(x, []float32{float32(p[0]), 1}) || logits[p[1]%4] != 5 || int(ex[0]) != int(p[1]%4) || int(ex[1]) != int(p[1]+1)%4 {
					t.Errorf("net 1 sample %d: input %v, logits %v, experts %v; want %d -> %d", i, x, logits, ex, p[0], p[1])
				}
			}
		})
	}
}

func TestLoadDatasetErrors(t *testing.T) {
	noInputs := tinyHeader
	noInputs.Inputs = trace.InputsNone
	noLogits := tinyHeader
	noLogits.Logits = false
	one := tinyHeader
	one.MoELayers = []int{1}
	bare := func(h trace.Header, toks ...*trace.Token) []byte {
		for _, tk := range toks {
			for j := range tk.Layers {
				if h.Inputs == trace.InputsNone {
					tk.Layers[j].Input = nil
				}
				if !h.Logits {
					tk.Layers[j].Logits = nil
				}
			}
			tk.Layers = tk.Layers[:len(h.MoELayers)]
		}
		return encode(t, h, toks)
	}
	full := encode(t, tinyHeader, []*trace.Token{tok(0, 0, 1, true), tok(0, 1, 2, true)})
	tests := []struct {
		name string
		b    []byte
		o    DataOptions
		want error
		msg  string
	}{
		{"no inputs", bare(noInputs, tok(0, 0, 1, true)), DataOptions{}, ErrNoInputs, "commit-run predictor collect"},
		{"no logits", bare(noLogits, tok(0, 0, 1, true)), DataOptions{}, ErrNoLogits, "no router logits"},
		{"empty", encode(t, tinyHeader, nil), DataOptions{}, ErrNoTokens, "no tokens"},
		{"no decode tokens", encode(t, tinyHeader, []*trace.Token{tok(0, 0, 1, false)}), DataOptions{DecodeOnly: true}, ErrNoTokens, "no tokens"},
		{"one layer, no pairs", bare(one, tok(0, 0, 1, true), tok(1, 0, 2, true)), DataOptions{}, nil, "no pairs"},
		{"negative limit", full, DataOptions{MaxTokens: -1}, nil, "max tokens"},
	}
	for _, tc := range tests {
		ds, err := load(t, tc.b, tc.o)
		if err == nil || ds != nil {
			t.Errorf("%s: dataset %v, error %v", tc.name, ds, err)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %q, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
}

// A truncated trace gives the tokens of its complete chunks and trace.ErrTruncated.
func TestLoadDatasetTruncated(t *testing.T) {
	var toks []*trace.Token
	for p := range 600 { // three chunks of at most 256 tokens
		toks = append(toks, tok(0, p, int32(p%50), true))
	}
	b := encode(t, tinyHeader, toks)
	ds, err := load(t, b[:len(b)-40], DataOptions{})
	if !errors.Is(err, trace.ErrTruncated) || ds == nil || ds.Tokens() != 512 || ds.Samples(1) != 511 {
		t.Fatalf("dataset %v, error %v", ds, err)
	}
	// Cut inside the first chunk (the end frame is 32 bytes, a chunk 16 + 80 per token):
	// nothing to keep.
	cut := len(b) - 32 - (16 + 88*80) - (16 + 256*80) - 100
	if ds, err := load(t, b[:cut], DataOptions{}); !errors.Is(err, trace.ErrTruncated) || ds != nil {
		t.Fatalf("dataset %v, error %v", ds, err)
	}
}

// Inputs of an f32 trace are kept in f32; Header comes back as read.
func TestLoadDatasetF32(t *testing.T) {
	h := tinyHeader
	h.Inputs = trace.InputsF32
	tk := tok(0, 0, 1, true)
	tk.Layers[0].Input = []float32{1.0001, -3e-9}
	ds, err := load(t, encode(t, h, []*trace.Token{tk}), DataOptions{})
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 2)
	ds.input(0, 0, x)
	if !slices.Equal(x, tk.Layers[0].Input) || ds.half {
		t.Errorf("input %v, want %v exactly", x, tk.Layers[0].Input)
	}
	if got := ds.Header(); got.Inputs != trace.InputsF32 || !slices.Equal(got.MoELayers, h.MoELayers) {
		t.Errorf("header %+v", got)
	}
}

// The split is the same for every net, a function of the seed, and of the asked size.
func TestSplit(t *testing.T) {
	ds, _ := synth{m: 3, e: 4, k: 1, d: 2, seqs: 10, seqLen: 20, seed: 5}.dataset(t)
	val := ds.split(0.2, 42)
	n := 0
	for _, v := range val {
		if v {
			n++
		}
	}
	if n != 40 {
		t.Errorf("%d validation tokens of 200, want 40", n)
	}
	if other := ds.split(0.2, 43); slices.Equal(other, val) {
		t.Error("the split does not depend on the seed")
	}
	if again := ds.split(0.2, 42); !slices.Equal(again, val) {
		t.Error("the split is not deterministic")
	}
	for j := range 3 {
		tr, va := ds.samples(j, val, false), ds.samples(j, val, true)
		if len(tr)+len(va) != ds.Samples(j) {
			t.Errorf("net %d: %d + %d samples of %d", j, len(tr), len(va), ds.Samples(j))
		}
		for _, i := range va {
			if from, _, _ := ds.source(j, int(i)); !val[from] {
				t.Errorf("net %d: validation sample %d from a training token", j, i)
			}
		}
	}
}
