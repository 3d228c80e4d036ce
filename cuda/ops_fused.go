package cuda

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// The GPU's device.Fused and device.RoutedMoE: the runs of a decode step's operations that
// kernels/fused.cu computes in one launch each, with the unfused kernels' numbers to the bit.

// fusedSuffix is the name of a weight type in the fused products' kernels (mmv3_<suffix>,
// moe_up_<suffix>, moe_down_<suffix>): the mmv kernel's.
func fusedSuffix(t quant.Type) (string, bool) {
	name, ok := mmvKernels[t]
	return strings.TrimPrefix(name, "mmv_"), ok
}

// Products implements device.Fused: for one token, one launch of mmv3 for the products of
// each weight type, the input quantized once for each dot type; otherwise (several tokens,
// where mmv reads the weights once for up to 8) a product and a bias at a time.
func (g *GPU) Products(x []float32, T int, ps [3]device.Product) {
	fused := T == 1
	for _, p := range ps {
		if _, ok := fusedSuffix(p.W.Type); p.W.Data != nil && (!ok || p.W.Cols != ps[0].W.Cols) {
			fused = false
		}
	}
	if !fused {
		for _, p := range ps {
			if p.W.Data != nil {
				g.MatMul(p.W, x, T, p.Out)
				if p.Bias != nil {
					g.AddRows(p.Out[:T*p.W.Rows], p.Bias)
				}
			}
		}
		return
	}
	c := g.begin("products")
	defer c.end()
	cols := ps[0].W.Cols
	xp := c.f(x[:T*cols], "the input")
	var done [3]bool
	for i, p := range ps {
		if p.W.Data == nil || done[i] {
			continue
		}
		// The products of p's type, in order.
		var w, y, b [3]DevicePtr
		var rows [3]int
		n, maxRows := 0, 0
		for j := i; j < len(ps); j++ {
			q := ps[j]
			if q.W.Data == nil || q.W.Type != p.W.Type {
				continue
			}
			done[j] = true
			w[n], y[n] = c.ptr(q.W.Data, "the weights"), c.f(q.Out[:T*q.W.Rows], "the output")
			if q.Bias != nil {
				b[n] = c.f(q.Bias[:q.W.Rows], "the bias")
			}
			rows[n] = q.W.Rows
			maxRows = max(maxRows, q.W.Rows)
			n++
		}
		sfx, _ := fusedSuffix(p.W.Type)
		xq := c.quantize(xp, T, cols, p.W.Type) // once for each dot type
		g.args.Reset().Ptr(w[0]).Ptr(w[1]).Ptr(w[2]).Ptr(y[0]).Ptr(y[1]).Ptr(y[2]).Ptr(b[0]).Ptr(b[1]).Ptr(b[2]).
			Int(rows[0]).Int(rows[1]).Int(rows[2]).Ptr(xp).Int(cols).Int(T).Ptr(xq.q).Ptr(xq.d).Ptr(xq.s)
		x, block := g.rowDims(maxRows, xq.q != 0)
		c.launch("mmv3_"+sfx, Dim3{X: x, Z: n}, block)
	}
}

// AddRMSNorm implements device.Fused.
func (g *GPU) AddRMSNorm(x, add, dst []float32, d int, w, b []float32, eps float32) {
	c := g.begin("add and RMSNorm")
	defer c.end()
	if d <= 0 || len(x)%d != 0 || len(add) < len(x) || len(dst) < len(x) {
		c.err = fmt.Errorf("rows of %d: %d, %d and %d floats", d, len(x), len(add), len(dst))
		return
	}
	xp, ap, dp := c.f(x, "the residual"), c.f(add[:len(x)], "the addend"), c.f(dst[:len(x)], "the output")
	wp, bp := c.f(w, "the norm's weight"), c.f(b, "the norm's bias")
	g.args.Reset().Ptr(xp).Ptr(ap).Ptr(dp).Ptr(wp).Ptr(bp).Int(d).Float(eps)
	c.launch("add_rms_norm_f32", Dim3{X: len(x) / d}, Dim3{X: 256})
}

