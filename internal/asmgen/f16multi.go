package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// f16Multi writes f16xNAVX2Rows for N activation rows (1 to 3): f16VecAVX2
// (ggml_vec_dot_f16 on AVX-512) of each of rows weight rows against each of N activation rows
// at once, the activations given already widened to float32 (exactly: they are fp16 values).
// f16VecAVX2 widens both operands of every product, so that its loop runs at the
// conversions' rate; here an activation is widened once per product, and each weight vector
// once for all N activation rows, so that the loop runs at the fused multiply-adds' rate.
//
// Each output sees f16VecAVX2's operations in its order. Its eight accumulators (two 8-lane
// halves of four 16-lane ones; accumulator j sums the elements 8j..8j+7 of every step of 64)
// are independent chains, folded at the end into lo = (a0+a4)+(a2+a6) and
// hi = (a1+a5)+(a3+a7), then reduced as hsum8(lo+hi). With more than one activation row,
// 8N accumulators do not fit the 16 registers, so the row is walked twice: once for the four
// accumulators of lo, once for those of hi, each pass folding its own. Beyond three rows a
// pass's accumulators would not fit either; callers take four rows as two and two, which run
// at the multiply-adds' rate already.
func f16Multi(N int) {
	name := fmt.Sprintf("f16x%dAVX2Rows", N)
	TEXT(name, NOSPLIT, "func(w []byte, ldw int, x []float32, ldx int, n int, rows int, out []float32, ldo int)")
	Pragma("noescape")
	Doc(name+" is f16VecAVX2 for rows rows of w (fp16, ldw bytes apart) against "+fmt.Sprint(N)+" activation row(s) of x",
		"(float32 widened from fp16, ldx floats apart), each of n elements: out[t*ldo+r] is row r's",
		"product with activation row t.")
	wrow := Load(Param("w").Base(), GP64())
	outp := Load(Param("out").Base(), GP64())
	rowsLeft := AllocLocal(8)
	nr := Load(Param("rows"), GP64())
	MOVQ(nr, rowsLeft)
	TESTQ(nr, nr)
	JZ(LabelRef("end"))
	Label("row")
	// Each pass's accumulators in the order of their fold: ((p0+p1)+(p2+p3)) for each four.
	passes := [][]int{{0, 4, 2, 6}, {1, 5, 3, 7}}
	if N == 1 {
		passes = [][]int{{0, 4, 2, 6, 1, 5, 3, 7}}
	}
	var halves []VecVirtual // lo and hi of the one activation row; with two passes, each row's hi
	// With two passes, each row's lo waits on the stack while the second runs: 4N accumulators,
	// N sums and the weight vector would not fit the registers for N = 3.
	los := AllocLocal(32 * N)
	for q, parts := range passes {
		acc := make([][]VecVirtual, N)
		for t := range acc {
			acc[t] = zeros(len(parts))
		}
		wp := GP64()
		MOVQ(wrow, wp)
		xp := Load(Param("x").Base(), GP64())
		var ldx Register
		if N > 1 {
			ldx = Load(Param("ldx"), GP64())
			SHLQ(U8(2), ldx)
		}
		c := Load(Param("n"), GP64())
		SHRQ(U8(6), c)
		label := fmt.Sprintf("pass%d", q)
		JZ(LabelRef(label + "done"))
		Label(label)
		if q == 0 {
			prefetch(wp, 128)
		}
		for k, part := range parts {
			wv := YMM()
			VCVTPH2PS(at(wp, 16*part), wv)
			for t := range N {
				VFMADD231PS(xAt(xp, ldx, t, 32*part), wv, acc[t][k])
			}
		}
		ADDQ(U8(128), wp)
		ADDQ(U32(256), xp)
		DECQ(c)
		JNZ(LabelRef(label))
		Label(label + "done")
		for t := range N {
			a := acc[t]
			for i := 0; i < len(a); i += 4 {
				VADDPS(a[i+1], a[i], a[i])
				VADDPS(a[i+3], a[i+2], a[i+2])
				VADDPS(a[i+2], a[i], a[i])
				if len(passes) > 1 && q == 0 {
					VMOVUPS(a[i], Mem{Base: los.Base, Disp: los.Disp + 32*t})
					continue
				}
				halves = append(halves, a[i])
			}
		}
	}
	for t := range N {
		var lo, hi VecVirtual
		if len(passes) == 1 {
			lo, hi = halves[0], halves[1]
		} else {
			lo, hi = YMM(), halves[t]
			VMOVUPS(Mem{Base: los.Base, Disp: los.Disp + 32*t}, lo)
		}
		VADDPS(hi, lo, lo)
		sum := hsum8(lo)
		// The remaining products (float32) added in float64, as f16VecAVX2's tail.
		sd := XMM()
		VCVTSS2SD(sum, sd, sd)
		n := Load(Param("n"), GP64())
		rem := GP64()
		MOVQ(n, rem)
		ANDQ(U8(63), rem)
		label := fmt.Sprintf("tail%d", t)
		JZ(LabelRef(label + "done"))
		ANDQ(I32(-64), n)
		wp := GP64()
		LEAQ(Mem{Base: wrow, Index: n, Scale: 2}, wp)
		xp := Load(Param("x").Base(), GP64())
		if t > 0 {
			ldx := Load(Param("ldx"), GP64())
			IMUL3Q(Imm(uint64(4*t)), ldx, ldx)
			ADDQ(ldx, xp)
		}
		LEAQ(Mem{Base: xp, Index: n, Scale: 4}, xp)
		a, b := XMM(), XMM()
		Label(label)
		halfAt(at(wp, 0), a)
		VMOVSS(at(xp, 0), b)
		VMULSS(b, a, a)
		VCVTSS2SD(a, a, a)
		VADDSD(a, sd, sd)
		ADDQ(U8(2), wp)
		ADDQ(U8(4), xp)
		DECQ(rem)
		JNZ(LabelRef(label))
		Label(label + "done")
		VCVTSD2SS(sd, sd, sd)
		o := outRow(outp, t)
		VMOVSS(sd, Mem{Base: o})
	}
	ADDQ(U8(4), outp)
	ldw := Load(Param("ldw"), GP64())
	ADDQ(ldw, wrow)
	DECQ(rowsLeft)
	JNZ(LabelRef("row"))
	Label("end")
	VZEROUPPER()
	RET()
}

