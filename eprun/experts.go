package eprun

import (
	"fmt"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/quant"
)

// Where a rank's experts come from when the plan moves them: copies between ranks, fetches
// from the host, and EPLB's re-placement, with the statistics each layer records.

// copyExpert copies expert e's weights from the host to rank r: the traffic of a fetch or a
// move. A GPU uploads them, so that its kernels read them; other devices copy them into a
// spare slot on their copy stream, and compute from the same weights in host memory.
func (g *Group) copyExpert(r int, moe *models.MoE, e int) error {
	dev := g.ranks[r].Device()
	if _, ok := dev.(device.Resident); ok {
		return g.uploadExpert(r, moe, e)
	}
	for _, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
		src := t.Expert(e).Data
		if cap(g.scratch[r]) < len(src) {
			g.scratch[r] = make([]byte, len(src))
		}
		dev.CopyIn(g.scratch[r][:len(src)], src)
	}
	return nil
}

// fetchSlots is a rank's slots for fetched experts on a device with memory of its own: each
// three device buffers (gate, up, down) as large as any layer's, charged to the budget when
// first needed and reused layer after layer, so that a fetch is an asynchronous copy on the
// copy stream and allocates nothing.
type fetchSlots struct {
	slots [][3][]byte
	size  [3]int // bytes of each slot's buffers
	// free is the compute stream done with the slots' last experts (nil: nothing to wait for).
	free device.Event
}

// fetchExpert copies expert e's weights from the host into rank r's fetch slot i, on the copy
// stream, and returns the expert as the rank computes it: from the slot on a device with
// memory of its own, from host memory on the others, where the copy is the traffic.
func (g *Group) fetchExpert(r int, moe *models.MoE, e, i int) (*models.FFN, error) {
	dev := g.ranks[r].Device()
	ts := [3]*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps}
	res, ok := dev.(device.Resident)
	if !ok {
		if err := g.copyExpert(r, moe, e); err != nil {
			return nil, err
		}
		return &models.FFN{Gate: moe.GateExps.Expert(e), Up: moe.UpExps.Expert(e), Down: moe.DownExps.Expert(e)}, nil
	}
	f := &g.fetch[r]
	if f.size == [3]int{} {
		for _, l := range g.arch.Layers {
			if l.MoE != nil {
				for k, t := range [3]*models.Tensor{l.MoE.GateExps, l.MoE.UpExps, l.MoE.DownExps} {
					f.size[k] = max(f.size[k], len(t.Expert(0).Data))
				}
			}
		}
	}
	for len(f.slots) <= i {
		n := int64(f.size[0] + f.size[1] + f.size[2])
		if err := dev.Memory().Alloc(n, "a slot for fetched experts"); err != nil {
			return nil, fmt.Errorf("rank %d on %s: %w", r, dev.Name(), err)
		}
		var slot [3][]byte
		for k, t := range ts {
			b, err := res.Buffer(int64(f.size[k]), fmt.Sprintf("a slot for fetched %s experts", t.Name))
			if err != nil {
				for _, b := range slot[:k] {
					res.Release(b)
				}
				dev.Memory().Free(n)
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
			slot[k] = b
		}
		f.slots = append(f.slots, slot)
	}
	if f.free != nil {
		// The slots' last experts may still be computing.
		dev.Copy().Wait(f.free)
		f.free = nil
	}
	var ms [3]quant.Matrix
	for k, t := range ts {
		ms[k] = t.Expert(e)
		src := ms[k].Data
		dev.CopyIn(f.slots[i][k][:len(src)], src)
		ms[k].Data = f.slots[i][k][:len(src)]
	}
	return &models.FFN{Gate: ms[0], Up: ms[1], Down: ms[2]}, nil
}

// uploadExpert puts expert e's weights on rank r's device, if it has memory of its own.
func (g *Group) uploadExpert(r int, moe *models.MoE, e int) error {
	res, ok := g.ranks[r].Device().(device.Resident)
	if !ok {
		return nil
	}
	for _, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
		if err := res.Upload(t.Expert(e).Data, fmt.Sprintf("%s, expert %d", t.Name, e)); err != nil {
			return err
		}
	}
	return nil
}

// releaseExpert frees rank r's device copy of expert e, once its work is done.
func (g *Group) releaseExpert(r int, moe *models.MoE, e int) {
	if res, ok := g.ranks[r].Device().(device.Resident); ok {
		for _, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
			res.Release(t.Expert(e).Data)
		}
	}
}

// record adds rank r's figures of a pass of MoE layer j; the schedule's are counted once.
func (g *Group) record(j, r int, compute, total float64, moved int64, s multigpu.Schedule, b multigpu.Batch) {
	g.smu.Lock()
	defer g.smu.Unlock()
	L := &g.stats.Layers[j]
	// moved is what this rank sent and received in the dispatch: summed over the ranks that
	// counts every dispatched byte twice, once for the dispatch and once for the combine,
	// which moves the same rows back.
	L.Bytes += moved
	if r == g.local[0] {
		load := s.DeviceLoad()
		L.Tokens += int64(s.Tokens)
		L.Choices += int64(len(b.Choice))
		L.Dropped += int64(s.Dropped)
		L.Extra += int64(s.Rerouted)
		L.Fetches += int64(len(s.Fetches))
		L.MaxLoad += multigpu.Straggler(load)
		L.Balancedness += multigpu.Balancedness(load)
	}
	p := &g.pass[j]
	p.n++
	p.compute, p.total = max(p.compute, compute), max(p.total, total)
	if p.n == len(g.local) {
		L.Passes++
		L.Straggler += p.compute
		L.Time += p.total
		*p = layerPass{}
	}
}

// replace lets an EPLB policy move experts after a pass: rank r allocates its new experts
// and copies those it did not hold; the layer's next experts wait for the copies.
func (g *Group) replace(r, j int, moe *models.MoE) error {
	rp, ok := g.pols[r].(multigpu.Replacer)
	if !ok {
		return nil
	}
	cur := g.place[r][j]
	np, changed := rp.Replace(j, cur)
	if !changed {
		return nil
	}
	if err := np.Check(len(cur.Holders)); err != nil {
		return fmt.Errorf("%s: new placement of MoE layer %d: %w", g.policy, j, err)
	}
	g.place[r][j] = np
	if err := g.hold(r); err != nil {
		g.place[r][j] = cur
		if err2 := g.hold(r); err2 != nil {
			return fmt.Errorf("%w; and the old placement no longer fits: %v", err, err2)
		}
		return err
	}
	dev := g.ranks[r].Device()
	var moved int64
	for e := range np.Holders {
		switch {
		case np.Holds(r, e) && !cur.Holds(r, e):
			g.ranks[r].Label("copy", "move", g.stats.Layers[j].Layer, e)
			if err := g.copyExpert(r, moe, e); err != nil {
				return fmt.Errorf("%s: moving expert %d of MoE layer %d to rank %d: %w", g.policy, e, j, r, err)
			}
			moved += g.expertBytes[j]
		case !np.Holds(r, e) && cur.Holds(r, e):
			g.releaseExpert(r, moe, e)
		}
	}
	if moved > 0 {
		g.pending[r][j] = dev.Copy().Record()
	}
	g.smu.Lock()
	g.stats.MovedBytes += moved
	if r == g.local[0] {
		g.stats.Replans++
	}
	g.smu.Unlock()
	return nil
}
