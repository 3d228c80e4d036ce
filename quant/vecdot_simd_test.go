package quant

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"testing"
)

// The fast kernels of vecDotFast (vecdot_simd.go) against the portable ones of vecDotRef.
//
// The other tests of this package hold VecDot to ggml's portable C kernels bit for bit
// (golden_test.go), so TestMain runs the test binary with the portable kernels in vecDot;
// the tests here call the fast kernels directly or put them back with simdUseFast.
//
// A fast kernel must compute the portable kernel's integer block sums exactly and may differ
// only in the order of its float32 operations, so results are compared against a bound on
// that reordering's rounding error, computed from the magnitudes of the terms summed
// (simdTermBound). Where the fast kernel reproduces ggml's AVX2 kernel, the golden fixtures' AVX2
// results must be matched bit for bit.

func TestMain(m *testing.M) {
	vecDot = vecDotRef
	os.Exit(m.Run())
}

// simdUseFast puts the fast kernels into vecDot for the rest of the test.
func simdUseFast(t testing.TB) {
	saved := vecDot
	installFast()
	t.Cleanup(func() { vecDot = saved })
}

// simdKernel is a fast kernel under test.
type simdKernel struct {
	name  string // the type, with "/repack", "/repack-gemm", "/x86..." for the other orders
	typ   Type
	f     func(n int, w, x []byte) float32
	order int // simdVec, simdRepack, simdRepackGemm or simdX86: which float order it has
	// x86 is the Go kernel of x86.go (quant.X86Dot) that f must match to the bit.
	x86 func(n int, w, x []byte) float32
}

const (
	simdVec        = iota // ggml_vec_dot_*, the VecDot kernels of vecDotFast
	simdRepack            // one row of the repacked GEMV (fastRepackQ4_0, fastRepackQ4K)
	simdRepackGemm        // one row of the repacked Q4_K GEMM (fastRepackGemmQ4K)
	simdX86               // the order of its x86.go kernel (fastX86*, which VecDot does not use)
)

// simdX86Kernels maps the name of each fast kernel to the x86.go kernel it reproduces.
var simdX86Kernels = map[string]func(int, []byte, []byte) float32{
	"Q8_0": x86LanesQ8_0, "Q4_0": x86LanesQ4_0, "Q5_0": x86LanesQ5_0, "Q4_K": x86Q4K, "Q6_K": x86Q6K,
	"Q4_0/repack": x86RepackQ4_0, "Q4_K/repack": x86RepackQ4K, "Q4_K/repack-gemm": x86RepackGemmQ4K,
}

// simdKernels returns the fast kernels of this machine.
func simdKernels() []simdKernel {
	var out []simdKernel
	for typ, f := range vecDotFast {
		if f != nil {
			name := Type(typ).String()
			out = append(out, simdKernel{name, Type(typ), f, simdVec, simdX86Kernels[name]})
		}
	}
	for _, k := range []simdKernel{
		{"Q4_0/repack", Q4_0, fastRepackQ4_0, simdRepack, x86RepackQ4_0},
		{"Q4_K/repack", Q4_K, fastRepackQ4K, simdRepack, x86RepackQ4K},
		{"Q4_K/repack-gemm", Q4_K, fastRepackGemmQ4K, simdRepackGemm, x86RepackGemmQ4K},
		{"Q4_1/x86", Q4_1, fastX86Q4_1, simdX86, x86LanesQ4_1},
		{"Q5_1/x86", Q5_1, fastX86Q5_1, simdX86, x86LanesQ5_1},
		{"IQ4_NL/x86", IQ4_NL, fastX86IQ4NL, simdX86, x86LanesIQ4NL},
		{"IQ4_NL/x86-vec", IQ4_NL, fastX86VecIQ4NL, simdX86, x86VecIQ4NL},
		{"IQ4_NL/repack", IQ4_NL, fastX86RepackIQ4NL, simdX86, x86RepackIQ4NL},
		{"Q5_K/x86", Q5_K, fastX86Q5K, simdX86, x86Q5K},
		{"Q3_K/x86", Q3_K, fastX86Q3K, simdX86, x86Q3K},
		{"Q2_K/x86", Q2_K, fastX86Q2K, simdX86, x86Q2K},
		{"Q2_K/repack", Q2_K, fastX86RepackQ2K, simdX86, x86RepackQ2K},
		{"Q2_K/repack-gemm", Q2_K, fastX86RepackGemmQ2K, simdX86, x86RepackGemmQ2K},
		{"F32/x86-vec", F32, fastX86F32Vec, simdX86, x86F32Vec},
		{"F32/x86-gemm", F32, fastX86F32Gemm, simdX86, x86F32Gemm},
		{"F16/x86-vec", F16, fastX86F16Vec, simdX86, x86F16Vec},
		{"F16/x86-gemm", F16, fastX86F16Gemm, simdX86, x86F16Gemm},
		{"BF16/x86-vec", BF16, fastX86BF16Vec, simdX86, x86BF16Vec},
		{"BF16/x86-gemm", BF16, fastX86BF16Gemm, simdX86, x86BF16Gemm},
		// Last, so that FuzzVecDotFast's seeds keep selecting the kernels they were made for.
		{"MXFP4/x86-vec", MXFP4, fastX86VecMXFP4, simdX86, x86VecMXFP4},
		{"MXFP4/repack", MXFP4, fastX86RepackMXFP4, simdX86, x86RepackMXFP4},
	} {
		if k.f != nil {
			out = append(out, k)
		}
	}
	return out
}

