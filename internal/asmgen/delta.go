package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The gated DeltaNet layer's recurrence, a token at a time (models.deltaJob.head), and the
// causal convolution before it (models.convolve). The recurrence's dot products are
// ggml_vec_dot_f32's on AVX-512 (attnSteps64, attnFold), its decay a float32 product rounded
// once and its update a fused multiply-add rounded once, so the assembly's results are the Go
// reference's bit for bit.

func deltaKernels() {
	deltaStepKernel()
	deltaConvKernel()
	deltaConvTokenKernel()
}

// deltaConvKernel: a token's convolution over 4 taps, channel by channel in lanes, the taps'
// inputs and weights in rows of n (x's oldest first), each sum from +0 as the Go loop's.
func deltaConvKernel() {
	attnText("deltaConv4AVX2", "func(out, x, w []float32)",
		"deltaConv4AVX2 sets out[c], for c < n = len(out), to the fused multiply-adds from +0 of\n"+
			"x[k*n+c] by w[k*n+c] for k = 0, 1, 2, 3, each rounded once; n is a multiple of 8 and x and\n"+
			"w hold at least 4n values.")
	op := Load(Param("out").Base(), GP64())
	n := Load(Param("out").Len(), GP64())
	var xs, ws [4]Register
	xs[0] = Load(Param("x").Base(), GP64())
	ws[0] = Load(Param("w").Base(), GP64())
	row := GP64()
	MOVQ(n, row)
	SHLQ(U8(2), row) // a tap's row: 4n bytes
	for k := 1; k < 4; k++ {
		xs[k], ws[k] = GP64(), GP64()
		LEAQ(Mem{Base: xs[k-1], Index: row, Scale: 1}, xs[k])
		LEAQ(Mem{Base: ws[k-1], Index: row, Scale: 1}, ws[k])
	}
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	acc, t := YMM(), YMM()
	VXORPS(acc, acc, acc)
	for k := 0; k < 4; k++ {
		VMOVUPS(attnAt(xs[k], 0), t)
		VFMADD231PS(attnAt(ws[k], 0), t, acc) // acc = x*w + acc
	}
	VMOVUPS(acc, attnAt(op, 0))
	ADDQ(U8(32), op)
	for k := 0; k < 4; k++ {
		ADDQ(U8(32), xs[k])
		ADDQ(U8(32), ws[k])
	}
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

// deltaConvTokenKernel: a decoded token's convolution over 4 taps, eight channels at a time,
// straight from the layouts the layer and its state keep: a channel's taps side by side
// (gathered with a stride of 4) and its last three inputs side by side (a stride of 3), where
// deltaConv4AVX2 needs both transposed first, which costs a decoded token more than the sums.
func deltaConvTokenKernel() {
	attnText("deltaConv4TokenAVX2", "func(out, state, x, w []float32)",
		"deltaConv4TokenAVX2 sets out[c], for c < n = len(out), to the fused multiply-adds from +0\n"+
			"of state[3c], state[3c+1], state[3c+2] and x[c] by w[4c], ..., w[4c+3], each rounded once;\n"+
			"n is a multiple of 8, state holds 3n values and w 4n.")
	op := Load(Param("out").Base(), GP64())
	n := Load(Param("out").Len(), GP64())
	sp := Load(Param("state").Base(), GP64())
	xp := Load(Param("x").Base(), GP64())
	wp := Load(Param("w").Base(), GP64())
	i3, i4 := YMM(), YMM()
	VMOVDQU(aStride3, i3)
	VMOVDQU(aStride4, i4)
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	acc := YMM()
	VXORPS(acc, acc, acc)
	// gather loads lane i of dst from base+disp + 4*idx[i]; it clears its mask.
	gather := func(base Register, disp int, idx VecVirtual) VecVirtual {
		m, t := YMM(), YMM()
		VPCMPEQD(m, m, m)
		VXORPS(t, t, t)
		VGATHERDPS(m, Mem{Base: base, Disp: disp, Index: idx, Scale: 4}, t)
		return t
	}
	for k := 0; k < 3; k++ {
		VFMADD231PS(gather(wp, 4*k, i4), gather(sp, 4*k, i3), acc) // acc = state*w + acc
	}
	x := YMM()
	VMOVUPS(attnAt(xp, 0), x)
	VFMADD231PS(gather(wp, 12, i4), x, acc)
	VMOVUPS(acc, attnAt(op, 0))
	ADDQ(U8(32), op)
	ADDQ(U8(32), xp)
	ADDQ(U8(96), sp)
	ADDQ(U32(128), wp)
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

// deltaStepKernel: one token of a head, row by row. A row (a column of the state) moves by
// its own dot products alone, so each is decayed and dotted with k in one sweep, then updated
// and dotted with q in a second while it is still in the L1 cache: the state is read from
// memory once a token, where a step per sweep of the whole head read it four times.
func deltaStepKernel() {
	attnText("deltaStepAVX2", "func(m, k, q, v, out []float32, decay, beta, scale float32)",
		"deltaStepAVX2 moves each row r < len(v) of m (rows of len(k) values) by one token of the\n"+
			"gated delta rule, as deltaStepGo: the row times decay, then plus k times (v[r] - the row's\n"+
			"dot with k) * beta, and out[r] = its dot with q (len(k) values) times scale; the dot\n"+
			"products are quant.DotF32Vec's. len(k) is a positive multiple of 64; m holds len(v) rows\n"+
			"and out len(v) values.")
	mp := Load(Param("m").Base(), GP64())
	kb := Load(Param("k").Base(), GP64())
	steps := Load(Param("k").Len(), GP64())
	qb := Load(Param("q").Base(), GP64())
	vp := Load(Param("v").Base(), GP64())
	rows := Load(Param("v").Len(), GP64())
	op := Load(Param("out").Base(), GP64())
	dx := Load(Param("decay"), XMM())
	bx := Load(Param("beta"), XMM())
	sx := Load(Param("scale"), XMM())
	dec := YMM()
	VBROADCASTSS(dx, dec)
	SHRQ(U8(6), steps)
	JZ(LabelRef("done"))
	TESTQ(rows, rows)
	JZ(LabelRef("done"))
	row, ki, qi, c := GP64(), GP64(), GP64(), GP64()

	Label("row")
	MOVQ(mp, row)
	// The decay and the dot with k: acc[i] += (m*decay) * k, m*decay stored back.
	acc := attnZeros(8)
	MOVQ(kb, ki)
	MOVQ(steps, c)
	Label("decay")
	for i := 0; i < 8; i++ {
		t := YMM()
		VMULPS(attnAt(mp, 32*i), dec, t)
		VMOVUPS(t, attnAt(mp, 32*i))
		VFMADD231PS(attnAt(ki, 32*i), t, acc[i])
	}
	ADDQ(U32(256), mp)
	ADDQ(U32(256), ki)
	DECQ(c)
	JNZ(LabelRef("decay"))
	// delta = (v[r] - dot) * beta, each rounded once.
	d := XMM()
	VMOVSS(attnAt(vp, 0), d)
	VSUBSS(attnFold(acc), d, d)
	VMULSS(bx, d, d)
	dr := YMM()
	VBROADCASTSS(d, dr)
	// The update and the dot with q: m = k*delta + m fused, acc[i] += m * q.
	acc = attnZeros(8)
	MOVQ(row, mp)
	MOVQ(kb, ki)
	MOVQ(qb, qi)
	MOVQ(steps, c)
	Label("update")
	for i := 0; i < 8; i++ {
		t := YMM()
		VMOVUPS(attnAt(mp, 32*i), t)
		VFMADD231PS(attnAt(ki, 32*i), dr, t)
		VMOVUPS(t, attnAt(mp, 32*i))
		VFMADD231PS(attnAt(qi, 32*i), t, acc[i])
	}
	ADDQ(U32(256), mp)
	ADDQ(U32(256), ki)
	ADDQ(U32(256), qi)
	DECQ(c)
	JNZ(LabelRef("update"))
	y := attnFold(acc)
	VMULSS(sx, y, y)
	VMOVSS(y, attnAt(op, 0))
	ADDQ(U8(4), op)
	ADDQ(U8(4), vp)
	DECQ(rows)
	JNZ(LabelRef("row"))
	Label("done")
	attnEnd()
}
