package cuda

// Differential tests of kernels/mmvq.cu: the activation's quantization against quant's, bit
// for bit, and the integer products against the float64 product of the dequantized weights and
// the quantized activation (the values the CPU reference's dot products multiply), and against
// the CPU's own dot products (quant.VecDot); FuzzMMVQ draws the shapes.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// mmvqTypes are the weight types with an mmvq kernel.
var mmvqTypes = []quant.Type{quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0, quant.IQ4_NL, quant.MXFP4,
	quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K}

// q8KindOf is quantize_q8_f32's kind for an activation type.
func q8KindOf(t quant.Type) int {
	switch t {
	case quant.Q8_1:
		return 1
	case quant.Q8_K:
		return 2
	}
	return 0
}

// q8Planes are an activation quantized as mmvq.cu lays it out: the quants, the block scales and
// Q8_1's sums.
type q8Planes struct {
	q    []int8
	d, s []float32
}

// planesOf splits quant.QuantizeRow's blocks of dot type t (ntok rows of cols) into planes.
func planesOf(t quant.Type, b []byte, cols, ntok int) q8Planes {
	var p q8Planes
	qb, bb := t.BlockSize(), t.BlockBytes()
	for i := 0; i < ntok*cols/qb; i++ {
		blk := b[i*bb : (i+1)*bb]
		var qs []byte
		switch t {
		case quant.Q8_0:
			p.d = append(p.d, quant.FP16ToFP32(binary.LittleEndian.Uint16(blk)))
			qs = blk[2:]
		case quant.Q8_1:
			p.d = append(p.d, quant.FP16ToFP32(binary.LittleEndian.Uint16(blk)))
			p.s = append(p.s, quant.FP16ToFP32(binary.LittleEndian.Uint16(blk[2:])))
			qs = blk[4:]
		case quant.Q8_K:
			p.d = append(p.d, math.Float32frombits(binary.LittleEndian.Uint32(blk)))
			qs = blk[4 : 4+256]
		}
		for _, v := range qs[:qb] {
			p.q = append(p.q, int8(v))
		}
	}
	return p
}

// quantizeRows is quant.QuantizeRow of ntok rows of x as type t.
func quantizeRows(t quant.Type, x []float32, cols, ntok int) []byte {
	rb, _ := t.RowBytes(cols)
	b := make([]byte, ntok*rb)
	for tk := 0; tk < ntok; tk++ {
		quant.QuantizeRow(t, x[tk*cols:(tk+1)*cols], b[tk*rb:(tk+1)*rb])
	}
	return b
}

func int8bytes(v []int8) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

func mmvqCases() []kernelCase {
	var cs []kernelCase
	for _, t := range []quant.Type{quant.Q8_0, quant.Q8_1, quant.Q8_K} {
		for _, c := range []struct{ cols, ntok int }{{256, 1}, {512, 3}, {4096, 2}} {
			c.cols = max(c.cols, 4*t.BlockSize()) // the special blocks below
			cs = append(cs, kernelCase{"quantize_q8_f32", fmt.Sprintf("%s,cols=%d,ntok=%d", t, c.cols, c.ntok), func(tt *testing.T, k *kernelEnv, r *rand.Rand) {
				checkQuantizeQ8(tt, k, t, c.cols, c.ntok, r)
			}})
		}
	}
	for _, typ := range mmvqTypes {
		cols := mmvCols(typ)
		for _, n := range cols {
			for _, rows := range []int{5, 37} {
				for _, ntok := range []int{1, 3, 9} {
					c := mmvCase{typ, rows, n, ntok, 1, 0}
					cs = append(cs, kernelCase{"mmvq_" + mmvKernels[typ][len("mmv_"):], c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMVQ(t, k, c, r) }})
				}
			}
		}
		c := mmvCase{typ, 6, cols[len(cols)-1], 17, 2, 3}
		cs = append(cs, kernelCase{"mmvq_" + mmvKernels[typ][len("mmv_"):], c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMVQ(t, k, c, r) }})
		// A row over several warps (GPUOptions.RowWarps): rows of more blocks than a warp's
		// lanes take in one step, and of fewer than one warp's.
		for _, w := range []int{2, 4, 8} {
			c := mmvCase{typ, 3, cols[len(cols)-1], 9, 1, 1}
			if w == 4 {
				c = mmvCase{typ, 5, cols[0], 3, 2, 0}
			}
			cs = append(cs, kernelCase{"mmvq_" + mmvKernels[typ][len("mmv_"):], fmt.Sprintf("%v,warps=%d", c, w), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				checkMMVQWarps(t, k, c, w, r)
			}})
		}
		for _, c := range []struct{ rows, warps int }{{5, 1}, {37, 1}, {5, 4}} {
			cs = append(cs, kernelCase{mmvq1Kernels[typ], fmt.Sprintf("rows=%d,cols=%d,warps=%d", c.rows, cols[len(cols)-1], c.warps), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				checkMMVQ1(t, k, typ, c.rows, cols[len(cols)-1], c.warps, r)
			}})
		}
	}
	return cs
}