func simdNeed(t testing.TB) []simdKernel {
	ks := simdKernels()
	if len(ks) == 0 {
		t.Skip("no fast kernels on this machine/build")
	}
	return ks
}

// simdBitExact lists the fast kernels that are ggml's vendored AVX2 kernels (the ones the
// golden fixtures ran) in every float operation. The Q6_K kernel is llama.cpp's later form,
// which spreads the -32 offset over the integer lanes differently.
var simdBitExact = map[Type]bool{Q8_0: true, Q4_0: true, Q5_0: true, Q4_K: true}

// simdTermBound returns the sum of the magnitudes of the float terms the kernels of typ
// accumulate (per block: |d| times the sum over elements of |scale*quant*activation|, and the
// min term where the type has one), in float64. A kernel that sums the same terms in another
// order, rounding each partial sum once, errs by at most about (number of sums) * 2^-24
// times this bound.
func simdTermBound(typ Type, n int, w, x []byte) float64 {
	var bound float64
	switch typ {
	case Q4_0, Q5_0, Q8_0:
		wb := typ.BlockBytes()
		var q [32]int32
		for i := 0; i < n/32; i++ {
			bw := w[i*wb : (i+1)*wb]
			var dw float32
			switch typ {
			case Q4_0:
				dw = simdDecodeQ4_0(bw, &q)
			case Q5_0:
				dw = simdDecodeQ5_0(bw, &q)
			case Q8_0:
				dw = simdDecodeQ8_0(bw, &q)
			}
			xb := x[i*34 : i*34+34]
			var s float64
			for j := 0; j < 32; j++ {
				s += math.Abs(float64(q[j]) * float64(int8(xb[2+j])))
			}
			bound += math.Abs(float64(dw)*float64(f16le(xb))) * s
		}
	case Q4_K:
		for i := 0; i < n/256; i++ {
			wb := w[i*144 : i*144+144]
			yd, q8, bs := q8K(x, i)
			var s, m float64
			for j := 0; j < 8; j++ {
				sc, mn := kScaleMin(j, wb[4:16])
				q := wb[16+32*(j/2):]
				for k := 0; k < 32; k++ {
					v := q[k] & 0xf
					if j%2 == 1 {
						v = q[k] >> 4
					}
					s += float64(sc) * float64(v) * math.Abs(float64(int8(q8[32*j+k])))
				}
				m += float64(mn) * math.Abs(float64(bsum(bs, 2*j))+float64(bsum(bs, 2*j+1)))
			}
			bound += math.Abs(float64(yd)*float64(f16le(wb[0:])))*s + math.Abs(float64(yd)*float64(f16le(wb[2:])))*m
		}
	case Q6_K:
		var deq [256]float32
		for i := 0; i < n/256; i++ {
			wb := w[i*210 : i*210+210]
			yd, q8, _ := q8K(x, i)
			// The quants minus 32, times the int8 scales: dequantize with d = 1.
			one := append([]byte(nil), wb...)
			binary.LittleEndian.PutUint16(one[208:], 0x3c00)
			DequantizeRow(Q6_K, one, deq[:])
			var s float64
			for e := 0; e < 256; e++ {
				s += math.Abs(float64(deq[e]) * float64(int8(q8[e])))
			}
			bound += math.Abs(float64(yd)*float64(f16le(wb[208:]))) * s
		}
	default:
		panic("simdTermBound: " + typ.String())
	}
	return bound
}

func simdDecodeQ4_0(b []byte, q *[32]int32) float32 {
	for j := 0; j < 16; j++ {
		q[j] = int32(b[2+j]&0xf) - 8
		q[j+16] = int32(b[2+j]>>4) - 8
	}
	return f16le(b)
}

func simdDecodeQ5_0(b []byte, q *[32]int32) float32 {
	qh := binary.LittleEndian.Uint32(b[2:])
	for j := 0; j < 16; j++ {
		q[j] = int32(b[6+j]&0xf|byte(qh>>j&1)<<4) - 16
		q[j+16] = int32(b[6+j]>>4|byte(qh>>(j+16)&1)<<4) - 16
	}
	return f16le(b)
}