// ropeKVMaxPairs is rope_kv_f32's limit on the rotated pairs of a head.
const ropeKVMaxPairs = 512

// ropeKVThreads is rope_kv_f32's block: a token's loops over its queries, keys and values wait
// for memory once a round, and at 256 threads OLMoE's took 12 rounds (10 us on the H200).
const ropeKVThreads = 1024

// RopeKV implements device.Fused: one launch of rope_kv_f32, or where its limits do not
// allow (heads of more than 1024 rotated values, a layout it does not know) the unfused
// operations.
func (g *GPU) RopeKV(q, k, v []float32, kv *device.KVLayer, pos0, T int, a *device.AttnShape, r *device.RoPE, n *device.QKNorm) {
	H, G, dk, dv := a.Heads, a.KVHeads, a.DK, a.DV
	if r.Dims/2 > ropeKVMaxPairs || r.Dims > dk || r.Dims%2 != 0 || kv.KDim != G*dk || kv.VDim != G*dv || a.Latent ||
		a.KHeadStride != dk || a.VHeadStride != dv || n != nil && !qkNormFits(n, H*dk, G*dk) {
		if n != nil {
			g.RMSNorm(q[:T*H*dk], q[:T*H*dk], n.QDim, n.QWeight, n.QBias, n.Eps)
			g.RMSNorm(k[:T*G*dk], k[:T*G*dk], n.KDim, n.KWeight, n.KBias, n.Eps)
		}
		g.Rope(q, pos0, T, H, dk, H*dk, r)
		g.Rope(k, pos0, T, G, dk, G*dk, r)
		g.StoreKV(kv, pos0, k, v)
		return
	}
	c := g.begin("RoPE and KV store")
	defer c.end()
	size := max(len(kv.K), len(kv.K16)) / max(kv.KDim, 1)
	switch {
	case len(q) < T*H*dk || len(k) < T*G*dk || len(v) < T*G*dv:
		c.err = fmt.Errorf("%d tokens' queries, keys and values in %d, %d and %d floats", T, len(q), len(k), len(v))
	case !kvFits(kv, pos0, T, size):
		c.err = fmt.Errorf("%d tokens at position %d: the cache holds %d", T, pos0, size)
	}
	if c.err != nil {
		return
	}
	qp, kp, vp := c.f(q[:T*H*dk], "the queries"), c.f(k[:T*G*dk], "the keys"), c.f(v[:T*G*dv], "the values")
	kc, vc := c.kvCache(kv.K, kv.K16, "the key cache"), c.kvCache(kv.V, kv.V16, "the value cache")
	ff := c.f(r.FreqFactors, "the frequency factors")
	var nq, nk norm
	if n != nil {
		nq = norm{c.f(n.QWeight, "the queries' norm"), c.f(n.QBias, "the queries' norm bias"), n.QDim}
		nk = norm{c.f(n.KWeight, "the keys' norm"), c.f(n.KBias, "the keys' norm bias"), n.KDim}
	}
	posp, off := c.pos(pos0)
	g.args.Reset().Ptr(qp).Ptr(kp).Ptr(vp).Ptr(kc).Ptr(vc).Int(b2i(kv.F16)).Ptr(posp).Int(off).Int(T).Int(H).Int(G).Int(dk).Int(dv).
		Int(r.Dims).Int(b2i(r.NeoX)).Float(r.ThetaScale).Float(r.FreqScale).Float(r.ExtFactor).Float(r.MScale).
		Float(r.CorrLo).Float(r.CorrHi).Ptr(ff).Int(kv.Ring).Ptr(nq.w).Ptr(nq.b).Int(nq.dim).Ptr(nk.w).Ptr(nk.b).Int(nk.dim)
	if n != nil {
		g.args.Float(n.Eps)
	} else {
		g.args.Float(0)
	}
	c.launch("rope_kv_f32", Dim3{X: T}, Dim3{X: ropeKVThreads})
}