// checkMMVQ1: mmvq1_<type> against mmvq_<type> at one token with the same warps a row, bit
// for bit (checkMMVQ holds mmvq to the CPU).
func checkMMVQ1(t *testing.T, k *kernelEnv, typ quant.Type, rows, cols, warps int, r *rand.Rand) {
	w := randMatrix(t, typ, rows, cols, r)
	dw, dx := k.put(t, w.Data), k.putF32(t, randF32(r, cols, 1))
	xq := k.quantized(t, dx, 1, cols, typ, true)
	gx, block := rowDims(rows, warps)
	var ys [2][]float32
	for i, name := range []string{mmvqKernels[typ], mmvq1Kernels[typ]} {
		dy := k.alloc(t, 4*rows)
		var args Args
		k.run(t, name, Dim3{X: gx, Y: 1}, block, args.Ptr(dw).Ptr(xq.q).Ptr(xq.d).Ptr(xq.s).Ptr(dy).Int(rows).Int(cols).Int(1))
		ys[i] = k.getF32(t, dy, rows)
	}
	checkBits(t, "one token", ys[1], ys[0])
}

// checkQuantizeQ8: quantize_q8_f32 against quant.QuantizeRow, bit for bit. The rows hold what
// the quantizers treat apart: an all-zero block, values exactly halfway between two quants
// (ties to even), and largest magnitudes of both signs (Q8_K takes the first).
func checkQuantizeQ8(t *testing.T, k *kernelEnv, typ quant.Type, cols, ntok int, r *rand.Rand) {
	x := randF32(r, ntok*cols, 2)
	qb := typ.BlockSize()
	clear(x[qb : 2*qb])                            // an all-zero block
	x[2*qb], x[2*qb+1], x[2*qb+5] = 127, 2.5, -127 // quants 127, 2.5 (a tie) and -127
	x[3*qb+7], x[3*qb+9] = -3, 3                   // the first largest magnitude is negative
	want := planesOf(typ, quantizeRows(typ, x, cols, ntok), cols, ntok)
	nb := ntok * cols / qb
	dx, dq, dd, ds := k.putF32(t, x), k.alloc(t, ntok*cols), k.alloc(t, 4*nb), k.alloc(t, 4*nb)
	var args Args
	k.run(t, "quantize_q8_f32", Dim3{X: ceilDiv(nb, 8)}, Dim3{X: 256}, args.Ptr(dx).Ptr(dq).Ptr(dd).Ptr(ds).Int(cols).Int(ntok).Int(q8KindOf(typ)))
	got := k.get(t, dq, ntok*cols)
	for i, v := range want.q {
		if int8(got[i]) != v {
			t.Fatalf("quant %d = %d, want %d", i, int8(got[i]), v)
		}
	}
	checkBits(t, "d", k.getF32(t, dd, nb), want.d)
	if typ == quant.Q8_1 {
		checkBits(t, "s", k.getF32(t, ds, nb), want.s)
	}
}