// outRow returns the address of output row t: outp plus t rows of the ldo parameter's floats.
func outRow(outp Register, t int) Register {
	if t == 0 {
		return outp
	}
	o := GP64()
	ldo := Load(Param("ldo"), GP64())
	IMUL3Q(Imm(uint64(4*t)), ldo, ldo)
	LEAQ(Mem{Base: outp, Index: ldo, Scale: 1}, o)
	return o
}

// xAt addresses the float32 at byte disp of activation row t, the rows ld bytes apart.
func xAt(xp, ld Register, t, disp int) Mem {
	switch t {
	case 0:
		return Mem{Base: xp, Disp: disp}
	case 1:
		return Mem{Base: xp, Index: ld, Scale: 1, Disp: disp}
	case 2:
		return Mem{Base: xp, Index: ld, Scale: 2, Disp: disp}
	}
	panic("xAt: activation row")
}

// widenF16 writes widenF16AVX2: n fp16 values widened to float32 by VCVTPH2PS, as the float
// kernels widen them.
func widenF16() {
	TEXT("widenF16AVX2", NOSPLIT, "func(x []byte, out []float32, n int)")
	Pragma("noescape")
	Doc("widenF16AVX2 widens the n fp16 values of x into out with VCVTPH2PS.")
	xp := Load(Param("x").Base(), GP64())
	op := Load(Param("out").Base(), GP64())
	n := Load(Param("n"), GP64())
	c := GP64()
	MOVQ(n, c)
	SHRQ(U8(3), c)
	JZ(LabelRef("vecdone"))
	v := YMM()
	Label("vec")
	VCVTPH2PS(at(xp, 0), v)
	VMOVUPS(v, at(op, 0))
	ADDQ(U8(16), xp)
	ADDQ(U8(32), op)
	DECQ(c)
	JNZ(LabelRef("vec"))
	Label("vecdone")
	ANDQ(U8(7), n)
	JZ(LabelRef("ret"))
	a := XMM()
	Label("tail")
	halfAt(at(xp, 0), a)
	VMOVSS(a, at(op, 0))
	ADDQ(U8(2), xp)
	ADDQ(U8(4), op)
	DECQ(n)
	JNZ(LabelRef("tail"))
	Label("ret")
	VZEROUPPER()
	RET()
}

