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

// ExpertGroups implements device.GroupedExperts in groupedFFN's six launches whatever the
// number of experts (seven with the engine's gather of their inputs), each expert's outputs
// written to its rows of y.
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
	c.groupedFFN(groupedFFN{gate: gate, up: up, down: down, biased: biased, act: moeActOf(e0), tab: tab, col: len(ex), row: 1,
		groups: len(ex), off: offp, at: atp, x: xp, xRows: n, n: n, most: most, gates: gatep, ups: upp, y: yp})
	return true
}

// groupedFFN is the operands of experts' gated FFNs on their token groups (groupedFFN's
// launches).
type groupedFFN struct {
	gate, up, down quant.Matrix // the first expert's: every expert's types and shapes
	biased         [3]bool      // whether the experts have gate, up and down biases
	act            moeAct
	// tab holds group z's gate (j = 0), up, down and their biases (3 to 5, 0 for none) at
	// tab[j*col + z*row], of groups groups.
	tab        DevicePtr
	col, row   int
	groups     int
	off, at    DevicePtr // group z's rows off[z] .. off[z+1]-1; its outputs' from at[z] (0: from off[z])
	rix        DevicePtr // group rows' inputs: row rix[i] of x (0: row i)
	x          DevicePtr // the input, xRows rows of the experts' input width
	xRows      int
	n, most    int       // the groups' rows in all; the most a group may have (the launches' grid)
	gates, ups DevicePtr // n rows of the experts' width each
	y          DevicePtr // the outputs
}

// groupedFFN enqueues the experts' gated FFNs on their groups in six launches whatever the
// number of groups: the input quantized once (twice where the gates' and the ups' dot types
// differ), the gates and the ups (mmqi_id each), their SwiGLU (or gpt-oss's activation), its
// quantization, and the downs (mmqi_id); experts with biases take a launch more per product
// (add_rows_id_f32).
func (c *opCall) groupedFFN(o groupedFFN) {
	g := c.g
	d, ff := o.gate.Cols, o.gate.Rows
	// product launches mmqi_id on the experts' matrices j (gate, up, down) with the quantized
	// input a (its rows through rix, where not 0), into out (rows from outAt's, or from off's).
	product := func(j int, w quant.Matrix, a q8, rix, out, outAt DevicePtr) {
		if c.err != nil {
			return
		}
		g.args.Reset().Ptr(o.tab.Add(int64(8 * j * o.col))).Int(o.row).Ptr(o.off).Ptr(outAt).Ptr(rix).Ptr(a.q).Ptr(a.d).Ptr(a.s).Ptr(out).
			Int(w.Rows).Int(w.Cols)
		var fn *Function
		if fn, c.err = g.function("mmqi_id_" + strings.TrimPrefix(mmqiKernels[w.Type], "mmqi_")); c.err != nil {
			return
		}
		grid := Dim3{X: blocks(w.Rows, mmqRowsPerBlock), Y: blocks(o.most, mmqTokensPerBlock), Z: o.groups}
		if c.err = g.launch(fn, grid, Dim3{X: mmqiThreads}, &g.args); c.err == nil {
			g.launched(true)
		}
	}
	// addBias adds the biases j (3 gate, 4 up, 5 down), where the experts have them, to their
	// products' rows in out (from outAt's rows, or from off's).
	addBias := func(j int, out, outAt DevicePtr, width int) {
		if c.err != nil || !o.biased[j-3] {
			return
		}
		g.args.Reset().Ptr(out).Ptr(o.tab.Add(int64(8 * j * o.col))).Int(o.row).Ptr(o.off).Ptr(outAt).Int(width)
		c.launch("add_rows_id_f32", Dim3{X: blocks(width, 256), Y: min(o.most, 1024), Z: o.groups}, Dim3{X: 256})
	}
	product(0, o.gate, c.quantize(o.x, o.xRows, d, o.gate.Type), o.rix, o.gates, 0)
	product(1, o.up, c.quantize(o.x, o.xRows, d, o.up.Type), o.rix, o.ups, 0) // one quantization for both where the types share a dot type
	addBias(3, o.gates, 0, ff)
	addBias(4, o.ups, 0, ff)
	if c.err == nil {
		if a := o.act; a.oai {
			g.args.Reset().Ptr(o.gates).Ptr(o.ups).Int(o.n * ff).Float(a.alpha).Float(a.limit)
			c.launch("swiglu_oai_f32", ewGrid(o.n*ff), Dim3{X: 256})
		} else {
			g.args.Reset().Ptr(o.gates).Ptr(o.ups).Int(o.n * ff)
			c.launch("swiglu_f32", ewGrid(o.n*ff), Dim3{X: 256})
		}
	}
	product(2, o.down, c.quantize(o.gates, o.n, ff, o.down.Type), 0, o.y, o.at)
	addBias(5, o.y, o.at, d)
}