// checkMMVQ runs one integer product on the activation quantized as the CPU quantizes it.
//
// Tolerance: the sums of quant products are exact integers; each lane then adds its blocks'
// shares with a fused multiply-add of the scales' rounded product (2 roundings a term, and 2
// more for the K-quants' minimums), and the warp's butterfly adds 5. Against the float64 sum of
// the dequantized weights times the quantized activation, whose weights DequantizeRow rounds
// once or twice more, gamma(64 + cols/32) times the sum of |terms| bounds the error; the terms
// of the K-quants with minimums (scale * quant and minimum apart) are taken as 4 times
// sum |w x|, their weights' usual bound on random rows. The CPU's dot products (quant.VecDot)
// meet the same bound from the other side: the two may differ by both.
func checkMMVQ(t *testing.T, k *kernelEnv, c mmvCase, r *rand.Rand) {
	t.Helper()
	checkMMVQWarps(t, k, c, 1, r)
}

// checkMMVQWarps is checkMMVQ with warps warps a row. Their sums add W-1 roundings to a row's,
// which the bound's 64 covers.
func checkMMVQWarps(t *testing.T, k *kernelEnv, c mmvCase, warps int, r *rand.Rand) {
	t.Helper()
	gx, block := rowDims(c.rows, warps)
	checkIntProduct(t, k, c, r, func(w, q, d, s, y DevicePtr) {
		var args Args
		k.run(t, "mmvq_"+mmvKernels[c.typ][len("mmv_"):], Dim3{X: gx, Y: c.gridY}, block,
			args.Ptr(w).Ptr(q).Ptr(d).Ptr(s).Ptr(y).Int(c.rows).Int(c.cols).Int(c.ntok))
	})
}

// checkIntProduct runs one integer product (launch: the weights' rows from c.off on, the
// activation's planes, the output) on the activation quantized as the CPU quantizes it, and
// checks it as checkMMVQ says.
func checkIntProduct(t *testing.T, k *kernelEnv, c mmvCase, r *rand.Rand, launch func(w, q, d, s, y DevicePtr)) {
	t.Helper()
	dt := c.typ.DotType()
	w := randMatrix(t, c.typ, c.off+c.rows, c.cols, r)
	x := randF32(r, c.ntok*c.cols, 1)
	xb := quantizeRows(dt, x, c.cols, c.ntok)
	p := planesOf(dt, xb, c.cols, c.ntok)
	dq, dd, ds := k.put(t, int8bytes(p.q)), k.putF32(t, p.d), DevicePtr(0)
	if p.s != nil {
		ds = k.putF32(t, p.s)
	}
	rb := w.RowBytes()
	dw, dy := k.put(t, w.Data), k.alloc(t, 4*c.ntok*c.rows)
	launch(dw.Add(int64(c.off*rb)), dq, dd, ds, dy)
	got := k.getF32(t, dy, c.ntok*c.rows)

	mins := c.typ == quant.Q2_K || c.typ == quant.Q4_K || c.typ == quant.Q5_K
	g := gamma(64 + c.cols/32)
	qb := dt.BlockSize()
	want, tol, cpu := make([]float64, len(got)), make([]float64, len(got)), make([]float32, len(got))
	dxb := dt.BlockBytes() * c.cols / qb
	row := make([]float32, c.cols)
	for o := 0; o < c.rows; o++ {
		quant.DequantizeRow(c.typ, w.Row(c.off+o), row)
		for tk := 0; tk < c.ntok; tk++ {
			var s, a float64
			for j, v := range row {
				xj := float64(p.q[tk*c.cols+j]) * float64(p.d[(tk*c.cols+j)/qb])
				s += float64(v) * xj
				a += math.Abs(float64(v) * xj)
			}
			s += minCorrection(w, c.off+o, p, tk)
			if mins {
				a *= 4
			}
			i := tk*c.rows + o
			want[i], tol[i] = s, g*a
			cpu[i] = quant.VecDot(c.typ, c.cols, w.Row(c.off+o), xb[tk*dxb:(tk+1)*dxb])
		}
	}
	checkClose(t, "y", got, want, tol)
	for i := range tol {
		tol[i] *= 2
		want[i] = float64(cpu[i])
	}
	checkClose(t, "y against the CPU's dot products", got, want, tol)
}

