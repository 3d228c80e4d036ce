package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The gated DeltaNet layer's elementwise steps, in the attn set: the decay of a head's state
// and its rank-1 delta-rule update (models.deltaJob.head), and the causal convolution before
// them (models.convolve). All are lane by lane, so the assembly's results are the Go loops' bit
// for bit: a float32 product rounded once, and a fused multiply-add rounded once (the Go
// loops' fma32).

func deltaKernels() {
	deltaScaleKernel()
	deltaRank1Kernel()
	deltaConvKernel()
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

func deltaScaleKernel() {
	attnText("deltaScaleAVX2", "func(x []float32, s float32)",
		"deltaScaleAVX2 multiplies every value of x by s, each product rounded once; len(x) is a\nmultiple of 8.")
	xp := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	sx := Load(Param("s"), XMM())
	s := YMM()
	VBROADCASTSS(sx, s)
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	t := YMM()
	VMULPS(attnAt(xp, 0), s, t)
	VMOVUPS(t, attnAt(xp, 0))
	ADDQ(U8(32), xp)
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

func deltaRank1Kernel() {
	attnText("deltaRank1AVX2", "func(m, k, d []float32)",
		"deltaRank1AVX2 adds to row r of m (rows of len(k) values) k times d[r], each value a fused\n"+
			"multiply-add rounded once, for every r < len(d); len(k) is a multiple of 8 and len(m) at\n"+
			"least len(d)*len(k).")
	mp := Load(Param("m").Base(), GP64())
	kb := Load(Param("k").Base(), GP64())
	nk := Load(Param("k").Len(), GP64())
	dp := Load(Param("d").Base(), GP64())
	rows := Load(Param("d").Len(), GP64())
	SHRQ(U8(3), nk)
	JZ(LabelRef("done"))
	TESTQ(rows, rows)
	JZ(LabelRef("done"))
	Label("row")
	dr := YMM()
	VBROADCASTSS(attnAt(dp, 0), dr)
	kp, c := GP64(), GP64()
	MOVQ(kb, kp)
	MOVQ(nk, c)
	Label("loop")
	t := YMM()
	VMOVUPS(attnAt(mp, 0), t)
	VFMADD231PS(attnAt(kp, 0), dr, t) // t = k*d + t
	VMOVUPS(t, attnAt(mp, 0))
	ADDQ(U8(32), mp)
	ADDQ(U8(32), kp)
	DECQ(c)
	JNZ(LabelRef("loop"))
	ADDQ(U8(4), dp)
	DECQ(rows)
	JNZ(LabelRef("row"))
	Label("done")
	attnEnd()
}
