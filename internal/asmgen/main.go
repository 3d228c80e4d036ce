// Command asmgen writes the AVX2 assembly of package quant (quant/vecdot_avx2_amd64.s and its Go
// declarations, quant/vecdot_avx2_stubs_amd64.go) with avo. It is a module of its own so that
// avo is not a dependency of commit-run. Regenerate with
//
//	go generate -run asmgen ./quant
//
// Every kernel reproduces the arithmetic of one of llama.cpp's x86 kernels (ggml-cpu
// arch/x86/quants.c ggml_vec_dot_*, the repacked GEMV/GEMM, llamafile's tinyBLAS), as quant's
// x86.go describes it: the same int32 lane sums and the same float32 fused multiply-adds in
// the same order, so its result is bit-identical to ggml's on the inputs ggml computes exactly
// (all the engine makes) and to x86.go's Go kernel on any input. Where ggml's integer tricks
// would overflow or saturate on arbitrary bytes (_mm256_sign_epi8 of -128,
// _mm256_maddubs_epi16 of pairs of -128 products, _mm_hadd_epi16 of large bsums), these
// kernels use exact sequences instead, so their integer sums equal those of quant's portable
// kernels for any bytes. The one exception is Q6_K, which, like llama.cpp today, takes the
// quants' offset of 32 from the activation's bsums: its sums are exact when the bsums are the
// sums of the quants, as QuantizeRow makes them. The F32, F16 and BF16 kernels reproduce
// AVX-512 code with AVX2 registers, two per 16-lane accumulator (see floats).
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// sets are the groups of kernels, each written to an assembly file of its own (-set NAME), so
// that each file's constants and kernels can be changed without regenerating the others.
var sets = map[string]func(){
	"vecdot": func() {
		consts()
		for _, k := range rowKernels {
			k()
		}
		floats()
		// The same kernels over many rows (name + "Rows"): one call per product of a single
		// activation row, not one per weight row.
		many = &manyFrame{}
		for _, k := range rowKernels {
			k()
		}
		many = nil
		for n := 1; n <= 3; n++ {
			f16Multi(n)
			for r := 1; r <= 2; r++ {
				f16Gemm(r, n)
			}
		}
		widenF16()
	},
}

// rowKernels write the kernels of one weight row against one activation row (sig, storeRet).
var rowKernels = []func(){q8_0, q4_0, q5_0, q4K, q6K, q4_1, q5_1, iq4nl, q5K, q3K, q2K, mxfp4}

func main() {
	set := flag.String("set", "vecdot", "the group of kernels to write")
	flag.Parse()
	gen, ok := sets[*set]
	if !ok {
		fmt.Fprintf(os.Stderr, "asmgen: no kernel set %q\n", *set)
		os.Exit(2)
	}
	ConstraintExpr("!purego")
	gen()
	Generate()
	if err := checkAVX2(flag.Lookup("out").Value.String()); err != nil {
		fmt.Fprintln(os.Stderr, "asmgen:", err)
		os.Exit(1)
	}
}

// highVec matches the vector registers only AVX-512 has. avo's allocator hands them out when
// a kernel keeps more than 16 vectors live; Go's assembler then encodes many instructions with
// EVEX, which an AVX2 machine cannot run, so such a kernel must use fewer registers.
var highVec = regexp.MustCompile(`\b[XYZ](1[6-9]|2[0-9]|3[01])\b`)

// checkAVX2 fails if the assembly written to path uses a register AVX2 does not have.
func checkAVX2(path string) error {
	if path == "" || path == "-" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, line := range strings.Split(string(b), "\n") {
		if highVec.MatchString(line) {
			return fmt.Errorf("%s:%d uses an AVX-512 register (too many live vectors): %s", path, i+1, strings.TrimSpace(line))
		}
	}
	return nil
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
	cIQ4NL   Mem // kvalues_iq4nl, in both 128-bit lanes
	cThree   Mem // bytes 0x03
	cFour    Mem // bytes 0x04
	cThirty2 Mem // bytes 0x20 (the offset of Q3_K's 6-bit scales)
	cExpW    Mem // int16 0x7f80 (a bfloat16's exponent)
	cAbsW    Mem // int16 0x7fff
	cExpD    Mem // int32 0x7f800000 (a float32's exponent)
	cAbsD    Mem // int32 0x7fffffff
	cHighW   Mem // int32 0xffff0000
	cMXFP4   Mem // kvalues_mxfp4, in both 128-bit lanes
	cE8M0    Mem // GGML_E8M0_TO_FP32_HALF of every byte, 256 float32
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
	cK4Shuf = table("k4shuf", k4ShufBytes())
	cQ6Shuf = table("q6shuf", q6ShufBytes())
	iq4 := []int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
	kv := make([]byte, 32)
	for i := range kv {
		kv[i] = byte(iq4[i%16])
	}
	cIQ4NL = table("iq4nlvalues", kv)
	cThree = splat("three", 0x03)
	cFour = splat("four", 0x04)
	cThirty2 = splat("thirtytwo", 0x20)
	cExpW = splat("expw", 0x80, 0x7f)
	cAbsW = splat("absw", 0xff, 0x7f)
	cExpD = splat("expd", 0, 0, 0x80, 0x7f)
	cAbsD = splat("absd", 0xff, 0xff, 0xff, 0x7f)
	cHighW = splat("highw", 0, 0, 0xff, 0xff)
	mx := []int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	kv = make([]byte, 32)
	for i := range kv {
		kv[i] = byte(mx[i%16])
	}
	cMXFP4 = table("mxfp4values", kv)
	e8m0 := make([]byte, 4*256)
	for e := range 256 {
		bits := uint32(e-1) << 23
		if e < 2 {
			bits = 0x00200000 << e
		}
		binary.LittleEndian.PutUint32(e8m0[4*e:], bits)
	}
	cE8M0 = table("e8m0half", e8m0)
}

// k4ShufBytes is cK4Shuf's table.
func k4ShufBytes() []byte {
	k4 := make([]byte, 8*32)
	for i := 0; i < 8; i++ {
		for k := 0; k < 16; k++ {
			k4[32*i+2*k] = byte(2 * i)
			k4[32*i+2*k+1] = byte(2*i + 1)
		}
	}
	return k4
}

// q6KQuants decodes half (0 or 1) of the Q6_K block at wp: its four 32-quant groups as
// unsigned bytes, each the low or high nibble of ql with its two high bits from qh.
func q6KQuants(wp Register, half int, low4, thirty VecVirtual) [4]VecVirtual {
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
	return q
}