// minCorrection is what the activation's s changes in a product of row `row` of w with token
// tk of p: Q4_1 and Q5_1 multiply their minimum m by it, as the CPU does (d times the quants'
// sum, rounded to FP16), in place of the exact sum of the quantized values; 0 for other types.
func minCorrection(w quant.Matrix, row int, p q8Planes, tk int) float64 {
	if p.s == nil {
		return 0
	}
	var c float64
	cols := w.Cols
	for b := 0; b < cols/32; b++ {
		blk := w.Row(row)[b*w.Type.BlockBytes():]
		m := float64(quant.FP16ToFP32(binary.LittleEndian.Uint16(blk[2:])))
		var sum float64
		for _, q := range p.q[tk*cols+b*32 : tk*cols+(b+1)*32] {
			sum += float64(q)
		}
		xb := tk*cols/32 + b
		c += m * (float64(p.s[xb]) - float64(p.d[xb])*sum)
	}
	return c
}

// FuzzMMVQ checks the integer products on shapes from the fuzzer, as FuzzMMV does mmv's.
func FuzzMMVQ(f *testing.F) {
	for i := range mmvqTypes {
		f.Add(uint8(i), uint8(4+i), uint8(i), uint8(2*i), uint8(i), uint64(i))
	}
	k := openKernels(f)
	f.Fuzz(func(t *testing.T, typ, rows, blocks, ntok, gy uint8, seed uint64) {
		c := mmvCase{typ: mmvqTypes[int(typ)%len(mmvqTypes)], rows: 1 + int(rows)%24, ntok: 1 + int(ntok)%20,
			gridY: 1 + int(gy)%4, off: int(seed % 3)}
		c.cols = fuzzCols(c.typ, blocks)
		warps := RowWarpsChoices[int(seed>>8)%len(RowWarpsChoices)]
		t.Log("mmvq", c.typ, c, "warps", warps)
		checkMMVQWarps(t, k, c, warps, rand.New(rand.NewPCG(seed, 3)))
	})
}

// mmqiTypes are the weight types with a tensor-core prompt product (kernels/mmqi.cu).
var mmqiTypes = []quant.Type{quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0, quant.IQ4_NL, quant.MXFP4, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K}

// mmqiCases run the tensor-core products as checkMMVQ checks mmvq's: partial tiles of rows and
// tokens, several token tiles on one grid row, an offset matrix, a tile of three tokens.
func mmqiCases() []kernelCase {
	var cs []kernelCase
	for _, typ := range mmqiTypes {
		// cols in 32-value blocks, or in the K-quants' 256.
		cols := []int{32, 96, 256, 1056}
		if typ.BlockSize() == 256 {
			cols = []int{256, 512, 256, 2304}
		}
		for _, c := range []mmvCase{
			{typ, 5, cols[0], 9, 1, 0},
			{typ, 70, cols[1], 70, 2, 0},
			{typ, 64, cols[2], 130, 1, 3},
			{typ, 9, cols[3], 12, 1, 1},
			{typ, 33, cols[1], 3, 1, 2}, // a prompt's expert of few tokens, as mmqi_id runs it
		} {
			cs = append(cs, kernelCase{mmqiKernels[typ], c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMQI(t, k, c, r) }})
		}
	}
	return cs
}

// checkMMQI runs one tensor-core product and checks it as checkMMVQ does: its blocks' integer
// sums are exact, and each adds with a product of scales and one fused multiply-add, in
// column order.
func checkMMQI(t *testing.T, k *kernelEnv, c mmvCase, r *rand.Rand) {
	t.Helper()
	checkIntProduct(t, k, c, r, func(w, q, d, s, y DevicePtr) {
		var args Args
		k.run(t, mmqiKernels[c.typ], Dim3{X: ceilDiv(c.rows, mmqRowsPerBlock), Y: c.gridY}, Dim3{X: mmqiThreads},
			args.Ptr(w).Ptr(q).Ptr(d).Ptr(s).Ptr(y).Int(c.rows).Int(c.cols).Int(c.ntok))
	})
}

