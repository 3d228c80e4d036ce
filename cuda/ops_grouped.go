package cuda

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// GroupMinTokens implements device.GroupedExperts. In a prompt's pass (mmqMinTokens tokens
// or more) every expert a token chose joins the group: its weights are read once either way,
// the tile's unused tokens cost tensor-core work the card has to spare, and alone it would
// take five or six launches (on a 32-token OLMoE prompt, most of a layer's 64 experts have
// fewer than 9 tokens). Such an expert's numbers are then mmqi's where MatMul's would be
// mmvq's: the same integer sums, the float sums in another order. A pass of fewer tokens
// (batched decode) groups none, and keeps MatMul's numbers. The simulated card (sim) groups
// by the same rule.
func (g *GPU) GroupMinTokens(T int) int {
	if T >= mmqMinTokens {
		return 1
	}
	return mmqMinTokens
}

// GroupsExperts implements device.GroupedExperts: experts whose products are all integer ones
// on the tensor cores (mmqi), whatever kernels the device has loaded.
func (g *GPU) GroupsExperts(e device.ExpertMatrices) bool {
	for _, w := range []quant.Matrix{e.Gate, e.Up, e.Down} {
		if _, qb, ok := q8Kind(w.Type); !ok || w.Cols%qb != 0 || mmqiKernels[w.Type] == "" {
			return false
		}
	}
	return true
}

