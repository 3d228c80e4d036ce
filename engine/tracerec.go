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
	h := w.Header()
	if len(m.info.MoELayers) == 0 {
		return 0, fmt.Errorf("record trace: %s has no MoE layers", m.info.Path)
	}
	if h.Experts != m.info.Experts || h.Used != m.info.ExpertsUsed || h.Embd != m.info.Embedding || len(h.MoELayers) != len(m.info.MoELayers) {
		return 0, fmt.Errorf("record trace: the writer's header does not describe %s", m.info.Path)
	}
	lastMoE := m.info.MoELayers[len(m.info.MoELayers)-1]
	var (
		batch   []trace.Token
		slot    = map[int]int{} // block index -> position in Token.Layers
		seq     = -1
		written int
		werr    error
	)
	for i, l := range m.info.MoELayers {
		slot[l] = i
	}
	obs := func(ev *RouteEvent) {
		if werr != nil {
			return
		}
		if ev.Layer == m.info.MoELayers[0] {
			if ev.Pos0 == 0 {
				seq++
			}
			batch = batch[:0]
			for t := 0; t < ev.Tokens; t++ {
				// Teacher-forced tokens route as decoded ones do, so they count as decode tokens.
				batch = append(batch, trace.Token{Seq: seq, Pos: ev.Pos0 + t, ID: ev.IDs[t], Decode: true,
					Layers: make([]trace.LayerRoute, len(m.info.MoELayers))})
			}
		}
		j := slot[ev.Layer]
		for t := range batch {
			lr := &batch[t].Layers[j]
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
		if ev.Layer == lastMoE {
			for t := range batch {
				if werr = w.Write(&batch[t]); werr != nil {
					return
				}
				written++
			}
		}
	}
	_, err := m.Observe(ctx, text, window, obs)
	if werr != nil {
		return written, fmt.Errorf("record trace: %w", werr)
	}
	return written, err
}
