package cuda

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/device"
)

// TestGPUCommitOps runs committed routing through the GPU's device.Committer: the weights
// against commitRef to the bit, the record read back asynchronously into pinned memory, and
// the one-row combine with the weights where the kernel left them.
func TestGPUCommitOps(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	r := rand.New(rand.NewPCG(7, 8))
	const n, k, d = 60, 4, 40
	logits := randUniform(r, n, -6, 6)
	gt := &device.Gating{Func: device.GatingSoftmax}
	o := device.OWA{On: true, Alpha1: 1.3, Alpha2: 1, MinCorrect: 2, MaxCorrect: 3}
	_, truth, _ := commitRef(logits, device.Gating{Func: gt.Func}, make([]int32, k), device.OWA{})
	pred := commitPred(r, n, truth, 2)
	want, _, adjusted := commitRef(logits, device.Gating{Func: gt.Func}, pred, o)
	if !adjusted {
		t.Fatal("the case does not trigger OWA")
	}

	dl, dw, drec := deviceFloats(t, g, n, logits), deviceFloats(t, g, k, nil), deviceFloats(t, g, k+1, nil)
	g.CommitWeights(dl, gt, pred, o, dw, drec)
	pb, err := g.HostAlloc(4 * (k + 1))
	if err != nil {
		t.Fatal(err)
	}
	rec := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(pb))), k+1)
	ev := g.ReadAsync(rec, drec)
	ys := randF32(r, k*d, 1)
	dys, dout := deviceFloats(t, g, k*d, ys), deviceFloats(t, g, d, nil)
	g.CombineOne(dout, dys, dw, d)
	g.Sync(ev)
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	checkBits(t, "w", hostFloats(g, dw), want)
	for j, e := range truth {
		if rec[j] != float32(e) {
			t.Fatalf("record %v, want the router's top-k %v and 1", rec, truth)
		}
	}
	if rec[k] != 1 {
		t.Errorf("record %v: OWA applied, want 1 last", rec)
	}
	// combine_off_f32 sums the rows in order, each product rounded (no fused multiply-add).
	out := make([]float32, d)
	for j := range k {
		for i := range d {
			out[i] += float32(want[j] * ys[j*d+i]) // the conversion forbids a fused multiply-add
		}
	}
	checkBits(t, "out", hostFloats(g, dout), out)
}

// TestGPUCommitOpsErrors checks that bad operands fail the GPU with an error that names them
// and launch nothing.
func TestGPUCommitOpsErrors(t *testing.T) {
	gt := &device.Gating{Func: device.GatingSoftmax}
	o := device.OWA{On: true, Alpha1: 1, Alpha2: 1, MinCorrect: 1, MaxCorrect: 1}
	cases := []struct {
		name string
		run  func(g *GPU, l, w, rec []float32)
		want string
	}{
		{"too many experts", func(g *GPU, l, w, rec []float32) {
			big := deviceFloats(t, g, device.CommitMaxExperts+1, nil)
			g.CommitWeights(big, gt, []int32{0, 1}, o, w, rec)
		}, "513 router logits"},
		{"no experts", func(g *GPU, l, w, rec []float32) { g.CommitWeights(l, gt, nil, o, w[:0], rec[:1]) }, "0 committed experts"},
		{"expert out of range", func(g *GPU, l, w, rec []float32) { g.CommitWeights(l, gt, []int32{0, 8}, o, w, rec) }, "committed expert 8 of 8"},
		{"short record", func(g *GPU, l, w, rec []float32) { g.CommitWeights(l, gt, []int32{0, 1}, o, w, rec[:2]) }, "2 record floats"},
		{"bias of another size", func(g *GPU, l, w, rec []float32) {
			g.CommitWeights(l, &device.Gating{Bias: l[:4]}, []int32{0, 1}, o, w, rec)
		}, "selection bias of 4 floats"},
		{"host logits", func(g *GPU, l, w, rec []float32) { g.CommitWeights(make([]float32, 8), gt, []int32{0, 1}, o, w, rec) }, "the router logits"},
		{"combine of a short row", func(g *GPU, l, w, rec []float32) { g.CombineOne(l[:3], l, w, 4) }, "3 outputs"},
		{"read of another length", func(g *GPU, l, w, rec []float32) {
			if ev := g.ReadAsync(make([]float32, 2), rec); ev != nil {
				t.Error("a failed read returned an event")
			}
		}, "3 floats into 2"},
	}
	for _, c := range cases {
		g := openFakeGPU(t, GPUOptions{})
		l, w, rec := deviceFloats(t, g, 8, nil), deviceFloats(t, g, 2, []float32{-1, -1}), deviceFloats(t, g, 3, nil)
		c.run(g, l, w, rec)
		if err := g.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if got := hostFloats(g, w); got[0] != -1 || got[1] != -1 {
			t.Errorf("%s: the weights were written: %v", c.name, got)
		}
	}
}