// norm is one of rope_kv_f32's q/k norms: its weight and bias (0: none) and the floats of its
// rows (0: no norm).
type norm struct {
	w, b DevicePtr
	dim  int
}

// qkNormFits says whether rope_kv_f32 takes norms n of a token's q floats and k floats: rows
// that divide them, with weights (and biases) of a row's length.
func qkNormFits(n *device.QKNorm, q, k int) bool {
	fits := func(floats, dim int, w, b []float32) bool {
		return dim > 0 && floats%dim == 0 && (w == nil || len(w) == dim) && (b == nil || len(b) == dim)
	}
	return fits(q, n.QDim, n.QWeight, n.QBias) && fits(k, n.KDim, n.KWeight, n.KBias)
}

// The bounds of moe_route_f32 (kernels/fused.cu).
const (
	routeMaxExperts = 512
	routeMaxUsed    = 16
	routeMaxGroups  = 64
)

// moeTable is a layer's experts' weights as the kernels find them: expert e's gate, up and
// down matrices and its biases at the device addresses tab[6e..6e+5] (moeTabStride), and the
// launches of their products, as their types need.
type moeTable struct {
	tab           DevicePtr
	d, ff, shFF   int
	sg, su, sd    DevicePtr // the shared expert's matrices, 0 if none
	shGate, bias  DevicePtr
	experts, used int
	up, down      []moeLaunch
	act           moeAct
}

// moeAct is a layer's routed experts' activation: SwiGLU, or gpt-oss's (oai).
type moeAct struct {
	oai          bool
	alpha, limit float32
}

// moeActOf is the activation of experts like e.
func moeActOf(e device.ExpertMatrices) moeAct {
	if a := e.OAI; a != nil {
		return moeAct{oai: true, alpha: a.Alpha, limit: a.Limit}
	}
	return moeAct{}
}

// moeTabStride is the table's entries per expert (kernels/fused.cu's MOE_TAB): its gate, up
// and down matrices, then its gate, up and down biases (0: none).
const moeTabStride = 6

// moeDownWarps is fused.cu's MOE_DOWN_WARPS: the most warps of a moe_down block that
// multiply its row by the routed experts' down matrices.
const moeDownWarps = 8

// moeDownMaxThreads is the largest moe_down block (maxBlockThreads): up to 12 warps, the
// routed experts' two groups and the shared expert's of four warps a row, or nine groups of a
// warp. A block of 16 (eight warps a row and a shared expert) would need the kernels to take
// at most 128 registers where some take up to 148, and a card refuses a block whose
// registers do not fit (65536 an SM); TestPTXAssembles holds the kernels to this size.
const moeDownMaxThreads = 384

// moeDownSplit reports whether a moe_down launch of k routed experts and the shared expert,
// warps a row, would take a block larger than moeDownMaxThreads: the shared expert then takes
// a launch of its own (moeLaunches), added onto the routed experts' sum as the joined launch
// adds it, the same bits.
func moeDownSplit(k, warps int) bool {
	_, b := moeDownDims(1, 1, k, true, true, warps)
	return b.X*b.Y*b.Z > moeDownMaxThreads
}

// integerDot reports whether the products of m take an integer dot on a quantized input
// (quantizeLocked's condition), whose rows moeProducts deals over the GPU's warps a row.
func integerDot(m quant.Matrix) bool {
	_, qb, ok := q8Kind(m.Type)
	return ok && m.Cols%qb == 0
}

// moeDownDims are a moe_down launch's grid and block (fused.cu): a block for each row of d and
// each of T tokens, its groups of rowWarps warps the routed experts' (k of them, when routed,
// up to moeDownWarps warps in all) and the shared expert's.
func moeDownDims(d, T, k int, routed, shared bool, rowWarps int) (grid, block Dim3) {
	w := 0
	if routed {
		w = min(k, max(moeDownWarps/rowWarps, 1))
	}
	return Dim3{X: d, Y: T}, Dim3{X: 32, Y: w + b2i(shared), Z: rowWarps}
}

