// Package commitrouter trains, evaluates and tunes a model's Commit Router and measures what
// committing to its predictions costs in quality, through engine's public API: the runs that
// make and judge a predictor file, beside the runtime that uses it.
package commitrouter

import (
	"context"
	"errors"
	"fmt"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/predictor"
	"github.com/commit-run/commit-run/trace"
)

// TrainOptions configure Train.
type TrainOptions struct {
	predictor.TrainOptions
	// RandomInit starts the predictors from random weights instead of the model's next
	// routers (PredictorInit).
	RandomInit bool
	// MaxTokens reads at most this many tokens of the trace (0 = all).
	MaxTokens int
}

// OpenTrace opens a trace recorded from m with router inputs and logits, refusing one
// recorded from another model.
func OpenTrace(m *engine.Model, path string) (*trace.Reader, error) {
	r, err := trace.Open(path)
	if err != nil {
		return nil, err
	}
	h := r.Header()
	got, want := predictor.IdentityOf(h), m.PredictorIdentity()
	if h.Fingerprint != "" {
		err = got.Check(want)
	} else if got.Arch != want.Arch {
		err = fmt.Errorf("recorded from %q (%s), a model of another architecture", h.Model, h.Arch)
	} else {
		// A trace without a fingerprint: the shape is all that can be checked.
		err = want.CheckShape(got)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("trace %s does not come from %s: %w", path, m.Info().Path, err)
	}
	return r, nil
}

// Train trains a Commit Router for m on a trace recorded from m with router inputs and
// logits (predictor collect).
func Train(ctx context.Context, m *engine.Model, tracePath string, o TrainOptions) (*predictor.Router, error) {
	r, err := OpenTrace(m, tracePath)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	ds, err := predictor.LoadDataset(r, predictor.DataOptions{MaxTokens: o.MaxTokens})
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", tracePath, err)
	}
	to := o.TrainOptions
	if !o.RandomInit {
		to.Init = m.PredictorInit()
	}
	return predictor.Train(ctx, ds, m.PredictorIdentity(), to)
}

// Evaluate scores the Commit Router r of m on a trace recorded from m: per-layer accuracy
// beside the frequency baseline, and accuracy against router certainty.
func Evaluate(m *engine.Model, r *predictor.Router, tracePath string, split predictor.Split, maxTokens int) (predictor.EvalReport, error) {
	if err := r.ID.Check(m.PredictorIdentity()); err != nil {
		return predictor.EvalReport{}, err
	}
	tr, err := OpenTrace(m, tracePath)
	if err != nil {
		return predictor.EvalReport{}, err
	}
	defer tr.Close()
	// A trace cut short (a collection stopped early) is scored on the tokens it holds.
	ds, err := predictor.LoadDataset(tr, predictor.DataOptions{MaxTokens: maxTokens})
	if err != nil && (ds == nil || !errors.Is(err, trace.ErrTruncated)) {
		return predictor.EvalReport{}, fmt.Errorf("trace %s: %w", tracePath, err)
	}
	return predictor.Evaluate(r, ds, split)
}
