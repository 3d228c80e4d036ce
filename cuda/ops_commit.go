package cuda

import (
	"fmt"

	"github.com/commit-run/commit-run/device"
)

// The GPU's device.Committer: committed routing weighed on the device (router.cu's
// commit_weights_f32), so that the host does not read a layer's router logits before it
// enqueues the experts it committed to.

// CommitWeights implements device.Committer.
func (g *GPU) CommitWeights(logits []float32, gt *device.Gating, pred []int32, o device.OWA, w, rec []float32) {
	c := g.begin("commit weights")
	defer c.end()
	n, k := len(logits), len(pred)
	switch {
	case n < 1 || n > device.CommitMaxExperts:
		c.err = fmt.Errorf("%d router logits: want 1 to %d", n, device.CommitMaxExperts)
	case k < 1 || k > min(n, device.CommitMaxUsed):
		c.err = fmt.Errorf("%d committed experts of %d: want 1 to %d", k, n, min(n, device.CommitMaxUsed))
	case len(w) != k || len(rec) != k+1:
		c.err = fmt.Errorf("%d weights and %d record floats for %d experts: want %d and %d", len(w), len(rec), k, k, k+1)
	case gt.Bias != nil && len(gt.Bias) != n:
		c.err = fmt.Errorf("a selection bias of %d floats for %d experts", len(gt.Bias), n)
	case gt.Groups > 1 && (gt.Groups > device.CommitMaxGroups || n%gt.Groups != 0 || n/gt.Groups < 2 || gt.GroupsUsed < 1 || gt.GroupsUsed > gt.Groups):
		c.err = fmt.Errorf("%d of %d expert groups of %d experts: want equal groups of 2 or more, at most %d", gt.GroupsUsed, gt.Groups, n, device.CommitMaxGroups)
	}
	for _, e := range pred {
		if c.err == nil && (e < 0 || int(e) >= n) {
			c.err = fmt.Errorf("committed expert %d of %d", e, n)
		}
	}
	lp, bp := c.f(logits, "the router logits"), c.f(gt.Bias, "the selection bias")
	wp, rp := c.f(w, "the weights"), c.f(rec, "the routing record")
	pp := c.param(int32Bytes(pred))
	g.args.Reset().Ptr(lp).Ptr(bp).Int(n).Int(k).Int(int(gt.Func)).Int(b2i(gt.Normalize)).Float(gt.Scale).
		Ptr(pp).Int(b2i(o.On)).Float64(o.Alpha1).Float64(o.Alpha2).Int(o.MinCorrect).Int(o.MaxCorrect).Ptr(wp).Ptr(rp).
		Int(gt.Groups).Int(gt.GroupsUsed)
	c.launch("commit_weights_f32", Dim3{X: 1}, Dim3{X: 32})
}

// CombineOne implements device.Committer.
func (g *GPU) CombineOne(out, ys, w []float32, d int) {
	c := g.begin("combine")
	defer c.end()
	if len(out) != d || len(ys) != len(w)*d {
		c.err = fmt.Errorf("%d outputs of %d experts' %d floats for a row of %d", len(out), len(w), len(ys), d)
	}
	op, yp, wp := c.f(out, "the output"), c.f(ys, "the experts' outputs"), c.f(w, "the weights")
	offp := c.param(int32Bytes([]int32{0, int32(len(w))}))
	g.args.Reset().Ptr(op).Ptr(yp).Ptr(wp).Ptr(offp).Ptr(0).Int(0).Int(d)
	c.launch("combine_off_f32", Dim3{X: blocks(d, 256)}, Dim3{X: 256})
}

// ReadAsync implements device.Committer.
func (g *GPU) ReadAsync(dst, src []float32) device.Event {
	c := g.begin("read back")
	if len(dst) != len(src) {
		c.err = fmt.Errorf("%d floats into %d", len(src), len(dst))
	}
	if p := c.f(src, "the source"); c.err == nil {
		c.err = g.compute.CopyDtoH(floatBytes(dst), p)
	}
	failed := c.err != nil
	c.end()
	if failed {
		return nil
	}
	return g.record(g.compute)
}

var _ device.Committer = (*GPU)(nil)

// b2i is a bool as a kernel's int flag.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