func simdDecodeQ8_0(b []byte, q *[32]int32) float32 {
	for j := 0; j < 32; j++ {
		q[j] = int32(int8(b[2+j]))
	}
	return f16le(b)
}

// The float order of the fast kernels: each reproduces one of ggml's AVX2 kernels, and these
// models (written from ggml-cpu/arch/x86/quants.c and quant/x86.go's description of llama.cpp)
// say what that order is. The fast kernels must match them bit for bit wherever no float
// overflows.

// simdFMA32 is a float32 fused multiply-add with one rounding: big.Float holds a*b+c exactly
// at 512 bits (float32 spans fewer than 330), and Float32 rounds to nearest even.
func simdFMA32(a, b, c float32) float32 {
	p := new(big.Float).SetPrec(512).SetFloat64(float64(a))
	p.Mul(p, new(big.Float).SetPrec(512).SetFloat64(float64(b)))
	p.Add(p, new(big.Float).SetPrec(512).SetFloat64(float64(c)))
	f, _ := p.Float32()
	if f == 0 && (a*b+c == 0) {
		return a*b + c // the sign of an exact zero
	}
	return f
}

// simdHsum8 is ggml's hsum_float_8.
func simdHsum8(a *[8]float32) float32 {
	v0, v1, v2, v3 := a[4]+a[0], a[5]+a[1], a[6]+a[2], a[7]+a[3]
	return (v0 + v2) + (v1 + v3)
}

// simdModel returns what the ggml kernel that k reproduces computes.
func simdModel(k simdKernel, n int, w, x []byte) float32 {
	if k.order != simdVec {
		return simdModelRepack(k, n, w, x)
	}
	typ := k.typ
	var acc [8]float32
	switch typ {
	case Q4_0, Q5_0, Q8_0:
		// Integer lane l is elements 4l..4l+3; acc += d*lane, d = fp16(w.d)*fp16(x.d).
		wb := typ.BlockBytes()
		var q [32]int32
		for i := 0; i < n/32; i++ {
			bw := w[i*wb : (i+1)*wb]
			var dw float32
			switch typ {
			case Q4_0:
				dw = simdDecodeQ4_0(bw, &q)
			case Q5_0:
				dw = simdDecodeQ5_0(bw, &q)
			case Q8_0:
				dw = simdDecodeQ8_0(bw, &q)
			}
			xb := x[i*34 : i*34+34]
			d := dw * f16le(xb)
			for l := 0; l < 8; l++ {
				var s int32
				for k := 4 * l; k < 4*l+4; k++ {
					s += q[k] * int32(int8(xb[2+k]))
				}
				acc[l] = simdFMA32(d, float32(s), acc[l])
			}
		}
		return simdHsum8(&acc)
	case Q4_K:
		// Integer lane l is elements 4l..4l+3 of each 32-element sub-block times its scale;
		// the mins go to four lanes, lane i taking sub-blocks 2i and 2i+1, fused with -dmin.
		var accm [4]float32
		for i := 0; i < n/256; i++ {
			wb := w[i*144 : i*144+144]
			yd, q8, bs := q8K(x, i)
			var lane [8]int32
			var ml [4]int32
			for j := 0; j < 8; j++ {
				sc, m := kScaleMin(j, wb[4:16])
				qs := wb[16+32*(j/2):]
				for k := 0; k < 32; k++ {
					v := int32(qs[k] & 0xf)
					if j%2 == 1 {
						v = int32(qs[k] >> 4)
					}
					lane[k/4] += int32(sc) * v * int32(int8(q8[32*j+k]))
				}
				ml[j/2] += int32(m) * (bsum(bs, 2*j) + bsum(bs, 2*j+1))
			}
			d, dmin := yd*f16le(wb[0:]), -yd*f16le(wb[2:])
			for l := range acc {
				acc[l] = simdFMA32(d, float32(lane[l]), acc[l])
			}
			for l := range accm {
				accm[l] = simdFMA32(dmin, float32(ml[l]), accm[l])
			}
		}
		return simdHsum8(&acc) + ((accm[0] + accm[2]) + (accm[1] + accm[3]))
	case Q6_K:
		// Integer lane l is elements 4l..4l+3 of each 32-element group times its sub-block's
		// scale, quants unsigned, minus 32 * (bsum_2l*sc_2l + bsum_2l+1*sc_2l+1).
		for i := 0; i < n/256; i++ {
			wb := w[i*210 : i*210+210]
			yd, q8, bs := q8K(x, i)
			var lane [8]int32
			for h := 0; h < 2; h++ {
				ql, qh := wb[64*h:], wb[128+32*h:]
				for l := 0; l < 32; l++ {
					q := [4]int32{
						int32(ql[l]&0xf | (qh[l]&3)<<4), int32(ql[l+32]&0xf | (qh[l]>>2&3)<<4),
						int32(ql[l]>>4 | (qh[l]>>4&3)<<4), int32(ql[l+32]>>4 | (qh[l]>>6)<<4),
					}
					for g := 0; g < 4; g++ {
						e := 128*h + 32*g + l
						lane[l/4] += int32(int8(wb[192+e/16])) * q[g] * int32(int8(q8[e]))
					}
				}
			}
			for l := range lane {
				lane[l] -= 32 * (bsum(bs, 2*l)*int32(int8(wb[192+2*l])) + bsum(bs, 2*l+1)*int32(int8(wb[192+2*l+1])))
			}
			d := yd * f16le(wb[208:])
			for l := range acc {
				acc[l] = simdFMA32(d, float32(lane[l]), acc[l])
			}
		}
		return simdHsum8(&acc)
	}
	panic("simdModel: " + typ.String())
}

