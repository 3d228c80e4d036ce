package engine

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/models"
)

// TimingOnlyOptions make a model's passes on a simulated GPU charge every kernel and copy to
// the card's timeline without computing anything or reading a weight: the engine's own
// forward pass and offloader, on numbers nobody looks at, so that the time of a model or a
// policy comes from the code that would run on the card however large the model. The
// routers are charged but not read: what each chose comes from Routing, and the Commit
// Router's predictions from Predict.
type TimingOnlyOptions struct {
	// Routing returns the experts MoE layer j (0 for the model's first MoE block) chooses for
	// the token at position pos, in top-k order: what its router chose in a run that computed
	// (RouteEvent.Selected), a trace's, or a synthetic router's.
	Routing func(pos, j int) []int
	// Predict returns the experts the Commit Router predicted for MoE layer j of the token at
	// position pos (RouteEvent.Predicted of the layer before it). Only runs with the Commit
	// Router need it.
	Predict func(pos, j int) []int
	// ModelledPredictor stands a modelled predictor (an oracle, a given accuracy) in for the
	// Commit Router of a model that has no Commit Router file: Predict's experts, priced as
	// one float32 linear layer per MoE layer from the router input to the next layer's
	// experts.
	ModelledPredictor bool
}

// checkTimingOnly checks that a timing-only run can be set up as opts ask.
func checkTimingOnly(opts Options) error {
	o := opts.TimingOnly
	switch {
	case o == nil:
		return nil
	case !strings.HasPrefix(strings.TrimSpace(opts.Device), "sim:"):
		return fmt.Errorf("timing-only runs need a simulated GPU (--device sim:<profile>), not %q", cmp.Or(opts.Device, "cpu"))
	case o.Routing == nil:
		return fmt.Errorf("timing-only run without routing: its routers are not computed")
	case opts.EP != nil:
		return fmt.Errorf("timing-only runs of expert parallelism are not supported")
	}
	return nil
}

// replay is a timing-only model's routing: what its routers and its Commit Router chose in
// another run.
type replay struct {
	opts TimingOnlyOptions
	moe  map[int]int // block index -> MoE layer number
}

func newReplay(m *Model) *replay {
	r := &replay{opts: *m.opts.TimingOnly, moe: map[int]int{}}
	for j, l := range m.info.MoELayers {
		r.moe[l] = j
	}
	return r
}

// routes returns the routing of T tokens at positions pos0.. through MoE block layer, each
// chosen expert weighted 1/k: the weights of a pass that computes nothing change nothing.
func (r *replay) routes(layer int, moe *models.MoE, pos0, T int) ([]routing, error) {
	j := r.moe[layer]
	out := make([]routing, T)
	for t := range out {
		ex := r.opts.Routing(pos0+t, j)
		if err := checkChoice(ex, moe); err != nil {
			return nil, fmt.Errorf("timing-only routing of position %d, MoE layer %d: %w", pos0+t, j, err)
		}
		w := make([]float32, len(ex))
		for k := range w {
			w[k] = 1 / float32(len(ex))
		}
		out[t] = routing{experts: slices.Clone(ex), weights: w}
	}
	return out, nil
}

// predict returns the Commit Router's recorded prediction for MoE layer j at pos.
func (r *replay) predict(j, pos int, moe *models.MoE) ([]int, error) {
	if r.opts.Predict == nil {
		return nil, fmt.Errorf("timing-only run with the Commit Router but without its predictions")
	}
	ex := r.opts.Predict(pos, j)
	if err := checkChoice(ex, moe); err != nil {
		return nil, fmt.Errorf("timing-only prediction for position %d, MoE layer %d: %w", pos, j, err)
	}
	return slices.Clone(ex), nil
}

// checkChoice checks one token's experts against a MoE block: top-k distinct experts.
func checkChoice(ex []int, moe *models.MoE) error {
	if len(ex) != moe.Used {
		return fmt.Errorf("%d experts, want the block's top-%d", len(ex), moe.Used)
	}
	for i, e := range ex {
		if e < 0 || e >= moe.Experts || slices.Contains(ex[:i], e) {
			return fmt.Errorf("experts %v: out of range [0, %d) or repeated", ex, moe.Experts)
		}
	}
	return nil
}
