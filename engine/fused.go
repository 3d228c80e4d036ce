package engine

import (
	"errors"
	"fmt"
	"slices"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// A pass on a device that fuses (a GPU: device.Fused, device.RoutedMoE) takes fewer launches
// for the same numbers: the residual adds go with the next norm, attention's Q, K and V and
// its RoPE and cache store are one launch each, and a MoE layer whose experts are all in the
// device's memory is routed on the device, its chosen experts computed from a table there:
// the host never reads a layer's routing back before its experts can start. Each fused
// kernel gives the unfused kernels' results to the bit, so a fused pass equals an unfused one.

// setupFused finds the device's fused operations for passes in its memory, and prepares the
// MoE layers the device routes itself: those whose every expert stays on the device for as
// long as the model is open (placement.keptWeights), when no Commit Router chooses them and
// no expert parallelism spreads them. That is every layer without offloading, and the device
// layers of llama.cpp's split (static, static-cache), whose experts keep their slots: a
// decoded token reads back no routing there, and the host takes part only in its host
// layers. A layer the device cannot take (too many experts, experts of mixed types) is routed
// on the host as before.
func (m *Model) setupFused() error {
	f, ok := m.dev.(device.Fused)
	if !ok || !m.resident || m.opts.unfused {
		return nil
	}
	m.fused = f
	rm, ok := m.dev.(device.RoutedMoE)
	if !ok || m.ep != nil || m.commit != nil {
		return nil
	}
	m.moeDev = make([]*device.MoELayer, len(m.arch.Layers))
layers:
	for i, l := range m.arch.Layers {
		moe := l.MoE
		if moe == nil {
			continue
		}
		ml := &device.MoELayer{Used: moe.Used, Gating: *gatingOf(moe), SharedGate: moe.SharedGate, SharedSigmoid: moe.SharedSigmoid}
		for e := 0; e < moe.Experts; e++ {
			w, kept, err := m.place.keptWeights(i, e)
			if err != nil {
				return fmt.Errorf("layer %d: %w", i, err)
			}
			if !kept {
				continue layers // routed on the host, which places its experts
			}
			ml.Experts = append(ml.Experts, expertMatrices(moe, e, w.Gate, w.Up, w.Down))
		}
		if sh := moe.Shared; sh != nil {
			ml.Shared = &device.ExpertMatrices{Gate: sh.Gate, Up: sh.Up, Down: sh.Down}
		}
		if err := rm.PrepareMoE(ml); err != nil {
			if m.moeDevErr == nil {
				m.moeDevErr = fmt.Errorf("layer %d's experts are routed on the host: %w", i, err)
			}
			continue
		}
		m.moeDev[i] = ml
	}
	return nil
}

// expertMatrices is expert e of moe as a device computes it, with the weights gate, up and
// down (where the placement keeps them) and the expert's biases and activation.
func expertMatrices(moe *models.MoE, e int, gate, up, down quant.Matrix) device.ExpertMatrices {
	gb, ub, db := moe.ExpertBiases(e)
	return device.ExpertMatrices{Gate: gate, Up: up, Down: down, GateBias: gb, UpBias: ub, DownBias: db, OAI: moe.OAI}
}

// gatingOf is a MoE block's gating as a device computes it.
func gatingOf(moe *models.MoE) *device.Gating {
	g := &device.Gating{Bias: moe.SelectionBias, Normalize: moe.NormWeights, Scale: moe.WeightsScale, Groups: moe.Groups, GroupsUsed: moe.GroupsUsed}
	switch moe.Gating {
	case models.GatingSigmoid:
		g.Func = device.GatingSigmoid
	case models.GatingSoftmaxWeight:
		g.Func = device.GatingSoftmaxWeight
	}
	return g
}

// routedOnDevice returns layer's MoE as the device routes and computes it in its fused
// kernels, or nil where it does not: a layer the device did not take, a pass whose routing
// the host reads (an observer, the Commit Router) or plans (token drop, which a pass of
// several rows may take), or a prompt's, whose experts the device groups (groupedOnDevice)
// or the host does. A pass of a few rows (several sequences' decode steps batched) takes the
// fused kernels as one token does: each row's chosen experts as entries of their own, so the
// host never waits for a layer's routing, where grouping the rows by expert on the host cost
// a read-back and a wait a layer.
func (m *Model) routedOnDevice(layer, T int, ev *RouteEvent, cs *commitState) *device.MoELayer {
	if m.moeDev == nil || T < 1 || ev != nil || cs != nil || T > 1 && (m.drop != nil || !m.tokenByToken(T)) {
		return nil
	}
	return m.moeDev[layer]
}

// tokenByToken says whether the device computes a pass of T rows' experts row by row, not
// grouped by expert: a decode batch's few rows (device.GroupedExperts's GroupMinTokens above
// 1: no expert is grouped).
func (m *Model) tokenByToken(T int) bool {
	gd, ok := m.dev.(device.GroupedExperts)
	return ok && gd.GroupMinTokens(T) > 1
}

// moeOnDevice is moe for a layer the device routes: the router's product, then the routing,
// the experts and their weighted sum (the shared expert's added) in three launches, reading
// nothing back.
func (m *Model) moeOnDevice(b models.Backend, l *device.MoELayer, moe *models.MoE, x []float32, T int, out []float32) {
	logits := b.Floats(T * len(l.Experts))
	// The router's bias (gpt-oss) is added in the product's launch.
	m.fused.Products(x, T, [3]device.Product{{W: moe.Router.Matrix(), Out: logits, Bias: moe.RouterBias}})
	m.dev.(device.RoutedMoE).MoE(l, x, logits, T, out, b.Floats(l.ScratchFloats(T)))
	m.place.deviceRouted(T * l.Used)
}

// groupedOnDevice returns layer's MoE as the device routes it and computes its experts on
// their tokens grouped (device.GroupedMoE), with the device, or nil where it does not: a
// layer the device does not route, a pass whose routing the host reads or plans (an
// observer, the Commit Router, token drop), or one the device does not group (a decode
// step's, experts without grouped products).
func (m *Model) groupedOnDevice(layer, T int, ev *RouteEvent, cs *commitState) (*device.MoELayer, device.GroupedMoE) {
	if m.moeDev == nil || m.moeDev[layer] == nil || ev != nil || cs != nil || m.drop != nil || m.opts.ungrouped {
		return nil, nil
	}
	gm, ok := m.dev.(device.GroupedMoE)
	if !ok || !gm.GroupsMoE(m.moeDev[layer], T) {
		return nil, nil
	}
	return m.moeDev[layer], gm
}

// moeGroupedOnDevice is moe for a prompt's pass of a layer the device routes and groups: the
// router's product, then the routing, the grouped experts and their weighted sum, reading
// nothing back. The shared expert is the caller's, as on the host-routed path.
func (m *Model) moeGroupedOnDevice(b models.Backend, gm device.GroupedMoE, l *device.MoELayer, moe *models.MoE, x []float32, T int, out []float32) {
	logits := b.Floats(T * len(l.Experts))
	m.fused.Products(x, T, [3]device.Product{{W: moe.Router.Matrix(), Out: logits, Bias: moe.RouterBias}})
	gm.MoEGrouped(l, x, logits, T, out, b.Floats(l.GroupedScratchFloats(T)))
	m.place.deviceRouted(T * l.Used)
}

// Fused returns the device's fused operations, or nil (models.FusedBackend).
func (b *backend) Fused() device.Fused { return b.fused }

// expertsOnDevice computes a single token's experts, which the host routed or committed to,
// and their weighted sum into out in the device's fused kernels (device.RoutedMoE's Experts:
// two launches where there were four for each expert and a gather and a combine), where every
// expert computes on the device and their weights fit it at once: the offloader's layers, and
// committed routing's.
// planned says whether it asked the placement which experts the host computes (plan: those,
// nil for none), which the caller then does not ask again; with planned and a nil plan the
// experts are done.
func (m *Model) expertsOnDevice(b models.Backend, layer int, x []float32, routes []routing, kept [][]bool, out []float32) (plan []bool, planned bool, err error) {
	rm, ok := m.dev.(device.RoutedMoE)
	if !ok || m.fused == nil || len(routes) != 1 || kept != nil {
		return nil, false, nil
	}
	moe := m.arch.Layers[layer].MoE
	r := routes[0]
	k := len(r.experts)
	weights := r.weights
	if weights == nil {
		weights = r.devWeights // committed routing's, weighed on the device (moeCommitted)
	}
	if out == nil || len(weights) != k {
		return nil, false, nil
	}
	// The experts in the order the host path acquires them, its jobs': ascending.
	active := slices.Sorted(slices.Values(r.experts))
	if m.holdable(layer, active, m.place.Pinnable()) < k {
		return nil, false, nil
	}
	if len(slices.Compact(slices.Clone(active))) != k {
		return nil, false, nil // an expert chosen twice: the host path groups it
	}
	ones := make([]int, k)
	for i := range ones {
		ones[i] = 1
	}
	if plan = m.place.OnHost(layer, active, ones); plan != nil {
		return plan, true, nil
	}
	ws := make([]device.ExpertMatrices, k)
	dones := make([]func() error, 0, k)
	defer func() {
		for _, done := range dones {
			err = errors.Join(err, done())
		}
	}()
	for _, e := range active {
		w, done, err := m.place.Weights(layer, e, false)
		if err != nil {
			return nil, true, err
		}
		dones = append(dones, done)
		ws[slices.Index(r.experts, e)] = expertMatrices(moe, e, w.Gate, w.Up, w.Down)
	}
	d := m.arch.Config.Embd
	rm.Experts(x[:d], 1, k, ws, weights, out[:d], b.Floats(k*ws[0].Gate.Rows))
	return nil, true, nil
}

// holdable is how many of experts, from the first, the placement can hold at once: all but
// those beyond most that it does not keep for good.
func (m *Model) holdable(layer int, experts []int, most int) int {
	held := 0
	for n, e := range experts {
		if !m.place.Kept(layer, e) {
			if held == most {
				return n
			}
			held++
		}
	}
	return len(experts)
}
