package main

import (
	"encoding/binary"
	"math"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The attention and element-wise kernels (-set attn: models/attn_avx2_amd64.s) of the host's
// forward pass. Each reproduces, to the bit, a Go function of package models that follows
// llama.cpp's AVX-512 CPU build:
//
//   - the scores q·K of one head: a ggml_vec_dot_f32 (four 16-lane fused multiply-add
//     accumulators over steps of 64, each a pair of YMM registers, then the rest rounded and
//     added one by one, the last fewer than 8 fused) per cached position, times the scale;
//     for two or three queries of one KV head at once, each key widened once for them all;
//   - the softmax of a row (ggml's soft_max over the padded KV length): its exponentials are
//     ggml_v_expf, whose _mm512_scalef_ps is two exact-then-rounding multiplications by
//     powers of two here, each 16-lane block's sum reduced as _mm512_reduce_add_ps and
//     added in float64;
//   - the weighted sums of the values, as ggml_vec_dot_f32 (one token) or tinyBLAS (16 lanes,
//     a batch) over the positions padded with zero weights: dot products along the rows of a
//     transposed value cache, or lane-major accumulations over rows of the cache (MLA, whose
//     values are the first values of its key rows, shared by up to three heads at once);
//   - SwiGLU's silu(g)*u with ggml_v_expf, and the F16 roundings of an F16 cache.
//
// Every padded position contributes the product of a zero weight and a zero value, as in
// llama.cpp, so even the signs of zero sums are those of the Go code.

func init() { sets["attn"] = attnKernels }

func attnKernels() {
	attnConsts()
	attnExpKernel()
	attnSwiGLUKernel()
	attnSiLUKernel()
	attnSoftmaxKernel()
	attnRoundF16Kernel()
	attnToF16Kernel()
	deltaKernels()
	for _, k := range []attnElem{attnF32, attnF16} {
		attnDots(k)
		for _, steps := range []int{1, 2, 3, 4, 9, 0} {
			attnDotsMulti(k, 3, steps)
			attnDotsMulti(k, 2, steps)
		}
		attnWSumVec(k)
		attnWSumLanes(k)
		for _, nq := range []int{1, 2, 3} {
			attnWSumRows(k, 64, nq)
			attnWSumRows(k, 16, nq)
		}
	}
}

// attnElem is the element type of a cache the kernels read.
type attnElem int

const (
	attnF32 attnElem = iota
	attnF16
)

func (e attnElem) size() int {
	if e == attnF32 {
		return 4
	}
	return 2
}

func (e attnElem) suffix() string {
	if e == attnF32 {
		return ""
	}
	return "F16"
}

func (e attnElem) goType() string {
	if e == attnF32 {
		return "[]float32"
	}
	return "[]uint16"
}

// attnLoad8 widens the eight cache elements at m into a new register.
func (e attnElem) load8(m Mem) VecVirtual {
	t := YMM()
	if e == attnF32 {
		VMOVUPS(m, t)
	} else {
		VCVTPH2PS(m, t)
	}
	return t
}

// attnLoad1 widens the cache element at m into the low lane of a new register.
func (e attnElem) load1(m Mem) VecVirtual {
	t := XMM()
	if e == attnF32 {
		VMOVSS(m, t)
		return t
	}
	g := GP32()
	MOVWLZX(m, g)
	VMOVD(g, t)
	VCVTPH2PS(t, t)
	return t
}

// Constants, all prefixed attn so that they cannot clash with the other sets'.
var (
	aR, aLog2e, aLn2Hi, aLn2Lo Mem // ggml_v_expf's range reduction
	aP5, aP4, aP3, aP2, aP1    Mem // and its polynomial
	aOne, a192, aAbs, aInf     Mem
	aNegInf, a127              Mem
	aOneD                      Mem // float64 1
	aMask                      Mem // 64 int32 -1 then 64 zeros: lane masks of a partial block
	aStride3, aStride4         Mem // int32 0, 3, ..., 21 and 0, 4, ..., 28: eight channels' gathers
)

func attnTable(name string, b []byte) Mem {
	m := GLOBL(name, RODATA|NOPTR)
	for i := 0; i < len(b); i += 8 {
		DATA(i, U64(binary.LittleEndian.Uint64(b[i:])))
	}
	return m
}

// attnSplat is eight copies of the 32-bit v.
func attnSplat(name string, v uint32) Mem {
	b := make([]byte, 32)
	for i := 0; i < 8; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return attnTable(name, b)
}

func attnSplatF(name string, v float32) Mem { return attnSplat(name, math.Float32bits(v)) }

func attnConsts() {
	aR = attnSplatF("attnr", 0x1.8p23)
	aLog2e = attnSplatF("attnlog2e", 0x1.715476p+0)
	aLn2Hi = attnSplatF("attnln2hi", 0x1.62e4p-1)
	aLn2Lo = attnSplatF("attnln2lo", 0x1.7f7d1cp-20)
	aP5 = attnSplatF("attnp5", 0x1.0e4020p-7)
	aP4 = attnSplatF("attnp4", 0x1.573e2ep-5)
	aP3 = attnSplatF("attnp3", 0x1.555e66p-3)
	aP2 = attnSplatF("attnp2", 0x1.fffdb6p-2)
	aP1 = attnSplatF("attnp1", 0x1.ffffecp-1)
	aOne = attnSplatF("attnone", 1)
	a192 = attnSplatF("attn192", 192)
	aAbs = attnSplat("attnabs", 0x7fffffff)
	aInf = attnSplat("attninf", 0x7f800000)
	aNegInf = attnSplat("attnneginf", 0xff800000)
	a127 = attnSplat("attn127", 127)
	one := make([]byte, 8)
	binary.LittleEndian.PutUint64(one, math.Float64bits(1))
	aOneD = attnTable("attnoned", one)
	mask := make([]byte, 512)
	for i := 0; i < 64; i++ {
		binary.LittleEndian.PutUint32(mask[4*i:], 0xffffffff)
	}
	aMask = attnTable("attnmask", mask)
	for _, c := range []struct {
		m    *Mem
		name string
		step uint32
	}{{&aStride3, "attnstride3", 3}, {&aStride4, "attnstride4", 4}} {
		b := make([]byte, 32)
		for i := uint32(0); i < 8; i++ {
			binary.LittleEndian.PutUint32(b[4*i:], i*c.step)
		}
		*c.m = attnTable(c.name, b)
	}
}

func attnAt(base Register, disp int) Mem { return Mem{Base: base, Disp: disp} }

func attnText(name, sig, doc string) {
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(strings.Split(doc, "\n")...)
}

func attnEnd() {
	VZEROUPPER()
	RET()
}

// attnExp returns models' expAVX512 (ggml_v_expf) of the eight lanes of x, which it leaves
// alone: n = round(x*log2(e)), b = x - n*ln2 in two parts, a degree-5 polynomial j, and
// j*2^n rounded once, which _mm512_scalef_ps does in one instruction: here j*2^(n>>1) is
// exact (a normal float32 for |n| <= 192) and the multiplication by 2^(n-(n>>1)) rounds.
// Lanes with |n| > 192 give 0 or +Inf, NaN lanes n.
func attnExp(x VecVirtual) VecVirtual {
	z := YMM()
	VMOVUPS(aR, z)
	VFMADD231PS(aLog2e, x, z) // z = x*log2(e) + 0x1.8p23
	n := YMM()
	VSUBPS(aR, z, n) // n = z - 0x1.8p23
	b := YMM()
	VMOVAPS(x, b)
	VFNMADD231PS(aLn2Hi, n, b) // b = x - n*ln2hi
	VFNMADD231PS(aLn2Lo, n, b) // b -= n*ln2lo
	u := YMM()
	VMULPS(b, b, u)
	j := YMM()
	VMOVUPS(aP4, j)
	VFMADD231PS(aP5, b, j) // j = p5*b + p4
	t := YMM()
	VMOVUPS(aP2, t)
	VFMADD231PS(aP3, b, t) // t = p3*b + p2
	VFMADD213PS(t, u, j)   // j = j*u + t
	VMOVUPS(aOne, t)
	VFMADD231PS(aP1, b, t) // t = p1*b + 1
	VFMADD213PS(t, u, j)   // j = j*u + t
	// j * 2^n, rounded once.
	VCVTPS2DQ(n, z)
	VPSRAD(U8(1), z, b)
	VPSUBD(b, z, z)
	VPADDD(a127, b, b)
	VPSLLD(U8(23), b, b)
	VPADDD(a127, z, z)
	VPSLLD(U8(23), z, z)
	VMULPS(b, j, j)
	VMULPS(z, j, j)
	// |n| > 192: 0 or +Inf; NaN: n.
	VANDPS(aAbs, n, b)
	VCMPPS(U8(0x1e), a192, b, b) // |n| > 192 (ordered)
	VXORPS(t, t, t)
	VCMPPS(U8(0x1e), t, n, t) // n > 0 (ordered)
	VANDPS(aInf, t, t)
	VBLENDVPS(b, t, j, j)
	VCMPPS(U8(3), n, n, b) // unordered
	VBLENDVPS(b, n, j, j)
	return j
}

func attnExpKernel() {
	attnText("attnExpAVX2", "func(dst, x []float32)",
		"attnExpAVX2 writes expAVX512 of every value of x to dst; len(x) is a multiple of 8 and\nlen(dst) at least len(x).")
	dp := Load(Param("dst").Base(), GP64())
	xp := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	x := YMM()
	VMOVUPS(attnAt(xp, 0), x)
	VMOVUPS(attnExp(x), attnAt(dp, 0))
	ADDQ(U8(32), xp)
	ADDQ(U8(32), dp)
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

func attnSwiGLUKernel() {
	attnText("attnSwiGLUAVX2", "func(dst, g, u []float32)",
		"attnSwiGLUAVX2 writes siluAVX512(g[i]) * u[i], silu(x) = x / (1 + expAVX512(0-x)), to dst[i]\n"+
			"for i < len(dst), a multiple of 8; dst may be g.")
	attnSiLULoop("g", "u")
}

func attnSiLUKernel() {
	attnText("attnSiLUAVX2", "func(dst, x []float32)",
		"attnSiLUAVX2 writes siluAVX512(x[i]), x / (1 + expAVX512(0-x)), to dst[i] for i < len(dst),\n"+
			"a multiple of 8; dst may be x.")
	attnSiLULoop("x", "")
}

// attnSiLULoop is the body of both: siluAVX512 of parameter in, times parameter mul's values
// where mul is not empty, into dst.
func attnSiLULoop(in, mul string) {
	dp := Load(Param("dst").Base(), GP64())
	gp := Load(Param(in).Base(), GP64())
	var up Register
	if mul != "" {
		up = Load(Param(mul).Base(), GP64())
	}
	n := Load(Param("dst").Len(), GP64())
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	g := YMM()
	VMOVUPS(attnAt(gp, 0), g)
	x := YMM()
	VXORPS(x, x, x)
	VSUBPS(g, x, x) // 0 - g
	e := attnExp(x)
	VADDPS(aOne, e, e)
	VDIVPS(e, g, e)
	if mul != "" {
		VMULPS(attnAt(up, 0), e, e)
	}
	VMOVUPS(e, attnAt(dp, 0))
	ADDQ(U8(32), gp)
	if mul != "" {
		ADDQ(U8(32), up)
	}
	ADDQ(U8(32), dp)
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

// attnHsum16 is _mm512_reduce_add_ps of the 16 lanes lo, hi (models' quant.HSum16): hi+lo,
// then hsum_float_8. It overwrites lo.
func attnHsum16(lo, hi VecVirtual) VecVirtual {
	VADDPS(hi, lo, lo)
	return hsum8(lo)
}

func attnSoftmaxKernel() {
	attnText("attnSoftmaxAVX2", "func(x []float32)",
		"attnSoftmaxAVX2 is models' softmax(x, true) (SoftmaxPadded) for len(x) a multiple of 16, at least\n"+
			"16: the maximum, ggml_v_expf of every value minus it, the 16-lane blocks' sums reduced as\n"+
			"_mm512_reduce_add_ps and added in float64, then every value times float32(1/sum).")
	xp := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	SHRQ(U8(4), n)
	p, c := GP64(), GP64()

	// The maximum: a lane keeps its value unless a later one is greater, as Go's v > max.
	m0, m1 := YMM(), YMM()
	VMOVUPS(aNegInf, m0)
	VMOVUPS(aNegInf, m1)
	MOVQ(xp, p)
	MOVQ(n, c)
	Label("max")
	t := YMM()
	VMOVUPS(attnAt(p, 0), t)
	VMAXPS(m0, t, m0)
	VMOVUPS(attnAt(p, 32), t)
	VMAXPS(m1, t, m1)
	ADDQ(U8(64), p)
	DECQ(c)
	JNZ(LabelRef("max"))
	VMAXPS(m1, m0, m0)
	VBROADCASTSS(maxTree(m0), m0)

	// The exponentials and their sum.
	sum := XMM()
	VXORPD(sum, sum, sum)
	MOVQ(xp, p)
	MOVQ(n, c)
	Label("exp")
	lo := YMM()
	VMOVUPS(attnAt(p, 0), lo)
	VSUBPS(m0, lo, lo)
	elo := attnExp(lo)
	VMOVUPS(elo, attnAt(p, 0))
	hi := YMM()
	VMOVUPS(attnAt(p, 32), hi)
	VSUBPS(m0, hi, hi)
	ehi := attnExp(hi)
	VMOVUPS(ehi, attnAt(p, 32))
	s := attnHsum16(elo, ehi)
	VCVTSS2SD(s, s, s)
	VADDSD(s, sum, sum)
	ADDQ(U8(64), p)
	DECQ(c)
	JNZ(LabelRef("exp"))

	// Every value times float32(1/sum).
	inv := XMM()
	VMOVSD(aOneD, inv)
	VDIVSD(sum, inv, inv)
	VCVTSD2SS(inv, inv, inv)
	VBROADCASTSS(inv, m1)
	MOVQ(xp, p)
	MOVQ(n, c)
	Label("scale")
	VMULPS(attnAt(p, 0), m1, t)
	VMOVUPS(t, attnAt(p, 0))
	VMULPS(attnAt(p, 32), m1, t)
	VMOVUPS(t, attnAt(p, 32))
	ADDQ(U8(64), p)
	DECQ(c)
	JNZ(LabelRef("scale"))
	attnEnd()
}

func attnRoundF16Kernel() {
	attnText("attnRoundF16AVX2", "func(x []float32)",
		"attnRoundF16AVX2 rounds every value of x to the nearest float16 (F16C, round to nearest\neven); len(x) is a multiple of 8.")
	xp := Load(Param("x").Base(), GP64())
	n := Load(Param("x").Len(), GP64())
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	t := YMM()
	VMOVUPS(attnAt(xp, 0), t)
	h := XMM()
	VCVTPS2PH(U8(0), t, h)
	VCVTPH2PS(h, t)
	VMOVUPS(t, attnAt(xp, 0))
	ADDQ(U8(32), xp)
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

func attnToF16Kernel() {
	attnText("attnToF16AVX2", "func(dst []uint16, src []float32)",
		"attnToF16AVX2 writes every value of src as a float16 (F16C, round to nearest even) to dst;\nlen(src) is a multiple of 8 and len(dst) at least len(src).")
	dp := Load(Param("dst").Base(), GP64())
	sp := Load(Param("src").Base(), GP64())
	n := Load(Param("src").Len(), GP64())
	SHRQ(U8(3), n)
	JZ(LabelRef("done"))
	Label("loop")
	t := YMM()
	VMOVUPS(attnAt(sp, 0), t)
	VCVTPS2PH(U8(0), t, attnAt(dp, 0))
	ADDQ(U8(32), sp)
	ADDQ(U8(16), dp)
	DECQ(n)
	JNZ(LabelRef("loop"))
	Label("done")
	attnEnd()
}

// attnFold adds ggml_vec_dot_f32's four 16-lane accumulators (acc[2j], acc[2j+1] is
// accumulator j) as 0+2, 1+3, then 0+1, and reduces the sum as _mm512_reduce_add_ps.
func attnFold(acc []VecVirtual) VecVirtual {
	for h := 0; h < 2; h++ {
		VADDPS(acc[4+h], acc[h], acc[h])
		VADDPS(acc[6+h], acc[2+h], acc[2+h])
		VADDPS(acc[2+h], acc[h], acc[h])
	}
	return attnHsum16(acc[0], acc[1])
}

func attnZeros(n int) []VecVirtual {
	v := make([]VecVirtual, n)
	for i := range v {
		v[i] = YMM()
		VXORPS(v[i], v[i], v[i])
	}
	return v
}

// attnDots writes the scores of one head: out[p] = DotF32Vec(k row p, q) * scale.
func attnDots(e attnElem) {
	name := "attnDots" + e.suffix() + "AVX2"
	attnText(name, "func(out, q []float32, k "+e.goType()+", stride int, scale float32)",
		name+" writes quant.DotF32Vec(k[p*stride:p*stride+len(q)] (widened), q) * scale to out[p] for\n"+
			"every p < len(out) (ggml_vec_dot_f32 on AVX-512, then a float32 product); k holds them all.")
	op := Load(Param("out").Base(), GP64())
	n := Load(Param("out").Len(), GP64())
	qp := Load(Param("q").Base(), GP64())
	dk := Load(Param("q").Len(), GP64())
	kp := Load(Param("k").Base(), GP64())
	st := Load(Param("stride"), GP64())
	if e == attnF32 {
		SHLQ(U8(2), st)
	} else {
		SHLQ(U8(1), st)
	}
	sc := Load(Param("scale"), XMM())
	TESTQ(n, n)
	JZ(LabelRef("done"))
	steps, r8, r1 := GP64(), GP64(), GP64()
	MOVQ(dk, steps)
	SHRQ(U8(6), steps)
	MOVQ(dk, r8)
	ANDQ(U8(0x38), r8)
	MOVQ(dk, r1)
	ANDQ(U8(7), r1)
	qi, ki, c := GP64(), GP64(), GP64()

	Label("pos")
	acc := attnZeros(8)
	MOVQ(qp, qi)
	MOVQ(kp, ki)
	MOVQ(steps, c)
	attnSteps64(e, acc, qi, ki, c, "fold")
	Label("fold")
	s := attnFold(acc)
	// The rest: products rounded and added one by one up to the last multiple of 8, then
	// fused.
	MOVQ(r8, c)
	TESTQ(c, c)
	JZ(LabelRef("fused"))
	Label("rounded")
	a := e.load1(attnAt(ki, 0))
	VMULSS(attnAt(qi, 0), a, a)
	VADDSS(a, s, s)
	ADDQ(U8(4), qi)
	ADDQ(U8(uint8(e.size())), ki)
	DECQ(c)
	JNZ(LabelRef("rounded"))
	Label("fused")
	MOVQ(r1, c)
	TESTQ(c, c)
	JZ(LabelRef("scale"))
	Label("fusedloop")
	b := e.load1(attnAt(ki, 0))
	VFMADD231SS(attnAt(qi, 0), b, s)
	ADDQ(U8(4), qi)
	ADDQ(U8(uint8(e.size())), ki)
	DECQ(c)
	JNZ(LabelRef("fusedloop"))
	Label("scale")
	VMULSS(sc, s, s)
	VMOVSS(s, attnAt(op, 0))
	ADDQ(U8(4), op)
	ADDQ(st, kp)
	DECQ(n)
	JNZ(LabelRef("pos"))
	Label("done")
	attnEnd()
}

// attnDotsMulti writes the scores of b queries against the same rows of keys (the tokens
// of a prefill, or the heads that share a KV head), loading and widening each key once for
// all of them. Each score is attnDots's to the bit: its eight accumulators (two per 16-lane
// accumulator j of ggml_vec_dot_f32) are summed over the steps of 64 one at a time, in the
// order the fold adds them, (0+2)+(1+3) of each half, so that few are live at once. dk is a
// multiple of 64; steps is dk/64 when it is unrolled, 0 for a loop over a steps argument.
func attnDotsMulti(e attnElem, b, steps int) {
	name := "attnDots" + itoa(b) + "x" + itoa(steps) + e.suffix() + "AVX2"
	sig := "func(out []float32, ostride int, q []float32, qstride int, k " + e.goType() + ", stride, n int, scale float32)"
	if steps == 0 {
		name = "attnDots" + itoa(b) + e.suffix() + "AVX2"
		sig = "func(out []float32, ostride int, q []float32, qstride int, k " + e.goType() + ", stride, n, steps int, scale float32)"
	}
	dk := "64*steps"
	if steps > 0 {
		dk = itoa(64 * steps)
	}
	attnText(name, sig,
		name+" writes, for the "+itoa(b)+" queries i of "+dk+" values at q[i*qstride:], the\n"+
			"scores quant.DotF32Vec(k[p*stride:p*stride+"+dk+"] (widened), query i) * scale to\n"+
			"out[i*ostride+p] for every p < n; k holds them all.")
	op := Load(Param("out").Base(), GP64())
	ost := Load(Param("ostride"), GP64())
	SHLQ(U8(2), ost)
	qp := Load(Param("q").Base(), GP64())
	qst := Load(Param("qstride"), GP64())
	SHLQ(U8(2), qst)
	kp := Load(Param("k").Base(), GP64())
	kst := Load(Param("stride"), GP64())
	if e == attnF32 {
		SHLQ(U8(2), kst)
	} else {
		SHLQ(U8(1), kst)
	}
	n := Load(Param("n"), GP64())
	var nsteps, off Register
	if steps == 0 {
		nsteps = Load(Param("steps"), GP64())
		SHLQ(U8(8), nsteps) // bytes of q per step
		off = GP64()
	}
	sc := Load(Param("scale"), XMM())
	TESTQ(n, n)
	JZ(LabelRef("done"))
	qm := func(i, disp int) Mem { // query i's floats at disp, plus off
		m := Mem{Base: qp, Disp: disp}
		switch i {
		case 1:
			m.Index, m.Scale = qst, 1
		case 2:
			m.Index, m.Scale = qst, 2
		}
		if off != nil {
			if m.Index != nil {
				panic("attnDotsMulti: two indices")
			}
			m.Index, m.Scale = off, 1
		}
		return m
	}
	Label("row")
	// chain returns the b accumulators of YMM i of the dot products.
	label := 0
	chain := func(i int) []VecVirtual {
		acc := make([]VecVirtual, b)
		for j := range acc {
			acc[j] = YMM()
			VXORPS(acc[j], acc[j], acc[j])
		}
		step := func(s int, km func(disp int) Mem, qmm func(j, disp int) Mem) {
			t := e.load8(km(e.size() * (64*s + 8*i)))
			for j := range acc {
				VFMADD231PS(qmm(j, 4*(64*s+8*i)), t, acc[j])
			}
		}
		if steps > 0 {
			for s := 0; s < steps; s++ {
				step(s, func(d int) Mem { return attnAt(kp, d) }, qm)
			}
			return acc
		}
		// A loop over the steps; off counts the bytes of q, and every query but the first
		// is addressed from its own base then.
		qb := make([]Register, b)
		qb[0] = qp
		for j := 1; j < b; j++ {
			qb[j] = GP64()
			LEAQ(Mem{Base: qp, Index: qst, Scale: uint8(j)}, qb[j])
		}
		l := "chain" + itoa(label)
		label++
		XORQ(off, off)
		Label(l)
		kmem := func(d int) Mem {
			if e == attnF32 {
				return Mem{Base: kp, Index: off, Scale: 1, Disp: d}
			}
			return Mem{Base: kp, Index: off, Scale: 1, Disp: d} // off is halved below
		}
		if e == attnF16 {
			// k advances half as fast as q: address it with off/2.
			h := GP64()
			MOVQ(off, h)
			SHRQ(U8(1), h)
			kmem = func(d int) Mem { return Mem{Base: kp, Index: h, Scale: 1, Disp: d} }
		}
		step(0, kmem, func(j, d int) Mem { return Mem{Base: qb[j], Index: off, Scale: 1, Disp: d} })
		ADDQ(U32(256), off)
		CMPQ(off, nsteps)
		JB(LabelRef(l))
		return acc
	}
	var a0 []VecVirtual
	for h := 0; h < 2; h++ {
		x := chain(h)
		c := chain(4 + h)
		for j := range x {
			VADDPS(c[j], x[j], x[j])
		}
		y := chain(2 + h)
		c = chain(6 + h)
		for j := range y {
			VADDPS(c[j], y[j], y[j])
			VADDPS(y[j], x[j], x[j])
		}
		if h == 0 {
			a0 = x
			continue
		}
		for j := range x {
			s := attnHsum16(a0[j], x[j])
			VMULSS(sc, s, s)
			m := Mem{Base: op}
			if j > 0 {
				m.Index, m.Scale = ost, uint8(j)
			}
			VMOVSS(s, m)
		}
	}
	ADDQ(U8(4), op)
	ADDQ(kst, kp)
	DECQ(n)
	JNZ(LabelRef("row"))
	Label("done")
	attnEnd()
}

// attnWSumArgs loads the arguments of a weighted sum: out, w, v, stride (in bytes) and n.
func attnWSumArgs(e attnElem) (op, dv, wp, vp, st, n Register) {
	op = Load(Param("out").Base(), GP64())
	dv = Load(Param("out").Len(), GP64())
	wp = Load(Param("w").Base(), GP64())
	vp = Load(Param("v").Base(), GP64())
	st = Load(Param("stride"), GP64())
	if e == attnF32 {
		SHLQ(U8(2), st)
	} else {
		SHLQ(U8(1), st)
	}
	n = Load(Param("n"), GP64())
	return
}

// attnMaskBase points mb at the lane masks of a partial block of r = n mod 64 positions:
// the 32-bit masks from mb on are -1 for the first r lanes and 0 after.
func attnMaskBase(n Register, bits int) (mb, r Register) {
	r, mb = GP64(), GP64()
	MOVQ(n, r)
	ANDQ(U8(uint8(1<<bits-1)), r)
	LEAQ(aMask, mb)
	t := GP64()
	MOVQ(U32(64), t)
	SUBQ(r, t)
	SHLQ(U8(2), t)
	ADDQ(t, mb)
	return
}

// attnWSumVec is the weighted sum of one token (ggml_vec_dot_f32 along rows of V^T).
// attnSteps64 emits the loop of c steps of 64 values: acc[i] += a[8i:8i+8] * b[8i:8i+8], a
// float32 at ai and b of e at bi, both advanced; with c zero it jumps to skip.
func attnSteps64(e attnElem, acc []VecVirtual, ai, bi, c Register, skip string) {
	TESTQ(c, c)
	JZ(LabelRef(skip))
	Label("step")
	for i := 0; i < 8; i++ {
		t := e.load8(attnAt(bi, 8*i*e.size()))
		VFMADD231PS(attnAt(ai, 32*i), t, acc[i])
	}
	ADDQ(U32(256), ai)
	ADDQ(U32(64*e.size()), bi)
	DECQ(c)
	JNZ(LabelRef("step"))
}

func attnWSumVec(e attnElem) {
	name := "attnWSumVec" + e.suffix() + "AVX2"
	attnText(name, "func(out, w []float32, v "+e.goType()+", stride, n int)",
		name+" writes to out[d] the weighted sum over positions p of w[p] * v[d*stride+p] as\n"+
			"quant.DotF32Vec sums it over the n positions padded to a multiple of 64 with zero weights\n"+
			"and values: the weights w[n:] up to the next multiple of 64 are zero, and v's values there\n"+
			"are read (in bounds) but taken as zero.")
	op, dv, wp, vp, st, n := attnWSumArgs(e)
	TESTQ(dv, dv)
	JZ(LabelRef("done"))
	steps := GP64()
	MOVQ(n, steps)
	SHRQ(U8(6), steps)
	mb, r := attnMaskBase(n, 6)
	wi, vi, c := GP64(), GP64(), GP64()
	Label("row")
	acc := attnZeros(8)
	MOVQ(wp, wi)
	MOVQ(vp, vi)
	MOVQ(steps, c)
	attnSteps64(e, acc, wi, vi, c, "tail")
	Label("tail")
	TESTQ(r, r)
	JZ(LabelRef("sum"))
	for i := 0; i < 8; i++ {
		t := e.load8(attnAt(vi, 8*i*e.size()))
		VANDPS(attnAt(mb, 32*i), t, t)
		VFMADD231PS(attnAt(wi, 32*i), t, acc[i])
	}
	Label("sum")
	VMOVSS(attnFold(acc), attnAt(op, 0))
	ADDQ(U8(4), op)
	ADDQ(st, vp)
	DECQ(dv)
	JNZ(LabelRef("row"))
	Label("done")
	attnEnd()
}

// attnWSumLanes is the weighted sum of a token of a batch (tinyBLAS's 16 lanes along rows of
// V^T), four rows at a time so that eight accumulators hide the latency of the fused
// multiply-adds.
func attnWSumLanes(e attnElem) {
	name := "attnWSumLanes" + e.suffix() + "AVX2"
	attnText(name, "func(out, w []float32, v "+e.goType()+", stride, n int)",
		name+" is attnWSumVec"+e.suffix()+"AVX2 in the order of quant.DotF32Lanes16 (16 fused lanes,\n"+
			"then _mm512_reduce_add_ps) over the n positions padded to a multiple of 16.")
	op, dv, wp, vp, st, n := attnWSumArgs(e)
	steps := GP64()
	MOVQ(n, steps)
	SHRQ(U8(4), steps)
	mb, r := attnMaskBase(n, 4)
	st3 := GP64()
	LEAQ(Mem{Base: st, Index: st, Scale: 2}, st3)
	wi, vi, c, quads := GP64(), GP64(), GP64(), GP64()
	MOVQ(dv, quads)
	SHRQ(U8(2), quads)
	JZ(LabelRef("single"))

	rows := []func(disp int) Mem{
		func(d int) Mem { return Mem{Base: vi, Disp: d} },
		func(d int) Mem { return Mem{Base: vi, Index: st, Scale: 1, Disp: d} },
		func(d int) Mem { return Mem{Base: vi, Index: st, Scale: 2, Disp: d} },
		func(d int) Mem { return Mem{Base: vi, Index: st3, Scale: 1, Disp: d} },
	}
	Label("quad")
	acc := attnZeros(8)
	MOVQ(wp, wi)
	MOVQ(vp, vi)
	MOVQ(steps, c)
	TESTQ(c, c)
	JZ(LabelRef("quadtail"))
	Label("quadstep")
	wa, wb := YMM(), YMM()
	VMOVUPS(attnAt(wi, 0), wa)
	VMOVUPS(attnAt(wi, 32), wb)
	for k, row := range rows {
		t := e.load8(row(0))
		VFMADD231PS(wa, t, acc[2*k])
		t = e.load8(row(8 * e.size()))
		VFMADD231PS(wb, t, acc[2*k+1])
	}
	ADDQ(U8(64), wi)
	ADDQ(U8(uint8(16*e.size())), vi)
	DECQ(c)
	JNZ(LabelRef("quadstep"))
	Label("quadtail")
	TESTQ(r, r)
	JZ(LabelRef("quadsum"))
	VMOVUPS(attnAt(wi, 0), wa)
	VMOVUPS(attnAt(wi, 32), wb)
	for k, row := range rows {
		t := e.load8(row(0))
		VANDPS(attnAt(mb, 0), t, t)
		VFMADD231PS(wa, t, acc[2*k])
		t = e.load8(row(8 * e.size()))
		VANDPS(attnAt(mb, 32), t, t)
		VFMADD231PS(wb, t, acc[2*k+1])
	}
	Label("quadsum")
	for k := range rows {
		VMOVSS(attnHsum16(acc[2*k], acc[2*k+1]), attnAt(op, 4*k))
	}
	ADDQ(U8(16), op)
	LEAQ(Mem{Base: vp, Index: st, Scale: 4}, vp)
	DECQ(quads)
	JNZ(LabelRef("quad"))

	Label("single")
	ANDQ(U8(3), dv)
	JZ(LabelRef("done"))
	Label("row")
	a := attnZeros(2)
	MOVQ(wp, wi)
	MOVQ(vp, vi)
	MOVQ(steps, c)
	TESTQ(c, c)
	JZ(LabelRef("rowtail"))
	Label("rowstep")
	t := e.load8(attnAt(vi, 0))
	VFMADD231PS(attnAt(wi, 0), t, a[0])
	t = e.load8(attnAt(vi, 8*e.size()))
	VFMADD231PS(attnAt(wi, 32), t, a[1])
	ADDQ(U8(64), wi)
	ADDQ(U8(uint8(16*e.size())), vi)
	DECQ(c)
	JNZ(LabelRef("rowstep"))
	Label("rowtail")
	TESTQ(r, r)
	JZ(LabelRef("rowsum"))
	t = e.load8(attnAt(vi, 0))
	VANDPS(attnAt(mb, 0), t, t)
	VFMADD231PS(attnAt(wi, 0), t, a[0])
	t = e.load8(attnAt(vi, 8*e.size()))
	VANDPS(attnAt(mb, 32), t, t)
	VFMADD231PS(attnAt(wi, 32), t, a[1])
	Label("rowsum")
	VMOVSS(attnHsum16(a[0], a[1]), attnAt(op, 0))
	ADDQ(U8(4), op)
	ADDQ(st, vp)
	DECQ(dv)
	JNZ(LabelRef("row"))
	Label("done")
	attnEnd()
}

// attnWSumRows is the weighted sum over rows of the cache (MLA, whose values are the first
// values of the key rows), for nq queries with the same positions (the heads of a token).
// Position p belongs to lane p mod lanes of the dot product along each value's column (64:
// ggml_vec_dot_f32's four 16-lane accumulators, 16: tinyBLAS's lanes), and each lane sees
// its positions in order: so for a tile of values at a time (64 for one query, 32 for two or
// three, which share each value the kernel reads), the kernel walks each lane's positions
// (every lanes-th row) with eight or twelve accumulators in registers, stores the lane's
// sums to acc, and then reduces the lanes as the dot product does. A lane that llama.cpp's
// padding reaches gets a zero product too (which turns a -0 into +0).
func attnWSumRows(e attnElem, lanes, nq int) {
	groups := 8 // of 8 values per tile
	if nq > 1 {
		groups = 4
	}
	tile := 8 * groups
	name := "attnWSumRows"
	if lanes == 16 {
		name += "16"
	}
	if nq > 1 {
		name += "x" + itoa(nq)
	}
	name += e.suffix() + "AVX2"
	order := "quant.DotF32Vec (positions padded to a multiple of 64)"
	if lanes == 16 {
		order = "quant.DotF32Lanes16 (positions padded to a multiple of 16)"
	}
	laneBytes := nq * tile * 4 // one lane's sums in acc
	if nq == 1 {
		attnText(name, "func(out, w []float32, v "+e.goType()+", stride, n int, acc []float32)",
			name+" writes to out[d] the weighted sum over the n positions p of w[p] * v[p*stride+d],\n"+
				"in the order of "+order+"; len(out) is a multiple of 64\n"+
				"and acc holds "+itoa(lanes*laneBytes/4)+" floats of scratch.")
	} else {
		attnText(name, "func(out []float32, ostride int, w []float32, wstride int, v "+e.goType()+", stride, n, dv int, acc []float32)",
			name+" writes, for the "+itoa(nq)+" queries i with weights at w[i*wstride:], to out[i*ostride+d]\n"+
				"the weighted sum over the n positions p of w[i*wstride+p] * v[p*stride+d] for d < dv (a\n"+
				"multiple of 32), in the order of "+order+";\n"+
				"acc holds "+itoa(lanes*laneBytes/4)+" floats of scratch.")
	}
	op := Load(Param("out").Base(), GP64())
	wp := Load(Param("w").Base(), GP64())
	vp := Load(Param("v").Base(), GP64())
	ap := Load(Param("acc").Base(), GP64())
	var dv, wst Register
	if nq == 1 {
		dv = Load(Param("out").Len(), GP64())
	} else {
		dv = Load(Param("dv"), GP64())
		wst = Load(Param("wstride"), GP64())
		SHLQ(U8(2), wst)
	}
	shift := 6
	if tile == 32 {
		shift = 5
	}
	SHRQ(U8(uint8(shift)), dv)
	JZ(LabelRef("done"))
	elemShift := uint8(2)
	if e == attnF16 {
		elemShift = 1
	}
	// The lanes from padFrom on (all of them if n mod lanes is 0: none is padded, and no
	// lane is at or after lanes) get the padding's zero product.
	padFrom := Load(Param("n"), GP64())
	ANDQ(U8(uint8(lanes-1)), padFrom)
	JNZ(LabelRef("padset"))
	MOVQ(U32(uint32(lanes)), padFrom)
	Label("padset")
	lstride := Load(Param("stride"), GP64()) // bytes between a lane's rows
	SHLQ(U8(elemShift+uint8(bitsOfLanes(lanes))), lstride)
	wi, vi, c, r, lo := GP64(), GP64(), GP64(), GP64(), GP64()
	wm := func(j int) Mem { // query j's weight at wi
		if j == 0 {
			return attnAt(wi, 0)
		}
		return Mem{Base: wi, Index: wst, Scale: uint8(j)}
	}

	Label("tile")
	XORQ(r, r)
	MOVQ(ap, lo)
	Label("lane")
	acc := attnZeros(nq * groups) // query j's group g: acc[j*groups+g]
	// The lane's positions r, r+lanes, ... below n: (n - r + lanes-1) / lanes of them.
	Load(Param("n"), c)
	SUBQ(r, c)
	JLE(LabelRef("lanepad"))
	ADDQ(U8(uint8(lanes-1)), c)
	SHRQ(U8(uint8(bitsOfLanes(lanes))), c)
	LEAQ(Mem{Base: wp, Index: r, Scale: 4}, wi)
	Load(Param("stride"), vi)
	SHLQ(U8(elemShift), vi)
	IMULQ(r, vi)
	ADDQ(vp, vi)
	Label("pos")
	wb := make([]VecVirtual, nq)
	for j := range wb {
		wb[j] = YMM()
		VBROADCASTSS(wm(j), wb[j])
	}
	for g := 0; g < groups; g++ {
		t := e.load8(attnAt(vi, 8*g*e.size()))
		for j := range wb {
			VFMADD231PS(wb[j], t, acc[j*groups+g])
		}
	}
	ADDQ(U32(uint32(4*lanes)), wi)
	ADDQ(lstride, vi)
	DECQ(c)
	JNZ(LabelRef("pos"))
	Label("lanepad")
	CMPQ(r, padFrom)
	JB(LabelRef("lanestore"))
	z := YMM()
	VXORPS(z, z, z)
	for i := range acc {
		VADDPS(z, acc[i], acc[i])
	}
	Label("lanestore")
	for i := range acc {
		VMOVUPS(acc[i], attnAt(lo, 32*i))
	}
	ADDQ(U32(uint32(laneBytes)), lo)
	INCQ(r)
	CMPQ(r, U8(uint8(lanes)))
	JB(LabelRef("lane"))

	// Reduce the lanes of each query's groups of 8 values.
	var ost Register
	if nq > 1 {
		ost = Load(Param("ostride"), GP64())
		SHLQ(U8(2), ost)
	}
	for j := 0; j < nq; j++ {
		for g := 0; g < groups; g++ {
			lane := func(l int) Mem { return attnAt(ap, laneBytes*l+4*tile*j+32*g) }
			// A[r], r < 16: the 16-lane accumulator after ggml_vec_dot_f32's fold (64 lanes)
			// or tinyBLAS's own (16).
			laneA := func(r int) VecVirtual {
				a := YMM()
				VMOVUPS(lane(r), a)
				if lanes == 64 {
					VADDPS(lane(32+r), a, a)
					b := YMM()
					VMOVUPS(lane(16+r), b)
					VADDPS(lane(48+r), b, b)
					VADDPS(b, a, a)
				}
				return a
			}
			var t [8]VecVirtual
			for i := range t {
				t[i] = laneA(i)
				hi := laneA(i + 8)
				VADDPS(hi, t[i], t[i])
			}
			for i := 0; i < 4; i++ {
				VADDPS(t[4+i], t[i], t[i])
			}
			VADDPS(t[2], t[0], t[0])
			VADDPS(t[3], t[1], t[1])
			VADDPS(t[1], t[0], t[0])
			m := attnAt(op, 32*g)
			if j > 0 {
				m.Index, m.Scale = ost, uint8(j)
			}
			VMOVUPS(t[0], m)
		}
	}
	ADDQ(U32(uint32(4*tile)), op)
	ADDQ(U32(uint32(tile*e.size())), vp)
	DECQ(dv)
	JNZ(LabelRef("tile"))
	Label("done")
	attnEnd()
}

func bitsOfLanes(lanes int) int {
	if lanes == 64 {
		return 6
	}
	return 4
}

func itoa(v int) string {
	s := ""
	for {
		s = string(rune('0'+v%10)) + s
		v /= 10
		if v == 0 {
			return s
		}
	}
}
