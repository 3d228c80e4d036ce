package engine

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// Committed routing on the device. Under commit, a token's experts are known before its
// router runs, so on a device that weighs them itself (device.Committer, a GPU) the host
// enqueues the router, the committed experts and their weighted sum without reading the
// router's logits: no synchronisation per layer. What the host needs of the router's own
// choice (the Commit Router's and the offloader's statistics, the heuristics' memory) comes
// back asynchronously into pinned memory and is read when the pass ends. The Commit Router's
// input, the router input, also comes back asynchronously: the host waits for it only after
// this layer's experts are enqueued, so the device computes them while the host predicts.

// commitDevice is a model's committed routing on its device.
type commitDevice struct {
	dev device.Committer
	// x receives a layer's router input for the Commit Router, rec each MoE layer's record
	// (its router's top-k and whether OWA applied), at slot[layer]*(Used+1): pinned host
	// memory, written by the device.
	x, rec []float32
	slot   map[int]int
	gating map[int]*device.Gating
	owa    device.OWA
	// pending are the records of the pass in progress, not read yet. Passes in device memory
	// run one at a time (Model.passMu), so they need no lock of their own.
	pending []committedRoute
}

// committedRoute is one layer's committed routing whose record the host reads later.
type committedRoute struct {
	layer        int
	pred, commit []int
	rec          []float32
	ev           device.Event
}

// setupCommitDevice turns on committed routing on the device for a model that commits
// (policy commit, or the Commit Router without offloading) and runs its passes in the
// memory of a device that is a Committer and allocates pinned host memory.
func (m *Model) setupCommitDevice() error {
	cm, ok := m.dev.(device.Committer)
	ha, hok := m.dev.(device.HostAllocator)
	commits := m.commit != nil && m.commit.compute || m.off != nil && m.off.Commits()
	// OnlyAllWrong chooses between the router's experts and the predicted ones: the host
	// must read the routing to know which to compute.
	only0 := m.commit != nil && m.commit.only0
	if !m.resident || !ok || !hok || !commits || only0 {
		return nil
	}
	c := &commitDevice{dev: cm, slot: map[int]int{}, gating: map[int]*device.Gating{}}
	p, on := m.owaParams()
	c.owa = device.OWA{On: on, Alpha1: p.Alpha1, Alpha2: p.Alpha2, MinCorrect: p.MinCorrect, MaxCorrect: p.MaxCorrect}
	n := 0
	for _, l := range m.info.MoELayers {
		moe := m.arch.Layers[l].MoE
		c.slot[l] = n
		n += moe.Used + 1
		c.gating[l] = gatingOf(moe)
	}
	d := m.arch.Config.Embd
	b, err := ha.HostAlloc(int64(4 * (d + n)))
	if err != nil {
		return fmt.Errorf("pinned memory for committed routing: %w", err)
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), d+n)
	c.x, c.rec = all[:d], all[d:]
	m.commitDev = c
	return nil
}

// fits says whether a layer's router is within the kernel's bounds; the host weighs the
// others' committed experts.
func (c *commitDevice) fits(moe *models.MoE) bool {
	return moe.Experts <= device.CommitMaxExperts && moe.Used <= device.CommitMaxUsed && moe.Groups <= device.CommitMaxGroups
}

// moeCommitted is moe for one token whose experts, commit, were chosen ahead of its router,
// on a device that weighs them itself. pred is the prediction the offloader scores.
func (m *Model) moeCommitted(b models.Backend, layer int, moe *models.MoE, x []float32, pos0 int, out []float32, cs *commitState, pred, commit []int) error {
	c := m.commitDev
	d := m.arch.Config.Embd
	var xev device.Event
	if cs != nil {
		xev = c.dev.ReadAsync(c.x, x[:d])
	}
	logits := b.Floats(moe.Experts)
	m.label("router", "router", layer, -1)
	b.MatMul(moe.Router.Matrix(), x[:d], 1, logits)
	addBias(b, logits, moe.RouterBias)
	k := len(commit)
	w, rec := b.Floats(k), b.Floats(k+1)
	ids := make([]int32, k)
	for j, e := range commit {
		ids[j] = int32(e)
	}
	c.dev.CommitWeights(logits, c.gating[layer], ids, c.owa, w, rec)
	hrec := c.rec[c.slot[layer] : c.slot[layer]+k+1]
	c.pending = append(c.pending, committedRoute{layer: layer, pred: pred, commit: commit, rec: hrec, ev: c.dev.ReadAsync(hrec, rec)})

	// The fused experts sum them into out where they can (expertsOnDevice); else their
	// outputs come back one by one and are combined here.
	ys, _, err := m.experts(b, layer, moe, x, nil, []routing{{experts: commit, devWeights: w}}, nil, out)
	if err != nil {
		return err
	}
	if ys != nil {
		m.label("combine", "combine", layer, -1)
		c.dev.CombineOne(out[:d], ys, w, d)
	}

	// The Commit Router predicts the next layer's experts while the device computes these.
	var next []int
	var nextLayer int
	if cs != nil {
		m.dev.Sync(xev)
		var nj, npos int
		var err error
		if nj, npos, next, err = m.predict(layer, c.x, pos0); err != nil {
			return err
		}
		cs.pending[nj], cs.pos[nj] = next, npos
		nextLayer = m.commit.moe[nj]
	}
	if next == nil && m.place.Heuristic() && layer == m.info.MoELayers[len(m.info.MoELayers)-1] {
		// The heuristics predict the next token's first layer from this token's choice
		// there: read what is back so far.
		if err := m.flushCommitted(); err != nil {
			return err
		}
	}
	if err := m.place.Ahead(layer, moe.Used, nextLayer, next, nil); err != nil {
		return err
	}
	m.sharedExpert(b, layer, moe, x, 1, out)
	return nil
}

// flushCommitted reads the records of the committed layers enqueued so far, waiting for
// each, and adds them to the statistics. A record the device did not write properly (after
// a device error) is dropped with an error.
func (m *Model) flushCommitted() error {
	c := m.commitDev
	if c == nil {
		return nil
	}
	pending := c.pending
	c.pending = c.pending[:0]
	for _, r := range pending {
		m.dev.Sync(r.ev)
		if err := m.deviceErr(); err != nil {
			return err
		}
		k := len(r.commit)
		moe := m.arch.Layers[r.layer].MoE
		truth := make([]int, k)
		for j, v := range r.rec[:k] {
			if !(v >= 0 && v < float32(moe.Experts)) || v != float32(math.Trunc(float64(v))) {
				return fmt.Errorf("committed routing of layer %d: the device's record %v names no expert of %d", r.layer, r.rec, moe.Experts)
			}
			truth[j] = int(v)
		}
		m.countCommit(r.layer, truth, r.commit, r.rec[k] == 1)
		m.place.routed(r.layer, []routing{{experts: truth}}, r.pred, true)
	}
	return nil
}
