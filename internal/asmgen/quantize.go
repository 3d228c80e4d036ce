package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The activation quantizers (-set quantize: quant/quantize_avx2_amd64.s): every matrix product
// rounds its activation rows to the weight's dot type first, and in Go that took a fifth of a
// prefill. Each reproduces quant's Go quantizer (which is llama.cpp's x86 one) bit for bit on
// any input, NaN and infinities included.

func init() { sets["quantize"] = quantizers }

func quantizers() {
	qConsts()
	quantQ8_0()
	quantQ8K()
	quantF16()
}

// quantF16 rounds n float32 to fp16 with VCVTPS2PH to nearest even, as quant's FP32ToFP16
// (ggml's F16C conversion) does, NaN payloads and subnormals included.
func quantF16() {
	TEXT("quantF16AVX2", NOSPLIT, "func(src []float32, dst []byte, n int)")
	Pragma("noescape")
	Doc("quantF16AVX2 is quant's quantF16 over n values of src into dst: VCVTPS2PH, to nearest even.")
	sp := Load(Param("src").Base(), GP64())
	dp := Load(Param("dst").Base(), GP64())
	n := Load(Param("n"), GP64())
	c := GP64()
	MOVQ(n, c)
	SHRQ(U8(3), c)
	JZ(LabelRef("q16done"))
	y := YMM()
	Label("q16")
	VMOVUPS(Mem{Base: sp}, y)
	VCVTPS2PH(U8(0), y, Mem{Base: dp})
	ADDQ(U8(32), sp)
	ADDQ(U8(16), dp)
	DECQ(c)
	JNZ(LabelRef("q16"))
	Label("q16done")
	ANDQ(U8(7), n)
	JZ(LabelRef("ret"))
	x, h := XMM(), XMM()
	g := GP32()
	Label("tail")
	VMOVSS(Mem{Base: sp}, x)
	VCVTPS2PH(U8(0), x, h)
	VMOVD(h, g)
	MOVW(g.As16(), Mem{Base: dp})
	ADDQ(U8(4), sp)
	ADDQ(U8(2), dp)
	DECQ(n)
	JNZ(LabelRef("tail"))
	Label("ret")
	VZEROUPPER()
	RET()
}

var (
	qAbs     Mem // int32 0x7fffffff
	q127     Mem // float32 127
	qNeg127  Mem // float32 -127
	qOne     Mem // float32 1
	qPerm    Mem // VPERMD indexes 0 4 1 5 2 6 3 7: the lanes' order after the packs
	qMagic   Mem // float32 12582912 (1.5 * 2^23): nearest_int's
	qMant    Mem // int32 0x7fffff
	qBias    Mem // int32 0x400000
	qI127    Mem // int32 127
	qLowByte Mem // int32 0xff
	qOnesB   Mem // bytes 1
	qOnes16  Mem // int16 1
)

func qConsts() {
	qAbs = splat("qabs", 0xff, 0xff, 0xff, 0x7f)
	q127 = splat("q127", 0x00, 0x00, 0xfe, 0x42)
	qNeg127 = splat("qneg127", 0x00, 0x00, 0xfe, 0xc2)
	qOne = splat("qone", 0x00, 0x00, 0x80, 0x3f)
	qPerm = table("qperm", []byte{0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 6, 0, 0, 0, 3, 0, 0, 0, 7, 0, 0, 0})
	qMagic = splat("qmagic", 0x00, 0x00, 0x40, 0x4b)
	qMant = splat("qmant", 0xff, 0xff, 0x7f, 0x00)
	qBias = splat("qbias", 0x00, 0x00, 0x40, 0x00)
	qI127 = splat("qi127", 127, 0, 0, 0)
	qLowByte = splat("qlowbyte", 0xff, 0, 0, 0)
	qOnesB = splat("qonesb", 1)
	qOnes16 = splat("qones16", 1, 0)
}