// mmqiGroupCase is one launch of mmqi_id_<type>: groups of these token counts, each with its
// own matrix, on gridY block rows.
type mmqiGroupCase struct {
	typ        quant.Type
	rows, cols int
	tokens     []int
	gridY      int
	at         bool // the groups' outputs in reverse order (mmqi_id's at), not in the inputs'
	// rix: the groups' rows gathered by index from a prompt's (GPU.MoEGrouped), not one
	// group's after another; stride: the table's entries a group (a moe table's 6), 0 for 1.
	rix    bool
	stride int
}

func (c mmqiGroupCase) String() string {
	return fmt.Sprintf("rows=%d,cols=%d,tokens=%v,grid.y=%d,at=%v,rix=%v,stride=%d", c.rows, c.cols, c.tokens, c.gridY, c.at, c.rix, c.stride)
}

// mmqiGroupCases: a layer's experts' token groups (an empty one, one token, tiles' edges)
// in one launch.
func mmqiGroupCases() []kernelCase {
	var cs []kernelCase
	for _, typ := range mmqiTypes {
		cols := 64
		if typ.BlockSize() == 256 {
			cols = 512
		}
		for _, c := range []mmqiGroupCase{
			{typ, 70, cols, []int{3, 0, 65, 1, 9}, 1, true, false, 0},
			{typ, 9, cols, []int{130, 2}, 2, false, false, 0},
			{typ, 70, cols, []int{0, 66, 2, 0, 9}, 2, false, true, moeTabStride},
		} {
			cs = append(cs, kernelCase{"mmqi_id_" + strings.TrimPrefix(mmqiKernels[typ], "mmqi_"), c.String(),
				func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMQIGroups(t, k, c, r) }})
		}
	}
	return cs
}

