package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/commit-run/commit-run/owa"
	"github.com/commit-run/commit-run/predictor"
	"github.com/commit-run/commit-run/trace"
)

// TrainRouterOptions configure Model.TrainCommitRouter.
type TrainRouterOptions struct {
	predictor.TrainOptions
	// RandomInit starts the predictors from random weights instead of the model's next
	// routers (PredictorInit).
	RandomInit bool
	// MaxTokens reads at most this many tokens of the trace (0 = all).
	MaxTokens int
}

// openRouterTrace opens a trace recorded from m with router inputs and logits, refusing one
// recorded from another model.
func (m *Model) openRouterTrace(path string) (*trace.Reader, error) {
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
		return nil, fmt.Errorf("trace %s does not come from %s: %w", path, m.info.Path, err)
	}
	return r, nil
}

// TrainCommitRouter trains a Commit Router for m on a trace recorded from m with router inputs
// and logits (predictor collect).
func (m *Model) TrainCommitRouter(ctx context.Context, tracePath string, o TrainRouterOptions) (*predictor.Router, error) {
	r, err := m.openRouterTrace(tracePath)
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

// EvalCommitRouter scores the Commit Router r of m on a trace recorded from m: per-layer
// accuracy beside the frequency baseline, and accuracy against router certainty.
func (m *Model) EvalCommitRouter(r *predictor.Router, tracePath string, split predictor.Split, maxTokens int) (predictor.EvalReport, error) {
	if err := r.ID.Check(m.PredictorIdentity()); err != nil {
		return predictor.EvalReport{}, err
	}
	tr, err := m.openRouterTrace(tracePath)
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

// CommitVariant is one way of routing in a quality comparison: nil Commit is the model as
// trained (the router's choice).
type CommitVariant struct {
	Name   string
	Commit *CommitOptions
}

// QualityRow is one variant's held-out quality.
type QualityRow struct {
	Name       string
	Perplexity float64
	// Delta is the relative change of perplexity from the first row.
	Delta float64
	// Accuracy is the share of predicted experts the router also chose, over the committed
	// tokens and layers; AllWrong the share of those with none right, OWA the share whose
	// weights OWA adjusted. NaN for the router's own choice.
	Accuracy, AllWrong, OWA float64
	Stats                   CommitStats
}

// CommitQuality evaluates text token at a time (as decoding runs, so that commit acts on every
// token) once per variant, each on a freshly opened model, and reports perplexity against the
// first variant's: CommitMoE's Table 1 and Table 3 on a text.
func CommitQuality(ctx context.Context, path string, opts Options, text string, po PerplexityOptions, variants []CommitVariant) ([]QualityRow, error) {
	po.Decode = true
	var rows []QualityRow
	for _, v := range variants {
		o := opts
		o.Commit, o.Offload = v.Commit, nil
		m, err := Open(path, o)
		if err != nil {
			return rows, err
		}
		res, err := m.PerplexityWith(ctx, text, po)
		st, _ := m.CommitStats()
		m.Close()
		if err != nil {
			return rows, fmt.Errorf("%s: %w", v.Name, err)
		}
		row := QualityRow{Name: v.Name, Perplexity: res.Perplexity, Stats: st,
			Accuracy: math.NaN(), AllWrong: math.NaN(), OWA: math.NaN()}
		var tokens, correct, wrong, adj int64
		for _, l := range st.Layers {
			tokens += l.Tokens
			correct += l.Correct
			wrong += l.AllWrong
			adj += l.OWA
		}
		if tokens > 0 {
			k := float64(m.info.ExpertsUsed)
			row.Accuracy = float64(correct) / (float64(tokens) * k)
			row.AllWrong = float64(wrong) / float64(tokens)
			row.OWA = float64(adj) / float64(tokens)
		}
		if len(rows) > 0 {
			row.Delta = row.Perplexity/rows[0].Perplexity - 1
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// QualityVariants are the comparisons of CommitMoE's Table 3 (base, commit without OWA, with
// neutral OWA, with the model's OWA settings), each without and with the cross-token commit
// (CommitOptions.CrossToken, the paper's pipeline), and Table 1 (the router's experts replaced
// only where every prediction is wrong, every layer), for the Commit Router file predictorFile
// ("" = sidecar) and the OWA settings tuned ("" = the model's defaults; owa.Parse's syntax).
func QualityVariants(predictorFile, tuned string) []CommitVariant {
	c := func(o CommitOptions) *CommitOptions { o.Predictor = predictorFile; return &o }
	return []CommitVariant{
		{"base (router)", nil},
		{"commit, no OWA", c(CommitOptions{NoOWA: true})},
		{"commit, neutral OWA", c(CommitOptions{OWASpec: "neutral"})},
		{"commit, OWA", c(CommitOptions{OWASpec: tuned})},
		{"commit +cross-token, no OWA", c(CommitOptions{NoOWA: true, CrossToken: true})},
		{"commit +cross-token, neutral OWA", c(CommitOptions{OWASpec: "neutral", CrossToken: true})},
		{"commit +cross-token, OWA", c(CommitOptions{OWASpec: tuned, CrossToken: true})},
		{"replace only all-wrong", c(CommitOptions{OnlyAllWrong: true, NoOWA: true, CrossToken: true})},
	}
}

// TuneResult is one OWA setting's perplexity in TuneOWA.
type TuneResult struct {
	Params     owa.Params
	Perplexity float64
}

// TuneOWA searches OWA settings for the lowest perplexity of committed routing on text (a
// validation text, not the one quality is reported on): alpha1 and alpha2 over alphas and
// every trigger range of 1..k-1 correct predictions (all k correct leaves nothing to
// repair). It returns the results best first. progress, when set, sees each result.
func TuneOWA(ctx context.Context, path string, opts Options, predictorFile, text string, po PerplexityOptions, alphas []float64, progress func(TuneResult)) ([]TuneResult, error) {
	po.Decode = true
	info, err := Inspect(path)
	if err != nil {
		return nil, err
	}
	k := info.ExpertsUsed
	if k < 2 {
		return nil, fmt.Errorf("tune: %s chooses %d expert per token: a prediction is all right or all wrong, and OWA has nothing to repair", path, k)
	}
	if len(alphas) == 0 {
		return nil, fmt.Errorf("tune: no alpha values")
	}
	var out []TuneResult
	for lo := 1; lo < k; lo++ {
		for hi := lo; hi < k; hi++ {
			for _, a1 := range alphas {
				for _, a2 := range alphas {
					p := owa.Params{Alpha1: a1, Alpha2: a2, MinCorrect: lo, MaxCorrect: hi}
					o := opts
					o.Offload = nil
					o.Commit = &CommitOptions{Predictor: predictorFile, OWA: &p}
					m, err := Open(path, o)
					if err != nil {
						return out, err
					}
					res, err := m.PerplexityWith(ctx, text, po)
					m.Close()
					if err != nil {
						return out, err
					}
					r := TuneResult{Params: p, Perplexity: res.Perplexity}
					out = append(out, r)
					if progress != nil {
						progress(r)
					}
				}
			}
		}
	}
	slices.SortStableFunc(out, func(a, b TuneResult) int { return cmp.Compare(a.Perplexity, b.Perplexity) })
	return out, nil
}

// FirstTokens returns the text of text's first n tokens (all of it when it has no more).
func (m *Model) FirstTokens(text string, n int) (string, error) {
	if n < 0 {
		return "", fmt.Errorf("max tokens %d: want 0 (all) or more", n)
	}
	ids, err := m.tok.Encode(text, false, false)
	if err != nil {
		return "", err
	}
	if n == 0 || n >= len(ids) {
		return text, nil
	}
	return m.tok.Detokenize(ids[:n], false, false), nil
}