// simdModelRepack is simdModel for the repacked orders: the integer sum of each block (Q4_0),
// super-block (Q4_K GEMV) or 64-element pair of sub-blocks (Q4_K GEMM) fused into a single
// accumulator; Q4_K keeps the min terms in a second one, subtracted at the end.
func simdModelRepack(k simdKernel, n int, w, x []byte) float32 {
	var acc, accm float32
	switch k.typ {
	case Q4_0:
		var q [32]int32
		for i := 0; i < n/32; i++ {
			dw := simdDecodeQ4_0(w[i*18:i*18+18], &q)
			xb := x[i*34 : i*34+34]
			var s int32
			for j, v := range q {
				s += v * int32(int8(xb[2+j]))
			}
			acc = simdFMA32(float32(s), dw*f16le(xb), acc)
		}
		return acc
	case Q4_K:
		for i := 0; i < n/256; i++ {
			wb := w[i*144 : i*144+144]
			yd, q8, bs := q8K(x, i)
			d, dmin := f16le(wb[0:])*yd, f16le(wb[2:])*yd
			var sum, sumMin int32
			for c := 0; c < 4; c++ {
				for j := 2 * c; j < 2*c+2; j++ {
					sc, m := kScaleMin(j, wb[4:16])
					for e := 0; e < 32; e++ {
						v := int32(wb[16+32*c+e] & 0xf)
						if j%2 == 1 {
							v = int32(wb[16+32*c+e] >> 4)
						}
						sum += int32(sc) * v * int32(int8(q8[32*j+e]))
					}
					sumMin += int32(m) * (bsum(bs, 2*j) + bsum(bs, 2*j+1))
				}
				if k.order == simdRepackGemm || c == 3 {
					acc = simdFMA32(float32(sum), d, acc)
					accm = simdFMA32(float32(sumMin), dmin, accm)
					sum, sumMin = 0, 0
				}
			}
		}
		return acc - accm
	}
	panic("simdModelRepack: " + k.name)
}

// simdCheck compares the fast kernel of typ with the portable one on one pair of rows, and
// with the model of its float order.
func simdCheck(t testing.TB, k simdKernel, n int, w, x []byte) {
	t.Helper()
	if k.order == simdX86 {
		simdCheckX86(t, k, n, w, x)
		return
	}
	typ := k.typ
	ref := vecDotRef[typ](n, w, x)
	got := k.f(n, w, x)
	bound := simdTermBound(typ, n, w, x)
	if math.IsNaN(bound) || bound > 1e38 {
		// Infinite or NaN scales, or sums near float32's range, where the order of the
		// additions decides between overflow, infinity and NaN.
		return
	}
	nb := n / typ.BlockSize()
	tol := float64(2*nb+16) * (0x1p-24*bound + 0x1p-149)
	if diff := math.Abs(float64(got) - float64(ref)); !(diff <= tol) {
		t.Errorf("%s n=%d: fast %.9g, portable %.9g: |diff| %.3g > %.3g (term bound %.6g)", k.name, n, got, ref, diff, tol, bound)
	}
	if bound < 1e30 {
		if model := simdModel(k, n, w, x); math.Float32bits(got) != math.Float32bits(model) {
			t.Errorf("%s n=%d: fast %.9g, model of ggml's kernel %.9g", k.name, n, got, model)
		}
	}
}

// simdCheckX86 holds a fast kernel to its x86.go kernel bit for bit, whatever the bytes: the
// Go kernels compute exact integer sums and round each float32 operation once, as the
// assembly does, so even infinities and subnormals agree (NaNs agree as NaNs; their payloads
// are not compared).
func simdCheckX86(t testing.TB, k simdKernel, n int, w, x []byte) {
	t.Helper()
	got, want := k.f(n, w, x), k.x86(n, w, x)
	if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
		t.Errorf("%s n=%d: fast %.9g (%08x), x86.go %.9g (%08x)", k.name, n, got, math.Float32bits(got), want, math.Float32bits(want))
	}
}