// moeLaunch is one launch of moe_up (with its mode) or moe_down (acc as mode): over the
// routed experts, the shared expert, or both.
type moeLaunch struct {
	kernel         string
	typ            quant.Type // its weights', whose dot type quantizes its input
	mode           int
	routed, shared bool
}

// moeLaunches plans the products of a layer of used experts a token, rowWarps warps a row of
// its integer products: one launch of moe_up for gate and up of one type (two where they
// differ: the gate's product, then the up's and the SwiGLU), and one of moe_down; the shared
// expert joins the routed experts' launches where its types are theirs, else takes launches of
// its own (its down product then added to their sum), as its down product also does where the
// joined block would not fit (moeDownSplit).
func moeLaunches(e0 device.ExpertMatrices, sh *device.ExpertMatrices, used, rowWarps int) (up, down []moeLaunch, err error) {
	kernel := func(prefix string, t quant.Type) (string, error) {
		sfx, ok := fusedSuffix(t)
		if !ok {
			return "", fmt.Errorf("no fused kernels for %s weights", t)
		}
		return prefix + sfx, nil
	}
	ups := func(g, u quant.Type, routed, shared bool) error {
		kg, err1 := kernel("moe_up_", g)
		ku, err2 := kernel("moe_up_", u)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		if g == u {
			up = append(up, moeLaunch{kernel: kg, typ: g, routed: routed, shared: shared})
		} else {
			up = append(up, moeLaunch{kernel: kg, typ: g, mode: 1, routed: routed, shared: shared},
				moeLaunch{kernel: ku, typ: u, mode: 2, routed: routed, shared: shared})
		}
		return nil
	}
	joinUp := sh != nil && sh.Gate.Type == e0.Gate.Type && sh.Up.Type == e0.Up.Type
	joinDown := sh != nil && sh.Down.Type == e0.Down.Type
	if joinDown && integerDot(e0.Down) && integerDot(sh.Down) { // moeProducts deals their rows over rowWarps warps
		joinDown = !moeDownSplit(used, rowWarps)
	}
	if err := ups(e0.Gate.Type, e0.Up.Type, true, joinUp); err != nil {
		return nil, nil, err
	}
	if sh != nil && !joinUp {
		if err := ups(sh.Gate.Type, sh.Up.Type, false, true); err != nil {
			return nil, nil, err
		}
	}
	kd, err := kernel("moe_down_", e0.Down.Type)
	if err != nil {
		return nil, nil, err
	}
	down = append(down, moeLaunch{kernel: kd, typ: e0.Down.Type, routed: true, shared: joinDown})
	if sh != nil && !joinDown {
		ks, err := kernel("moe_down_", sh.Down.Type)
		if err != nil {
			return nil, nil, err
		}
		down = append(down, moeLaunch{kernel: ks, typ: sh.Down.Type, mode: 1, shared: true})
	}
	return up, down, nil
}

