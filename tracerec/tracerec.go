// Package tracerec records a model's routing into trace files (package trace): every token's
// chosen experts, weights and, if asked, the router's logits and inputs, over a text or over
// the tokens a model generates after prompts. They are what the Commit Router trains on and
// what bench replays. Routing summarises a model's routing over a text instead: each MoE
// layer's expert load and router certainty (commit-run inspect --routing). Both use engine's
// public routing observers only.
package tracerec

import (
	"context"
	"fmt"
	"time"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/trace"
)

// Options choose what a routing trace stores besides each layer's experts and weights.
type Options struct {
	// Inputs stores each MoE layer's router input h(i) (what the Commit Router learns from).
	Inputs trace.InputFormat
	// Logits stores each MoE layer's router logits (what it learns to predict).
	Logits bool
	// Source says what text was run, for the header.
	Source string
}

// Header is the header of a routing trace of m.
func Header(m *engine.Model, opts Options) trace.Header {
	info := m.Info()
	return trace.Header{
		Model: info.Name, Arch: info.Architecture, Layers: info.Layers, MoELayers: info.MoELayers,
		Experts: info.Experts, Used: info.ExpertsUsed, Embd: info.Embedding,
		Fingerprint: m.Fingerprint(),
		Inputs:      opts.Inputs, Logits: opts.Logits, Source: opts.Source,
		Created: time.Now().UTC().Format(time.RFC3339),
	}
}

// Text runs text through m as m.Observe does and writes every token's routing to w, a
// writer made with Header's header. Windows are numbered as sequences, positions count
// from each window's start. It returns the tokens written.
func Text(ctx context.Context, m *engine.Model, text string, window int, w *trace.Writer) (int, error) {
	rec, err := newRecorder(m, w, false)
	if err != nil {
		return 0, err
	}
	_, err = m.Observe(ctx, text, window, rec.observe)
	return rec.result(err)
}

// Generated decodes tokens tokens greedily after each prompt and writes the routing of
// the decoded tokens to w (a writer made with Header's header), one sequence per
// prompt: the data CommitMoE trains its Commit Router on (the first generated tokens of
// prompts). The prompts' own tokens are not written. It returns the tokens written.
func Generated(ctx context.Context, m *engine.Model, prompts []string, tokens int, w *trace.Writer) (int, error) {
	if n := m.ContextLength(); tokens < 1 || tokens >= n {
		return 0, fmt.Errorf("record trace: %d tokens per prompt: want 1 to the context length %d", tokens, n)
	}
	rec, err := newRecorder(m, w, true)
	if err != nil {
		return 0, err
	}
	s, err := m.NewSession()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	s.ObserveRouting(rec.observe)
	for _, p := range prompts {
		ids, err := m.Tokenize(p, true)
		if err != nil {
			return rec.result(err)
		}
		s.Reset()
		// A generated token routes when the pass after its sampling reads it: one more.
		if _, err := s.Generate(ctx, ids, engine.GenerateOptions{MaxTokens: tokens + 1, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}); err != nil {
			return rec.result(fmt.Errorf("prompt %q: %w", p, err))
		}
		if rec.werr != nil {
			break
		}
	}
	return rec.result(nil)
}

// recorder turns route events into trace tokens and writes them.
type recorder struct {
	h       trace.Header
	w       *trace.Writer
	first   int         // the first MoE block
	last    int         // the last MoE block
	slot    map[int]int // block index -> position in Token.Layers
	decode  bool        // write single-token passes only, as decode tokens
	batch   []trace.Token
	seq     int
	written int
	werr    error
}

// newRecorder makes the recorder of m's routing into w; decode: of single-token passes only.
func newRecorder(m *engine.Model, w *trace.Writer, decode bool) (*recorder, error) {
	h, info := w.Header(), m.Info()
	if len(info.MoELayers) == 0 {
		return nil, fmt.Errorf("record trace: %s has no MoE layers", info.Path)
	}
	if h.Experts != info.Experts || h.Used != info.ExpertsUsed || h.Embd != info.Embedding || len(h.MoELayers) != len(info.MoELayers) {
		return nil, fmt.Errorf("record trace: the writer's header does not describe %s", info.Path)
	}
	r := &recorder{h: h, w: w, first: info.MoELayers[0], last: info.MoELayers[len(info.MoELayers)-1],
		slot: map[int]int{}, decode: decode, seq: -1}
	for i, l := range info.MoELayers {
		r.slot[l] = i
	}
	return r, nil
}

// result is what was written, and the write's error before err.
func (r *recorder) result(err error) (int, error) {
	if r.werr != nil {
		return r.written, fmt.Errorf("record trace: %w", r.werr)
	}
	return r.written, err
}

// observe is the routing observer: it collects a pass's tokens layer by layer and writes them
// once the last MoE layer has routed.
func (r *recorder) observe(ev *engine.RouteEvent) {
	h := r.h
	if r.werr != nil {
		return
	}
	if ev.Layer == r.first && ev.Pos0 == 0 {
		r.seq++ // a new window or prompt
	}
	if r.decode && ev.Tokens != 1 {
		return // a prompt's prefill
	}
	if ev.Layer == r.first {
		r.batch = r.batch[:0]
		for t := 0; t < ev.Tokens; t++ {
			// Teacher-forced tokens route as decoded ones do, so they count as decode tokens.
			r.batch = append(r.batch, trace.Token{Seq: r.seq, Pos: ev.Pos0 + t, ID: ev.IDs[t], Decode: true,
				Layers: make([]trace.LayerRoute, len(r.slot))})
		}
	}
	j := r.slot[ev.Layer]
	for t := range r.batch {
		lr := &r.batch[t].Layers[j]
		lr.Layer = ev.Layer
		lr.Experts = append([]int(nil), ev.Selected[t*ev.Used:(t+1)*ev.Used]...)
		lr.Weights = append([]float32(nil), ev.Weights[t*ev.Used:(t+1)*ev.Used]...)
		if h.Logits {
			lr.Logits = append([]float32(nil), ev.Logits[t*ev.Experts:(t+1)*ev.Experts]...)
		}
		if h.Inputs != trace.InputsNone && h.Inputs != "" {
			d := len(ev.Input) / ev.Tokens
			lr.Input = append([]float32(nil), ev.Input[t*d:(t+1)*d]...)
		}
	}
	if ev.Layer == r.last {
		for t := range r.batch {
			if r.werr = r.w.Write(&r.batch[t]); r.werr != nil {
				return
			}
			r.written++
		}
	}
}