// simdFixBsums recomputes the bsums of a Q8_K row from its quants.
func simdFixBsums(x []byte) {
	for i := 0; i+292 <= len(x); i += 292 {
		b := x[i : i+292]
		for g := 0; g < 16; g++ {
			var s int16
			for _, v := range b[4+16*g : 4+16*g+16] {
				s += int16(int8(v))
			}
			binary.LittleEndian.PutUint16(b[260+2*g:], uint16(s))
		}
	}
}

// simdTameScales overwrites the fp16 (and Q8_K float32) scales of random rows with finite values
// of either sign, keeping their low bits, so that random quants get compared rather than
// skipped for overflow.
func simdTameScales(typ Type, w, x []byte) {
	h := func(b []byte) {
		v := binary.LittleEndian.Uint16(b)
		binary.LittleEndian.PutUint16(b, v&0x83ff|0x2c00) // |v| in [2^-4, 2^-3)
	}
	switch typ {
	case F32, F16, BF16:
		simdTameFloats(typ, w, 0)
		simdTameFloats(typ, x, 0)
		return
	}
	wb, xb := typ.BlockBytes(), typ.DotType().BlockBytes()
	for i := 0; i+wb <= len(w); i += wb {
		switch typ {
		case MXFP4:
			w[i] = 120 + w[i]&15 // scale 2^(e-128) in [2^-8, 2^7)
		case Q4_K, Q5_K, Q4_1, Q5_1:
			h(w[i:])
			h(w[i+2:])
		case Q6_K:
			h(w[i+208:])
		case Q3_K:
			h(w[i+108:])
		case Q2_K:
			h(w[i+80:])
			h(w[i+82:])
		default:
			h(w[i:])
		}
	}
	for i := 0; i+xb <= len(x); i += xb {
		switch typ.DotType() {
		case Q8_K:
			v := binary.LittleEndian.Uint32(x[i:])
			binary.LittleEndian.PutUint32(x[i:], v&0x807fffff|0x3c000000) // [2^-7, 2^-6)
		case Q8_1:
			h(x[i:])
			h(x[i+2:])
		default:
			h(x[i:])
		}
	}
}

// simdTameFloats gives the F32, F16 or BF16 values of b exponents in a range of 16 binades
// around 2^shift (from their own bits), keeping signs and mantissas: finite products whose
// sums do not overflow. A shift of -63 puts BF16 and F32 products near the float32 subnormal
// range, where VDPBF16PS flushes.
func simdTameFloats(typ Type, b []byte, shift int) {
	switch typ {
	case F32:
		for i := 0; i+4 <= len(b); i += 4 {
			v := binary.LittleEndian.Uint32(b[i:])
			e := uint32(127+shift-8) + v>>23&0xf
			binary.LittleEndian.PutUint32(b[i:], v&0x807fffff|e<<23)
		}
	case F16:
		for i := 0; i+2 <= len(b); i += 2 {
			v := binary.LittleEndian.Uint16(b[i:])
			binary.LittleEndian.PutUint16(b[i:], v&0x83ff|(11+v>>10&7)<<10)
		}
	case BF16:
		for i := 0; i+2 <= len(b); i += 2 {
			v := binary.LittleEndian.Uint16(b[i:])
			e := uint16(127+shift-8) + v>>7&0xf
			binary.LittleEndian.PutUint16(b[i:], v&0x807f|e<<7)
		}
	}
}

func simdRandomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestVecDotFast compares each fast kernel with the portable one on quantized rows (as the
// engine makes them), on random bytes, and on constant bytes that hit the integer edge cases
// (-128 quants, the largest products and sums), for many lengths.
func TestVecDotFast(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, k := range simdNeed(t) {
		typ := k.typ
		bs := typ.BlockSize()
		for _, blocks := range []int{0, 1, 2, 3, 7, 8, 9, 16, 33, 128} {
			n := blocks * bs
			wn, _ := typ.RowBytes(n)
			xn, _ := typ.DotType().RowBytes(n)
			for trial := 0; trial < 8; trial++ {
				w, x := make([]byte, wn), make([]byte, xn)
				switch trial {
				case 0, 1:
					QuantizeRow(typ, randomRow(r, n, 0.05), w)
					QuantizeRow(typ.DotType(), randomRow(r, n, 1), x)
				case 2, 3:
					w, x = simdRandomBytes(r, wn), simdRandomBytes(r, xn)
					simdTameScales(typ, w, x)
				case 4:
					w, x = simdRandomBytes(r, wn), simdRandomBytes(r, xn)
				default:
					// Constant quant bytes: 0x80 (-128 or nibbles 0 and 8), 0x7f, 0xff.
					c := []byte{0x80, 0x7f, 0xff}[trial-5]
					for i := range w {
						w[i] = c
					}
					for i := range x {
						x[i] = c ^ byte(trial&1)<<7
					}
					simdTameScales(typ, w, x)
				}
				if typ.DotType() == Q8_K && (typ == Q6_K || trial < 2) {
					simdFixBsums(x)
				}
				simdCheck(t, k, n, w, x)
			}
		}
	}
}

// TestVecDotFastGolden runs the fast kernels on the golden fixtures (ggml's own inputs): those
// that reproduce ggml's AVX2 kernel must give its result bit for bit, the others must be
// within the bound the portable kernels are held to against it.
func TestVecDotFastGolden(t *testing.T) {
	simdNeed(t)
	seen := map[Type]int{}
	for _, r := range records(t, recVecDot) {
		f := vecDotFast[r.typ]
		if f == nil {
			continue
		}
		seen[r.typ]++
		got := f(r.n, r.a, r.b)
		if simdBitExact[r.typ] {
			if math.Float32bits(got) != math.Float32bits(r.simd) {
				t.Errorf("%v n=%d: fast %.9g, ggml AVX2 kernel %.9g", r.typ, r.n, got, r.simd)
			}
		} else {
			scale := absDot(r.typ, r.n, r.a, r.b)
			if diff := math.Abs(float64(got) - float64(r.simd)); diff > 2e-6*scale+1e-30 {
				t.Errorf("%v n=%d: fast %.9g, ggml AVX2 kernel %.9g: |diff| %.3g > 2e-6 * %.3g", r.typ, r.n, got, r.simd, diff, scale)
			}
		}
		simdCheck(t, simdKernel{r.typ.String(), r.typ, f, simdVec, simdX86Kernels[r.typ.String()]}, r.n, r.a, r.b)
	}
	for typ, f := range vecDotFast {
		if f != nil && seen[Type(typ)] == 0 {
			t.Errorf("no golden vec_dot record for %v", Type(typ))
		}
	}
}

// TestVecDotUsesFast checks that VecDot dispatches to the fast kernels once they are
// installed (without allocating), and to the portable ones in this test binary otherwise.
func TestVecDotUsesFast(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, k := range simdNeed(t) {
		if k.order != simdVec {
			continue
		}
		typ := k.typ
		t.Run(typ.String(), func(t *testing.T) {
			n := 4 * typ.BlockSize()
			wn, _ := typ.RowBytes(n)
			xn, _ := typ.DotType().RowBytes(n)
			w, x := make([]byte, wn), make([]byte, xn)
			QuantizeRow(typ, randomRow(r, n, 0.05), w)
			QuantizeRow(typ.DotType(), randomRow(r, n, 1), x)
			if got, want := VecDot(typ, n, w, x), vecDotRef[typ](n, w, x); math.Float32bits(got) != math.Float32bits(want) {
				t.Errorf("VecDot %.9g, portable %.9g before simdUseFast", got, want)
			}
			simdUseFast(t)
			if got, want := VecDot(typ, n, w, x), vecDotFast[typ](n, w, x); math.Float32bits(got) != math.Float32bits(want) {
				t.Errorf("VecDot %.9g, fast %.9g after simdUseFast", got, want)
			}
		})
	}
}

// TestFastMatchesX86 checks each fast kernel against the Go kernel of x86.go (quant.X86Dot)
// that describes the same llama.cpp arithmetic: they must agree bit for bit, so that X86Dot
// can hand out the fast kernels. The rows are quantized ones, random bytes with finite scales,
// random bytes with any scales (infinities and NaNs included), and constant bytes at the
// integer edges.
func TestFastMatchesX86(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, k := range simdNeed(t) {
		model := k.x86
		if model == nil {
			t.Errorf("%s: no x86.go kernel to compare with", k.name)
			continue
		}
		typ := k.typ
		for trial := 0; trial < 200; trial++ {
			n := (1 + r.IntN(24)) * typ.BlockSize()
			if typ.BlockSize() == 1 {
				// Float rows: multiples of the GEMM steps and any lengths, with tails.
				n = 32 * r.IntN(12)
				if trial%8 >= 4 {
					n = r.IntN(400)
				}
			}
			wn, _ := typ.RowBytes(n)
			xn, _ := typ.DotType().RowBytes(n)
			w, x := make([]byte, wn), make([]byte, xn)
			switch trial % 4 {
			case 0:
				QuantizeRow(typ, randomRow(r, n, 0.05), w)
				QuantizeRow(typ.DotType(), randomRow(r, n, 1), x)
			case 1, 2:
				w, x = simdRandomBytes(r, wn), simdRandomBytes(r, xn)
				if trial%4 == 1 {
					simdTameScales(typ, w, x)
				}
			case 3:
				c := []byte{0x80, 0x7f, 0xff, 0x88, 0x00, 0x0f}[trial/4%6]
				for i := range w {
					w[i] = c
				}
				for i := range x {
					x[i] = c ^ byte(trial/24&1)<<7
				}
				simdTameScales(typ, w, x)
			}
			if typ.BlockSize() == 1 {
				switch trial % 16 {
				case 5:
					// Products near float32's subnormal range.
					simdTameFloats(typ, w, -63)
					simdTameFloats(typ, x, -63)
				case 9, 13:
					// Large values times subnormal and tiny ones (BF16 reads the subnormals
					// as zero).
					big, tiny := w, x
					if trial%16 == 13 {
						big, tiny = x, w
					}
					simdTameFloats(typ, big, 56)
					simdTameFloats(typ, tiny, -119)
				}
			}
			if typ == Q6_K && trial%4 != 0 {
				simdFixBsums(x)
			}
			got, want := k.f(n, w, x), model(n, w, x)
			if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
				t.Errorf("%s n=%d trial %d: fast %.9g (%08x), x86.go %.9g (%08x)", k.name, n, trial, got, math.Float32bits(got), want, math.Float32bits(want))
			}
		}
	}
}

