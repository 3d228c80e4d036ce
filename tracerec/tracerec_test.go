package tracerec_test

import (
	"bytes"
	"context"
	"io"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/trace"
	"github.com/commit-run/commit-run/tracerec"
)

// TestRecordTrace: a text's trace holds exactly what the routing observer saw, token by
// token, numbered by window.
func TestRecordTrace(t *testing.T) {
	m, err := engine.Open("../models/testdata/tiny.gguf", engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	text := "The quick brown fox jumps over the lazy dog. It was a bright cold day in April."
	ids, err := m.Tokenize(text, false)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	h := tracerec.Header(m, tracerec.Options{Inputs: trace.InputsF32, Logits: true, Source: "test"})
	w, err := trace.NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	n, err := tracerec.Text(context.Background(), m, text, 8, w)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if n != len(ids) {
		t.Fatalf("%d tokens recorded, the text has %d", n, len(ids))
	}
	// The trace holds exactly what the routing observer saw, token by token.
	var want []engine.RouteEvent
	s, _ := m.NewSession()
	defer s.Close()
	s.ObserveRouting(func(ev *engine.RouteEvent) {
		c := *ev
		c.Selected = slices.Clone(ev.Selected)
		c.Logits = slices.Clone(ev.Logits)
		c.Input = slices.Clone(ev.Input)
		want = append(want, c)
	})
	for start := 0; start < len(ids); start += 8 {
		if err := s.Probs(context.Background(), ids[start:min(start+8, len(ids))], func(int, []float32) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	r, err := trace.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	info := m.Info()
	ev := 0
	for i := 0; ; i++ {
		tok, err := r.Next()
		if err == io.EOF {
			if i != len(ids) {
				t.Fatalf("read %d tokens, want %d", i, len(ids))
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if tok.Seq != i/8 || tok.Pos != i%8 || tok.ID != ids[i] || len(tok.Layers) != len(info.MoELayers) {
			t.Fatalf("token %d: seq %d pos %d id %d, %d layers", i, tok.Seq, tok.Pos, tok.ID, len(tok.Layers))
		}
		for j, lr := range tok.Layers {
			e := want[ev+j]
			tt := i % 8
			if lr.Layer != e.Layer || !slices.Equal(lr.Experts, e.Selected[tt*e.Used:(tt+1)*e.Used]) ||
				!slices.Equal(lr.Logits, e.Logits[tt*e.Experts:(tt+1)*e.Experts]) ||
				!slices.Equal(lr.Input, e.Input[tt*info.Embedding:(tt+1)*info.Embedding]) {
				t.Fatalf("token %d layer %d differs from the observer", i, lr.Layer)
			}
		}
		if i%8 == 7 || i == len(ids)-1 {
			ev += len(info.MoELayers)
		}
	}
}
