package main

import (
	"fmt"

	"github.com/mmcloughlin/avo/attr"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The tile kernels (-set tile: quant/tile_avx2_amd64.s) compute a tile of a matrix product,
// eight consecutive weight rows against T activation rows, for the weight types llama.cpp
// repacks into interleaved groups of eight rows. Its repacked products keep one float32
// accumulator per row and fuse one product per block (Q4_0, MXFP4) or per super-block or pair
// of sub-blocks (Q4_K) into it; the eight rows of a tile are the eight float lanes of one
// register here, so every output sees exactly the fused multiply-adds of quant's one-row
// repacked kernels, in the same order. What a tile saves is work, not arithmetic: each weight
// block is decoded once for all T activation rows, and each activation block is read once
// for eight weight rows.
//
// The accumulators live in acc (T rows of eight floats, zeroed by the caller), so that T is
// not bounded by the register file; the caller scatters them into the product's output.

func init() { sets["tile"] = tiles }

func tiles() {
	tileConsts()
	q4_0Tile()
	q4KTile("q4KTile8AVX2", false)
	q4KTile("q4KTile8GemmAVX2", true)
	q8_0Tile()
	q6KTile()
	q5KTile()
	mxfp4Tile()
}

var (
	tOnes16  Mem // int16 1
	tLow4    Mem // bytes 0x0f
	tDword63 Mem // int32 63 (broadcast from 4 bytes)
	tDword15 Mem // int32 15
	tDword3  Mem // int32 3
	tThirty  Mem // bytes 0x30 (the two high bits of a Q6_K quant, in place)
	tQ6Shuf  Mem // cQ6Shuf
	tK4Shuf  Mem // cK4Shuf
	tSixteen Mem // bytes 0x10
	tMXFP4   Mem // kvalues_mxfp4 + 12 (unsigned), in both 128-bit lanes
	tDword1  Mem // int32 1
	tDword2  Mem // int32 2
	tSubE8M0 Mem // int32 0x00200000: GGML_E8M0_TO_FP32_HALF(0), a subnormal
)

func tileConsts() {
	tOnes16 = splat("tileones16", 1, 0)
	tLow4 = splat("tilelow4", 0x0f)
	tDword63 = splat("tiledword63", 63, 0, 0, 0)
	tDword15 = splat("tiledword15", 15, 0, 0, 0)
	tDword3 = splat("tiledword3", 3, 0, 0, 0)
	tThirty = splat("tilethirty", 0x30)
	tQ6Shuf = table("tileq6shuf", q6ShufBytes())
	tK4Shuf = table("tilek4shuf", k4ShufBytes())
	tSixteen = splat("tilesixteen", 0x10)
	mx := []int{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	kv := make([]byte, 32)
	for i := range kv {
		kv[i] = byte(mx[i%16] + 12)
	}
	tMXFP4 = table("tilemxfp4", kv)
	tDword1 = splat("tiledword1", 1, 0, 0, 0)
	tDword2 = splat("tiledword2", 2, 0, 0, 0)
	tSubE8M0 = splat("tilesube8m0", 0, 0, 0x20, 0)
}

// tileArgs are the arguments every tile kernel takes.
type tileArgs struct {
	w0, w4, ldw, l3 Register // rows 0 and 4 of the tile, the row stride and three times it
	pf              Register // where prefetchRows reads the next tile
	x, ldx          Register // activation row 0 at the current block, and the row stride
	// aux points at the current block's activation terms (one per activation row, blocks
	// one after the other); loaded only by the tiles that take them.
	aux Register
	nb  Op  // blocks left: a register, or a local of the kernels that run short of them
	T   Mem // activation rows, in the argument frame (loaded by each loop over them)
	acc Register
}

// Kinds of tile kernel, by the registers they need (tileSig).
const (
	tileRows    = iota // addresses the eight rows together (row, rowScales): w4, l3
	tileRowLoop        // walks the rows one at a time from w0 and keeps nb on the stack
)

// tileSig declares a tile kernel and loads its arguments:
//
//	func(w []byte, ldw int, x []byte, ldx int, aux []int32, nb, T int, acc []float32)
//
// Kernels with a frame too large for NOSPLIT give flags 0.
func tileSig(name, doc string, kind int, flags attr.Attribute) tileArgs {
	TEXT(name, flags, "func(w []byte, ldw int, x []byte, ldx int, aux []int32, nb int, T int, acc []float32)")
	Pragma("noescape")
	Doc(doc)
	var a tileArgs
	a.w0 = Load(Param("w").Base(), GP64())
	a.ldw = Load(Param("ldw"), GP64())
	a.x = Load(Param("x").Base(), GP64())
	a.ldx = Load(Param("ldx"), GP64())
	a.T = paramMem("T")
	a.acc = Load(Param("acc").Base(), GP64())
	a.pf = GP64()
	LEAQ(Mem{Base: a.w0, Index: a.ldw, Scale: 8}, a.pf)
	switch kind {
	case tileRows:
		a.nb = Load(Param("nb"), GP64())
		a.w4, a.l3 = GP64(), GP64()
		LEAQ(Mem{Base: a.w0, Index: a.ldw, Scale: 4}, a.w4)
		LEAQ(Mem{Base: a.ldw, Index: a.ldw, Scale: 2}, a.l3)
	case tileRowLoop:
		nb := AllocLocal(8)
		g := Load(Param("nb"), GP64())
		MOVQ(g, nb)
		a.nb = nb
	}
	return a
}

// paramMem is the argument's slot in the frame.
func paramMem(name string) Mem {
	b, err := Param(name).Resolve()
	if err != nil {
		panic(err)
	}
	return b.Addr
}

// empty jumps to done when there are no blocks or no activation rows.
func (a tileArgs) empty() {
	CMPQ(a.nb, U8(0))
	JEQ(LabelRef("done"))
	CMPQ(a.T, U8(0))
	JEQ(LabelRef("done"))
}

// row returns the address of byte off of tile row r at the current block.
func (a tileArgs) row(r, off int) Mem {
	base := a.w0
	if r >= 4 {
		base, r = a.w4, r-4
	}
	switch r {
	case 0:
		return Mem{Base: base, Disp: off}
	case 1:
		return Mem{Base: base, Index: a.ldw, Scale: 1, Disp: off}
	case 2:
		return Mem{Base: base, Index: a.ldw, Scale: 2, Disp: off}
	}
	return Mem{Base: base, Index: a.l3, Scale: 1, Disp: off}
}

// advance moves the row pointers on by one block of size bytes.
func (a tileArgs) advance(size int) {
	ADDQ(U32(size), a.w0)
	if a.w4 != nil {
		ADDQ(U32(size), a.w4)
	}
	ADDQ(U32(8*size), a.pf)
}

// prefetchRows asks for the cache lines of the next tile's rows, for a block of size bytes.
// A decoded token streams its weights from memory, eight rows at a time here, which the
// hardware prefetchers alone follow poorly. The rows of a matrix lie one after the other, so
// the next tile is the 8*ldw bytes after this one, and reading them in order at eight blocks'
// bytes per block reaches its end as this tile ends: about one tile's work ahead.
func (a tileArgs) prefetchRows(size int) {
	for off := 0; off < 8*size; off += 64 {
		PREFETCHT0(Mem{Base: a.pf, Disp: off})
	}
}

// rowScales returns the eight rows' float16 scales at byte off of their blocks as float32
// lanes.
func (a tileArgs) rowScales(off int) VecVirtual {
	h := XMM()
	g := GP32()
	MOVWLZX(a.row(0, off), g)
	VMOVD(g, h)
	for r := 1; r < 8; r++ {
		VPINSRW(U8(r), a.row(r, off), h, h)
	}
	d := YMM()
	VCVTPH2PS(h, d)
	return d
}

// rowSums8 returns the sums of the eight int32 lanes of each of the registers row(0) ..
// row(7) as the eight lanes of one register (lane r: the sum of row(r)), with a VPHADDD tree
// that asks for each row's register only when it needs it, so that no more than four are live.
// Integer sums are exact in any order.
func rowSums8(row func(r int) VecVirtual) VecVirtual {
	// [p0 01, p0 23, p1 01, p1 23 | p0 45, p0 67, p1 45, p1 67], and so on up the tree.
	quad := func(r int) VecVirtual {
		a := row(r)
		VPHADDD(row(r+1), a, a)
		b := row(r + 2)
		VPHADDD(row(r+3), b, b)
		VPHADDD(b, a, a) // [p_r..p_r+3 low halves | p_r..p_r+3 high halves]
		return a
	}
	lo, hi := quad(0), quad(4)
	s := YMM()
	VPERM2I128(U8(0x20), hi, lo, s)
	VPERM2I128(U8(0x31), hi, lo, lo)
	VPADDD(lo, s, s)
	return s
}

// transpose4x8 returns the four dwords of each of eight rows of 16 bytes (row r at m(r)) as
// four registers: register j holds dword j of row r in dword lane r. Rows 0-3 go to the low
// 128-bit lane and rows 4-7 to the high one, and a 4x4 dword transpose within each lane
// (VPUNPCK*DQ, VPUNPCK*QDQ) does the rest.
func transpose4x8(m func(r int) Mem) [4]VecVirtual {
	var a [4]VecVirtual
	for r := range a {
		lo := XMM()
		VMOVDQU(m(r), lo)
		a[r] = YMM()
		VINSERTI128(U8(1), m(r+4), lo.AsY(), a[r])
	}
	t0, t1, t2, t3 := YMM(), YMM(), YMM(), YMM()
	VPUNPCKLDQ(a[1], a[0], t0) // [r0 d0, r1 d0, r0 d1, r1 d1]
	VPUNPCKHDQ(a[1], a[0], t1) // [r0 d2, r1 d2, r0 d3, r1 d3]
	VPUNPCKLDQ(a[3], a[2], t2)
	VPUNPCKHDQ(a[3], a[2], t3)
	var q [4]VecVirtual
	q[0], q[1], q[2], q[3] = a[0], a[1], a[2], a[3]
	VPUNPCKLQDQ(t2, t0, q[0]) // [r0 d0, r1 d0, r2 d0, r3 d0]
	VPUNPCKHQDQ(t2, t0, q[1])
	VPUNPCKLQDQ(t3, t1, q[2])
	VPUNPCKHQDQ(t3, t1, q[3])
	return q
}

// q4_0Tile is the Q4_0 tile: gemv_q4_b32_8x8_q8_0 and its GEMM, whose results are those of
// quant's x86RepackQ4_0 for each row. The eight rows' quants are interleaved four at a time as
// llama.cpp's repacking lays them out (register j: elements 4j..4j+3 of every row), so that
// VPMADDUBSW against the activation's elements 4j..4j+3, broadcast, leaves each row's products
// in its own lanes. The eight registers' int16 pair sums add up without overflow (at most
// 8*2*15*128 = 30720), and VPMADDWD finishes each row's sum in its dword. aux holds 8 times the
// sum of each activation block's quants, so that (q-8)·y is q·y less the block's term.
func q4_0Tile() {
	a := tileSig("q4_0Tile8AVX2", "q4_0Tile8AVX2 adds eight rows of repacked Q4_0 times T activation rows into acc.", tileRows, attr.NOSPLIT)
	a.aux = Load(Param("aux").Base(), GP64())
	a.empty()
	Label("block")
	a.prefetchRows(1)
	raw := transpose4x8(func(r int) Mem { return a.row(r, 2) })
	// Elements 0..15 are the low nibbles of the block's bytes, 16..31 the high ones.
	var q [8]VecVirtual
	for j := 0; j < 4; j++ {
		q[j+4] = YMM()
		VPSRLW(U8(4), raw[j], q[j+4])
		VPAND(tLow4, q[j+4], q[j+4])
		q[j] = raw[j]
		VPAND(tLow4, q[j], q[j])
	}
	dw := a.rowScales(0)

	xt, acct, t := GP64(), GP64(), GP64()
	MOVQ(a.x, xt)
	MOVQ(a.acc, acct)
	MOVQ(a.T, t)
	Label("token")
	s := YMM()
	for j := range q {
		y := YMM()
		VPBROADCASTD(Mem{Base: xt, Disp: 2 + 4*j}, y)
		if j == 0 {
			VPMADDUBSW(y, q[j], s)
			continue
		}
		VPMADDUBSW(y, q[j], y)
		VPADDW(y, s, s)
	}
	VPMADDWD(tOnes16, s, s)
	off := YMM()
	VPBROADCASTD(Mem{Base: a.aux}, off)
	VPSUBD(off, s, s)
	VCVTDQ2PS(s, s)
	hx := XMM()
	VPBROADCASTW(Mem{Base: xt}, hx)
	d := YMM()
	VCVTPH2PS(hx, d)
	VMULPS(d, dw, d) // fp16(w.d) * fp16(x.d), as the one-row kernel rounds it
	acc := YMM()
	VMOVUPS(Mem{Base: acct}, acc)
	VFMADD231PS(s, d, acc)
	VMOVUPS(acc, Mem{Base: acct})
	ADDQ(a.ldx, xt)
	ADDQ(U8(4), a.aux) // the next activation row's term, or the next block's first
	ADDQ(U8(32), acct)
	DECQ(t)
	JNZ(LabelRef("token"))

	a.advance(18)
	ADDQ(U8(34), a.x)
	DECQ(a.nb)
	JNZ(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// mxfp4Tile is the MXFP4 tile: gemv_q4_b32_8x8_q8_0_lut_avx<block_mxfp4x8> and its GEMM,
// whose results are those of quant's x86RepackMXFP4 for each row. As q4_0Tile, with the
// indices looked up in kvalues_mxfp4 + 12 (0..24, unsigned for VPMADDUBSW) and aux holding 12
// times the sum of each activation block's quants, which takes the offset back out: exact for
// any bytes. A pair of products is at most 2*24*128 = 6144 in magnitude, so four registers'
// int16 sums cannot overflow, and each four are widened by VPMADDWD before they are added.
// The rows' scales are GGML_E8M0_TO_FP32_HALF of their E8M0 bytes, computed in the lanes:
// (e-1)<<23, or 0x200000<<e for the two bytes whose scale is subnormal.
func mxfp4Tile() {
	a := tileSig("mxfp4Tile8AVX2", "mxfp4Tile8AVX2 adds eight rows of repacked MXFP4 times T activation rows into acc.", tileRows, attr.NOSPLIT)
	a.aux = Load(Param("aux").Base(), GP64())
	a.empty()
	Label("block")
	a.prefetchRows(17)
	raw := transpose4x8(func(r int) Mem { return a.row(r, 1) })
	// Elements 0..15 are the low nibbles of the block's bytes, 16..31 the high ones.
	lut := YMM()
	VMOVDQU(tMXFP4, lut)
	var q [8]VecVirtual
	for j := 0; j < 4; j++ {
		q[j+4] = YMM()
		VPSRLW(U8(4), raw[j], q[j+4])
		VPAND(tLow4, q[j+4], q[j+4])
		VPSHUFB(q[j+4], lut, q[j+4])
		q[j] = raw[j]
		VPAND(tLow4, q[j], q[j])
		VPSHUFB(q[j], lut, q[j])
	}
	dw := a.rowE8M0()

	xt, acct, t := GP64(), GP64(), GP64()
	MOVQ(a.x, xt)
	MOVQ(a.acc, acct)
	MOVQ(a.T, t)
	Label("token")
	s, lo := YMM(), YMM()
	for j := range q {
		y := YMM()
		VPBROADCASTD(Mem{Base: xt, Disp: 2 + 4*j}, y)
		if j%4 == 0 {
			VPMADDUBSW(y, q[j], s)
			continue
		}
		VPMADDUBSW(y, q[j], y)
		VPADDW(y, s, s)
		if j == 3 {
			VPMADDWD(tOnes16, s, lo)
		}
	}
	VPMADDWD(tOnes16, s, s)
	VPADDD(lo, s, s)
	off := YMM()
	VPBROADCASTD(Mem{Base: a.aux}, off)
	VPSUBD(off, s, s)
	VCVTDQ2PS(s, s)
	hx := XMM()
	VPBROADCASTW(Mem{Base: xt}, hx)
	d := YMM()
	VCVTPH2PS(hx, d)
	VMULPS(d, dw, d) // the halved E8M0 scale times fp16(x.d), as the one-row kernel rounds it
	acc := YMM()
	VMOVUPS(Mem{Base: acct}, acc)
	VFMADD231PS(s, d, acc)
	VMOVUPS(acc, Mem{Base: acct})
	ADDQ(a.ldx, xt)
	ADDQ(U8(4), a.aux) // the next activation row's term, or the next block's first
	ADDQ(U8(32), acct)
	DECQ(t)
	JNZ(LabelRef("token"))

	a.advance(17)
	ADDQ(U8(34), a.x)
	DECQ(a.nb)
	JNZ(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// rowE8M0 returns GGML_E8M0_TO_FP32_HALF of the eight rows' E8M0 bytes (byte 0 of their
// blocks) as float32 lanes.
func (a tileArgs) rowE8M0() VecVirtual {
	h := XMM()
	g := GP32()
	MOVBLZX(a.row(0, 0), g)
	VMOVD(g, h)
	for r := 1; r < 8; r++ {
		VPINSRB(U8(r), a.row(r, 0), h, h)
	}
	e := YMM()
	VPMOVZXBD(h, e)
	big, small, m := YMM(), YMM(), YMM()
	VPSUBD(tDword1, e, big)
	VPSLLD(U8(23), big, big)
	VMOVDQU(tSubE8M0, small)
	VPSLLVD(e, small, small)
	VMOVDQU(tDword2, m)
	VPCMPGTD(e, m, m) // e < 2
	VPBLENDVB(m, small, big, big)
	return big
}

// Q4_K tiles. A tile token's accumulators (acc, T rows of q4KAccStride floats): the scaled
// sums' float lanes at 0, the min terms' at 8 (subtracted into 0 at the end, as the one-row
// kernel does), and the super-block's int32 sums at 16.
const q4KAccStride = 32

// q4KTile is the Q4_K tile: ggml_gemv_q4_K_8x8_q8_K (gemm false) or ggml_gemm_q4_K_8x8_q8_K
// (gemm true), whose results are those of quant's x86RepackQ4K and x86RepackGemmQ4K for each
// row. Per super-block, the eight rows' 6-bit scales and mins are unpacked together (a
// transpose of the blocks' first 16 bytes puts each row's scale bytes in its dword) into
// int16 pairs, so that VPMADDWD scales a sub-block's pair sums as it widens them. The quants
// are interleaved per 32-byte chunk as for Q4_0 and kept on the stack while the activation
// rows pass over them, first the low nibbles (sub-block 2c) then the high ones (2c+1).
func q4KTile(name string, gemm bool) {
	// Its stack frame is beyond what a NOSPLIT function may take.
	a := tileSig(name, name+" adds eight rows of repacked Q4_K times T activation rows into acc (q4KAccStride floats per row).", tileRows, 0)
	sc := AllocLocal(8 * 32)  // per sub-block: the rows' scales as int16 pairs
	mn := AllocLocal(8 * 32)  // and their mins
	raw := AllocLocal(8 * 32) // the current chunk's quants, interleaved
	dws := AllocLocal(2 * 32) // the rows' d and dmin as float32
	a.empty()
	Label("block")
	a.prefetchRows(144)

	// Scales and mins: s[0..3], s[4..7], s[8..11] of every row (dwords 1..3 of its block).
	head := transpose4x8(func(r int) Mem { return a.row(r, 0) })
	s0, s1, s2 := head[1], head[2], head[3]
	m63, m15, m3 := YMM(), YMM(), YMM()
	VPBROADCASTD(tDword63, m63)
	VPBROADCASTD(tDword15, m15)
	VPBROADCASTD(tDword3, m3)
	pair := func(v VecVirtual, dst Mem) { // v | v<<16, stored
		t := YMM()
		VPSLLD(U8(16), v, t)
		VPOR(t, v, v)
		VMOVDQU(v, dst)
	}
	field := func(src VecVirtual, shift int, mask VecVirtual) VecVirtual {
		v := YMM()
		if shift == 0 {
			VPAND(mask, src, v)
			return v
		}
		VPSRLD(U8(shift), src, v)
		VPAND(mask, v, v)
		return v
	}
	for j := 0; j < 4; j++ {
		pair(field(s0, 8*j, m63), sc.Offset(32*j)) // scale j: s[j] & 63
		pair(field(s1, 8*j, m63), mn.Offset(32*j)) // min j: s[j+4] & 63
		// scale j+4: s[j+8]&15 | (s[j]>>6)<<4; min j+4: s[j+8]>>4 | (s[j+4]>>6)<<4
		hiS := field(s0, 8*j+6, m3)
		VPSLLD(U8(4), hiS, hiS)
		v := field(s2, 8*j, m15)
		VPOR(hiS, v, v)
		pair(v, sc.Offset(32*(j+4)))
		hiM := field(s1, 8*j+6, m3)
		VPSLLD(U8(4), hiM, hiM)
		v = field(s2, 8*j+4, m15)
		VPOR(hiM, v, v)
		pair(v, mn.Offset(32*(j+4)))
	}
	VMOVUPS(a.rowScales(0), dws)
	VMOVUPS(a.rowScales(2), dws.Offset(32))

	// finish adds the sums of isum (the whole super-block, or pair c) and their min term into
	// the float accumulators of every token.
	finish := func(label string, subs []int) {
		xt, acct, t := GP64(), GP64(), GP64()
		MOVQ(a.x, xt)
		MOVQ(a.acc, acct)
		MOVQ(a.T, t)
		Label(label)
		yd := YMM()
		VBROADCASTSS(Mem{Base: xt}, yd)
		s := YMM()
		VCVTDQ2PS(Mem{Base: acct, Disp: 64}, s)
		d := YMM()
		VMULPS(dws, yd, d) // fp16(w.d) * y.d (products commute exactly)
		acc := YMM()
		VMOVUPS(Mem{Base: acct}, acc)
		VFMADD231PS(s, d, acc)
		VMOVUPS(acc, Mem{Base: acct})
		// The min term: m_j * (bsum 2j + bsum 2j+1) for the sub-blocks j of subs.
		var m VecVirtual
		for i, j := range subs {
			b := YMM()
			VPBROADCASTD(Mem{Base: xt, Disp: 260 + 4*j}, b)
			VPMADDWD(mn.Offset(32*j), b, b)
			if i == 0 {
				m = b
				continue
			}
			VPADDD(b, m, m)
		}
		VCVTDQ2PS(m, m)
		VMULPS(dws.Offset(32), yd, d) // fp16(w.dmin) * y.d
		VMOVUPS(Mem{Base: acct, Disp: 32}, acc)
		VFMADD231PS(m, d, acc)
		VMOVUPS(acc, Mem{Base: acct, Disp: 32})
		ADDQ(a.ldx, xt)
		ADDQ(U32(q4KAccStride*4), acct)
		DECQ(t)
		JNZ(LabelRef(label))
	}

	for c := 0; c < 4; c++ {
		lo := transpose4x8(func(r int) Mem { return a.row(r, 16+32*c) })
		hi := transpose4x8(func(r int) Mem { return a.row(r, 16+32*c+16) })
		for j := 0; j < 4; j++ {
			VMOVDQU(lo[j], raw.Offset(32*j))
			VMOVDQU(hi[j], raw.Offset(32*(j+4)))
		}
		for half := 0; half < 2; half++ {
			var q [8]VecVirtual
			for j := range q {
				q[j] = YMM()
				VMOVDQU(raw.Offset(32*j), q[j])
				if half == 1 {
					VPSRLW(U8(4), q[j], q[j])
				}
				VPAND(tLow4, q[j], q[j])
			}
			xt, acct, t := GP64(), GP64(), GP64()
			MOVQ(a.x, xt)
			MOVQ(a.acc, acct)
			MOVQ(a.T, t)
			label := "token" + string(rune('0'+2*c+half))
			Label(label)
			s := YMM()
			for j := range q {
				y := YMM()
				VPBROADCASTD(Mem{Base: xt, Disp: 4 + 64*c + 32*half + 4*j}, y)
				if j == 0 {
					VPMADDUBSW(y, q[j], s)
					continue
				}
				VPMADDUBSW(y, q[j], y)
				VPADDW(y, s, s)
			}
			VPMADDWD(sc.Offset(32*(2*c+half)), s, s)
			if c > 0 && !gemm || half > 0 {
				VPADDD(Mem{Base: acct, Disp: 64}, s, s)
			}
			VMOVDQU(s, Mem{Base: acct, Disp: 64})
			ADDQ(a.ldx, xt)
			ADDQ(U32(q4KAccStride*4), acct)
			DECQ(t)
			JNZ(LabelRef(label))
		}
		if gemm {
			finish("pair"+string(rune('0'+c)), []int{2 * c, 2*c + 1})
		}
	}
	if !gemm {
		finish("whole", []int{0, 1, 2, 3, 4, 5, 6, 7})
	}

	a.advance(144)
	ADDQ(U32(292), a.x)
	DECQ(a.nb)
	JNZ(LabelRef("block"))

	// acc - accMin, as the one-row kernels end.
	acct, t := GP64(), GP64()
	MOVQ(a.acc, acct)
	MOVQ(a.T, t)
	Label("sub")
	v := YMM()
	VMOVUPS(Mem{Base: acct}, v)
	VSUBPS(Mem{Base: acct, Disp: 32}, v, v)
	VMOVUPS(v, Mem{Base: acct})
	ADDQ(U32(q4KAccStride*4), acct)
	DECQ(t)
	JNZ(LabelRef("sub"))
	Label("done")
	VZEROUPPER()
	RET()
}

// q8_0Tile is the Q8_0 tile. llama.cpp does not repack Q8_0: each output has the eight float
// lanes of ggml_vec_dot_q8_0_q8_0 (x86LanesQ8_0), so each row and activation row has its own
// accumulator. The tile keeps those of four rows and two activation rows in registers over
// all the blocks (as llamafile's tinyBLAS keeps its register tiles), twice for its eight
// rows, and leaves each's lanes in acc (64 floats per activation row) for laneSums. The
// integer lanes are VPMADDUBSW(|w|, sign(y, w)), exact when no activation quant is -128
// (|w| <= 128 and |y| <= 127 keep the pair sums within int16); QuantizeRow never makes -128,
// and X86Rows takes the one-row kernels for activations that have one.
func q8_0Tile() {
	a := tileSig("q8_0Tile8AVX2", "q8_0Tile8AVX2 adds eight rows of Q8_0 times T activation rows into acc (64 floats per activation row: 8 lanes per weight row).", tileRows, attr.NOSPLIT)
	dds := AllocLocal(32) // the current block's d of four rows, for each of two activation rows
	a.empty()
	xt, acct, t := GP64(), GP64(), GP64()
	MOVQ(a.x, xt)
	MOVQ(a.acc, acct)
	MOVQ(a.T, t)
	Label("pair")
	CMPQ(t, U8(2))
	JB(LabelRef("single"))
	q8_0Quads(a, xt, acct, 2, dds, "p")
	LEAQ(Mem{Base: xt, Index: a.ldx, Scale: 2}, xt)
	ADDQ(U32(2*256), acct)
	SUBQ(U8(2), t)
	JMP(LabelRef("pair"))
	Label("single")
	TESTQ(t, t)
	JZ(LabelRef("lanes"))
	q8_0Quads(a, xt, acct, 1, dds, "s")
	Label("lanes")
	laneSums(a)
	Label("done")
	VZEROUPPER()
	RET()
}

// q8_0Quads computes the lanes of the tile's rows 0-3, then 4-7, against C (1 or 2)
// activation rows from xt (ldx apart) over every block, into acct's lanes.
func q8_0Quads(a tileArgs, xt, acct Register, C int, dds Mem, tag string) {
	for quad := 0; quad < 2; quad++ {
		base := a.w0
		if quad == 1 {
			base = a.w4
		}
		var acc [4][2]VecVirtual
		for r := range acc {
			for c := 0; c < C; c++ {
				acc[r][c] = YMM()
				VXORPS(acc[r][c], acc[r][c], acc[r][c])
			}
		}
		wb, xb, k := GP64(), GP64(), GP64()
		MOVQ(base, wb)
		MOVQ(xt, xb)
		MOVQ(a.nb, k)
		label := fmt.Sprintf("%sblock%d", tag, quad)
		Label(label)
		row := func(r, off int) Mem {
			switch r {
			case 0:
				return Mem{Base: wb, Disp: off}
			case 1:
				return Mem{Base: wb, Index: a.ldw, Scale: 1, Disp: off}
			case 2:
				return Mem{Base: wb, Index: a.ldw, Scale: 2, Disp: off}
			}
			return Mem{Base: wb, Index: a.l3, Scale: 1, Disp: off}
		}
		// The four rows' scales, then each activation row's four products d = fp16(w.d) *
		// fp16(x.d) with one multiply, kept on the stack for broadcasting: a multiply per
		// output and block would compete with the integer multiplies and the fused
		// multiply-adds for the same two pipes.
		h := XMM()
		g := GP32()
		MOVWLZX(row(0, 0), g)
		VMOVD(g, h)
		for r := 1; r < 4; r++ {
			VPINSRW(U8(r), row(r, 0), h, h)
		}
		VCVTPH2PS(h, h)
		var y [2]VecVirtual
		for c := 0; c < C; c++ {
			m := Mem{Base: xb}
			if c == 1 {
				m = Mem{Base: xb, Index: a.ldx, Scale: 1}
			}
			hx := XMM()
			VPBROADCASTW(m, hx)
			VCVTPH2PS(hx, hx)
			VMULPS(hx, h, hx)
			VMOVUPS(hx, dds.Offset(16*c))
			y[c] = YMM()
			VMOVDQU(m.Offset(2), y[c])
		}
		for r := 0; r < 4; r++ {
			wr, wa := YMM(), YMM()
			VMOVDQU(row(r, 2), wr)
			VPABSB(wr, wa)
			for c := 0; c < C; c++ {
				p := YMM()
				VPSIGNB(wr, y[c], p)
				VPMADDUBSW(p, wa, p)
				VPMADDWD(tOnes16, p, p)
				VCVTDQ2PS(p, p)
				d := YMM()
				VBROADCASTSS(dds.Offset(16*c+4*r), d)
				VFMADD231PS(p, d, acc[r][c])
			}
		}
		ADDQ(U8(34), wb)
		ADDQ(U8(34), xb)
		DECQ(k)
		JNZ(LabelRef(label))
		for r := range acc {
			for c := 0; c < C; c++ {
				VMOVUPS(acc[r][c], Mem{Base: acct, Disp: 256*c + 32*(4*quad+r)})
			}
		}
	}
}

// laneSums ends a tile whose acc holds eight float lanes per weight row and activation row
// (64 floats per activation row): each row's lanes reduced in the order of ggml's
// hsum_float_8, into acc[t*64+r].
func laneSums(a tileArgs) {
	acct, t := GP64(), GP64()
	MOVQ(a.acc, acct)
	MOVQ(a.T, t)
	Label("sums")
	var sums [8]VecVirtual
	for r := range sums {
		v := YMM()
		VMOVUPS(Mem{Base: acct, Disp: 32 * r}, v)
		sums[r] = hsum8(v)
	}
	for r, v := range sums {
		VMOVSS(v, Mem{Base: acct, Disp: 4 * r})
	}
	ADDQ(U32(256), acct)
	DECQ(t)
	JNZ(LabelRef("sums"))
}

// q6KTile is the Q6_K tile: ggml_vec_dot_q6_K_q8_K's eight float lanes per output
// (x86Q6K), as the Q8_0 tile keeps them. Per super-block and row, the 6-bit quants are
// decoded and the sub-block scales spread once (to registers and the stack) for all T
// activation rows; per activation row the integer lanes are then eight VPMADDUBSW against
// the activation's quants and eight VPMADDWD with the scales, less 32 times the scaled bsums,
// as llama.cpp's current AVX2 kernel (and quant's avx2DotQ6K) computes them.
func q6KTile() {
	a := tileSig("q6KTile8AVX2", "q6KTile8AVX2 adds eight rows of Q6_K times T activation rows into acc (64 floats per activation row: 8 lanes per weight row).", tileRowLoop, 0)
	scales := AllocLocal(8 * 32) // the row's scale words for each of its eight 32-element groups
	sc16 := AllocLocal(32)       // the row's 16 scales as int16, for the bsum term
	a.empty()
	low4, thirty := YMM(), YMM()
	VMOVDQU(tLow4, low4)
	VMOVDQU(tThirty, thirty)
	Label("block")
	a.prefetchRows(210)
	wr, accr, r := GP64(), GP64(), GP64()
	MOVQ(a.w0, wr)
	MOVQ(a.acc, accr)
	MOVQ(U32(8), r)
	Label("row")
	// The row's d as float32, kept in the low lane of dw.
	g := GP32()
	MOVWLZX(Mem{Base: wr, Disp: 208}, g)
	dw := XMM()
	VMOVD(g, dw)
	VCVTPH2PS(dw, dw)
	sc := YMM()
	VPMOVSXBW(Mem{Base: wr, Disp: 192}, sc)
	VMOVDQU(sc, sc16)
	scb := YMM()
	VBROADCASTI128(Mem{Base: wr, Disp: 192}, scb)
	for k := 0; k < 8; k++ {
		s := YMM()
		VPSHUFB(tQ6Shuf.Offset(32*k), scb, s)
		VPSRAW(U8(8), s, s)
		VMOVDQU(s, scales.Offset(32*k))
	}
	var q [8]VecVirtual
	for half := 0; half < 2; half++ {
		h := q6KQuants(wr, half, low4, thirty)
		copy(q[4*half:], h[:])
	}

	xt, acct, t := GP64(), GP64(), GP64()
	MOVQ(a.x, xt)
	MOVQ(accr, acct)
	MOVQ(a.T, t)
	Label("token")
	sumi := YMM()
	for k, v := range q {
		p := YMM()
		VPMADDUBSW(Mem{Base: xt, Disp: 4 + 32*k}, v, p)
		VPMADDWD(scales.Offset(32*k), p, p)
		if k == 0 {
			sumi = p
			continue
		}
		VPADDD(p, sumi, sumi)
	}
	// 32 * (bsum_2l*sc_2l + bsum_2l+1*sc_2l+1) per lane l.
	b := YMM()
	VMOVDQU(sc16, b)
	VPMADDWD(Mem{Base: xt, Disp: 260}, b, b)
	VPSLLD(U8(5), b, b)
	VPSUBD(b, sumi, sumi)
	VCVTDQ2PS(sumi, sumi)
	d := XMM()
	VMULSS(Mem{Base: xt}, dw, d) // fp16(w.d) * y.d
	dd := YMM()
	VBROADCASTSS(d, dd)
	acc := YMM()
	VMOVUPS(Mem{Base: acct}, acc)
	VFMADD231PS(sumi, dd, acc)
	VMOVUPS(acc, Mem{Base: acct})
	ADDQ(a.ldx, xt)
	ADDQ(U32(256), acct)
	DECQ(t)
	JNZ(LabelRef("token"))

	ADDQ(a.ldw, wr)
	ADDQ(U8(32), accr)
	DECQ(r)
	JNZ(LabelRef("row"))

	a.advance(210)
	ADDQ(U32(292), a.x)
	DECQ(a.nb)
	JNZ(LabelRef("block"))
	laneSums(a)
	Label("done")
	VZEROUPPER()
	RET()
}

// q5KAccStride is the floats of a Q5_K tile's acc per activation row: for each weight row its
// eight lanes and its min term (9 floats, 36 bytes).
const q5KAccStride = 72

// q5KTile is the Q5_K tile: ggml_vec_dot_q5_K_q8_K as quant's x86Q5K computes it, the scaled
// quants in eight float lanes per output and the min term as an int32 fused into a scalar per
// super-block, added at the end. As in the Q6_K tile, per super-block and row the quants are
// decoded and the scales spread once for all T activation rows.
func q5KTile() {
	a := tileSig("q5KTile8AVX2", "q5KTile8AVX2 adds eight rows of Q5_K times T activation rows into acc (q5KAccStride floats per activation row).", tileRowLoop, 0)
	scales := AllocLocal(8 * 32) // per sub-block: the row's scale in every int16
	mins := AllocLocal(32)       // the row's mins, each twice, as int16
	dws := AllocLocal(8)         // the row's d and dmin as float32
	a.empty()
	Label("block")
	a.prefetchRows(176)
	wr, accr, r := GP64(), GP64(), GP64()
	MOVQ(a.w0, wr)
	MOVQ(a.acc, accr)
	MOVQ(U32(8), r)
	Label("row")
	h := XMM()
	VMOVD(Mem{Base: wr}, h)
	VCVTPH2PS(h, h)
	VMOVQ(h, dws)
	u0, u1 := kScalesMins(wr)
	mn := XMM()
	VMOVQ(u1, mn)
	VPUNPCKLBW(mn, mn, mn)
	mw := YMM()
	VPMOVZXBW(mn, mw)
	VMOVDQU(mw, mins)
	scw := wordScales(u0)
	for k := 0; k < 8; k++ {
		s := YMM()
		VPSHUFB(tK4Shuf.Offset(32*k), scw, s)
		VMOVDQU(s, scales.Offset(32*k))
	}
	// Pair j: the low nibbles of qs[32j..] with bit 2j of qh (sub-block 2j), the high ones with
	// bit 2j+1 (sub-block 2j+1).
	qh := YMM()
	VMOVDQU(Mem{Base: wr, Disp: 16}, qh)
	var q [8]VecVirtual
	for j := 0; j < 4; j++ {
		lo, hi, b := YMM(), YMM(), YMM()
		VMOVDQU(Mem{Base: wr, Disp: 48 + 32*j}, lo)
		VPSRLW(U8(4), lo, hi)
		VPAND(tLow4, lo, lo)
		VPAND(tLow4, hi, hi)
		bitTo(qh, b, 2*j, 4)
		VPAND(tSixteen, b, b)
		VPOR(b, lo, lo)
		bitTo(qh, b, 2*j+1, 4)
		VPAND(tSixteen, b, b)
		VPOR(b, hi, hi)
		q[2*j], q[2*j+1] = lo, hi
	}

	xt, acct, t := GP64(), GP64(), GP64()
	MOVQ(a.x, xt)
	MOVQ(accr, acct)
	MOVQ(a.T, t)
	Label("token")
	var sum VecVirtual
	for k, v := range q {
		p := YMM()
		VPMADDUBSW(Mem{Base: xt, Disp: 4 + 32*k}, v, p)
		VPMADDWD(scales.Offset(32*k), p, p)
		if k == 0 {
			sum = p
			continue
		}
		VPADDD(p, sum, sum)
	}
	VCVTDQ2PS(sum, sum)
	yd := XMM()
	VMOVSS(Mem{Base: xt}, yd)
	d := XMM()
	VMULSS(dws, yd, d) // y.d * fp16(w.d)
	dd := YMM()
	VBROADCASTSS(d, dd)
	acc := YMM()
	VMOVUPS(Mem{Base: acct}, acc)
	VFMADD231PS(sum, dd, acc)
	VMOVUPS(acc, Mem{Base: acct})
	// summs -= y.d*fp16(w.dmin) * sum of m_j*(bsum 2j + bsum 2j+1), one rounding.
	m := YMM()
	VMOVDQU(mins, m)
	VPMADDWD(Mem{Base: xt, Disp: 260}, m, m)
	ms := hsumInt(m)
	VCVTDQ2PS(ms, ms)
	VMULSS(dws.Offset(4), yd, d)
	summs := XMM()
	VMOVSS(Mem{Base: acct, Disp: 32}, summs)
	VFNMADD231SS(d, ms, summs)
	VMOVSS(summs, Mem{Base: acct, Disp: 32})
	ADDQ(a.ldx, xt)
	ADDQ(U32(4*q5KAccStride), acct)
	DECQ(t)
	JNZ(LabelRef("token"))

	ADDQ(a.ldw, wr)
	ADDQ(U8(36), accr)
	DECQ(r)
	JNZ(LabelRef("row"))

	a.advance(176)
	ADDQ(U32(292), a.x)
	DECQ(a.nb)
	JNZ(LabelRef("block"))

	// hsum_float_8 of each row's lanes plus its min terms, into acc[t*72+r].
	acct2, t2 := GP64(), GP64()
	MOVQ(a.acc, acct2)
	MOVQ(a.T, t2)
	Label("sums")
	var res [8]VecVirtual
	for r := range res {
		v := YMM()
		VMOVUPS(Mem{Base: acct2, Disp: 36 * r}, v)
		res[r] = hsum8(v)
		VADDSS(Mem{Base: acct2, Disp: 36*r + 32}, res[r], res[r])
	}
	for r, v := range res {
		VMOVSS(v, Mem{Base: acct2, Disp: 4 * r})
	}
	ADDQ(U32(4*q5KAccStride), acct2)
	DECQ(t2)
	JNZ(LabelRef("sums"))
	Label("done")
	VZEROUPPER()
	RET()
}