// TestFastX86Dispatch checks that X86Dot hands out, for every type and product shape, a fast
// kernel only where it computes what x86Dot's choice of Go kernel computes: bit for bit.
func TestFastX86Dispatch(t *testing.T) {
	simdNeed(t)
	r := rand.New(rand.NewPCG(29, 30))
	for _, typ := range weightTypes {
		ns := []int{768}
		if typ.BlockSize() == 1 {
			ns = append(ns, 100, 48)
		}
		for _, n := range ns {
			wn, _ := typ.RowBytes(n)
			xn, _ := typ.DotType().RowBytes(n)
			for trial := 0; trial < 4; trial++ {
				w, x := make([]byte, wn), make([]byte, xn)
				if trial%2 == 0 {
					QuantizeRow(typ, randomRow(r, n, 0.05), w)
					QuantizeRow(typ.DotType(), randomRow(r, n, 1), x)
				} else {
					w, x = simdRandomBytes(r, wn), simdRandomBytes(r, xn)
					simdTameScales(typ, w, x)
					if typ == Q6_K {
						simdFixBsums(x)
					}
				}
				for _, rows := range []int{1, 4, 8, 12, 16} {
					for _, batch := range []int{1, 2, 4, 6, 9} {
						for _, i := range []int{0, batch - 1} {
							got := X86Dot(typ, rows, batch, i)(n, w, x)
							want := x86Dot(typ, rows, batch, i)(n, w, x)
							if math.Float32bits(got) != math.Float32bits(want) {
								t.Errorf("%v n=%d rows=%d batch=%d row=%d: X86Dot %.9g, x86Dot %.9g", typ, n, rows, batch, i, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// FuzzVecDotFast is differential fuzzing of the fast kernels against the portable ones:
//
//	go test -run '^$' -fuzz FuzzVecDotFast -fuzztime 60s ./quant
//
// sel picks the kernel (low bits) and whether the scales are tamed (bit 7), data splits into
// weight and activation blocks as in FuzzVecDot. Q6_K rows get consistent bsums (see
// avx2DotQ6K).
func FuzzVecDotFast(f *testing.F) {
	f.Add(uint8(0), bytesOf(0x80, 3*(210+292)))
	f.Add(uint8(0x81), bytesOf(0x7f, 5*(144+292)))
	f.Add(uint8(0x82), bytesOf(0xff, 40*(34+34)))
	f.Add(uint8(0x83), bytesOf(0x88, 9*(18+34)))
	f.Add(uint8(0x84), bytesOf(0x08, 9*(22+34)))
	f.Add(uint8(0x88), bytesOf(0x0f, 9*(20+36)))
	f.Add(uint8(0x89), bytesOf(0x80, 9*(24+36)))
	f.Add(uint8(0x8a), bytesOf(0x80, 9*(18+34)))
	f.Add(uint8(0x8b), bytesOf(0xf0, 9*(18+34)))
	f.Add(uint8(0x8c), bytesOf(0x7f, 9*(18+34)))
	f.Add(uint8(0x8d), bytesOf(0x80, 3*(176+292)))
	f.Add(uint8(0x8e), bytesOf(0x80, 3*(110+292)))
	f.Add(uint8(0x8f), bytesOf(0xff, 3*(84+292)))
	f.Add(uint8(0x90), bytesOf(0x7f, 3*(84+292)))
	f.Add(uint8(0x91), bytesOf(0x80, 3*(84+292)))
	for i := 0; i < 6; i++ {
		f.Add(uint8(0x92+i), bytesOf(0x0f, 4*(77+i)))
	}
	// MXFP4: scale bytes 0x88 and 0x0f (tamed or not), quants at the codebook's ends.
	f.Add(uint8(0x98), bytesOf(0x88, 9*(17+34)))
	f.Add(uint8(0x99), bytesOf(0x7f, 9*(17+34)))
	f.Add(uint8(0x18), bytesOf(0x0f, 3*(17+34)))
	f.Add(uint8(0x19), bytesOf(0x80, 8*(17+34)))
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		ks := simdNeed(t)
		k := ks[int(sel&0x7f)%len(ks)]
		typ := k.typ
		wb, xb := typ.BlockBytes(), typ.DotType().BlockBytes()
		blocks := len(data) / (wb + xb)
		w := append([]byte(nil), data[:blocks*wb]...)
		x := append([]byte(nil), data[blocks*wb:blocks*(wb+xb)]...)
		if sel&0x80 != 0 {
			simdTameScales(typ, w, x)
		}
		if typ == Q6_K {
			simdFixBsums(x)
		}
		simdCheck(t, k, blocks*typ.BlockSize(), w, x)
	})
}

// streamRows is a weight matrix of 1 GiB, larger than the caches (the L3 of the project's Xeon
// VM reports 480 MiB), as a decoding step streams its weights from memory.
var streamRows []byte

// BenchmarkVecDotFastStream is BenchmarkVecDotFast over the rows of a 1 GiB matrix, one
// activation row: the throughput of a matrix-vector product on one core, which memory bounds.
func BenchmarkVecDotFastStream(b *testing.B) {
	if streamRows == nil {
		streamRows = simdRandomBytes(rand.New(rand.NewPCG(25, 26)), 1<<30)
	}
	simdBench(b, func(typ Type) (w, x []byte, rows int) {
		rb, _ := typ.RowBytes(benchN)
		rows = len(streamRows) / rb
		w = streamRows[:rows*rb]
		_, x = benchRows(typ)
		simdTameScales(typ, w, nil)
		return w, x, rows
	})
}

// BenchmarkVecDotFast compares the portable and the fast kernels of each type in MB/s of weight
// row, on the 4096-element rows of BenchmarkVecDot (weights and activation in L1).
func BenchmarkVecDotFast(b *testing.B) {
	simdBench(b, func(typ Type) (w, x []byte, rows int) {
		w, x = benchRows(typ)
		return w, x, 1
	})
}

// simdBench runs the portable kernel of each type with a fast kernel ("ref"), then its fast
// kernels, on rows rows of benchN elements. The fastX86 kernels, which VecDot does not use,
// run after the x86.go kernel they reproduce ("/go").
func simdBench(b *testing.B, rowsOf func(Type) (w, x []byte, rows int)) {
	ks := simdKernels()
	done := map[Type]bool{}
	for _, k := range ks {
		if k.order == simdX86 {
			w, x, rows := rowsOf(k.typ)
			rb := len(w) / rows
			for _, v := range []struct {
				name string
				f    func(int, []byte, []byte) float32
			}{{k.name + "/go", k.x86}, {k.name + "/avx2", k.f}} {
				b.Run(v.name, func(b *testing.B) {
					b.SetBytes(int64(len(w)))
					for b.Loop() {
						for o := 0; o < rows; o++ {
							sinkF32 = v.f(benchN, w[o*rb:(o+1)*rb], x)
						}
					}
				})
			}
			continue
		}
		if done[k.typ] {
			continue
		}
		done[k.typ] = true
		w, x, rows := rowsOf(k.typ)
		rb := len(w) / rows
		run := func(name string, f func(int, []byte, []byte) float32) {
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(len(w)))
				for b.Loop() {
					for o := 0; o < rows; o++ {
						sinkF32 = f(benchN, w[o*rb:(o+1)*rb], x)
					}
				}
			})
		}
		run(k.typ.String()+"/ref", vecDotRef[k.typ])
		for _, k2 := range ks {
			if k2.typ == k.typ {
				run(k2.name+"/avx2", k2.f)
			}
		}
	}
}

// DotF32Vec, which takes the AVX2 kernel where the CPU has it, computes its plain-Go
// reference's bits for every length, including the leftovers after steps of 64.
func TestDotF32VecMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for n := 0; n <= 300; n++ {
		a, b := make([]float32, n), make([]float32, n)
		for i := range a {
			a[i], b[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
		}
		if got, want := DotF32Vec(a, b), dotF32VecRef(a, b); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("n=%d: %v, reference %v", n, got, want)
		}
	}
}