// checkMMQIGroups runs the groups in one mmqi_id launch and requires each group's outputs to be
// mmqi's on that group alone, bit for bit (mmqi itself is held to the reference above).
func checkMMQIGroups(t *testing.T, k *kernelEnv, c mmqiGroupCase, r *rand.Rand) {
	t.Helper()
	dt := c.typ.DotType()
	off := []int32{0}
	for _, n := range c.tokens {
		off = append(off, off[len(off)-1]+int32(n))
	}
	N := int(off[len(off)-1])
	qb := dt.BlockSize()
	// With rix the launch reads the groups' rows rix[i] of X rows (a prompt's, fewer than the
	// groups' rows: a token in several groups), the reference the rows gathered.
	X, rix, rixp := N, []int32(nil), DevicePtr(0)
	if c.rix {
		X = N/2 + 1
		for range N {
			rix = append(rix, int32(r.IntN(X)))
		}
		rixp = k.put(t, i32bytes(rix))
	}
	x := randF32(r, X*c.cols, 1)
	p := planesOf(dt, quantizeRows(dt, x, c.cols, X), c.cols, X)
	dq, dd, ds := k.put(t, int8bytes(p.q)), k.putF32(t, p.d), DevicePtr(0)
	if p.s != nil {
		ds = k.putF32(t, p.s)
	}
	gq, gd, gs := dq, dd, ds // the groups' rows one after another
	if c.rix {
		var g q8Planes
		nb := c.cols / qb
		for _, i := range rix {
			g.q = append(g.q, p.q[int(i)*c.cols:][:c.cols]...)
			g.d = append(g.d, p.d[int(i)*nb:][:nb]...)
			if p.s != nil {
				g.s = append(g.s, p.s[int(i)*nb:][:nb]...)
			}
		}
		gq, gd = k.put(t, int8bytes(g.q)), k.putF32(t, g.d)
		if g.s != nil {
			gs = k.putF32(t, g.s)
		}
	}
	stride := max(c.stride, 1)
	var tab []uint64
	var ws []DevicePtr
	for range c.tokens {
		w := randMatrix(t, c.typ, c.rows, c.cols, r)
		ws = append(ws, k.put(t, w.Data))
		tab = append(tab, uint64(ws[len(ws)-1]))
		for range stride - 1 {
			tab = append(tab, 0) // another matrix's entry, never read
		}
	}
	// at[g]: where group g's outputs start; with c.at the last group's come first.
	at, atp := slices.Clone(off[:len(c.tokens)]), DevicePtr(0)
	if c.at {
		next := int32(0)
		for g := len(c.tokens) - 1; g >= 0; g-- {
			at[g], next = next, next+int32(c.tokens[g])
		}
		atp = k.put(t, i32bytes(at))
	}
	dy := k.alloc(t, 4*max(N, 1)*c.rows)
	var args Args
	k.run(t, "mmqi_id_"+strings.TrimPrefix(mmqiKernels[c.typ], "mmqi_"), Dim3{X: ceilDiv(c.rows, mmqRowsPerBlock), Y: c.gridY, Z: len(c.tokens)},
		Dim3{X: mmqiThreads}, args.Ptr(k.put(t, u64bytes(tab))).Int(stride).Ptr(k.put(t, i32bytes(off))).Ptr(atp).Ptr(rixp).Ptr(dq).Ptr(dd).Ptr(ds).
			Ptr(dy).Int(c.rows).Int(c.cols))
	got := k.getF32(t, dy, N*c.rows)
	for g, n := range c.tokens {
		if n == 0 {
			continue
		}
		t0 := int(off[g])
		one := k.alloc(t, 4*n*c.rows)
		sp := DevicePtr(0)
		if gs != 0 {
			sp = gs.Add(int64(4 * t0 * c.cols / qb))
		}
		var a Args
		k.run(t, mmqiKernels[c.typ], Dim3{X: ceilDiv(c.rows, mmqRowsPerBlock), Y: 1}, Dim3{X: mmqiThreads},
			a.Ptr(ws[g]).Ptr(gq.Add(int64(t0*c.cols))).Ptr(gd.Add(int64(4*t0*c.cols/qb))).Ptr(sp).Ptr(one).Int(c.rows).Int(c.cols).Int(n))
		want := k.getF32(t, one, n*c.rows)
		for i, v := range want {
			if w := got[int(at[g])*c.rows+i]; math.Float32bits(w) != math.Float32bits(v) {
				t.Fatalf("group %d (%d tokens), output %d: %g in the grouped launch, %g alone", g, n, i, w, v)
			}
		}
	}
}

// FuzzMMQI draws the tensor-core products' shapes: rows and tokens across tile edges, grids
// of several token tiles a row.
func FuzzMMQI(f *testing.F) {
	for i := range mmqiTypes {
		f.Add(uint8(i), uint8(60+i), uint8(i), uint8(64+i), uint8(i), uint64(i))
	}
	k := openKernels(f)
	f.Fuzz(func(t *testing.T, typ, rows, blocks, ntok, gy uint8, seed uint64) {
		c := mmvCase{typ: mmqiTypes[int(typ)%len(mmqiTypes)], rows: 1 + int(rows)%140, ntok: 1 + int(ntok)%140,
			gridY: 1 + int(gy)%3, off: int(seed % 3)}
		c.cols = fuzzCols(c.typ, blocks)
		t.Log("mmqi", c.typ, c)
		checkMMQI(t, k, c, rand.New(rand.NewPCG(seed, 3)))
	})
}

