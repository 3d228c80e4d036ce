package autoplace

import (
	"fmt"
	"io"
	"slices"

	"github.com/commit-run/commit-run/trace"
)

// The routing sample the candidates replay: a short prompt, and decode steps whose first half
// warms the caches and whose second half is timed.
const (
	Prompt = 32
	Tokens = 96
	// Sample is how many tokens of routing the candidates replay: the prompt, the decode
	// steps, and the one the last predicts for.
	Sample = Prompt + Tokens + 1
)

// SampleSize fits the routing sample to a context of nctx positions (0: the model's own,
// taken to be long enough): a quarter of it at most for the prompt, the rest decoded.
func SampleSize(nctx int) (prompt, tokens int, err error) {
	if nctx == 0 {
		return Prompt, Tokens, nil
	}
	prompt = min(Prompt, nctx/4)
	tokens = min(Tokens, nctx-prompt-1)
	if prompt < 1 || tokens < 4 {
		return 0, 0, fmt.Errorf("auto placement: a %d-position context leaves no room for a routing sample", nctx)
	}
	return prompt, tokens, nil
}

// Shape is what routing must fit: a model's MoE layers, experts and top-k.
type Shape struct {
	Name                  string
	Layers, Experts, Used int
}

// SyntheticSample draws n tokens of routing, by token and MoE layer, for s from the synthetic
// router at so's skew and correlations, and says where it came from.
func SyntheticSample(so trace.SynthOptions, s Shape, n int) ([][][]int, string, error) {
	so.Layers, so.Experts, so.Used = s.Layers, s.Experts, s.Used
	sr, err := trace.NewSynthRouter(so)
	if err != nil {
		return nil, "", err
	}
	out := make([][][]int, n)
	for i := range out {
		t := sr.Next()
		out[i] = make([][]int, len(t.Layers))
		for j, l := range t.Layers {
			out[i][j] = l.Experts
		}
	}
	return out, sr.Header("auto").Source, nil
}

// TraceSample reads the routing of the first n tokens recorded in the trace at path, which
// must route s's MoE layers, and says where it came from.
func TraceSample(path string, s Shape, n int) ([][][]int, string, error) {
	r, err := trace.OpenFor(path, s.Name, s.Layers, s.Experts, s.Used)
	if err != nil {
		return nil, "", err
	}
	defer r.Close()
	out := make([][][]int, 0, n)
	for len(out) < n {
		t, err := r.Next()
		if err == io.EOF {
			return nil, "", fmt.Errorf("trace %s holds %d tokens; the routing sample needs %d", path, len(out), n)
		}
		if err != nil {
			return nil, "", err
		}
		tok := make([][]int, len(t.Layers))
		for j, l := range t.Layers {
			tok[j] = slices.Clone(l.Experts)
		}
		out = append(out, tok)
	}
	return out, "the first tokens of the routing recorded in " + path, nil
}
