package engine

import "github.com/commit-run/commit-run/models"

// block runs a model's forward passes and their mixture-of-experts layers. Open chooses it
// once: localBlock on the model's own device, or epBlock (epblock.go, over package eprun)
// where expert parallelism spreads the experts over ranks, so that a local model's token never
// passes through ep*.go.
type block interface {
	// pass runs a session's forward pass of tokens at positions pos0.. on kv, and returns
	// the logits want asks for; obs sees the routing, cs holds the Commit Router's
	// predictions (nil: none).
	pass(kv *models.KVCache, tokens []int32, pos0 int, want logitRows, obs RouteObserver, cs *commitState) ([]float32, error)
	// moe runs layer's MoE block on T rows of x (at positions pos0..) into out, filling ev
	// with the routing when it is not nil.
	moe(b models.Backend, layer int, moe *models.MoE, x []float32, T, pos0 int, out []float32, ev *RouteEvent, cs *commitState) error
}

// localBlock runs everything on the model's own device: forward.go's pass, moe.go's block.
type localBlock struct{ m *Model }

func (l localBlock) pass(kv *models.KVCache, tokens []int32, pos0 int, want logitRows, obs RouteObserver, cs *commitState) ([]float32, error) {
	return l.m.forward(kv, tokens, pos0, want, obs, cs)
}

func (l localBlock) moe(b models.Backend, layer int, moe *models.MoE, x []float32, T, pos0 int, out []float32, ev *RouteEvent, cs *commitState) error {
	return l.m.localMoE(b, layer, moe, x, T, pos0, out, ev, cs)
}
