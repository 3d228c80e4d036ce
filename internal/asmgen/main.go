// Command asmgen writes the AVX2 assembly of package quant (quant/vecdot_avx2_amd64.s and its Go
// declarations, quant/vecdot_avx2_stubs_amd64.go) with avo. It is a module of its own so that
// avo is not a dependency of commit-run. Regenerate with
//
//	go generate -run asmgen ./quant
//
// Every kernel reproduces the arithmetic of one of llama.cpp's x86 AVX2 kernels (ggml-cpu
// arch/x86/quants.c, ggml_vec_dot_*): the same int32 lane sums and the same float32 fused
// multiply-adds in the same order, so its result is bit-identical to ggml's on the inputs
// ggml computes exactly (all the engine makes). Where ggml's integer tricks would overflow or
// saturate on arbitrary bytes (_mm256_sign_epi8 of -128, _mm256_maddubs_epi16 of pairs of
// -128 products, _mm_hadd_epi16 of large bsums), these kernels use exact sequences instead, so
// their integer sums equal those of quant's portable kernels for any bytes. The one exception
// is Q6_K, which, like llama.cpp today, takes the quants' offset of 32 from the activation's
// bsums: its sums are exact when the bsums are the sums of the quants, as QuantizeRow makes
// them.
package main

import (
	"encoding/binary"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

func main() {
	ConstraintExpr("!purego")
	consts()
	q8_0()
	q4_0()
	q5_0()
	q4K()
	q6K()
	Generate()
}

// Constants.

var (
	cOnes16  Mem // int16 1
	cLow4    Mem // bytes 0x0f
	cEight   Mem // bytes 0x08
	cSixteen Mem // bytes 0x10
	cThirty  Mem // bytes 0x30 (the two high bits of a Q6_K quant, in place)
	cOddByte Mem // int16 0xff00
	cQhShuf  Mem // bytes_from_bits_32's shuffle: byte k of qh to bytes 8k..8k+7
	cBitSel  Mem // bytes 1, 2, 4, ..., 128 repeated
	cK4Shuf  Mem // 8 x 32 bytes: get_scale_shuffle_k4(i), int16 i to every int16
	cQ6Shuf  Mem // 8 x 32 bytes: int8 scale 2i (low lane), 2i+1 (high lane) to the high byte of every int16
)

func table(name string, b []byte) Mem {
	if len(b)%8 != 0 {
		panic(name)
	}
	m := GLOBL(name, RODATA|NOPTR)
	for i := 0; i < len(b); i += 8 {
		DATA(i, U64(binary.LittleEndian.Uint64(b[i:])))
	}
	return m
}

func splat(name string, pattern ...byte) Mem {
	b := make([]byte, 32)
	for i := range b {
		b[i] = pattern[i%len(pattern)]
	}
	return table(name, b)
}

func consts() {
	cOnes16 = splat("ones16", 1, 0)
	cLow4 = splat("low4", 0x0f)
	cEight = splat("eight", 0x08)
	cSixteen = splat("sixteen", 0x10)
	cThirty = splat("thirty", 0x30)
	cOddByte = splat("oddbyte", 0x00, 0xff)
	qh := make([]byte, 32)
	for i := range qh {
		qh[i] = byte(i / 8)
	}
	cQhShuf = table("qhshuf", qh)
	cBitSel = splat("bitsel", 1, 2, 4, 8, 16, 32, 64, 128)
	k4 := make([]byte, 8*32)
	q6 := make([]byte, 8*32)
	for i := 0; i < 8; i++ {
		for k := 0; k < 16; k++ {
			k4[32*i+2*k] = byte(2 * i)
			k4[32*i+2*k+1] = byte(2*i + 1)
		}
		for k := 0; k < 8; k++ {
			q6[32*i+2*k] = 0x80
			q6[32*i+2*k+1] = byte(2 * i)
			q6[32*i+16+2*k] = 0x80
			q6[32*i+16+2*k+1] = byte(2*i + 1)
		}
	}
	cK4Shuf = table("k4shuf", k4)
	cQ6Shuf = table("q6shuf", q6)
}

// Helpers.

func at(base Register, disp int) Mem { return Mem{Base: base, Disp: disp} }

func load(c Mem) VecVirtual {
	r := YMM()
	VMOVDQU(c, r)
	return r
}

// storeRet writes the low float32 of x to the function's result.
func storeRet(x Register) {
	b, err := ReturnIndex(0).Resolve()
	if err != nil {
		panic(err)
	}
	VMOVSS(x, b.Addr)
}

// hsum8 is ggml's hsum_float_8: (hi+lo) of the 128-bit halves, then lanes 2,3 onto 0,1,
// then lane 1 onto lane 0. The result is in the low lane of the returned register.
func hsum8(acc VecVirtual) VecVirtual {
	r := XMM()
	VEXTRACTF128(U8(1), acc, r)
	VADDPS(acc.AsX(), r, r)
	t := XMM()
	VMOVHLPS(r, r, t)
	VADDPS(t, r, r)
	VMOVSHDUP(r, t)
	VADDSS(t, r, r)
	return r
}

// scale32 broadcasts fp16(w.d) * fp16(x.d) for two blocks whose fp16 scales are at wp and xp.
func scale32(wp, xp Register) VecVirtual {
	d := YMM()
	VBROADCASTSS(scale32Scalar(wp, xp), d)
	return d
}

// scale32Scalar is scale32 in the low lane of an XMM register.
func scale32Scalar(wp, xp Register) VecVirtual {
	a, b := GP32(), GP32()
	MOVWLZX(at(wp, 0), a)
	MOVWLZX(at(xp, 0), b)
	SHLL(U8(16), b)
	ORL(b, a)
	h := XMM()
	VMOVD(a, h)
	VCVTPH2PS(h, h)
	t := XMM()
	VMOVSHDUP(h, t)
	VMULSS(t, h, h)
	return h
}

// hsumInt adds the eight int32 lanes of v (exactly) into the low lane of the returned XMM.
func hsumInt(v VecVirtual) VecVirtual {
	r := XMM()
	VEXTRACTI128(U8(1), v, r)
	VPADDD(v.AsX(), r, r)
	return hsumInt4(r)
}

// hsumInt4 adds the four int32 lanes of r into its low lane, in place.
func hsumInt4(r VecVirtual) VecVirtual {
	t := XMM()
	VPSHUFD(U8(0x4e), r, t)
	VPADDD(t, r, r)
	VPSHUFD(U8(0xb1), r, t)
	VPADDD(t, r, r)
	return r
}

// nibbles32 returns the 32 4-bit quants at m (16 bytes) as bytes, low nibbles first:
// ggml's bytes_from_nibbles_32.
func nibbles32(m Mem, low4 VecVirtual) VecVirtual {
	lo := XMM()
	VMOVDQU(m, lo)
	hi := XMM()
	VPSRLW(U8(4), lo, hi)
	q := YMM()
	VINSERTI128(U8(1), hi, lo.AsY(), q)
	VPAND(low4, q, q)
	return q
}

// loopStart opens the loop over nb blocks; loopEnd advances the pointers by their block
// sizes and closes it.
func loopStart(nb Register) {
	TESTQ(nb, nb)
	JZ(LabelRef("done"))
	Label("loop")
}

// prefetchDist is how far ahead of the block being read the weight row is prefetched. On the
// 2-core Xeon (Sapphire Rapids) the project benchmarks on, a row streamed from memory by one
// core runs at 5.3 GB/s (Q8_0) and 2.9 GB/s (Q4_0) without prefetching and at 8-10 GB/s with
// any distance from 1 to 4 KiB; 2 KiB was best. Rows in cache do not notice.
const prefetchDist = 2048

// prefetch asks for the cache lines of the weight block prefetchDist bytes ahead of wp, for a
// block of size bytes. The hardware prefetchers alone keep too few lines in flight for these
// loops: prefetching doubles the throughput of rows streamed from memory. A prefetch never
// faults, so running past the end of the row is harmless.
func prefetch(wp Register, size int) {
	if prefetchDist <= 0 {
		return
	}
	for off := 0; off < size; off += 64 {
		PREFETCHT0(at(wp, prefetchDist+off))
	}
}

func loopEnd(nb Register, ptrs []Register, strides []int) {
	for i, p := range ptrs {
		ADDQ(U32(strides[i]), p)
	}
	DECQ(nb)
	JNZ(LabelRef("loop"))
	Label("done")
}

// sig declares a kernel over nb blocks of w and x and loads its arguments.
func sig(name, doc string) (wp, xp, nb Register) {
	TEXT(name, NOSPLIT, "func(w, x []byte, nb int) float32")
	Pragma("noescape")
	Doc(strings.Split(doc, "\n")...)
	wp = Load(Param("w").Base(), GP64())
	xp = Load(Param("x").Base(), GP64())
	nb = Load(Param("nb"), GP64())
	return
}

func finish32(acc VecVirtual) {
	storeRet(hsum8(acc))
	VZEROUPPER()
	RET()
}

// Kernels.

func q8_0() {
	wp, xp, nb := sig("q8_0DotAVX2", "q8_0DotAVX2 is ggml_vec_dot_q8_0_q8_0 (AVX2) over nb blocks of w and x.")
	acc := YMM()
	VXORPS(acc, acc, acc)
	ones, odd := load(cOnes16), load(cOddByte)
	loopStart(nb)
	prefetch(wp, 1)
	d := scale32(wp, xp)
	// Lane l of the integer sum is elements 4l..4l+3. The even bytes of each int16 word,
	// moved to the high byte, and the odd bytes, masked in place, are w_k*256 and x_k*256
	// exactly; VPMULHW of two such words is w_k*x_k exactly, and VPMADDWD with ones adds
	// neighbouring products into int32.
	a, b := YMM(), YMM()
	VMOVDQU(at(wp, 2), a)
	VMOVDQU(at(xp, 2), b)
	ae, be := YMM(), YMM()
	VPSLLW(U8(8), a, ae)
	VPSLLW(U8(8), b, be)
	VPMULHW(be, ae, ae)
	VPAND(odd, a, a)
	VPAND(odd, b, b)
	VPMULHW(b, a, a)
	VPMADDWD(ones, ae, ae)
	VPMADDWD(ones, a, a)
	VPADDD(a, ae, ae)
	VCVTDQ2PS(ae, ae)
	VFMADD231PS(ae, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{34, 34})
	finish32(acc)
}

func q4_0() {
	q4_0Kernel("q4_0DotAVX2", "q4_0DotAVX2 is ggml_vec_dot_q4_0_q8_0 (AVX2) over nb blocks of w and x.", false)
	q4_0Kernel("q4_0RepackAVX2", "q4_0RepackAVX2 is the product of one row of llama.cpp's repacked Q4_0 (the 8-row\n"+
		"interleaved GEMV/GEMM, gemv_q4_b32_8x8_q8_0) with nb blocks of x: one fused multiply-add of\n"+
		"each block's integer sum.", true)
}

func q4_0Kernel(name, doc string, repack bool) {
	wp, xp, nb := sig(name, doc)
	acc := YMM()
	VXORPS(acc, acc, acc)
	ones, low4, eight := load(cOnes16), load(cLow4), load(cEight)
	loopStart(nb)
	prefetch(wp, 1)
	// (q-8)*y summed in pairs is maddubs(q, y) - maddubs(8, y), both exact in int16.
	q := nibbles32(at(wp, 2), low4)
	y := YMM()
	VMOVDQU(at(xp, 2), y)
	c := YMM()
	VPMADDUBSW(y, q, q)
	VPMADDUBSW(y, eight, c)
	VPSUBW(c, q, q)
	VPMADDWD(ones, q, q)
	if repack {
		d := scale32Scalar(wp, xp)
		s := hsumInt(q)
		VCVTDQ2PS(s, s)
		VFMADD231SS(d, s, acc.AsX())
	} else {
		d := scale32(wp, xp)
		VCVTDQ2PS(q, q)
		VFMADD231PS(q, d, acc)
	}
	loopEnd(nb, []Register{wp, xp}, []int{18, 34})
	if repack {
		storeRet(acc.AsX())
		VZEROUPPER()
		RET()
		return
	}
	finish32(acc)
}

func q5_0() {
	wp, xp, nb := sig("q5_0DotAVX2", "q5_0DotAVX2 is ggml_vec_dot_q5_0_q8_0 (AVX2) over nb blocks of w and x.")
	acc := YMM()
	VXORPS(acc, acc, acc)
	ones, low4, sixteen := load(cOnes16), load(cLow4), load(cSixteen)
	shuf, bits := load(cQhShuf), load(cBitSel)
	loopStart(nb)
	prefetch(wp, 1)
	d := scale32(wp, xp)
	// Bit k of qh, as 0x10 in byte k (bytes_from_bits_32), or'ed onto the nibbles.
	h := YMM()
	VPBROADCASTD(at(wp, 2), h)
	VPSHUFB(shuf, h, h)
	VPAND(bits, h, h)
	VPCMPEQB(bits, h, h)
	VPAND(sixteen, h, h)
	q := nibbles32(at(wp, 6), low4)
	VPOR(h, q, q)
	y := YMM()
	VMOVDQU(at(xp, 2), y)
	c := YMM()
	VPMADDUBSW(y, q, q)
	VPMADDUBSW(y, sixteen, c)
	VPSUBW(c, q, q)
	VPMADDWD(ones, q, q)
	VCVTDQ2PS(q, q)
	VFMADD231PS(q, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{22, 34})
	finish32(acc)
}

// The Q4_K kernels: ggml_vec_dot_q4_K_q8_K, and one row of the repacked (8-row interleaved)
// products ggml_gemv_q4_K_8x8_q8_K and ggml_gemm_q4_K_8x8_q8_K.
const (
	q4KVec = iota
	q4KRepack
	q4KRepackGemm
)

func q4K() {
	q4KKernel("q4KDotAVX2", "q4KDotAVX2 is ggml_vec_dot_q4_K_q8_K (AVX2) over nb super-blocks of w and x.", q4KVec)
	q4KKernel("q4KRepackAVX2", "q4KRepackAVX2 is the product of one row of llama.cpp's repacked Q4_K with nb super-blocks of x\n"+
		"as ggml_gemv_q4_K_8x8_q8_K computes it: per super-block one fused multiply-add of the scaled\n"+
		"integer sum and one of the min term, in two accumulators subtracted at the end.", q4KRepack)
	q4KKernel("q4KRepackGemmAVX2", "q4KRepackGemmAVX2 is q4KRepackAVX2 as ggml_gemm_q4_K_8x8_q8_K computes it, with the fused\n"+
		"multiply-adds per 64-element pair of sub-blocks.", q4KRepackGemm)
}

func q4KKernel(name, doc string, mode int) {
	wp, xp, nb := sig(name, doc)
	acc := YMM()
	VXORPS(acc, acc, acc)
	accm := XMM()
	VXORPS(accm, accm, accm)
	low4 := load(cLow4)
	loopStart(nb)
	prefetch(wp, 144)

	// d = y.d * fp16(w.d), dmin = y.d * fp16(w.dmin); ggml_vec_dot multiplies by -dmin, which
	// VFNMADD does exactly, the repacked products subtract at the end.
	h := XMM()
	VMOVD(at(wp, 0), h)
	VCVTPH2PS(h, h)
	yd := XMM()
	VBROADCASTSS(at(xp, 0), yd)
	VMULPS(yd, h, h)
	dmin := XMM()
	VSHUFPS(U8(0x55), h, h, dmin)

	// The 12 scale bytes to 8 scales and 8 mins (ggml's utmp shuffle).
	u0, u1, u2, t, s := GP64(), GP64(), GP64(), GP64(), GP64()
	MOVL(at(wp, 4), u0.As32())
	MOVL(at(wp, 8), u1.As32())
	MOVL(at(wp, 12), u2.As32())
	MOVL(u2.As32(), t.As32())
	SHRL(U8(4), t.As32())
	ANDL(U32(0x0f0f0f0f), t.As32())
	MOVL(u1.As32(), s.As32())
	SHRL(U8(6), s.As32())
	ANDL(U32(0x03030303), s.As32())
	SHLL(U8(4), s.As32())
	ORL(s.As32(), t.As32()) // mins 4..7
	ANDL(U32(0x0f0f0f0f), u2.As32())
	MOVL(u0.As32(), s.As32())
	SHRL(U8(6), s.As32())
	ANDL(U32(0x03030303), s.As32())
	SHLL(U8(4), s.As32())
	ORL(s.As32(), u2.As32())         // scales 4..7
	ANDL(U32(0x3f3f3f3f), u1.As32()) // mins 0..3
	ANDL(U32(0x3f3f3f3f), u0.As32()) // scales 0..3
	SHLQ(U8(32), u2)
	ORQ(u2, u0)
	SHLQ(U8(32), t)
	ORQ(t, u1)

	// Min term: ggml adds the bsums in pairs in int16 (_mm_hadd_epi16) and then takes
	// m_j*(b_2j + b_2j+1) in pairs of j per int32 lane. Here each min is doubled so that
	// VPMADDWD forms m_j*b_2j + m_j*b_2j+1 in int32, and VPHADDD pairs the j: the same
	// lane values whenever ggml's int16 sums do not wrap, and exact for any bsums.
	mn := XMM()
	VMOVQ(u1, mn)
	VPUNPCKLBW(mn, mn, mn)
	mw := YMM()
	VPMOVZXBW(mn, mw)
	VPMADDWD(at(xp, 260), mw, mw)
	mh := XMM()
	VEXTRACTI128(U8(1), mw, mh)
	VPHADDD(mh, mw.AsX(), mh)
	sc := XMM()
	VMOVQ(u0, sc)
	scw := YMM()
	VPMOVZXBW(sc, scw.AsX())
	VINSERTI128(U8(1), scw.AsX(), scw, scw)

	// Integer lane l of pair j: elements 4l..4l+3 of both its sub-blocks, times their scales.
	var pair [4]VecVirtual
	for j := 0; j < 4; j++ {
		lo, hi := YMM(), YMM()
		VMOVDQU(at(wp, 16+32*j), lo)
		VPSRLW(U8(4), lo, hi)
		VPAND(low4, lo, lo)
		VPAND(low4, hi, hi)
		VPMADDUBSW(at(xp, 4+64*j), lo, lo)
		VPMADDUBSW(at(xp, 4+64*j+32), hi, hi)
		sl, sh := YMM(), YMM()
		VPSHUFB(cK4Shuf.Offset(32*(2*j)), scw, sl)
		VPSHUFB(cK4Shuf.Offset(32*(2*j+1)), scw, sh)
		VPMADDWD(sl, lo, lo)
		VPMADDWD(sh, hi, hi)
		VPADDD(hi, lo, lo)
		pair[j] = lo
	}
	switch mode {
	case q4KVec:
		VCVTDQ2PS(mh, mh)
		VFNMADD231PS(mh, dmin, accm)
		VPADDD(pair[1], pair[0], pair[0])
		VPADDD(pair[3], pair[2], pair[2])
		VPADDD(pair[2], pair[0], pair[0])
		VCVTDQ2PS(pair[0], pair[0])
		d := YMM()
		VBROADCASTSS(h, d)
		VFMADD231PS(pair[0], d, acc)
	case q4KRepack:
		VPADDD(pair[1], pair[0], pair[0])
		VPADDD(pair[3], pair[2], pair[2])
		VPADDD(pair[2], pair[0], pair[0])
		sum := hsumInt(pair[0])
		VCVTDQ2PS(sum, sum)
		VFMADD231SS(h, sum, acc.AsX())
		hsumInt4(mh)
		VCVTDQ2PS(mh, mh)
		VFMADD231SS(dmin, mh, accm)
	case q4KRepackGemm:
		// The four pairs' sums in the four lanes of one register (VPHADDD tree; the int32
		// sums are exact in any order), then the fused multiply-adds in pair order.
		VPHADDD(pair[1], pair[0], pair[0])
		VPHADDD(pair[3], pair[2], pair[2])
		VPHADDD(pair[2], pair[0], pair[0])
		sums := XMM()
		VEXTRACTI128(U8(1), pair[0], sums)
		VPADDD(pair[0].AsX(), sums, sums)
		VCVTDQ2PS(sums, sums)
		VCVTDQ2PS(mh, mh)
		t := XMM()
		for j := 0; j < 4; j++ {
			for _, v := range []struct{ src, scale, acc Register }{{sums, h, acc.AsX()}, {mh, dmin, accm}} {
				var lane Register = v.src
				if j > 0 {
					lane = t
					VSHUFPS(U8(0x55*j), v.src, v.src, t)
				}
				VFMADD231SS(v.scale, lane, v.acc)
			}
		}
	}
	loopEnd(nb, []Register{wp, xp}, []int{144, 292})

	var r Register
	if mode == q4KVec {
		h8 := hsum8(acc)
		m := XMM()
		VMOVHLPS(accm, accm, m)
		VADDPS(m, accm, accm)
		VMOVSHDUP(accm, m)
		VADDSS(m, accm, accm)
		VADDSS(accm, h8, h8)
		r = h8
	} else {
		r = acc.AsX()
		VSUBSS(accm, r, r)
	}
	storeRet(r)
	VZEROUPPER()
	RET()
}

func q6K() {
	wp, xp, nb := sig("q6KDotAVX2", "q6KDotAVX2 is ggml_vec_dot_q6_K_q8_K (AVX2) over nb super-blocks of w and x.")
	acc := YMM()
	VXORPS(acc, acc, acc)
	low4, thirty := load(cLow4), load(cThirty)
	loopStart(nb)
	prefetch(wp, 210)

	g := GP32()
	MOVWLZX(at(wp, 208), g)
	h := XMM()
	VMOVD(g, h)
	VCVTPH2PS(h, h)
	VMULSS(at(xp, 0), h, h)
	d := YMM()
	VBROADCASTSS(h, d)

	// 32 * (bsum_2l*sc_2l + bsum_2l+1*sc_2l+1) per lane l, subtracted at the end.
	sc16 := YMM()
	VPMOVSXBW(at(wp, 192), sc16)
	VPMADDWD(at(xp, 260), sc16, sc16)
	VPSLLD(U8(5), sc16, sc16)
	scb := YMM()
	VBROADCASTI128(at(wp, 192), scb)

	sumi := YMM()
	VPXOR(sumi, sumi, sumi)
	for half := 0; half < 2; half++ {
		ql1, ql2, qh := YMM(), YMM(), YMM()
		VMOVDQU(at(wp, 64*half), ql1)
		VMOVDQU(at(wp, 64*half+32), ql2)
		VMOVDQU(at(wp, 128+32*half), qh)
		q := [4]VecVirtual{YMM(), YMM(), YMM(), YMM()}
		// High bits 2g, 2g+1 of qh moved to bits 4, 5.
		VPSLLW(U8(4), qh, q[0])
		VPSLLW(U8(2), qh, q[1])
		VPSRLW(U8(2), qh, q[3])
		VPAND(thirty, q[0], q[0])
		VPAND(thirty, q[1], q[1])
		VPAND(thirty, qh, q[2])
		VPAND(thirty, q[3], q[3])
		lo := YMM()
		VPAND(low4, ql1, lo)
		VPOR(lo, q[0], q[0])
		VPAND(low4, ql2, lo)
		VPOR(lo, q[1], q[1])
		VPSRLW(U8(4), ql1, ql1)
		VPAND(low4, ql1, ql1)
		VPOR(ql1, q[2], q[2])
		VPSRLW(U8(4), ql2, ql2)
		VPAND(low4, ql2, ql2)
		VPOR(ql2, q[3], q[3])
		for k := 0; k < 4; k++ {
			VPMADDUBSW(at(xp, 4+128*half+32*k), q[k], q[k])
			s := YMM()
			VPSHUFB(cQ6Shuf.Offset(32*(4*half+k)), scb, s)
			VPSRAW(U8(8), s, s)
			VPMADDWD(s, q[k], q[k])
			VPADDD(q[k], sumi, sumi)
		}
	}
	VPSUBD(sc16, sumi, sumi)
	VCVTDQ2PS(sumi, sumi)
	VFMADD231PS(sumi, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{210, 292})
	finish32(acc)
}
