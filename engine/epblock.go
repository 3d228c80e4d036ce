package engine

import (
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/eprun"
	"github.com/commit-run/commit-run/models"
)

// epBlock runs passes as rank 0's tokens in a step of every rank, and their MoE layers
// spread over the ranks (eprun.Group.MoE).
type epBlock struct{ m *Model }

func (e epBlock) pass(kv *models.KVCache, tokens []int32, pos0 int, want logitRows, obs RouteObserver, _ *commitState) ([]float32, error) {
	work := make([]func() error, e.m.ep.Ranks())
	var logits []float32
	if len(tokens) > 0 {
		work[0] = func() (err error) {
			logits, err = e.m.forward(kv, tokens, pos0, want, obs, nil)
			return err
		}
	}
	if err := e.m.ep.Step(work); err != nil {
		return nil, err
	}
	return logits, nil
}

func (e epBlock) moe(_ models.Backend, layer int, moe *models.MoE, x []float32, T, _ int, out []float32, ev *RouteEvent, _ *commitState) error {
	var observe func([]float32, []eprun.Route)
	if ev != nil {
		observe = func(logits []float32, routes []eprun.Route) {
			ev.fill(moe, x[:T*e.m.arch.Config.Embd], logits, fromEPRoutes(routes))
		}
	}
	return e.m.ep.MoE(e.m.rank, layer, moe, x, T, out, observe)
}

// epRank is a rank's model as package eprun drives it: the steps of a pass and of a MoE
// layer that are the model's own.
type epRank struct{ m *Model }

func (r epRank) Device() device.Device { return r.m.dev }

func (r epRank) Label(kind, name string, layer, expert int) { r.m.label(kind, name, layer, expert) }

// HostBackend: expert parallelism's ranks compute their MoE layers with the host's Ops.
func (r epRank) HostBackend() models.Backend { return r.m.hostBackend() }

// Route: timing-only runs do not take expert parallelism (checkTimingOnly): the routing is the
// router's.
func (r epRank) Route(b models.Backend, layer int, moe *models.MoE, x []float32, T int) ([]float32, []eprun.Route, error) {
	logits, routes, err := r.m.routeTokens(b, layer, moe, x, T, 0)
	if err != nil {
		return nil, nil, err
	}
	ers := make([]eprun.Route, len(routes))
	for t, rt := range routes {
		ers[t] = eprun.Route{Experts: rt.experts, Weights: rt.weights}
	}
	return logits, ers, nil
}

func (r epRank) Expert(b models.Backend, layer, e int, f *models.FFN, x []float32, T int, out []float32) {
	r.m.expertFFN(b, r.m.dev.MatMulID, r.m.charger, layer, e, f, x, T, out)
}

func (r epRank) Combine(b models.Backend, layer int, routes []eprun.Route, ys []float32, off []int, out []float32) {
	r.m.combine(b, layer, fromEPRoutes(routes), ys, off, out)
}

func (r epRank) SharedExpert(b models.Backend, layer int, moe *models.MoE, x []float32, T int, out []float32) {
	r.m.sharedExpert(b, layer, moe, x, T, out)
}

func (r epRank) Forward(kv *models.KVCache, tokens []int32, pos0 int) ([]float32, error) {
	return r.m.forward(kv, tokens, pos0, allLogits, nil, nil)
}

func (r epRank) NewKV() (*models.KVCache, error) {
	return models.NewKVCache(r.m.arch, r.m.kvOptions(), models.HostAlloc)
}

func (r epRank) Upload() error { return r.m.upload() }

func (r epRank) Close() error { return closeDevice(r.m.dev) }

// fromEPRoutes is eprun's routes as the engine's.
func fromEPRoutes(routes []eprun.Route) []routing {
	rs := make([]routing, len(routes))
	for t, rt := range routes {
		rs[t] = routing{experts: rt.Experts, weights: rt.Weights}
	}
	return rs
}