// q6ShufBytes is cQ6Shuf's table.
func q6ShufBytes() []byte {
	q6 := make([]byte, 8*32)
	for i := 0; i < 8; i++ {
		for k := 0; k < 8; k++ {
			q6[32*i+2*k] = 0x80
			q6[32*i+2*k+1] = byte(2 * i)
			q6[32*i+16+2*k] = 0x80
			q6[32*i+16+2*k+1] = byte(2*i + 1)
		}
	}
	return q6
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
	if many != nil {
		many.store(x)
		return
	}
	b, err := ReturnIndex(0).Resolve()
	if err != nil {
		panic(err)
	}
	VMOVSS(x, b.Addr)
}

// hsum8 is ggml's hsum_float_8: (hi+lo) of the 128-bit halves, then lanes 2,3 onto 0,1,
// then lane 1 onto lane 0. The result is in the low lane of the returned register.
func hsum8(acc VecVirtual) VecVirtual { return tree8(acc, VADDPS, VADDSS) }

// tree8 reduces the eight lanes of v with op in ggml's order, the high 128-bit half onto the
// low one, then lanes 2,3 onto 0,1, then lane 1 onto lane 0 (with opSS, op's scalar form),
// each step's operands in the order of the intrinsics ggml writes it with. The result is in
// the low lane of the returned register.
func tree8(v VecVirtual, op, opSS func(...Op)) VecVirtual {
	r := XMM()
	VEXTRACTF128(U8(1), v, r)
	op(v.AsX(), r, r)
	t := XMM()
	VMOVHLPS(r, r, t)
	op(t, r, r)
	VMOVSHDUP(r, t)
	opSS(t, r, r)
	return r
}

// scale32 broadcasts fp16(w.d) * fp16(x.d) for two blocks whose fp16 scales are at wp and xp.
func scale32(wp, xp Register) VecVirtual {
	d := YMM()
	VBROADCASTSS(scale32Scalar(wp, xp), d)
	return d
}

// scale32Scalar is scale32 in the low lane of an XMM register.
func scale32Scalar(wp, xp Register) VecVirtual { return scale32ScalarAt(at(wp, 0), at(xp, 0)) }