// quantQ8_0 is ggml's AVX2 quantize_row_q8_0 (quant's quantQ8_0): the block's largest |x| in
// its order of VMAXPS, d = amax/127 stored as float16 (a NaN as the one quiet NaN, as ggml's
// scalar conversion does), x*127/amax rounded half to even and saturated to int8.
func quantQ8_0() {
	sp, dp, nb := quantSig("quantQ8_0AVX2", "quantQ8_0AVX2 quantizes nb blocks of 32 values of src into dst (34 bytes each), as quant's quantQ8_0.")
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("block")
	var v [4]VecVirtual
	for k := range v {
		v[k] = YMM()
		VMOVUPS(Mem{Base: sp, Disp: 32 * k}, v[k])
	}
	m := YMM()
	VANDPS(qAbs, v[0], m)
	for k := 1; k < 4; k++ {
		a := YMM()
		VANDPS(qAbs, v[k], a)
		VMAXPS(a, m, m) // m > a ? m : a, as _mm256_max_ps(maxAbs, |v|)
	}
	q := maxTree(m)
	d := XMM()
	VDIVSS(q127.Offset(0), q, d) // amax / 127
	id := XMM()
	VMOVSS(q127.Offset(0), id)
	VDIVSS(q, id, id) // 127 / amax
	zero, nz := XMM(), XMM()
	VXORPS(zero, zero, zero)
	VCMPSS(U8(4), zero, q, nz) // amax != 0 (true for NaN, as in C)
	VANDPS(nz, id, id)
	idv := YMM()
	VBROADCASTSS(id, idv)
	for k := range v {
		VMULPS(idv, v[k], v[k])
		VROUNDPS(U8(0), v[k], v[k])
		VCVTPS2DQ(v[k], v[k])
	}
	VPACKSSDW(v[1], v[0], v[0])
	VPACKSSDW(v[3], v[2], v[2])
	VPACKSSWB(v[2], v[0], v[0])
	perm := YMM()
	VMOVDQU(qPerm, perm)
	VPERMD(v[0], perm, v[0])
	VMOVDQU(v[0], Mem{Base: dp, Disp: 2})
	// d as float16; a NaN d (amax NaN, whose sign VANDPS cleared) is 0x7e00.
	h := XMM()
	VCVTPS2PH(U8(0), d, h)
	g := GP32()
	VMOVD(h, g)
	nan := GP32()
	MOVL(U32(0x7e00), nan)
	VUCOMISS(d, d)
	CMOVLPS(nan, g)
	MOVW(g.As16(), Mem{Base: dp})
	ADDQ(U8(128), sp)
	ADDQ(U8(34), dp)
	DECQ(nb)
	JNZ(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// quantQ8K is quantize_row_q8_K_ref (quant's quantQ8K): the signed value of largest magnitude
// (the first, NaNs ignored) gives iscale = -127/max; each quant is nearest_int(iscale*x)
// (a multiply, then an add of 1.5*2^23, two roundings) capped at 127 and truncated to a byte;
// bsums are the 16-quant sums; d = 1/iscale. An all-zero block is all zero bytes.
func quantQ8K() {
	sp, dp, nb := quantSig("quantQ8KAVX2", "quantQ8KAVX2 quantizes nb blocks of 256 values of src into dst (292 bytes each), as quant's quantQ8K.")
	absR := YMM()
	VMOVDQU(qAbs, absR)
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("block")
	// amax: VMAXPS(new, acc) keeps acc when new is NaN; from zero, acc is never NaN.
	m := YMM()
	VXORPS(m, m, m)
	for k := 0; k < 32; k++ {
		a := YMM()
		VANDPS(Mem{Base: sp, Disp: 32 * k}, absR, a)
		VMAXPS(m, a, m) // a > m ? a : m
	}
	q := maxTree(m)
	zero := XMM()
	VXORPS(zero, zero, zero)
	VUCOMISS(zero, q)
	JNE(LabelRef("nonzero"))
	// amax == 0: the block is zeros.
	zy := YMM()
	VXORPS(zy, zy, zy)
	for off := 0; off+32 <= 288; off += 32 {
		VMOVDQU(zy, Mem{Base: dp, Disp: off})
	}
	MOVL(U32(0), Mem{Base: dp, Disp: 288})
	JMP(LabelRef("next"))

	Label("nonzero")
	// max: the first value whose magnitude is amax.
	amax := YMM()
	VBROADCASTSS(q, amax)
	idx := GP64()
	XORQ(idx, idx)
	Label("find")
	a := YMM()
	VANDPS(Mem{Base: sp, Index: idx, Scale: 1}, absR, a)
	VCMPPS(U8(0), amax, a, a) // |v| == amax (ordered)
	mask := GP32()
	VMOVMSKPS(a, mask)
	TESTL(mask, mask)
	JNZ(LabelRef("found"))
	ADDQ(U8(32), idx)
	JMP(LabelRef("find"))
	Label("found")
	BSFL(mask, mask)
	SHLL(U8(2), mask)
	ADDQ(mask.As64(), idx)
	iscale := XMM()
	VMOVSS(qNeg127.Offset(0), iscale)
	VDIVSS(Mem{Base: sp, Index: idx, Scale: 1}, iscale, iscale) // -127 / max
	is := YMM()
	VBROADCASTSS(iscale, is)
	// d = 1/iscale
	dd := XMM()
	VMOVSS(qOne.Offset(0), dd)
	VDIVSS(iscale, dd, dd)
	VMOVSS(dd, Mem{Base: dp})

	for g := 0; g < 8; g++ { // 32 values at a time: two bsums
		var v [4]VecVirtual
		for k := range v {
			v[k] = YMM()
			VMULPS(Mem{Base: sp, Disp: 128*g + 32*k}, is, v[k])
			VADDPS(qMagic, v[k], v[k])
			VPAND(qMant, v[k], v[k])
			VPSUBD(qBias, v[k], v[k])
			VPMINSD(qI127, v[k], v[k])
			VPAND(qLowByte, v[k], v[k]) // the byte int8(q) keeps
		}
		VPACKUSDW(v[1], v[0], v[0])
		VPACKUSDW(v[3], v[2], v[2])
		VPACKUSWB(v[2], v[0], v[0])
		perm := YMM()
		VMOVDQU(qPerm, perm)
		VPERMD(v[0], perm, v[0])
		VMOVDQU(v[0], Mem{Base: dp, Disp: 4 + 32*g})
		// bsums of bytes 0..15 and 16..31, exact.
		s := YMM()
		VMOVDQU(qOnesB, s)
		VPMADDUBSW(v[0], s, s)
		VPMADDWD(qOnes16, s, s)
		VPHADDD(s, s, s)
		VPHADDD(s, s, s)
		hi := XMM()
		VEXTRACTI128(U8(1), s, hi)
		VPUNPCKLWD(hi, s.AsX(), hi) // word 0: the low group's sum, word 1: the high group's
		VMOVD(hi, Mem{Base: dp, Disp: 260 + 4*g})
	}
	Label("next")
	ADDQ(U32(1024), sp)
	ADDQ(U32(292), dp)
	DECQ(nb)
	JNZ(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// quantSig declares a quantizer of nb blocks of src into dst and loads its arguments.
func quantSig(name, doc string) (sp, dp, nb Register) {
	TEXT(name, NOSPLIT, "func(src []float32, dst []byte, nb int)")
	Pragma("noescape")
	Doc(doc)
	sp = Load(Param("src").Base(), GP64())
	dp = Load(Param("dst").Base(), GP64())
	nb = Load(Param("nb"), GP64())
	return
}

// maxTree reduces the eight lanes of m to the low lane of the result in the order of ggml's
// quantize_row_q8_0: _mm_max_ps(high half, low half), then lanes 2,3 onto 0,1, then lane 1
// onto lane 0, each VMAXPS keeping its first operand when greater.
func maxTree(m VecVirtual) VecVirtual { return tree8(m, VMAXPS, VMAXSS) }