// PrepareMoE implements device.RoutedMoE: it writes the layer's expert table to device
// memory, which the GPU frees on Close.
func (g *GPU) PrepareMoE(l *device.MoELayer) error {
	if err := l.Check(); err != nil {
		return err
	}
	n, e0 := len(l.Experts), l.Experts[0]
	if n > routeMaxExperts || l.Used > routeMaxUsed || l.Gating.Groups > routeMaxGroups {
		return fmt.Errorf("%d experts, %d used, in %d groups: the routing kernel takes up to %d, %d and %d", n, l.Used, l.Gating.Groups,
			routeMaxExperts, routeMaxUsed, routeMaxGroups)
	}
	up, down, err := moeLaunches(e0, l.Shared, l.Used, g.rowWarps)
	if err != nil {
		return err
	}
	t := &moeTable{d: e0.Gate.Cols, ff: e0.Gate.Rows, experts: n, used: l.Used, up: up, down: down}
	addr := func(b []byte, what string) (DevicePtr, error) {
		p, ok := g.lookup(b)
		if !ok {
			return 0, fmt.Errorf("%s is not in device memory", what)
		}
		return p, nil
	}
	tab := make([]uint64, moeTabStride*n)
	var errs []error
	for e, x := range l.Experts {
		for j, b := range [][]byte{x.Gate.Data, x.Up.Data, x.Down.Data, floatBytes(x.GateBias), floatBytes(x.UpBias), floatBytes(x.DownBias)} {
			if len(b) == 0 {
				continue // no bias
			}
			p, err := addr(b, fmt.Sprintf("expert %d's weights", e))
			tab[moeTabStride*e+j] = uint64(p)
			errs = append(errs, err)
		}
	}
	t.act = moeActOf(e0)
	if s := l.Shared; s != nil {
		var err1, err2, err3 error
		t.sg, err1 = addr(s.Gate.Data, "the shared expert's gate")
		t.su, err2 = addr(s.Up.Data, "the shared expert's up")
		t.sd, err3 = addr(s.Down.Data, "the shared expert's down")
		t.shFF = s.Gate.Rows
		errs = append(errs, err1, err2, err3)
		if l.SharedGate != nil {
			var err error
			t.shGate, err = addr(floatBytes(l.SharedGate), "the shared expert's gate vector")
			errs = append(errs, err)
		}
	}
	if l.Gating.Bias != nil {
		var err error
		t.bias, err = addr(floatBytes(l.Gating.Bias), "the selection bias")
		errs = append(errs, err)
	}

	if err := errors.Join(errs...); err != nil {
		return err
	}
	b, err := g.Buffer(int64(8*len(tab)), "an expert table")
	if err != nil {
		return err
	}
	p, _ := g.lookup(b)
	g.mu.Lock()
	err = errors.Join(g.compute.CopyHtoD(p, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tab))), 8*len(tab))), g.compute.Synchronize())
	g.mu.Unlock()
	if err != nil {
		g.Release(b)
		return err
	}
	t.tab = p
	l.Table = t
	return nil
}

// MoE implements device.RoutedMoE: the routing, the experts' gate, up and SwiGLU (the shared
// expert's beside them) and their down products summed, in three launches where the experts'
// gate and up have one type and the shared expert's types are theirs.
func (g *GPU) MoE(l *device.MoELayer, x, logits []float32, T int, out, scratch []float32) {
	c := g.begin("experts")
	defer c.end()
	t, ok := l.Table.(*moeTable)
	switch {
	case !ok:
		c.err = errors.New("a MoE layer that PrepareMoE did not prepare")
	case T < 1 || len(x) < T*t.d || len(logits) < T*t.experts || len(out) < T*t.d || len(scratch) < l.ScratchFloats(T):
		c.err = fmt.Errorf("%d tokens: %d inputs, %d logits, %d outputs and %d scratch floats", T, len(x), len(logits), len(out), len(scratch))
	}
	if c.err != nil {
		return
	}
	k := t.used
	ids, w := scratch[:T*k], scratch[T*k:2*T*k]
	up := scratch[2*T*k : 2*T*k+T*k*t.ff]
	rest := scratch[2*T*k+T*k*t.ff:]
	xp, lp, op := c.f(x[:T*t.d], "the input"), c.f(logits[:T*t.experts], "the router logits"), c.f(out[:T*t.d], "the output")
	idp, wp, upp := c.f(ids, "the routing"), c.f(w, "the routing"), c.f(up, "the experts' activations")
	var shp, sgp DevicePtr
	if t.sg != 0 {
		shp = c.f(rest[:T*t.shFF], "the shared expert's activations")
		if t.shGate != 0 {
			sgp = c.f(rest[T*t.shFF:T*t.shFF+T], "the shared expert's gate")
		}
	}
	gt := l.Gating
	g.args.Reset().Ptr(lp).Int(t.experts).Int(k).Int(T).Int(int(gt.Func)).Ptr(t.bias).Int(b2i(gt.Normalize)).Float(gt.Scale).
		Ptr(idp).Ptr(wp).Ptr(t.shGate).Ptr(xp).Int(t.d).Ptr(sgp).Int(gt.Groups).Int(gt.GroupsUsed).Int(b2i(l.SharedSigmoid))
	c.launch("moe_route_f32", Dim3{X: T}, Dim3{X: 256})

	c.moeProducts(t.up, t.down, moeOperands{tab: t.tab, ids: idp, w: wp, x: xp, up: upp, out: op, T: T, k: k, d: t.d, ff: t.ff,
		sg: t.sg, su: t.su, sd: t.sd, sh: shp, shGate: sgp, shFF: t.shFF, act: t.act})
}