// ExpertGroups implements device.GroupedExperts in seven launches whatever the number of
// experts: the input quantized once, the gates and the ups (mmqi_id each), their SwiGLU, its
// quantization, and the downs (mmqi_id), each expert's written to its rows of y. Experts with
// biases (gpt-oss's) take a launch more per product (add_rows_id_f32), and gpt-oss's
// activation replaces SwiGLU.
func (g *GPU) ExpertGroups(ex []device.ExpertMatrices, x []float32, off, at []int32, y, scratch []float32) bool {
	if len(ex) == 0 || len(off) != len(ex)+1 || len(at) != len(ex) {
		return len(ex) == 0
	}
	e0 := ex[0]
	gate, up, down := e0.Gate, e0.Up, e0.Down
	biased := [3]bool{e0.GateBias != nil, e0.UpBias != nil, e0.DownBias != nil}
	for _, e := range ex {
		if e.Gate.Type != gate.Type || e.Up.Type != up.Type || e.Down.Type != down.Type || e.Gate.Rows != gate.Rows || e.Gate.Cols != gate.Cols ||
			e.Up.Rows != up.Rows || e.Up.Cols != up.Cols || e.Down.Rows != down.Rows || e.Down.Cols != down.Cols ||
			biased != [3]bool{e.GateBias != nil, e.UpBias != nil, e.DownBias != nil} || (e.OAI == nil) != (e0.OAI == nil) ||
			e.OAI != nil && *e.OAI != *e0.OAI {
			return false
		}
	}
	if !g.GroupsExperts(e0) {
		return false
	}
	for _, w := range []quant.Matrix{gate, up, down} {
		if g.mmqi[w.Type] == nil {
			return false
		}
	}
	c := g.begin("expert groups")
	defer c.end()
	d, ff, n := gate.Cols, gate.Rows, int(off[len(ex)])
	if up.Rows != ff || up.Cols != d || down.Cols != ff || down.Rows != d || len(x) < n*d || len(scratch) < 2*n*ff {
		c.err = fmt.Errorf("%d experts of %dx%d, %dx%d and %dx%d over %d rows: %d inputs, %d scratch floats",
			len(ex), gate.Rows, gate.Cols, up.Rows, up.Cols, down.Rows, down.Cols, n, len(x), len(scratch))
		return true
	}
	rows, most := 0, 0 // the outputs' rows; the largest group
	for i := range ex {
		k := int(off[i+1] - off[i])
		if k < 0 || at[i] < 0 {
			c.err = fmt.Errorf("group %d: rows %d .. %d, outputs from row %d", i, off[i], off[i+1], at[i])
			return true
		}
		rows, most = max(rows, int(at[i])+k), max(most, k)
	}
	if len(y) < rows*d {
		c.err = fmt.Errorf("outputs to row %d of %d floats", rows, len(y))
		return true
	}
	// The gates' addresses, then the ups', the downs', and their biases', in Experts's
	// reused scratch.
	g.tabScratch = g.tabScratch[:0]
	for _, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.ptr(e.Gate.Data, "an expert's gate")))
	}
	for _, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.ptr(e.Up.Data, "an expert's up")))
	}
	for _, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.ptr(e.Down.Data, "an expert's down")))
	}
	for _, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.f(e.GateBias, "an expert's gate bias")))
	}
	for _, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.f(e.UpBias, "an expert's up bias")))
	}
	for _, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.f(e.DownBias, "an expert's down bias")))
	}
	tab := c.param(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(g.tabScratch))), 8*len(g.tabScratch)))
	offp, atp := c.param(int32Bytes(off)), c.param(int32Bytes(at))
	xp, yp := c.f(x[:n*d], "the experts' inputs"), c.f(y[:rows*d], "the experts' outputs")
	gatep, upp := c.f(scratch[:n*ff], "the gates"), c.f(scratch[n*ff:2*n*ff], "the ups")
	// product launches mmqi_id on the experts' matrices of table k (gate, up, down) with the
	// quantized input a, into out (rows from outAt's, or beside the inputs').
	product := func(k int, w quant.Matrix, a q8, out, outAt DevicePtr) {
		if c.err != nil {
			return
		}
		g.args.Reset().Ptr(tab.Add(int64(8 * k * len(ex)))).Ptr(offp).Ptr(outAt).Ptr(a.q).Ptr(a.d).Ptr(a.s).Ptr(out).Int(w.Rows).Int(w.Cols)
		var fn *Function
		if fn, c.err = g.function("mmqi_id_" + strings.TrimPrefix(mmqiKernels[w.Type], "mmqi_")); c.err != nil {
			return
		}
		grid := Dim3{X: blocks(w.Rows, mmqRowsPerBlock), Y: blocks(most, mmqTokensPerBlock), Z: len(ex)}
		if c.err = g.launch(fn, grid, Dim3{X: mmqiThreads}, &g.args); c.err == nil {
			g.launched(true)
		}
	}
	// addBias adds table k's biases (3 gate, 4 up, 5 down), where the experts have them,
	// to their products' rows in out (from outAt's rows, or beside the inputs').
	addBias := func(k int, out, outAt DevicePtr, width int) {
		if c.err != nil || !biased[k-3] {
			return
		}
		g.args.Reset().Ptr(out).Ptr(tab.Add(int64(8 * k * len(ex)))).Ptr(offp).Ptr(outAt).Int(width)
		c.launch("add_rows_id_f32", Dim3{X: blocks(width, 256), Y: min(most, 1024), Z: len(ex)}, Dim3{X: 256})
	}
	product(0, gate, c.quantize(xp, n, d, gate.Type), gatep, 0)
	product(1, up, c.quantize(xp, n, d, up.Type), upp, 0) // one quantization for both where the types share a dot type
	addBias(3, gatep, 0, ff)
	addBias(4, upp, 0, ff)
	if c.err == nil {
		if a := e0.OAI; a != nil {
			g.args.Reset().Ptr(gatep).Ptr(upp).Int(n * ff).Float(a.Alpha).Float(a.Limit)
			c.launch("swiglu_oai_f32", ewGrid(n*ff), Dim3{X: 256})
		} else {
			g.args.Reset().Ptr(gatep).Ptr(upp).Int(n * ff)
			c.launch("swiglu_f32", ewGrid(n*ff), Dim3{X: 256})
		}
	}
	product(2, down, c.quantize(gatep, n, ff, down.Type), yp, atp)
	addBias(5, yp, atp, d)
	return true
}

var _ device.GroupedExperts = (*GPU)(nil)
