package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/commit-run/commit-run/trace"
)

// TraceOptions choose what a routing trace stores besides each layer's experts and weights.
type TraceOptions struct {
	// Inputs stores each MoE layer's router input h(i) (what the Commit Router learns from).
	Inputs trace.InputFormat
	// Logits stores each MoE layer's router logits (what it learns to predict).
	Logits bool
	// Source says what text was run, for the header.
	Source string
}

// TraceHeader is the header of a routing trace of m.
func (m *Model) TraceHeader(opts TraceOptions) trace.Header {
	return trace.Header{
		Model: m.info.Name, Arch: m.info.Architecture, Layers: m.info.Layers, MoELayers: m.info.MoELayers,
		Experts: m.info.Experts, Used: m.info.ExpertsUsed, Embd: m.info.Embedding,
		Fingerprint: m.Fingerprint(),
		Inputs:      opts.Inputs, Logits: opts.Logits, Source: opts.Source,
		Created: time.Now().UTC().Format(time.RFC3339),
	}
}

// RecordTrace runs text through m as Observe does and writes every token's routing to w, a
// writer made with m.TraceHeader's header. Windows are numbered as sequences, positions count
// from each window's start. It returns the tokens written.
func (m *Model) RecordTrace(ctx context.Context, text string, window int, w *trace.Writer) (int, error) {
	rec, err := m.newRecorder(w, false)
	if err != nil {
		return 0, err
	}
	_, err = m.Observe(ctx, text, window, rec.observe)
	return rec.result(err)
}

// RecordGenerated decodes tokens tokens greedily after each prompt and writes the routing of
// the decoded tokens to w (a writer made with m.TraceHeader's header), one sequence per
// prompt: the data CommitMoE trains its Commit Router on (the first generated tokens of
// prompts). The prompts' own tokens are not written. It returns the tokens written.
func (m *Model) RecordGenerated(ctx context.Context, prompts []string, tokens int, w *trace.Writer) (int, error) {
	if tokens < 1 || tokens >= m.nctx {
		return 0, fmt.Errorf("record trace: %d tokens per prompt: want 1 to the context length %d", tokens, m.nctx)
	}
	rec, err := m.newRecorder(w, true)
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
		if _, err := s.Generate(ctx, ids, GenerateOptions{MaxTokens: tokens + 1, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true}}); err != nil {
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

func (m *Model) newRecorder(w *trace.Writer, decode bool) (*recorder, error) {
	h := w.Header()
	if len(m.info.MoELayers) == 0 {
		return nil, fmt.Errorf("record trace: %s has no MoE layers", m.info.Path)
	}
	if h.Experts != m.info.Experts || h.Used != m.info.ExpertsUsed || h.Embd != m.info.Embedding || len(h.MoELayers) != len(m.info.MoELayers) {
		return nil, fmt.Errorf("record trace: the writer's header does not describe %s", m.info.Path)
	}
	r := &recorder{h: h, w: w, first: m.info.MoELayers[0], last: m.info.MoELayers[len(m.info.MoELayers)-1],
		slot: map[int]int{}, decode: decode, seq: -1}
	for i, l := range m.info.MoELayers {
		r.slot[l] = i
	}
	return r, nil
}

func (r *recorder) result(err error) (int, error) {
	if r.werr != nil {
		return r.written, fmt.Errorf("record trace: %w", r.werr)
	}
	return r.written, err
}

func (r *recorder) observe(ev *RouteEvent) {
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