// scale32ScalarAt is scale32Scalar for the fp16 scales at wm and xm.
func scale32ScalarAt(wm, xm Mem) VecVirtual {
	a, b := GP32(), GP32()
	MOVWLZX(wm, a)
	MOVWLZX(xm, b)
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

// many, while set, makes sig and storeRet write the many-row variant of a one-row kernel:
//
//	func NAMERows(w []byte, ldw int, x []byte, nb int, rows int, out []float32)
//
// out[r] is the one-row kernel of row r of w (ldw bytes after row r-1) with x. sig opens the
// loop over the rows and hands the kernel fresh copies of the row's pointer, x's and nb;
// storeRet stores the row's result and closes the loop, before the kernel's own ending.
var many *manyFrame

type manyFrame struct {
	w, out Register
	rows   Mem // rows left, on the stack
}

func (f *manyFrame) sig(name string) (wp, xp, nb Register) {
	TEXT(name+"Rows", NOSPLIT, "func(w []byte, ldw int, x []byte, nb int, rows int, out []float32)")
	Pragma("noescape")
	Doc(name+"Rows is "+name+" for rows rows of w, ldw bytes apart, against the one row x:", "out[r] is row r's product.")
	f.w = Load(Param("w").Base(), GP64())
	f.out = Load(Param("out").Base(), GP64())
	f.rows = AllocLocal(8)
	n := Load(Param("rows"), GP64())
	MOVQ(n, f.rows)
	TESTQ(n, n)
	JZ(LabelRef("rowsend"))
	Label("row")
	wp = GP64()
	MOVQ(f.w, wp)
	xp = Load(Param("x").Base(), GP64())
	nb = Load(Param("nb"), GP64())
	return wp, xp, nb
}

func (f *manyFrame) store(x Register) {
	VMOVSS(x, Mem{Base: f.out})
	ADDQ(U8(4), f.out)
	ldw := Load(Param("ldw"), GP64())
	ADDQ(ldw, f.w)
	DECQ(f.rows)
	JNZ(LabelRef("row"))
	Label("rowsend")
}

// sig declares a kernel over nb blocks of w and x and loads its arguments.
func sig(name, doc string) (wp, xp, nb Register) {
	if many != nil {
		return many.sig(name)
	}
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

// kScalesMins unpacks the 12 scale bytes of a Q4_K/Q5_K block at wp+4 into 8 scales (bytes
// of u0) and 8 mins (bytes of u1), 6 bits each: ggml's utmp shuffle.
func kScalesMins(wp Register) (u0, u1 GPVirtual) {
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
	return u0, u1
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

	u0, u1 := kScalesMins(wp)

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
		q := q6KQuants(wp, half, low4, thirty)
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

// The kernels below reproduce quant/x86.go's Go kernels of quant.X86Dot to the bit (the test
// TestFastMatchesX86 holds them to it) for the types whose VecDot has no fast kernel.

// scaleSum32 reads the fp16 pairs (d, m) of a Q4_1/Q5_1 block at wp and (d, s) of a Q8_1 block
// at xp, fuses m_w*s_x into the low lane of summs (x86.go: summs = fma32(m, s, summs)) and
// returns d_w*d_x broadcast.
func scaleSum32(wp, xp Register, summs VecVirtual) VecVirtual {
	a, b := GP64(), GP64()
	MOVL(at(wp, 0), a.As32())
	MOVL(at(xp, 0), b.As32())
	SHLQ(U8(32), b)
	ORQ(b, a)
	h := XMM()
	VMOVQ(a, h)
	VCVTPH2PS(h, h) // d_w, m_w, d_x, s_x
	t := XMM()
	VMOVHLPS(h, h, t) // d_x, s_x
	m, s := XMM(), XMM()
	VMOVSHDUP(h, m)
	VMOVSHDUP(t, s)
	VFMADD231SS(s, m, summs)
	VMULSS(t, h, h)
	d := YMM()
	VBROADCASTSS(h, d)
	return d
}

// finishSumms returns hsum8(acc) + summs (x86.go's Q4_1 and Q5_1 kernels).
func finishSumms(acc, summs VecVirtual) {
	r := hsum8(acc)
	VADDSS(summs, r, r)
	storeRet(r)
	VZEROUPPER()
	RET()
}

func q4_1() {
	wp, xp, nb := sig("q4_1DotAVX2", "q4_1DotAVX2 is ggml_vec_dot_q4_1_q8_1 (AVX2) over nb blocks of w and x, as quant's\n"+
		"x86LanesQ4_1: d_w*d_x times the eight 4-element lanes fused per block, m_w*s_x fused into a\n"+
		"scalar, hsum_float_8 of the lanes plus the scalar at the end.")
	acc, summs := YMM(), XMM()
	VXORPS(acc, acc, acc)
	VXORPS(summs, summs, summs)
	ones, low4 := load(cOnes16), load(cLow4)
	loopStart(nb)
	prefetch(wp, 1)
	d := scaleSum32(wp, xp, summs)
	// Unsigned nibbles times int8 activations: VPMADDUBSW's pairs are at most 2*15*128, exact.
	q := nibbles32(at(wp, 4), low4)
	VPMADDUBSW(at(xp, 4), q, q)
	VPMADDWD(ones, q, q)
	VCVTDQ2PS(q, q)
	VFMADD231PS(q, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{20, 36})
	finishSumms(acc, summs)
}

// highBits32 returns bit k of the 32-bit mask at m as 0x10 in byte k (bytes_from_bits_32).
func highBits32(m Mem, shuf, bits, sixteen VecVirtual) VecVirtual {
	h := YMM()
	VPBROADCASTD(m, h)
	VPSHUFB(shuf, h, h)
	VPAND(bits, h, h)
	VPCMPEQB(bits, h, h)
	VPAND(sixteen, h, h)
	return h
}

func q5_1() {
	wp, xp, nb := sig("q5_1DotAVX2", "q5_1DotAVX2 is ggml_vec_dot_q5_1_q8_1 (AVX2) over nb blocks of w and x, as quant's\n"+
		"x86LanesQ5_1 (the order of q4_1DotAVX2).")
	acc, summs := YMM(), XMM()
	VXORPS(acc, acc, acc)
	VXORPS(summs, summs, summs)
	ones, low4, sixteen := load(cOnes16), load(cLow4), load(cSixteen)
	shuf, bits := load(cQhShuf), load(cBitSel)
	loopStart(nb)
	prefetch(wp, 1)
	d := scaleSum32(wp, xp, summs)
	h := highBits32(at(wp, 4), shuf, bits, sixteen)
	q := nibbles32(at(wp, 8), low4)
	VPOR(h, q, q)
	// Quants 0..31 times int8: pairs at most 2*31*128, exact.
	VPMADDUBSW(at(xp, 4), q, q)
	VPMADDWD(ones, q, q)
	VCVTDQ2PS(q, q)
	VFMADD231PS(q, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{24, 36})
	finishSumms(acc, summs)
}

// The IQ4_NL kernels: the 4-bit indices looked up in kvalues_iq4nl (-127..113) and
// multiplied with the Q8_0 activation.

// iq4nlPairs returns the int16 sums of neighbouring products of the IQ4_NL block's quants
// (16 bytes of indices at m, low nibbles first) with the 32 int8 activations at y. ggml's
// mul_add_epi8 takes the signs from the weights, which is wrong for activations of -128;
// here VPMADDUBSW multiplies |y| (unsigned, 128 included) with q*sign(y) (q is never -128):
// every pair is at most 2*127*128 in magnitude, exact in int16.
func iq4nlPairs(m, y Mem, low4, kv VecVirtual) VecVirtual {
	q := nibbles32(m, low4)
	VPSHUFB(q, kv, q)
	v, a := YMM(), YMM()
	VMOVDQU(y, v)
	VPABSB(v, a)
	VPSIGNB(v, q, q)
	VPMADDUBSW(q, a, a)
	return a
}

func iq4nl() {
	iq4nlKernel("iq4nlLanesAVX2", "iq4nlLanesAVX2 is quant's x86LanesIQ4NL over nb blocks of w and x (llamafile's tinyBLAS for\n"+
		"IQ4_NL): d_w*d_x times the eight 4-element lanes fused per block, hsum_float_8 at the end.", false)
	iq4nlKernel("iq4nlRepackAVX2", "iq4nlRepackAVX2 is quant's x86RepackIQ4NL over nb blocks of w and x (the 8-row interleaved\n"+
		"GEMV/GEMM of repacked IQ4_NL): one fused multiply-add of each block's integer sum.", true)
	iq4nlVec()
}

func iq4nlKernel(name, doc string, repack bool) {
	wp, xp, nb := sig(name, doc)
	acc := YMM()
	VXORPS(acc, acc, acc)
	ones, low4, kv := load(cOnes16), load(cLow4), load(cIQ4NL)
	loopStart(nb)
	prefetch(wp, 1)
	p := iq4nlPairs(at(wp, 2), at(xp, 2), low4, kv)
	VPMADDWD(ones, p, p)
	if repack {
		d := scale32Scalar(wp, xp)
		s := hsumInt(p)
		VCVTDQ2PS(s, s)
		VFMADD231SS(d, s, acc.AsX())
	} else {
		d := scale32(wp, xp)
		VCVTDQ2PS(p, p)
		VFMADD231PS(p, d, acc)
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

// iq4nlVec is x86VecIQ4NL (ggml_vec_dot_iq4_nl_q8_0): even and odd blocks in two sets of
// lanes, added lane-wise and reduced at the end, and a last odd block fused as a scalar.
func iq4nlVec() {
	wp, xp, nb := sig("iq4nlVecAVX2", "iq4nlVecAVX2 is ggml_vec_dot_iq4_nl_q8_0 (AVX2) over nb blocks of w and x, as quant's\n"+
		"x86VecIQ4NL.")
	acc := [2]VecVirtual{YMM(), YMM()}
	VXORPS(acc[0], acc[0], acc[0])
	VXORPS(acc[1], acc[1], acc[1])
	ones, low4, kv := load(cOnes16), load(cLow4), load(cIQ4NL)
	pairs := GP64()
	MOVQ(nb, pairs)
	SHRQ(U8(1), pairs)
	JZ(LabelRef("pairsdone"))
	Label("pairs")
	prefetch(wp, 36)
	for h := 0; h < 2; h++ {
		d := YMM()
		VBROADCASTSS(scale32ScalarAt(at(wp, 18*h), at(xp, 34*h)), d)
		p := iq4nlPairs(at(wp, 18*h+2), at(xp, 34*h+2), low4, kv)
		VPMADDWD(ones, p, p)
		VCVTDQ2PS(p, p)
		VFMADD231PS(p, d, acc[h])
	}
	ADDQ(U32(36), wp)
	ADDQ(U32(68), xp)
	DECQ(pairs)
	JNZ(LabelRef("pairs"))
	Label("pairsdone")
	VADDPS(acc[1], acc[0], acc[0])
	r := hsum8(acc[0])
	TESTQ(U32(1), nb)
	JZ(LabelRef("ret"))
	d := scale32Scalar(wp, xp)
	p := iq4nlPairs(at(wp, 2), at(xp, 2), low4, kv)
	VPMADDWD(ones, p, p)
	s := hsumInt(p)
	VCVTDQ2PS(s, s)
	VFMADD231SS(s, d, r)
	Label("ret")
	storeRet(r)
	VZEROUPPER()
	RET()
}

// The MXFP4 kernels: IQ4_NL's with MXFP4's 17-byte block (the E8M0 scale byte, then the
// indices), its codebook kvalues_mxfp4 (-12..12) and its scale, the E8M0 byte halved
// (GGML_E8M0_TO_FP32_HALF, looked up in cE8M0) times the activation's fp16 d. tinyBLAS has no
// MXFP4 kernel, so there is no lanes kernel.

func mxfp4() {
	mxfp4Repack()
	mxfp4Vec()
}

// e8m0Table loads cE8M0's address: Go's assembler takes no index register with a static
// symbol.
func e8m0Table() Register {
	t := GP64()
	LEAQ(cE8M0, t)
	return t
}

// mxScaleAt returns, in the low lane of an XMM, the halved E8M0 scale at wm (looked up in the
// table at tbl) times the fp16 scale at xm: the block scale of an MXFP4 block against a Q8_0
// one.
func mxScaleAt(tbl Register, wm, xm Mem) VecVirtual {
	e := GP64()
	MOVBQZX(wm, e)
	h := XMM()
	VMOVSS(Mem{Base: tbl, Index: e, Scale: 4}, h)
	g := GP32()
	MOVWLZX(xm, g)
	t := XMM()
	VMOVD(g, t)
	VCVTPH2PS(t, t)
	VMULSS(t, h, h)
	return h
}

func mxfp4Repack() {
	wp, xp, nb := sig("mxfp4RepackAVX2", "mxfp4RepackAVX2 is quant's x86RepackMXFP4 over nb blocks of w and x (the 8-row interleaved\n"+
		"GEMV/GEMM of repacked MXFP4): one fused multiply-add of each block's integer sum.")
	acc := YMM()
	VXORPS(acc, acc, acc)
	ones, low4, kv := load(cOnes16), load(cLow4), load(cMXFP4)
	tbl := e8m0Table()
	loopStart(nb)
	prefetch(wp, 1)
	p := iq4nlPairs(at(wp, 1), at(xp, 2), low4, kv)
	VPMADDWD(ones, p, p)
	d := mxScaleAt(tbl, at(wp, 0), at(xp, 0))
	s := hsumInt(p)
	VCVTDQ2PS(s, s)
	VFMADD231SS(d, s, acc.AsX())
	loopEnd(nb, []Register{wp, xp}, []int{17, 34})
	storeRet(acc.AsX())
	VZEROUPPER()
	RET()
}

// mxfp4Vec is x86VecMXFP4 (ggml_vec_dot_mxfp4_q8_0): iq4nlVec's order, even and odd blocks in
// two sets of lanes, added lane-wise and reduced at the end, and a last odd block fused as a
// scalar.
func mxfp4Vec() {
	wp, xp, nb := sig("mxfp4VecAVX2", "mxfp4VecAVX2 is ggml_vec_dot_mxfp4_q8_0 (AVX2) over nb blocks of w and x, as quant's\n"+
		"x86VecMXFP4.")
	acc := [2]VecVirtual{YMM(), YMM()}
	VXORPS(acc[0], acc[0], acc[0])
	VXORPS(acc[1], acc[1], acc[1])
	ones, low4, kv := load(cOnes16), load(cLow4), load(cMXFP4)
	tbl := e8m0Table()
	pairs := GP64()
	MOVQ(nb, pairs)
	SHRQ(U8(1), pairs)
	JZ(LabelRef("pairsdone"))
	Label("pairs")
	prefetch(wp, 34)
	for h := 0; h < 2; h++ {
		d := YMM()
		VBROADCASTSS(mxScaleAt(tbl, at(wp, 17*h), at(xp, 34*h)), d)
		p := iq4nlPairs(at(wp, 17*h+1), at(xp, 34*h+2), low4, kv)
		VPMADDWD(ones, p, p)
		VCVTDQ2PS(p, p)
		VFMADD231PS(p, d, acc[h])
	}
	ADDQ(U32(34), wp)
	ADDQ(U32(68), xp)
	DECQ(pairs)
	JNZ(LabelRef("pairs"))
	Label("pairsdone")
	VADDPS(acc[1], acc[0], acc[0])
	r := hsum8(acc[0])
	TESTQ(U32(1), nb)
	JZ(LabelRef("ret"))
	d := mxScaleAt(tbl, at(wp, 0), at(xp, 0))
	p := iq4nlPairs(at(wp, 1), at(xp, 2), low4, kv)
	VPMADDWD(ones, p, p)
	s := hsumInt(p)
	VCVTDQ2PS(s, s)
	VFMADD231SS(s, d, r)
	Label("ret")
	storeRet(r)
	VZEROUPPER()
	RET()
}

// kMinsSum returns, in the low lane of an XMM, kMins (the int32 sum of m_j*(b_2j + b_2j+1))
// for the mins in the bytes of u1 and the Q8_K bsums at xp+260: each min doubled to two int16
// words, VPMADDWD with the bsums, exact for any bsums.
func kMinsSum(u1, xp Register) VecVirtual {
	mn := XMM()
	VMOVQ(u1, mn)
	VPUNPCKLBW(mn, mn, mn)
	mw := YMM()
	VPMOVZXBW(mn, mw)
	VPMADDWD(at(xp, 260), mw, mw)
	return hsumInt(mw)
}

// wordScales returns the 8 byte scales of u0 as int16 words, in both 128-bit lanes (for
// cK4Shuf).
func wordScales(u0 Register) VecVirtual {
	sc := XMM()
	VMOVQ(u0, sc)
	scw := YMM()
	VPMOVZXBW(sc, scw.AsX())
	VINSERTI128(U8(1), scw.AsX(), scw, scw)
	return scw
}

// bitTo moves bit from of every byte of v to bit to (other bits are garbage), by a word shift
// that carries no bit across bytes into bit to; dst may be v.
func bitTo(v, dst VecVirtual, from, to int) {
	switch {
	case from > to:
		VPSRLW(U8(from-to), v, dst)
	case from < to:
		VPSLLW(U8(to-from), v, dst)
	default:
		if dst != v {
			VMOVDQA(v, dst)
		}
	}
}

func q5K() {
	wp, xp, nb := sig("q5KDotAVX2", "q5KDotAVX2 is ggml_vec_dot_q5_K_q8_K (AVX2) over nb super-blocks of w and x, as quant's\n"+
		"x86Q5K: the scaled quants in eight lanes, the min term summed as an integer and fused into a\n"+
		"scalar per super-block.")
	acc, summs := YMM(), XMM()
	VXORPS(acc, acc, acc)
	VXORPS(summs, summs, summs)
	low4, sixteen := load(cLow4), load(cSixteen)
	loopStart(nb)
	prefetch(wp, 176)

	// d = y.d * fp16(w.d), dmin = y.d * fp16(w.dmin); summs += -dmin * kMins (VFNMADD).
	h := XMM()
	VMOVD(at(wp, 0), h)
	VCVTPH2PS(h, h)
	yd := XMM()
	VBROADCASTSS(at(xp, 0), yd)
	VMULPS(yd, h, h)
	dmin := XMM()
	VMOVSHDUP(h, dmin)
	u0, u1 := kScalesMins(wp)
	mins := kMinsSum(u1, xp)
	VCVTDQ2PS(mins, mins)
	VFNMADD231SS(dmin, mins, summs)
	scw := wordScales(u0)

	// Pair j: the low nibbles of qs[32j..] with bit 2j of qh (sub-block 2j), the high ones with
	// bit 2j+1 (sub-block 2j+1); 5-bit quants times int8 in VPMADDUBSW are exact.
	qh := YMM()
	VMOVDQU(at(wp, 16), qh)
	var sum VecVirtual
	for j := 0; j < 4; j++ {
		lo, hi, b := YMM(), YMM(), YMM()
		VMOVDQU(at(wp, 48+32*j), lo)
		VPSRLW(U8(4), lo, hi)
		VPAND(low4, lo, lo)
		VPAND(low4, hi, hi)
		bitTo(qh, b, 2*j, 4)
		VPAND(sixteen, b, b)
		VPOR(b, lo, lo)
		bitTo(qh, b, 2*j+1, 4)
		VPAND(sixteen, b, b)
		VPOR(b, hi, hi)
		VPMADDUBSW(at(xp, 4+64*j), lo, lo)
		VPMADDUBSW(at(xp, 4+64*j+32), hi, hi)
		sl, sh := YMM(), YMM()
		VPSHUFB(cK4Shuf.Offset(32*(2*j)), scw, sl)
		VPSHUFB(cK4Shuf.Offset(32*(2*j+1)), scw, sh)
		VPMADDWD(sl, lo, lo)
		VPMADDWD(sh, hi, hi)
		VPADDD(hi, lo, lo)
		if j == 0 {
			sum = lo
		} else {
			VPADDD(lo, sum, sum)
		}
	}
	VCVTDQ2PS(sum, sum)
	d := YMM()
	VBROADCASTSS(h, d)
	VFMADD231PS(sum, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{176, 292})
	finishSumms(acc, summs)
}

// k2BitLanes returns the eight int32 lanes of the 2-bit quants of one 128-element half of a
// Q2_K/Q3_K block (qs at qm, group g in bits 2g, 2g+1 of every byte) times the activation at
// xp+4+128*half, the 16 int8 scales (both 128-bit lanes of scb) applied per sub-block. hmask,
// if valid, holds Q3_K's high bits: where bit 4*half+g is clear, 4 is subtracted.
func k2BitLanes(qm Mem, xp Register, half int, scb, three, four VecVirtual, hmask VecVirtual) VecVirtual {
	qs := YMM()
	VMOVDQU(qm, qs)
	var sum VecVirtual
	for g := 0; g < 4; g++ {
		q := YMM()
		if g == 0 {
			VPAND(three, qs, q)
		} else {
			VPSRLW(U8(2*g), qs, q)
			VPAND(three, q, q)
		}
		y := at(xp, 4+128*half+32*g)
		VPMADDUBSW(y, q, q)
		if hmask != nil {
			m := YMM()
			bitTo(hmask, m, 4*half+g, 2)
			VPANDN(four, m, m) // 4 where the bit is clear
			VPMADDUBSW(y, m, m)
			VPSUBW(m, q, q)
		}
		s := YMM()
		VPSHUFB(cQ6Shuf.Offset(32*(4*half+g)), scb, s)
		VPSRAW(U8(8), s, s)
		VPMADDWD(s, q, q)
		if g == 0 {
			sum = q
		} else {
			VPADDD(q, sum, sum)
		}
	}
	return sum
}

func q3K() {
	wp, xp, nb := sig("q3KDotAVX2", "q3KDotAVX2 is ggml_vec_dot_q3_K_q8_K (AVX2) over nb super-blocks of w and x, as quant's\n"+
		"x86Q3K.")
	acc := YMM()
	VXORPS(acc, acc, acc)
	three, four := load(cThree), load(cFour)
	loopStart(nb)
	prefetch(wp, 110)

	g := GP32()
	MOVWLZX(at(wp, 108), g)
	h := XMM()
	VMOVD(g, h)
	VCVTPH2PS(h, h)
	VMULSS(at(xp, 0), h, h)
	d := YMM()
	VBROADCASTSS(h, d)

	// The 16 6-bit scales: low nibbles from bytes 0..7, high bits from bytes 8..11 (ggml's
	// kmask shuffle), minus 32, as int8 in both 128-bit lanes.
	a0, a1, a2 := GP64(), GP64(), GP64()
	MOVL(at(wp, 96), a0.As32())
	MOVL(at(wp, 100), a1.As32())
	MOVL(at(wp, 104), a2.As32())
	var sc [4]Register
	for k := 0; k < 4; k++ {
		lo, top := GP64(), GP64()
		src := a0
		if k%2 == 1 {
			src = a1
		}
		MOVL(src.As32(), lo.As32())
		if k >= 2 {
			SHRL(U8(4), lo.As32())
		}
		ANDL(U32(0x0f0f0f0f), lo.As32())
		// Bits 2k, 2k+1 of the bytes of a2 to bits 4, 5.
		MOVL(a2.As32(), top.As32())
		switch {
		case 2*k < 4:
			SHLL(U8(4-2*k), top.As32())
		case 2*k > 4:
			SHRL(U8(2*k-4), top.As32())
		}
		ANDL(U32(0x30303030), top.As32())
		ORL(top.As32(), lo.As32())
		sc[k] = lo
	}
	SHLQ(U8(32), sc[1])
	ORQ(sc[1], sc[0])
	SHLQ(U8(32), sc[3])
	ORQ(sc[3], sc[2])
	sx := XMM()
	VMOVQ(sc[0], sx)
	VPINSRQ(U8(1), sc[2], sx, sx)
	VPSUBB(cThirty2, sx, sx)
	scb := YMM()
	VINSERTI128(U8(1), sx, sx.AsY(), scb)

	// q = (2 bits) - 4 + 4*hbit: VPMADDUBSW of the 2 bits minus that of 4 where hbit is clear,
	// both exact.
	hm := YMM()
	VMOVDQU(at(wp, 0), hm)
	s0 := k2BitLanes(at(wp, 32), xp, 0, scb, three, four, hm)
	s1 := k2BitLanes(at(wp, 64), xp, 1, scb, three, four, hm)
	VPADDD(s1, s0, s0)
	VCVTDQ2PS(s0, s0)
	VFMADD231PS(s0, d, acc)
	loopEnd(nb, []Register{wp, xp}, []int{110, 292})
	finish32(acc)
}

// The Q2_K kernels: ggml_vec_dot_q2_K_q8_K, and one row of the repacked (8-row interleaved)
// products ggml_gemv_q2_K_8x8_q8_K and ggml_gemm_q2_K_8x8_q8_K.
const (
	q2KVec = iota
	q2KRepack
	q2KRepackGemm
)

func q2K() {
	q2KKernel("q2KDotAVX2", "q2KDotAVX2 is ggml_vec_dot_q2_K_q8_K (AVX2) over nb super-blocks of w and x, as quant's\n"+
		"x86Q2K: per super-block the min term in eight lanes of two sub-blocks each, fused with\n"+
		"-dmin, then the scaled quants fused with d, into one set of lanes.", q2KVec)
	q2KKernel("q2KRepackAVX2", "q2KRepackAVX2 is the product of one row of llama.cpp's repacked Q2_K with nb super-blocks of x\n"+
		"as ggml_gemv_q2_K_8x8_q8_K computes it (quant's x86RepackQ2K): per super-block one fused\n"+
		"multiply-add of the scaled integer sum and one of the min term, in two accumulators\n"+
		"subtracted at the end.", q2KRepack)
	q2KKernel("q2KRepackGemmAVX2", "q2KRepackGemmAVX2 is q2KRepackAVX2 as ggml_gemm_q2_K_8x8_q8_K computes it (quant's\n"+
		"x86RepackGemmQ2K), with the fused multiply-adds per 128-element half.", q2KRepackGemm)
}

func q2KKernel(name, doc string, mode int) {
	wp, xp, nb := sig(name, doc)
	acc := YMM()
	VXORPS(acc, acc, acc)
	accm := XMM()
	VXORPS(accm, accm, accm)
	low4, three := load(cLow4), load(cThree)
	loopStart(nb)
	prefetch(wp, 84)

	// d = y.d * fp16(w.d), dmin = y.d * fp16(w.dmin).
	h := XMM()
	VMOVD(at(wp, 80), h)
	VCVTPH2PS(h, h)
	yd := XMM()
	VBROADCASTSS(at(xp, 0), yd)
	VMULPS(yd, h, h)
	dmin := XMM()
	VMOVSHDUP(h, dmin)

	// Mins (high nibbles) times bsums: lane l = m_2l*b_2l + m_2l+1*b_2l+1, exact.
	scx, mx := XMM(), XMM()
	VMOVDQU(at(wp, 0), scx)
	VPSRLW(U8(4), scx, mx)
	VPAND(low4.AsX(), mx, mx)
	mw := YMM()
	VPMOVZXBW(mx, mw)
	VPMADDWD(at(xp, 260), mw, mw)
	// Scales (low nibbles) as int8 in both 128-bit lanes.
	VPAND(low4.AsX(), scx, scx)
	scb := YMM()
	VINSERTI128(U8(1), scx, scx.AsY(), scb)

	if mode == q2KVec {
		// The min term first, fused with -dmin (VFNMADD: -(dmin*m)+acc, as x86.go's
		// fma32(-yd*dmin, m, acc)).
		VCVTDQ2PS(mw, mw)
		dm := YMM()
		VBROADCASTSS(dmin, dm)
		VFNMADD231PS(mw, dm, acc)
	}
	s0 := k2BitLanes(at(wp, 16), xp, 0, scb, three, nil, nil)
	s1 := k2BitLanes(at(wp, 48), xp, 1, scb, three, nil, nil)
	switch mode {
	case q2KVec:
		VPADDD(s1, s0, s0)
		VCVTDQ2PS(s0, s0)
		d := YMM()
		VBROADCASTSS(h, d)
		VFMADD231PS(s0, d, acc)
	case q2KRepack:
		VPADDD(s1, s0, s0)
		sum := hsumInt(s0)
		VCVTDQ2PS(sum, sum)
		VFMADD231SS(h, sum, acc.AsX())
		m := hsumInt(mw)
		VCVTDQ2PS(m, m)
		VFMADD231SS(dmin, m, accm)
	case q2KRepackGemm:
		// [sum half 0, sum half 1, min half 0, min half 1] by a VPHADDD tree (the int32 sums
		// are exact in any order), then the fused multiply-adds in half order.
		VPHADDD(s1, s0, s0)
		a := XMM()
		VEXTRACTI128(U8(1), s0, a)
		VPADDD(s0.AsX(), a, a)
		b := XMM()
		VEXTRACTI128(U8(1), mw, b)
		VPHADDD(b, mw.AsX(), b)
		VPHADDD(b, a, a)
		VCVTDQ2PS(a, a)
		t := XMM()
		VFMADD231SS(h, a, acc.AsX())
		VMOVHLPS(a, a, t)
		VFMADD231SS(dmin, t, accm)
		VMOVSHDUP(a, t)
		VFMADD231SS(h, t, acc.AsX())
		VMOVHLPS(a, a, t)
		VMOVSHDUP(t, t)
		VFMADD231SS(dmin, t, accm)
	}
	loopEnd(nb, []Register{wp, xp}, []int{84, 292})
	if mode == q2KVec {
		finish32(acc)
		return
	}
	r := acc.AsX()
	VSUBSS(accm, r, r)
	storeRet(r)
	VZEROUPPER()
	RET()
}

// The float kernels: quant's x86F32Vec, x86F32Gemm, x86F16Vec, x86F16Gemm, x86BF16Vec and
// x86BF16Gemm. Their 16-lane accumulators (AVX-512 registers in llama.cpp's zen4 build) are
// pairs of YMM registers, lanes 0..7 and 8..15: every lane sees the same fused multiply-adds,
// and _mm512_reduce_add_ps (quant's hsum16) adds the upper eight lanes to the lower eight
// before hsum_float_8.

type floatKind int

const (
	kindF32 floatKind = iota
	kindF16
)

func (k floatKind) size() int {
	if k == kindF32 {
		return 4
	}
	return 2
}

// fma8 fuses the products of the 8 elements of w and x from element e into acc.
func fma8(k floatKind, wp, xp Register, e int, acc VecVirtual) {
	a := YMM()
	if k == kindF32 {
		VMOVUPS(at(wp, 4*e), a)
		VFMADD231PS(at(xp, 4*e), a, acc)
		return
	}
	b := YMM()
	VCVTPH2PS(at(wp, 2*e), a)
	VCVTPH2PS(at(xp, 2*e), b)
	VFMADD231PS(b, a, acc)
}

// hsum16 is _mm512_reduce_add_ps of the 16 lanes lo, hi: hi+lo, then hsum_float_8.
func hsum16(lo, hi VecVirtual) VecVirtual {
	VADDPS(hi, lo, lo)
	return hsum8(lo)
}

// floatSig declares a float kernel over n elements of w and x (or its many-row variant, whose
// nb is the elements: a float type's block is one).
func floatSig(name, doc string) (wp, xp, n Register) {
	if many != nil {
		return many.sig(name)
	}
	TEXT(name, NOSPLIT, "func(w, x []byte, n int) float32")
	Pragma("noescape")
	Doc(strings.Split(doc, "\n")...)
	wp = Load(Param("w").Base(), GP64())
	xp = Load(Param("x").Base(), GP64())
	n = Load(Param("n"), GP64())
	return
}

func zeros(k int) []VecVirtual {
	v := make([]VecVirtual, k)
	for i := range v {
		v[i] = YMM()
		VXORPS(v[i], v[i], v[i])
	}
	return v
}

// floatLoop runs body over n/step steps, advancing wp and xp by stride bytes each.
func floatLoop(label string, n Register, step, stride int, wp, xp Register, body func()) {
	c := GP64()
	MOVQ(n, c)
	SHRQ(U8(uint8(bitsOf(step))), c)
	JZ(LabelRef(label + "done"))
	Label(label)
	body()
	ADDQ(U32(stride), wp)
	ADDQ(U32(stride), xp)
	DECQ(c)
	JNZ(LabelRef(label))
	Label(label + "done")
}

func bitsOf(step int) int {
	b := 0
	for 1<<b < step {
		b++
	}
	if 1<<b != step {
		panic("step")
	}
	return b
}

func floats() {
	for _, k := range []floatKind{kindF32, kindF16} {
		name, typ := "f32", "F32"
		if k == kindF16 {
			name, typ = "f16", "F16"
		}
		floatVec(k, name+"VecAVX2", name+"VecAVX2 is quant's x86"+typ+"Vec (ggml_vec_dot_"+name+", AVX-512) over n elements of w and x.")
		floatGemm(k, name+"GemmAVX2", name+"GemmAVX2 is quant's x86"+typ+"Gemm (tinyBLAS, AVX-512) over n elements of w and x, n a\n"+
			"multiple of 16.")
	}
	bf16Vec()
	bf16Gemm()
}

func floatGemm(k floatKind, name, doc string) {
	wp, xp, n := floatSig(name, doc)
	acc := zeros(2)
	floatLoop("loop", n, 16, 16*k.size(), wp, xp, func() {
		prefetch(wp, 16*k.size())
		fma8(k, wp, xp, 0, acc[0])
		fma8(k, wp, xp, 8, acc[1])
	})
	storeRet(hsum16(acc[0], acc[1]))
	VZEROUPPER()
	RET()
}

// floatVec is ggml_vec_dot_f32/f16: four 16-lane accumulators over steps of 64 elements,
// folded 0+2, 1+3, 0+1 and reduced; then the rest. F32: the products of the elements up to
// the last multiple of 8 rounded and added one by one, the remaining ones fused. F16: the
// reduced sum and the rest's rounded products added in float64.
func floatVec(k floatKind, name, doc string) {
	wp, xp, n := floatSig(name, doc)
	acc := zeros(8) // accumulator j: acc[2j] lanes 0..7, acc[2j+1] lanes 8..15
	floatLoop("loop", n, 64, 64*k.size(), wp, xp, func() {
		prefetch(wp, 64*k.size())
		for i := 0; i < 8; i++ {
			fma8(k, wp, xp, 8*i, acc[i])
		}
	})
	for h := 0; h < 2; h++ {
		VADDPS(acc[4+h], acc[h], acc[h])
		VADDPS(acc[6+h], acc[2+h], acc[2+h])
		VADDPS(acc[2+h], acc[h], acc[h])
	}
	sum := hsum16(acc[0], acc[1])
	rem := GP64()
	MOVQ(n, rem)
	ANDQ(U8(63), rem)
	a := XMM()
	if k == kindF32 {
		r8 := GP64()
		MOVQ(rem, r8)
		ANDQ(U8(7), rem)
		SHRQ(U8(3), r8)
		SHLQ(U8(3), r8)
		JZ(LabelRef("fused"))
		Label("rounded")
		VMOVSS(at(wp, 0), a)
		VMULSS(at(xp, 0), a, a)
		VADDSS(a, sum, sum)
		ADDQ(U8(4), wp)
		ADDQ(U8(4), xp)
		DECQ(r8)
		JNZ(LabelRef("rounded"))
		Label("fused")
		TESTQ(rem, rem)
		JZ(LabelRef("ret"))
		Label("fusedloop")
		VMOVSS(at(wp, 0), a)
		VFMADD231SS(at(xp, 0), a, sum)
		ADDQ(U8(4), wp)
		ADDQ(U8(4), xp)
		DECQ(rem)
		JNZ(LabelRef("fusedloop"))
		Label("ret")
		storeRet(sum)
		VZEROUPPER()
		RET()
		return
	}
	sd := XMM()
	VCVTSS2SD(sum, sd, sd)
	TESTQ(rem, rem)
	JZ(LabelRef("ret"))
	b := XMM()
	Label("tail")
	halfAt(at(wp, 0), a)
	halfAt(at(xp, 0), b)
	VMULSS(b, a, a)
	VCVTSS2SD(a, a, a)
	VADDSD(a, sd, sd)
	ADDQ(U8(2), wp)
	ADDQ(U8(2), xp)
	DECQ(rem)
	JNZ(LabelRef("tail"))
	Label("ret")
	VCVTSD2SS(sd, sd, sd)
	storeRet(sd)
	VZEROUPPER()
	RET()
}

// halfAt widens the fp16 at m into the low lane of dst.
func halfAt(m Mem, dst VecVirtual) {
	g := GP32()
	MOVWLZX(m, g)
	VMOVD(g, dst)
	VCVTPH2PS(dst, dst)
}

// The BF16 kernels reproduce VDPBF16PS (AVX512-BF16) as quant's dpbf16 describes it: per
// float32 lane, the odd bfloat16 pair then the even one fused into the accumulator, inputs
// with a zero exponent read as zero and results with a zero exponent flushed to zero, signs
// kept.

// dazW zeroes (keeping the sign) the bfloat16 words of v whose exponent is zero.
func dazW(v, zero, expW, absW VecVirtual) {
	m := YMM()
	VPAND(expW, v, m)
	VPCMPEQW(zero, m, m)
	VPAND(absW, m, m)
	VPANDN(v, m, v)
}

// ftzD flushes (keeping the sign) the float32 lanes of v whose exponent is zero.
func ftzD(v, zero, expD, absD VecVirtual) {
	m := YMM()
	VPAND(expD, v, m)
	VPCMPEQD(zero, m, m)
	VPAND(absD, m, m)
	VPANDN(v, m, v)
}

type bf16Consts struct{ zero, expW, absW, expD, absD, high VecVirtual }

func loadBF16Consts() bf16Consts {
	var c bf16Consts
	c.zero = YMM()
	VPXOR(c.zero, c.zero, c.zero)
	c.expW, c.absW, c.expD, c.absD, c.high = load(cExpW), load(cAbsW), load(cExpD), load(cAbsD), load(cHighW)
	return c
}

// dpbf16 is VDPBF16PS of the 16 bfloat16 pairs at wm and xm into the 8 lanes of acc.
func dpbf16(wm, xm Mem, acc VecVirtual, c bf16Consts) {
	w, x := YMM(), YMM()
	VMOVDQU(wm, w)
	VMOVDQU(xm, x)
	dazW(w, c.zero, c.expW, c.absW)
	dazW(x, c.zero, c.expW, c.absW)
	wo, xo := YMM(), YMM()
	VPAND(c.high, w, wo)
	VPAND(c.high, x, xo)
	VFMADD231PS(xo, wo, acc)
	ftzD(acc, c.zero, c.expD, c.absD)
	VPSLLD(U8(16), w, w)
	VPSLLD(U8(16), x, x)
	VFMADD231PS(x, w, acc)
	ftzD(acc, c.zero, c.expD, c.absD)
}

func bf16Gemm() {
	wp, xp, n := floatSig("bf16GemmAVX2", "bf16GemmAVX2 is quant's x86BF16Gemm (tinyBLAS with AVX512-BF16) over n elements of w and x,\n"+
		"n a multiple of 32: lane l of 16 takes the pair 2l, 2l+1 of every 32 elements.")
	c := loadBF16Consts()
	acc := zeros(2)
	floatLoop("loop", n, 32, 64, wp, xp, func() {
		prefetch(wp, 64)
		dpbf16(at(wp, 0), at(xp, 0), acc[0], c)
		dpbf16(at(wp, 32), at(xp, 32), acc[1], c)
	})
	storeRet(hsum16(acc[0], acc[1]))
	VZEROUPPER()
	RET()
}

func bf16Vec() {
	wp, xp, n := floatSig("bf16VecAVX2", "bf16VecAVX2 is quant's x86BF16Vec (ggml_vec_dot_bf16 with AVX512-BF16) over n elements of w\n"+
		"and x: two sets of 16 VDPBF16PS lanes for the halves of every 64 elements, each reduced\n"+
		"and added in float64, then the remaining products (float32) added in float64.")
	c := loadBF16Consts()
	acc := zeros(4)
	floatLoop("loop", n, 64, 128, wp, xp, func() {
		prefetch(wp, 128)
		for i := 0; i < 4; i++ {
			dpbf16(at(wp, 32*i), at(xp, 32*i), acc[i], c)
		}
	})
	s0 := hsum16(acc[0], acc[1])
	s1 := hsum16(acc[2], acc[3])
	sd, t := XMM(), XMM()
	VCVTSS2SD(s0, sd, sd)
	VCVTSS2SD(s1, t, t)
	VADDSD(t, sd, sd)
	rem := GP64()
	MOVQ(n, rem)
	ANDQ(U8(63), rem)
	JZ(LabelRef("ret"))
	a, b := XMM(), XMM()
	g := GP32()
	Label("tail")
	MOVWLZX(at(wp, 0), g)
	SHLL(U8(16), g)
	VMOVD(g, a)
	MOVWLZX(at(xp, 0), g)
	SHLL(U8(16), g)
	VMOVD(g, b)
	VMULSS(b, a, a)
	VCVTSS2SD(a, a, a)
	VADDSD(a, sd, sd)
	ADDQ(U8(2), wp)
	ADDQ(U8(2), xp)
	DECQ(rem)
	JNZ(LabelRef("tail"))
	Label("ret")
	VCVTSD2SS(sd, sd, sd)
	storeRet(sd)
	VZEROUPPER()
	RET()
}