// moeOperands are the device memory of a layer's experts' products: the table of their
// weights' addresses, the routing (ids, weights w), the input x, the experts' SwiGLU outputs
// up and the output out, the shared expert's (sg, su, sd; its outputs sh and gate, 0 if
// none), and the routed experts' activation (their biases are in the table).
type moeOperands struct {
	tab, ids, w, x, up, out DevicePtr
	T, k, d, ff             int
	sg, su, sd, sh, shGate  DevicePtr
	shFF                    int
	act                     moeAct
}

// moeProducts enqueues the launches of a layer's experts (moeLaunches): every chosen expert's
// gate, up and SwiGLU, then their down products summed, each launch's input quantized once
// for each dot type the launches need.
func (c *opCall) moeProducts(up, down []moeLaunch, o moeOperands) {
	g := c.g
	if o.k > routeMaxUsed {
		// moe_down sums the experts' products in a table of that size.
		c.err = fmt.Errorf("%d experts a token: the fused kernels take up to %d", o.k, routeMaxUsed)
		return
	}
	for _, u := range up {
		tab, entries, rows := DevicePtr(0), 0, 0
		var sg, su DevicePtr
		if u.routed {
			tab, entries, rows = o.tab, o.T*o.k, o.ff
		}
		if u.shared {
			sg, su, entries, rows = o.sg, o.su, entries+o.T, max(rows, o.shFF)
		}
		xq := c.quantize(o.x, o.T, o.d, u.typ) // once for each dot type
		g.args.Reset().Ptr(tab).Ptr(o.ids).Int(o.k).Int(o.T).Ptr(o.x).Int(o.d).Ptr(o.up).Int(o.ff).Ptr(sg).Ptr(su).Ptr(o.sh).Int(o.shFF).Int(u.mode).
			Ptr(xq.q).Ptr(xq.d).Ptr(xq.s).Int(b2i(o.act.oai)).Float(o.act.alpha).Float(o.act.limit)
		x, block := g.rowDims(rows, xq.q != 0)
		c.launch(u.kernel, Dim3{X: x, Z: entries}, block)
	}
	for _, d := range down {
		tab, sd := DevicePtr(0), DevicePtr(0)
		var gq, hq q8
		if d.routed {
			tab, gq = o.tab, c.quantize(o.up, o.T*o.k, o.ff, d.typ)
		}
		if d.shared {
			sd, hq = o.sd, c.quantize(o.sh, o.T, o.shFF, d.typ)
		}
		// Several warps a row only where every dot of the launch is an integer one: moe_down's
		// float dots take no part in them.
		warps := 1
		if (!d.routed || gq.q != 0) && (!d.shared || hq.q != 0) {
			warps = g.rowWarps
		}
		g.args.Reset().Ptr(tab).Ptr(o.ids).Ptr(o.w).Int(o.k).Int(o.T).Ptr(o.up).Int(o.ff).Ptr(o.out).Int(o.d).Ptr(sd).Ptr(o.sh).Int(o.shFF).Ptr(o.shGate).Int(d.mode).
			Ptr(gq.q).Ptr(gq.d).Ptr(gq.s).Ptr(hq.q).Ptr(hq.d).Ptr(hq.s)
		grid, block := moeDownDims(o.d, o.T, o.k, d.routed, d.shared, warps)
		c.launch(d.kernel, grid, block)
	}
}