// FuzzMMQIID draws a layer's experts' token groups for mmqi_id, each held to mmqi on its
// rows alone (checkMMQIGroups): up to six groups of 0 to 80 tokens, most of them few, as a
// prompt's experts are (a prompt's pass groups every expert a token chose), their rows one
// group's after another or gathered by index, from a table of 1 or 6 entries a group.
func FuzzMMQIID(f *testing.F) {
	for i := range mmqiTypes {
		f.Add(uint8(i), uint8(60+i), uint8(i), uint64(i))
	}
	k := openKernels(f)
	f.Fuzz(func(t *testing.T, typ, rows, gy uint8, seed uint64) {
		r := rand.New(rand.NewPCG(seed, 5))
		c := mmqiGroupCase{typ: mmqiTypes[int(typ)%len(mmqiTypes)], rows: 1 + int(rows)%140, gridY: 1 + int(gy)%3, at: seed%2 == 1,
			rix: seed>>1%2 == 1, stride: int(seed>>2%2) * moeTabStride}
		c.cols = fuzzCols(c.typ, uint8(seed>>8))
		for range 1 + r.IntN(6) {
			n := r.IntN(9) // an expert of a few tokens, or now and then of up to 80
			if r.IntN(4) == 0 {
				n = r.IntN(81)
			}
			c.tokens = append(c.tokens, n)
		}
		t.Log("mmqi_id", c.typ, c)
		checkMMQIGroups(t, k, c, r)
	})
}

// TestFakeFaultsOnMisalignedLoads: the emulator fails a launch whose kernel makes a wide load
// from an address not aligned to it, where a GPU faults (CUDA_ERROR_MISALIGNED_ADDRESS), so
// that the kernel tests hold the kernels' alignment contracts (mmqi's Q4_K rows are read 16
// bytes at a time: a matrix 4 bytes off fails), and the next launch runs as before.
func TestFakeFaultsOnMisalignedLoads(t *testing.T) {
	k := openKernels(t)
	if k.real {
		t.Skip("a GPU that faults loses its context: the fake driver's check only")
	}
	r := rand.New(rand.NewPCG(1, 9))
	w := randMatrix(t, quant.Q4_K, 2, 256, r)
	dw := k.alloc(t, len(w.Data)+16)
	if err := k.s.CopyHtoD(dw.Add(4), w.Data); err != nil {
		t.Fatal(err)
	}
	dq, dd, dy := k.alloc(t, 256), k.alloc(t, 4), k.alloc(t, 8)
	var args Args
	args.Ptr(dw.Add(4)).Ptr(dq).Ptr(dd).Ptr(0).Ptr(dy).Int(2).Int(256).Int(1)
	f := k.function(t, mmqiKernels[quant.Q4_K])
	err := errors.Join(k.s.Launch(f, Dim3{X: 1}, Dim3{X: mmqiThreads}, 0, &args), k.s.Synchronize())
	if err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_LAUNCH_FAILED") {
		t.Errorf("a Q4_K matrix 4 bytes off its alignment: %v, want CUDA_ERROR_LAUNCH_FAILED", err)
	}
	checkMMQI(t, k, mmvCase{typ: quant.Q4_K, rows: 5, cols: 256, ntok: 3, gridY: 1}, r)
}

// TestFakeSkipsKernels: with FAKECUDA_SKIP_KERNELS set the fake driver takes a launch and runs
// no kernel, so that a pass's time through it is the host's alone (docs/benchmarking.md); unset,
// the same launch runs.
func TestFakeSkipsKernels(t *testing.T) {
	k := openKernels(t)
	if k.real {
		t.Skip("the fake driver's switch")
	}
	dst, src := k.putF32(t, []float32{1, 2, 3}), k.putF32(t, []float32{10, 20, 30})
	var args Args
	add := func() []float32 {
		k.run(t, "add_f32", Dim3{X: 1}, Dim3{X: 32}, args.Reset().Ptr(dst).Ptr(src).Int(3))
		return k.getF32(t, dst, 3)
	}
	t.Setenv("FAKECUDA_SKIP_KERNELS", "1")
	if got := add(); !slices.Equal(got, []float32{1, 2, 3}) {
		t.Errorf("kernels skipped: %v, want the destination as it was", got)
	}
	os.Unsetenv("FAKECUDA_SKIP_KERNELS")
	if got := add(); !slices.Equal(got, []float32{11, 22, 33}) {
		t.Errorf("kernels run: %v, want the sums", got)
	}
}