// moeGroupThreads is moe_group_ids's block: its passes over a prompt's slots take a block's
// width of them at a time.
const moeGroupThreads = 512

// GroupsMoE implements device.GroupedMoE: a prompt's pass (mmqMinTokens tokens or more) of a
// layer whose experts' products all run on the tensor cores (mmqi_id), as ExpertGroups
// groups them.
func (g *GPU) GroupsMoE(l *device.MoELayer, T int) bool {
	if _, ok := l.Table.(*moeTable); !ok || T < mmqMinTokens || len(l.Experts) == 0 || !g.GroupsExperts(l.Experts[0]) {
		return false
	}
	e0 := l.Experts[0]
	for _, w := range []quant.Matrix{e0.Gate, e0.Up, e0.Down} {
		if g.mmqi[w.Type] == nil {
			return false
		}
	}
	return true
}

// MoEGrouped implements device.GroupedMoE in nine launches (a quantization more where the gates'
// and the ups' dot types differ, three more for gpt-oss's biases), reading nothing back:
// the routing (moe_route_f32, as MoE), the tokens grouped by expert (moe_group_ids), the
// experts' FFNs on their groups (groupedFFN, every expert of the layer a group, those no
// token chose returning at once), and each token's outputs weighted and summed in top-k
// order (combine_off_f32 through each slot's row). Each group is ExpertGroups's for the
// host's routing: the same tokens in the same order, each input row quantized alike, so the
// numbers are the host-routed pass's to the bit.
func (g *GPU) MoEGrouped(l *device.MoELayer, x, logits []float32, T int, out, scratch []float32) {
	c := g.begin("grouped experts")
	defer c.end()
	t, _ := l.Table.(*moeTable)
	parts, total := l.GroupedScratch(T)
	switch {
	case !g.GroupsMoE(l, T):
		c.err = fmt.Errorf("a MoE layer of %d experts whose pass of %d tokens GroupsMoE does not take", len(l.Experts), T)
	case len(x) < T*t.d || len(logits) < T*t.experts || len(out) < T*t.d || len(scratch) < total:
		c.err = fmt.Errorf("%d tokens: %d inputs, %d logits, %d outputs and %d scratch floats", T, len(x), len(logits), len(out), len(scratch))
	}
	if c.err != nil {
		return
	}
	var p [8]DevicePtr
	at := 0
	for i, n := range parts {
		p[i] = c.f(scratch[at:at+n], "the grouped experts' scratch")
		at += (n + 3) &^ 3
	}
	ids, w, offs, rows, inv, gates, ups, ys := p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]
	xp, lp, op := c.f(x[:T*t.d], "the input"), c.f(logits[:T*t.experts], "the router logits"), c.f(out[:T*t.d], "the output")
	k, n, gt := t.used, T*t.used, l.Gating
	// The routing as MoE's, without the shared expert's gate: the caller adds that expert.
	g.args.Reset().Ptr(lp).Int(t.experts).Int(k).Int(T).Int(int(gt.Func)).Ptr(t.bias).Int(b2i(gt.Normalize)).Float(gt.Scale).
		Ptr(ids).Ptr(w).Ptr(0).Ptr(xp).Int(t.d).Ptr(0).Int(gt.Groups).Int(gt.GroupsUsed).Int(0)
	c.launch("moe_route_f32", Dim3{X: T}, Dim3{X: 256})
	g.args.Reset().Ptr(ids).Int(n).Int(k).Ptr(offs).Ptr(rows).Ptr(inv)
	c.launch("moe_group_ids", Dim3{X: t.experts}, Dim3{X: moeGroupThreads})
	e0 := l.Experts[0]
	c.groupedFFN(groupedFFN{gate: e0.Gate, up: e0.Up, down: e0.Down, biased: [3]bool{e0.GateBias != nil, e0.UpBias != nil, e0.DownBias != nil},
		act: t.act, tab: t.tab, col: 1, row: moeTabStride, groups: t.experts, off: offs, rix: rows, x: xp, xRows: T, n: n, most: T,
		gates: gates, ups: ups, y: ys})
	g.args.Reset().Ptr(op).Ptr(ys).Ptr(w).Ptr(0).Ptr(inv).Int(k).Int(t.d)
	c.launch("combine_off_f32", Dim3{X: blocks(t.d, 256), Y: T}, Dim3{X: 256})
}

var (
	_ device.GroupedExperts = (*GPU)(nil)
	_ device.GroupedMoE     = (*GPU)(nil)
)