// Experts implements device.RoutedMoE: the experts the host chose, found through a table of
// their addresses that this call writes (with the identity as ids and the weights) through
// the parameter ring, in MoE's launches.
func (g *GPU) Experts(x []float32, T, k int, ex []device.ExpertMatrices, weights []float32, out, scratch []float32) {
	c := g.begin("experts")
	defer c.end()
	n := T * k
	if n < 1 || len(ex) != n || len(weights) != n {
		c.err = fmt.Errorf("%d tokens of %d experts: %d experts' weights and %d mixing weights", T, k, len(ex), len(weights))
		return
	}
	e0 := ex[0]
	d, ff := e0.Gate.Cols, e0.Gate.Rows
	l := device.MoELayer{Experts: ex, Used: k}
	if err := l.Check(); err != nil {
		c.err = err
		return
	}
	if len(x) < T*d || len(out) < T*d || len(scratch) < n*ff {
		c.err = fmt.Errorf("%d tokens: %d inputs, %d outputs and %d scratch floats", T, len(x), len(out), len(scratch))
		return
	}
	plan, err := g.moePlan(e0)
	if err != nil {
		c.err = err
		return
	}
	g.tabScratch, g.idScratch = g.tabScratch[:0], g.idScratch[:0]
	for z, e := range ex {
		g.tabScratch = append(g.tabScratch, uint64(c.ptr(e.Gate.Data, "an expert's gate")), uint64(c.ptr(e.Up.Data, "an expert's up")),
			uint64(c.ptr(e.Down.Data, "an expert's down")), uint64(c.f(e.GateBias, "an expert's gate bias")),
			uint64(c.f(e.UpBias, "an expert's up bias")), uint64(c.f(e.DownBias, "an expert's down bias")))
		g.idScratch = append(g.idScratch, int32(z))
	}
	tab := c.param(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(g.tabScratch))), 8*len(g.tabScratch)))
	ids := c.param(int32Bytes(g.idScratch))
	// Committed routing's weights were computed on the device; the host's travel.
	wp, onDevice := g.lookup(floatBytes(weights))
	if !onDevice {
		wp = c.param(floatBytes(weights))
	}
	xp, op, upp := c.f(x[:T*d], "the input"), c.f(out[:T*d], "the output"), c.f(scratch[:n*ff], "the experts' activations")
	c.moeProducts(plan.up, plan.down, moeOperands{tab: tab, ids: ids, w: wp, x: xp, up: upp, out: op, T: T, k: k, d: d, ff: ff,
		act: moeActOf(e0)})
}

// moePlan returns the launches of experts of e's types without a shared expert, planned once
// for each. The caller holds g.mu.
func (g *GPU) moePlan(e device.ExpertMatrices) (moePlan, error) {
	key := [3]quant.Type{e.Gate.Type, e.Up.Type, e.Down.Type}
	if p, ok := g.moePlans[key]; ok {
		return p, nil
	}
	up, down, err := moeLaunches(e, nil, 0, g.rowWarps)
	if err != nil {
		return moePlan{}, err
	}
	if g.moePlans == nil {
		g.moePlans = map[[3]quant.Type]moePlan{}
	}
	p := moePlan{up: up, down: down}
	g.moePlans[key] = p
	return p, nil
}

// moePlan are the launches of a MoE layer's experts (moeLaunches).
type moePlan struct{ up, down []moeLaunch }

var (
	_ device.Fused     = (*GPU)(nil)
	_ device.RoutedMoE = (*GPU)(nil)
)