// f16Gemm writes f16gRxNAVX2Rows: f16GemmAVX2 (tinyBLAS for F16 on AVX-512: one 16-lane
// accumulator over steps of 16, then _mm512_reduce_add_ps) of rows weight rows (a multiple
// of R) against N activation rows widened to float32, R weight rows and N activation rows at a
// time: each weight vector is widened once for the N rows, each activation vector read once
// for the R rows, so that the loop runs at the multiply-adds' rate where f16GemmAVX2 per
// output runs at the conversions'. Every output keeps its two 8-lane halves and their
// reduction, so the results are f16GemmAVX2's to the bit. n is a multiple of 16.
func f16Gemm(R, N int) {
	name := fmt.Sprintf("f16g%dx%dAVX2Rows", R, N)
	TEXT(name, NOSPLIT, "func(w []byte, ldw int, x []float32, ldx int, n int, rows int, out []float32, ldo int)")
	Pragma("noescape")
	Doc(name+" is f16GemmAVX2 for rows rows of w (fp16, ldw bytes apart; a multiple of "+fmt.Sprint(R)+")",
		"against "+fmt.Sprint(N)+" activation row(s) of x (float32 widened from fp16, ldx floats apart), each of n",
		"elements (a multiple of 16): out[t*ldo+r] is row r's product with activation row t.")
	wrow := Load(Param("w").Base(), GP64())
	outp := Load(Param("out").Base(), GP64())
	rowsLeft := AllocLocal(8)
	nr := Load(Param("rows"), GP64())
	MOVQ(nr, rowsLeft)
	TESTQ(nr, nr)
	JZ(LabelRef("end"))
	Label("row")
	acc := make([][][2]VecVirtual, R)
	for r := range acc {
		acc[r] = make([][2]VecVirtual, N)
		for t := range acc[r] {
			for h := range 2 {
				acc[r][t][h] = YMM()
				VXORPS(acc[r][t][h], acc[r][t][h], acc[r][t][h])
			}
		}
	}
	wp := make([]Register, R)
	ldw := Load(Param("ldw"), GP64())
	for r := range wp {
		wp[r] = GP64()
		if r == 0 {
			MOVQ(wrow, wp[r])
		} else {
			LEAQ(Mem{Base: wp[r-1], Index: ldw, Scale: 1}, wp[r])
		}
	}
	xp := Load(Param("x").Base(), GP64())
	var ldx Register
	if N > 1 {
		ldx = Load(Param("ldx"), GP64())
		SHLQ(U8(2), ldx)
	}
	c := Load(Param("n"), GP64())
	SHRQ(U8(4), c)
	JZ(LabelRef("loopdone"))
	Label("loop")
	for r := range R {
		prefetch(wp[r], 32)
		for h := range 2 {
			wv := YMM()
			VCVTPH2PS(at(wp[r], 16*h), wv)
			for t := range N {
				VFMADD231PS(xAt(xp, ldx, t, 32*h), wv, acc[r][t][h])
			}
		}
	}
	for r := range R {
		ADDQ(U8(32), wp[r])
	}
	ADDQ(U8(64), xp)
	DECQ(c)
	JNZ(LabelRef("loop"))
	Label("loopdone")
	for t := range N {
		o := outRow(outp, t)
		for r := range R {
			VMOVSS(hsum16(acc[r][t][0], acc[r][t][1]), Mem{Base: o, Disp: 4 * r})
		}
	}
	ADDQ(U8(uint8(4*R)), outp)
	ldw2 := Load(Param("ldw"), GP64())
	for range R {
		ADDQ(ldw2, wrow)
	}
	SUBQ(U8(uint8(R)), rowsLeft)
	JNZ(LabelRef("row"))
	Label("end")
	VZEROUPPER()
	RET()
}
