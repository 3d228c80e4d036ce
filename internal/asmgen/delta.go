package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
)

// The gated DeltaNet recurrence's elementwise steps (models.deltaJob.head), in the attn set:
// the decay of a head's state and its rank-1 delta-rule update. Both are lane by lane, so the
// assembly's results are the Go loops' bit for bit: a float32 product rounded once, and a
// fused multiply-add rounded once (the Go loop's quant.FMA32).

func deltaKernels() {
	deltaScaleKernel()
	deltaRank1Kernel()
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
