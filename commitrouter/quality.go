package commitrouter

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/owa"
)

// Variant is one way of routing in a quality comparison: nil Commit is the model as
// trained (the router's choice).
type Variant struct {
	Name   string
	Commit *engine.CommitOptions
}

// Row is one variant's held-out quality.
type Row struct {
	Name       string
	Perplexity float64
	// Delta is the relative change of perplexity from the first row.
	Delta float64
	// Accuracy is the share of predicted experts the router also chose, over the committed
	// tokens and layers; AllWrong the share of those with none right, OWA the share whose
	// weights OWA adjusted. NaN for the router's own choice.
	Accuracy, AllWrong, OWA float64
	Stats                   engine.CommitStats
}

// Quality evaluates text token at a time (as decoding runs, so that commit acts on every
// token) once per variant, each on a freshly opened model, and reports perplexity against the
// first variant's: CommitMoE's Table 1 and Table 3 on a text.
func Quality(ctx context.Context, path string, opts engine.Options, text string, po engine.PerplexityOptions, variants []Variant) ([]Row, error) {
	po.Decode = true
	var rows []Row
	for _, v := range variants {
		o := opts
		o.Commit, o.Offload = v.Commit, nil
		m, err := engine.Open(path, o)
		if err != nil {
			return rows, err
		}
		res, err := m.PerplexityWith(ctx, text, po)
		st, _ := m.CommitStats()
		m.Close()
		if err != nil {
			return rows, fmt.Errorf("%s: %w", v.Name, err)
		}
		row := Row{Name: v.Name, Perplexity: res.Perplexity, Stats: st,
			Accuracy: math.NaN(), AllWrong: math.NaN(), OWA: math.NaN()}
		var tokens, correct, wrong, adj int64
		for _, l := range st.Layers {
			tokens += l.Tokens
			correct += l.Correct
			wrong += l.AllWrong
			adj += l.OWA
		}
		if tokens > 0 {
			k := float64(m.Info().ExpertsUsed)
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

// Variants are the comparisons of CommitMoE's Table 3 (base, commit without OWA, with
// neutral OWA, with the model's OWA settings), each without and with the cross-token commit
// (engine.CommitOptions.CrossToken, the paper's pipeline), and Table 1 (the router's experts replaced
// only where every prediction is wrong, every layer), for the Commit Router file predictorFile
// ("" = sidecar) and the OWA settings tuned ("" = the model's defaults; owa.Parse's syntax).
func Variants(predictorFile, tuned string) []Variant {
	c := func(o engine.CommitOptions) *engine.CommitOptions { o.Predictor = predictorFile; return &o }
	return []Variant{
		{"base (router)", nil},
		{"commit, no OWA", c(engine.CommitOptions{NoOWA: true})},
		{"commit, neutral OWA", c(engine.CommitOptions{OWASpec: "neutral"})},
		{"commit, OWA", c(engine.CommitOptions{OWASpec: tuned})},
		{"commit +cross-token, no OWA", c(engine.CommitOptions{NoOWA: true, CrossToken: true})},
		{"commit +cross-token, neutral OWA", c(engine.CommitOptions{OWASpec: "neutral", CrossToken: true})},
		{"commit +cross-token, OWA", c(engine.CommitOptions{OWASpec: tuned, CrossToken: true})},
		{"replace only all-wrong", c(engine.CommitOptions{OnlyAllWrong: true, NoOWA: true, CrossToken: true})},
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
func TuneOWA(ctx context.Context, path string, opts engine.Options, predictorFile, text string, po engine.PerplexityOptions, alphas []float64, progress func(TuneResult)) ([]TuneResult, error) {
	po.Decode = true
	info, err := engine.Inspect(path)
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
					o.Commit = &engine.CommitOptions{Predictor: predictorFile, OWA: &p}
					m, err := engine.Open(path, o)
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
