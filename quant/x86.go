package quant

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// This file holds the dot products in the arithmetic of llama.cpp's x86 CPU backend: the
// AVX2/AVX-512 builds (ggml-cpu-haswell ... ggml-cpu-zen4) that llama.cpp loads on any x86
// machine of the last decade, and with which the engine's golden fixtures were made (zen4).
// The integer parts are those of the portable kernels in vecdot.go; what differs is the float32
// arithmetic around them, which is not associative:
//
//   - 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) are summed in eight lanes of
//     four consecutive products; each lane accumulates d_w*d_x*lane over the blocks with a fused
//     multiply-add, and the lanes are added pairwise at the end (hsum_float_8). Q4_1 and Q5_1
//     add the m*s terms in a scalar chain of fused multiply-adds. This is ggml_vec_dot_*_q8_*
//     (AVX2) and llamafile's tinyBLAS_Q0_AVX alike.
//   - Weights that llama.cpp repacks into interleaved groups of 8 rows at load (Q4_0, IQ4_NL,
//     MXFP4 and Q4_K with a row count divisible by 8) accumulate each block's whole integer
//     sum with one fused multiply-add; Q4_K keeps its min term in a second accumulator, and
//     when four activation rows are multiplied together (GEMM) adds per 64-element pair of
//     sub-blocks. MXFP4 matrices that are not repacked take ggml_vec_dot_mxfp4_q8_0 whatever
//     the batch, since tinyBLAS has no MXFP4 kernel.
//   - The K-quants (Q2_K..Q6_K) keep eight integer lanes per 256-element block (elements
//     4l..4l+3 of every 32-element group) and fuse d*lane into eight float lanes; the min terms
//     of Q2_K, Q4_K and Q5_K are added in their own ways.
//   - F32, F16 and BF16 rows are summed in sixteen fused multiply-add lanes (AVX-512; BF16 with
//     AVX512-BF16's pairwise VDPBF16PS), folded and reduced in ggml's orders.
//
// These are differences in the last bits, but the activations are rounded to 8-bit blocks
// before every quantized matrix product (see QuantizeRow), and a last-bit difference can move a
// value, or a block's float16 scale or sum, across a rounding boundary; on the golden models
// one such flip changes next-token probabilities by up to 0.02. The portable kernels remain
// the reference that this package's fixtures check against ggml's C; these are checked
// against llama.cpp's x86 build by the engine's golden tests.

// fma32 is a float32 fused multiply-add with a single rounding (VFMADD*SS/PS).
func fma32(a, b, c float32) float32 {
	// The product of two float32 values is exact in float64 (at most 48 significant bits), so
	// s is a*b+c rounded once to float64 (whether or not the compiler fuses it). Rounding it
	// again to float32 is wrong only when s lies exactly halfway between two float32 values.
	s := float64(a)*float64(b) + float64(c)
	if uint32(math.Float64bits(s))<<3 == 1<<31 { // the 29 bits below float32 precision are 10...0
		return fma32Tie(a, b, c)
	}
	return float32(s)
}

// fma32Tie finishes fma32 when its float64 sum is a float32 tie: the rounding error of the
// float64 addition (TwoSum) decides the direction, or the tie rounds to even if it was exact.
func fma32Tie(a, b, c float32) float32 {
	p, cf := float64(a)*float64(b), float64(c)
	s := p + cf
	bp := s - p
	if e := (p - (s - bp)) + (cf - bp); e != 0 {
		t := math.Float64bits(s)
		a1 := float32(math.Float64frombits(t - 1<<28))
		a2 := float32(math.Float64frombits(t + 1<<28))
		if e > 0 {
			return max(a1, a2)
		}
		return min(a1, a2)
	}
	return float32(s)
}

// FMA32 is a float32 fused multiply-add (one rounding), for the other x86 emulations.
func FMA32(a, b, c float32) float32 { return fma32(a, b, c) }

// hsum8 is ggml's hsum_float_8: the upper four lanes added to the lower four, then lanes 2,3
// to lanes 0,1, then lane 1 to lane 0.
func hsum8(a *[8]float32) float32 {
	v0, v1, v2, v3 := a[4]+a[0], a[5]+a[1], a[6]+a[2], a[7]+a[3]
	return (v0 + v2) + (v1 + v3)
}

// HSum16 adds 16 lanes in the order of GCC's _mm512_reduce_add_ps (halves of 8, then 4, then
// 2, then 1), which ggml's AVX-512 kernels end with; package models needs the same order.
func HSum16(a *[16]float32) float32 {
	var t [8]float32
	for i := range t {
		t[i] = a[i+8] + a[i]
	}
	u0, u1, u2, u3 := t[4]+t[0], t[5]+t[1], t[6]+t[2], t[7]+t[3]
	return (u0 + u2) + (u1 + u3)
}

// lanes4 adds d times the eight 4-product lane sums of q·y (32 quants) into acc.
func lanes4(acc *[8]float32, d float32, q *[32]int32, y *[32]byte) {
	for l := 0; l < 8; l++ {
		k := 4 * l
		s := float32(q[k]*i8(y[k]) + q[k+1]*i8(y[k+1]) + q[k+2]*i8(y[k+2]) + q[k+3]*i8(y[k+3]))
		// fma32, with its common case inlined
		if v := float64(d)*float64(s) + float64(acc[l]); uint32(math.Float64bits(v))<<3 != 1<<31 {
			acc[l] = float32(v)
		} else {
			acc[l] = fma32Tie(d, s, acc[l])
		}
	}
}

// lanesNib adds d times the eight lane sums of a 4- or 5-bit block against y into acc: lane l
// holds elements 4l..4l+3, that is the low nibbles of qs[4l..4l+3] for l < 4 and the high
// nibbles of qs[4(l-4)..] after. qh holds the 5th bits (0 for 4-bit types) and off is
// subtracted from every quant.
func lanesNib(acc *[8]float32, d float32, qs *[16]byte, qh uint32, off int32, y *[32]byte) {
	for l := 0; l < 8; l++ {
		k := 4 * (l & 3)
		e := 4 * l
		var q0, q1, q2, q3 int32
		if l < 4 {
			q0, q1, q2, q3 = int32(qs[k]&0xf), int32(qs[k+1]&0xf), int32(qs[k+2]&0xf), int32(qs[k+3]&0xf)
		} else {
			q0, q1, q2, q3 = int32(qs[k]>>4), int32(qs[k+1]>>4), int32(qs[k+2]>>4), int32(qs[k+3]>>4)
		}
		h := int32(qh>>e) & 0xf
		q0 += (h & 1) << 4
		q1 += (h >> 1 & 1) << 4
		q2 += (h >> 2 & 1) << 4
		q3 += (h >> 3 & 1) << 4
		s := float32((q0-off)*i8(y[e]) + (q1-off)*i8(y[e+1]) + (q2-off)*i8(y[e+2]) + (q3-off)*i8(y[e+3]))
		// fma32, with its common case inlined
		if v := float64(d)*float64(s) + float64(acc[l]); uint32(math.Float64bits(v))<<3 != 1<<31 {
			acc[l] = float32(v)
		} else {
			acc[l] = fma32Tie(d, s, acc[l])
		}
	}
}

func x86LanesQ4_0(n int, w, x []byte) float32 {
	var acc [8]float32
	for i := 0; i < n/32; i++ {
		wb := (*[18]byte)(w[i*18:])
		xb := (*[34]byte)(x[i*34:])
		lanes4bit(&acc, f16le(wb[0:])*f16le(xb[0:]), (*[16]byte)(wb[2:]), 8, (*[32]byte)(xb[2:]))
	}
	return hsum8(&acc)
}

// lanes4bit is lanesNib for 4-bit quants: lanes l and l+4 come from the low and high nibbles
// of the same bytes qs[4l..4l+3].
func lanes4bit(acc *[8]float32, d float32, qs *[16]byte, off int32, y *[32]byte) {
	for l := 0; l < 4; l++ {
		k := 4 * l
		b0, b1, b2, b3 := int32(qs[k]), int32(qs[k+1]), int32(qs[k+2]), int32(qs[k+3])
		lo := float32((b0&0xf-off)*i8(y[k]) + (b1&0xf-off)*i8(y[k+1]) + (b2&0xf-off)*i8(y[k+2]) + (b3&0xf-off)*i8(y[k+3]))
		hi := float32((b0>>4-off)*i8(y[k+16]) + (b1>>4-off)*i8(y[k+17]) + (b2>>4-off)*i8(y[k+18]) + (b3>>4-off)*i8(y[k+19]))
		// fma32, with its common case inlined
		if v := float64(d)*float64(lo) + float64(acc[l]); uint32(math.Float64bits(v))<<3 != 1<<31 {
			acc[l] = float32(v)
		} else {
			acc[l] = fma32Tie(d, lo, acc[l])
		}
		if v := float64(d)*float64(hi) + float64(acc[l+4]); uint32(math.Float64bits(v))<<3 != 1<<31 {
			acc[l+4] = float32(v)
		} else {
			acc[l+4] = fma32Tie(d, hi, acc[l+4])
		}
	}
}

func x86LanesIQ4NL(n int, w, x []byte) float32 {
	var acc [8]float32
	var q [32]int32
	for i := 0; i < n/32; i++ {
		wb := (*[18]byte)(w[i*18:])
		xb := (*[34]byte)(x[i*34:])
		for j, b := range wb[2:18] {
			q[j] = int32(iq4nlValues[b&0xf])
			q[j+16] = int32(iq4nlValues[b>>4])
		}
		lanes4(&acc, f16le(wb[0:])*f16le(xb[0:]), &q, (*[32]byte)(xb[2:]))
	}
	return hsum8(&acc)
}

// x86VecIQ4NL is ggml_vec_dot_iq4_nl_q8_0 (AVX2), the one-row product of IQ4_NL rows that are
// not repacked: two sets of lanes for even and odd blocks, added lane-wise at the end, and a
// last odd block added as a scalar.
func x86VecIQ4NL(n int, w, x []byte) float32 {
	var acc [2][8]float32
	var q [32]int32
	nb := n / 32
	ib := 0
	for ; ib+1 < nb; ib += 2 {
		for h := 0; h < 2; h++ {
			wb := (*[18]byte)(w[(ib+h)*18:])
			xb := (*[34]byte)(x[(ib+h)*34:])
			for j, b := range wb[2:18] {
				q[j] = int32(iq4nlValues[b&0xf])
				q[j+16] = int32(iq4nlValues[b>>4])
			}
			lanes4(&acc[h], f16le(xb[0:])*f16le(wb[0:]), &q, (*[32]byte)(xb[2:]))
		}
	}
	var sum [8]float32
	for l := range sum {
		sum[l] = acc[0][l] + acc[1][l]
	}
	sumf := hsum8(&sum)
	for ; ib < nb; ib++ {
		wb := (*[18]byte)(w[ib*18:])
		xb := (*[34]byte)(x[ib*34:])
		var s1, s2 int32
		for j := 0; j < 16; j++ {
			s1 += i8(xb[2+j]) * int32(iq4nlValues[wb[2+j]&0xf])
			s2 += i8(xb[18+j]) * int32(iq4nlValues[wb[2+j]>>4])
		}
		sumf = fma32(f16le(xb[0:])*f16le(wb[0:]), float32(s1+s2), sumf)
	}
	return sumf
}

// x86VecMXFP4 is ggml_vec_dot_mxfp4_q8_0 (AVX2): x86VecIQ4NL's order, with MXFP4's codebook
// and its scale fp16(x.d) times the halved E8M0 scale.
func x86VecMXFP4(n int, w, x []byte) float32 {
	var acc [2][8]float32
	var q [32]int32
	nb := n / 32
	ib := 0
	for ; ib+1 < nb; ib += 2 {
		for h := 0; h < 2; h++ {
			wb := (*[17]byte)(w[(ib+h)*17:])
			xb := (*[34]byte)(x[(ib+h)*34:])
			for j, b := range wb[1:17] {
				q[j] = int32(mxfp4Values[b&0xf])
				q[j+16] = int32(mxfp4Values[b>>4])
			}
			lanes4(&acc[h], f16le(xb[0:])*e8m0Half[wb[0]], &q, (*[32]byte)(xb[2:]))
		}
	}
	var sum [8]float32
	for l := range sum {
		sum[l] = acc[0][l] + acc[1][l]
	}
	sumf := hsum8(&sum)
	for ; ib < nb; ib++ {
		wb := (*[17]byte)(w[ib*17:])
		xb := (*[34]byte)(x[ib*34:])
		var s1, s2 int32
		for j := 0; j < 16; j++ {
			s1 += i8(xb[2+j]) * int32(mxfp4Values[wb[1+j]&0xf])
			s2 += i8(xb[18+j]) * int32(mxfp4Values[wb[1+j]>>4])
		}
		sumf = fma32(f16le(xb[0:])*e8m0Half[wb[0]], float32(s1+s2), sumf)
	}
	return sumf
}

func x86LanesQ5_0(n int, w, x []byte) float32 {
	var acc [8]float32
	for i := 0; i < n/32; i++ {
		wb := (*[22]byte)(w[i*22:])
		xb := (*[34]byte)(x[i*34:])
		lanesNib(&acc, f16le(wb[0:])*f16le(xb[0:]), (*[16]byte)(wb[6:]), binary.LittleEndian.Uint32(wb[2:]), 16, (*[32]byte)(xb[2:]))
	}
	return hsum8(&acc)
}

func x86LanesQ8_0(n int, w, x []byte) float32 {
	var acc [8]float32
	for i := 0; i < n/32; i++ {
		wb := (*[34]byte)(w[i*34:])
		xb := (*[34]byte)(x[i*34:])
		d := f16le(wb[0:]) * f16le(xb[0:])
		a := (*[32]byte)(wb[2:])
		b := (*[32]byte)(xb[2:])
		for l := 0; l < 8; l++ {
			k := 4 * l
			s := i8(a[k])*i8(b[k]) + i8(a[k+1])*i8(b[k+1]) + i8(a[k+2])*i8(b[k+2]) + i8(a[k+3])*i8(b[k+3])
			acc[l] = fma32(d, float32(s), acc[l])
		}
	}
	return hsum8(&acc)
}

func x86LanesQ4_1(n int, w, x []byte) float32 {
	var acc [8]float32
	var summs float32
	for i := 0; i < n/32; i++ {
		wb := (*[20]byte)(w[i*20:])
		xb := (*[36]byte)(x[i*36:])
		summs = fma32(f16le(wb[2:]), f16le(xb[2:]), summs)
		lanes4bit(&acc, f16le(wb[0:])*f16le(xb[0:]), (*[16]byte)(wb[4:]), 0, (*[32]byte)(xb[4:]))
	}
	return hsum8(&acc) + summs
}

func x86LanesQ5_1(n int, w, x []byte) float32 {
	var acc [8]float32
	var summs float32
	for i := 0; i < n/32; i++ {
		wb := (*[24]byte)(w[i*24:])
		xb := (*[36]byte)(x[i*36:])
		summs = fma32(f16le(wb[2:]), f16le(xb[2:]), summs)
		lanesNib(&acc, f16le(wb[0:])*f16le(xb[0:]), (*[16]byte)(wb[8:]), binary.LittleEndian.Uint32(wb[4:]), 0, (*[32]byte)(xb[4:]))
	}
	return hsum8(&acc) + summs
}

// x86RepackQ4_0 is the 8x8-interleaved GEMV/GEMM of Q4_0 (gemv_q4_b32_8x8_q8_0_lut_avx and its
// GEMM): one fused multiply-add of each block's integer sum. The integer sum is that of dotQ4_0.
func x86RepackQ4_0(n int, w, x []byte) float32 {
	var acc float32
	for i := 0; i < n/32; i++ {
		wb := (*[18]byte)(w[i*18:])
		xb := (*[34]byte)(x[i*34:])
		q := (*[16]byte)(wb[2:])
		ylo := (*[16]byte)(xb[2:])
		yhi := (*[16]byte)(xb[18:])
		var s int32
		for j := 0; j < 4; j++ {
			k := 4 * j
			s += (int32(q[k]&0xf)-8)*i8(ylo[k]) + (int32(q[k+1]&0xf)-8)*i8(ylo[k+1]) +
				(int32(q[k+2]&0xf)-8)*i8(ylo[k+2]) + (int32(q[k+3]&0xf)-8)*i8(ylo[k+3])
			s += (int32(q[k]>>4)-8)*i8(yhi[k]) + (int32(q[k+1]>>4)-8)*i8(yhi[k+1]) +
				(int32(q[k+2]>>4)-8)*i8(yhi[k+2]) + (int32(q[k+3]>>4)-8)*i8(yhi[k+3])
		}
		acc = fma32(float32(s), f16le(wb[0:])*f16le(xb[0:]), acc)
	}
	return acc
}

// x86RepackIQ4NL is x86RepackQ4_0 for IQ4_NL (the same GEMV/GEMM template).
func x86RepackIQ4NL(n int, w, x []byte) float32 {
	kv := &iq4nlValues
	var acc float32
	for i := 0; i < n/32; i++ {
		wb := (*[18]byte)(w[i*18:])
		xb := (*[34]byte)(x[i*34:])
		q := (*[16]byte)(wb[2:])
		s := codebookDot(kv, q, (*[16]byte)(xb[2:]), (*[16]byte)(xb[18:])) // exact in any order
		acc = fma32(float32(s), f16le(wb[0:])*f16le(xb[0:]), acc)
	}
	return acc
}

// x86RepackMXFP4 is the 8x8-interleaved GEMV/GEMM of MXFP4 (llama.cpp's copy of IQ4_NL's,
// gemv_q4_b32_8x8_q8_0_lut_avx<block_mxfp4x8>): one fused multiply-add of each block's integer
// sum times the halved E8M0 scale times fp16(x.d).
func x86RepackMXFP4(n int, w, x []byte) float32 {
	kv := &mxfp4Values
	var acc float32
	for i := 0; i < n/32; i++ {
		wb := (*[17]byte)(w[i*17:])
		xb := (*[34]byte)(x[i*34:])
		q := (*[16]byte)(wb[1:])
		s := codebookDot(kv, q, (*[16]byte)(xb[2:]), (*[16]byte)(xb[18:])) // exact in any order
		acc = fma32(float32(s), e8m0Half[wb[0]]*f16le(xb[0:]), acc)
	}
	return acc
}

// x86RepackQ4K is ggml_gemv_q4_K_8x8_q8_K, the product of one activation row with repacked
// Q4_K rows: per super-block one fused multiply-add of the scaled integer sum and one of the
// min term, kept in separate accumulators until the end. x86RepackGemmQ4K is
// ggml_gemm_q4_K_8x8_q8_K, which takes activation rows four at a time and does the same per
// 64-element pair of sub-blocks.
func x86RepackQ4K(n int, w, x []byte) float32 { return x86Q4KRepack(n, w, x, false) }

func x86RepackGemmQ4K(n int, w, x []byte) float32 { return x86Q4KRepack(n, w, x, true) }

func x86Q4KRepack(n int, w, x []byte, perPair bool) float32 {
	var acc, accMin float32
	for i := 0; i < n/256; i++ {
		wb := (*[144]byte)(w[i*144:])
		yd, q8, bs := q8K(x, i)
		s := wb[4:16]
		d, dmin := f16le(wb[0:])*yd, f16le(wb[2:])*yd
		var sum, sumMin int32
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(wb[16+32*c:])
			ylo := (*[32]byte)(q8[64*c:])
			yhi := (*[32]byte)(q8[64*c+32:])
			sc1, m1 := kScaleMin(2*c, s)
			sc2, m2 := kScaleMin(2*c+1, s)
			var lo, hi int32
			for k := 0; k < 32; k += 4 {
				lo += int32(q[k]&0xf)*i8(ylo[k]) + int32(q[k+1]&0xf)*i8(ylo[k+1]) +
					int32(q[k+2]&0xf)*i8(ylo[k+2]) + int32(q[k+3]&0xf)*i8(ylo[k+3])
				hi += int32(q[k]>>4)*i8(yhi[k]) + int32(q[k+1]>>4)*i8(yhi[k+1]) +
					int32(q[k+2]>>4)*i8(yhi[k+2]) + int32(q[k+3]>>4)*i8(yhi[k+3])
			}
			sum += int32(sc1)*lo + int32(sc2)*hi
			sumMin += int32(m1)*(bsum(bs, 4*c)+bsum(bs, 4*c+1)) + int32(m2)*(bsum(bs, 4*c+2)+bsum(bs, 4*c+3))
			if perPair {
				acc = fma32(float32(sum), d, acc)
				accMin = fma32(float32(sumMin), dmin, accMin)
				sum, sumMin = 0, 0
			}
		}
		if !perPair {
			acc = fma32(float32(sum), d, acc)
			accMin = fma32(float32(sumMin), dmin, accMin)
		}
	}
	return acc - accMin
}

// x86Q6K is ggml_vec_dot_q6_K_q8_K (AVX2): integer lane l holds, over both halves and the four
// 32-element groups of each, elements 4l..4l+3 of the group times their sub-block scales, minus
// 32 times the bsums of sub-blocks 2l and 2l+1 weighted by their scales.
func x86Q6K(n int, w, x []byte) float32 {
	var acc [8]float32
	for i := 0; i < n/256; i++ {
		wb := (*[210]byte)(w[i*210:])
		yd, q8, bs := q8K(x, i)
		sc := (*[16]byte)(wb[192:208])
		var lane [8]int32
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(wb[64*h:])
			qh := (*[32]byte)(wb[128+32*h:])
			y := (*[128]byte)(q8[128*h:])
			for l := 0; l < 32; l += 4 {
				// Elements l..l+3 of each of the four 32-element groups share lane l/4 and,
				// within a group, one sub-block scale.
				var s1, s2, s3, s4 int32
				for k := l; k < l+4; k++ {
					hb := qh[k]
					s1 += int32(ql[k]&0xf|(hb&3)<<4) * i8(y[k])
					s2 += int32(ql[k+32]&0xf|(hb>>2&3)<<4) * i8(y[k+32])
					s3 += int32(ql[k]>>4|(hb>>4&3)<<4) * i8(y[k+64])
					s4 += int32(ql[k+32]>>4|(hb>>6)<<4) * i8(y[k+96])
				}
				p := 8*h + l/16
				lane[l/4] += int32(int8(sc[p]))*s1 + int32(int8(sc[p+2]))*s2 + int32(int8(sc[p+4]))*s3 + int32(int8(sc[p+6]))*s4
			}
		}
		for l := 0; l < 8; l++ {
			lane[l] -= 32 * (bsum(bs, 2*l)*int32(int8(sc[2*l])) + bsum(bs, 2*l+1)*int32(int8(sc[2*l+1])))
		}
		d := yd * f16le(wb[208:])
		kLanes(&acc, d, &lane)
	}
	return hsum8(&acc)
}

// kLanes fuses d times the eight integer lanes of a K-quant block into acc, the lanes of
// ggml's AVX2 K-quant kernels: lane l sums elements 4l..4l+3 of every 32-element group.
func kLanes(acc *[8]float32, d float32, lane *[8]int32) {
	for l := range acc {
		acc[l] = fma32(d, float32(lane[l]), acc[l])
	}
}

// x86Q2K is ggml_vec_dot_q2_K_q8_K (AVX2): per block, the min term as eight lanes of two
// sub-blocks each (dmin = -d_y*dmin_w), then the scaled quants, both fused into one set of
// lanes.
func x86Q2K(n int, w, x []byte) float32 {
	var acc [8]float32
	for i := 0; i < n/256; i++ {
		wb := (*[84]byte)(w[i*84:])
		yd, q8, bs := q8K(x, i)
		sc := (*[16]byte)(wb[0:16])
		var mins, lane [8]int32
		for l := 0; l < 8; l++ {
			mins[l] = int32(sc[2*l]>>4)*bsum(bs, 2*l) + int32(sc[2*l+1]>>4)*bsum(bs, 2*l+1)
		}
		for e := 0; e < 256; e++ {
			j, g, k := e/128, e%128/32, e%32
			q := int32(wb[16+32*j+k] >> (2 * g) & 3)
			lane[k/4] += int32(sc[e/16]&0xf) * q * i8(q8[e])
		}
		kLanes(&acc, -yd*f16le(wb[82:]), &mins)
		kLanes(&acc, yd*f16le(wb[80:]), &lane)
	}
	return hsum8(&acc)
}

// x86RepackQ2K is ggml_gemv_q2_K_8x8_q8_K (AVX-512 builds repack Q2_K): per super-block one
// fused multiply-add of the scaled integer sum and one of the min term, subtracted at the end.
// x86RepackGemmQ2K is ggml_gemm_q2_K_8x8_q8_K, which does the same per 128 elements.
func x86RepackQ2K(n int, w, x []byte) float32 { return x86Q2KRepack(n, w, x, false) }

func x86RepackGemmQ2K(n int, w, x []byte) float32 { return x86Q2KRepack(n, w, x, true) }

func x86Q2KRepack(n int, w, x []byte, perHalf bool) float32 {
	var acc, accMin float32
	for i := 0; i < n/256; i++ {
		wb := (*[84]byte)(w[i*84:])
		yd, q8, bs := q8K(x, i)
		sc := (*[16]byte)(wb[0:16])
		d, dmin := f16le(wb[80:])*yd, f16le(wb[82:])*yd
		var sum, sumMin int32
		for h := 0; h < 2; h++ {
			for e := 128 * h; e < 128*(h+1); e++ {
				g, k := e%128/32, e%32
				q := int32(wb[16+32*h+k] >> (2 * g) & 3)
				sum += int32(sc[e/16]&0xf) * q * i8(q8[e])
			}
			for j := 8 * h; j < 8*(h+1); j++ {
				sumMin += int32(sc[j]>>4) * bsum(bs, j)
			}
			if perHalf {
				acc = fma32(float32(sum), d, acc)
				accMin = fma32(float32(sumMin), dmin, accMin)
				sum, sumMin = 0, 0
			}
		}
		if !perHalf {
			acc = fma32(float32(sum), d, acc)
			accMin = fma32(float32(sumMin), dmin, accMin)
		}
	}
	return acc - accMin
}

// x86Q3K is ggml_vec_dot_q3_K_q8_K (AVX2).
func x86Q3K(n int, w, x []byte) float32 {
	var acc [8]float32
	var scales [16]int32
	for i := 0; i < n/256; i++ {
		wb := (*[110]byte)(w[i*110:])
		yd, q8, _ := q8K(x, i)
		q3kScales(wb[96:108], &scales)
		var lane [8]int32
		for e := 0; e < 256; e++ {
			j, g, k := e/128, e%128/32, e%32
			q := int32(wb[32+32*j+k]>>(2*g)&3) - 4 + 4*int32(wb[k]>>(4*j+g)&1)
			lane[k/4] += scales[e/16] * q * i8(q8[e])
		}
		kLanes(&acc, yd*f16le(wb[108:]), &lane)
	}
	return hsum8(&acc)
}

// x86Q4K is ggml_vec_dot_q4_K_q8_K (AVX2), for Q4_K matrices that llama.cpp does not repack:
// the min terms go to four lanes of two sub-blocks each, reduced separately.
func x86Q4K(n int, w, x []byte) float32 {
	var acc [8]float32
	var accMin [4]float32
	for i := 0; i < n/256; i++ {
		wb := (*[144]byte)(w[i*144:])
		yd, q8, bs := q8K(x, i)
		s := wb[4:16]
		var lane [8]int32
		for e := 0; e < 256; e++ {
			c, k := e/64, e%32
			b := wb[16+32*c+k]
			q := int32(b & 0xf)
			if e%64 >= 32 {
				q = int32(b >> 4)
			}
			sc, _ := kScaleMin(e/32, s)
			lane[k/4] += int32(sc) * q * i8(q8[e])
		}
		dmin := -yd * f16le(wb[2:])
		for k := 0; k < 4; k++ {
			_, m0 := kScaleMin(2*k, s)
			_, m1 := kScaleMin(2*k+1, s)
			p := int32(m0)*(bsum(bs, 4*k)+bsum(bs, 4*k+1)) + int32(m1)*(bsum(bs, 4*k+2)+bsum(bs, 4*k+3))
			accMin[k] = fma32(dmin, float32(p), accMin[k])
		}
		kLanes(&acc, yd*f16le(wb[0:]), &lane)
	}
	return hsum8(&acc) + ((accMin[0] + accMin[2]) + (accMin[1] + accMin[3]))
}

// x86Q5K is ggml_vec_dot_q5_K_q8_K (AVX2): the min term is summed as an integer and fused into
// a scalar per block.
func x86Q5K(n int, w, x []byte) float32 {
	var acc [8]float32
	var summs float32
	for i := 0; i < n/256; i++ {
		wb := (*[176]byte)(w[i*176:])
		yd, q8, bs := q8K(x, i)
		s := wb[4:16]
		qh := (*[32]byte)(wb[16:48])
		var lane [8]int32
		for e := 0; e < 256; e++ {
			c, k := e/64, e%32
			b := wb[48+32*c+k]
			hi := e%64 >= 32
			q := int32(b & 0xf)
			bit := uint(2 * c)
			if hi {
				q, bit = int32(b>>4), bit+1
			}
			q += int32(qh[k]>>bit&1) << 4
			sc, _ := kScaleMin(e/32, s)
			lane[k/4] += int32(sc) * q * i8(q8[e])
		}
		summs = fma32(-yd*f16le(wb[2:]), float32(kMins(s, bs)), summs)
		kLanes(&acc, yd*f16le(wb[0:]), &lane)
	}
	return hsum8(&acc) + summs
}

// DotF32Lanes16 is llamafile's tinyBLAS for F32 on AVX-512, the kernel of batched F32 matrix
// products: sixteen fused multiply-add lanes, lane r taking the elements r mod 16, then
// _mm512_reduce_add_ps. len(a) must be a multiple of 16.
func DotF32Lanes16(a, b []float32) float32 {
	b = b[:len(a)]
	var acc [16]float32
	for i := 0; i+16 <= len(a); i += 16 {
		lanes16(&acc, (*[16]float32)(a[i:]), (*[16]float32)(b[i:]))
	}
	return HSum16(&acc)
}

func lanes16(acc, x, y *[16]float32) {
	for r := range acc {
		// fma32, with its common case inlined
		if v := float64(x[r])*float64(y[r]) + float64(acc[r]); uint32(math.Float64bits(v))<<3 != 1<<31 {
			acc[r] = float32(v)
		} else {
			acc[r] = fma32Tie(x[r], y[r], acc[r])
		}
	}
}

// DotF32Vec is ggml_vec_dot_f32 on AVX-512, the kernel of one-row F32 products and of attention
// scores: four 16-lane fused multiply-add accumulators over steps of 64 elements, folded 0+2,
// 1+3, then 0+1 and reduced as _mm512_reduce_add_ps. The compiler vectorised the loop over the
// remaining elements: groups of 16, then one of 8, are multiplied, rounded and added one by one;
// the last ones (fewer than 8) are fused.
//
// It runs fastX86F32Vec where the CPU has it (chosen once at start-up), which computes the
// same bits; dotF32VecRef is the plain-Go reference it is tested against.
func DotF32Vec(a, b []float32) float32 {
	b = b[:len(a)]
	if f := fastX86F32Vec; f != nil && len(a) > 0 {
		return f(len(a), f32Bytes(a), f32Bytes(b))
	}
	return dotF32VecRef(a, b)
}

// f32Bytes views a's floats as their little-endian bytes.
func f32Bytes(a []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), 4*len(a))
}

// dotF32VecRef is DotF32Vec in plain Go.
func dotF32VecRef(a, b []float32) float32 {
	var v vecF32
	np := len(a) &^ 63
	for i := 0; i < np; i += 64 {
		v.step((*[64]float32)(a[i:]), (*[64]float32)(b[i:]))
	}
	return v.finish(a[np:], b[np:])
}

// vecF32 is the state of ggml_vec_dot_f32: its four 16-lane accumulators.
type vecF32 struct{ acc [4][16]float32 }

func (v *vecF32) step(x, y *[64]float32) {
	for j := range v.acc {
		lanes16(&v.acc[j], (*[16]float32)(x[16*j:]), (*[16]float32)(y[16*j:]))
	}
}

// finish reduces the accumulators and adds the leftover elements a, b (fewer than 64).
func (v *vecF32) finish(a, b []float32) float32 {
	acc := &v.acc
	for r := 0; r < 16; r++ {
		acc[0][r] += acc[2][r]
		acc[1][r] += acc[3][r]
	}
	for r := 0; r < 16; r++ {
		acc[0][r] += acc[1][r]
	}
	sum := HSum16(&acc[0])
	n, i := len(a), 0
	for ; n-i >= 16; i += 16 {
		for k := i; k < i+16; k++ {
			sum += float32(a[k] * b[k])
		}
	}
	if n-i >= 8 {
		for k := i; k < i+8; k++ {
			sum += float32(a[k] * b[k])
		}
		i += 8
	}
	for ; i < n; i++ {
		sum = fma32(a[i], b[i], sum)
	}
	return sum
}

// f32s decodes len(dst) little-endian floats from b.
func f32s(dst []float32, b []byte) {
	b = b[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i : 4*i+4]))
	}
}

// x86F32Gemm and x86F32Vec are DotF32Lanes16 and DotF32Vec on F32 row bytes, decoded in
// chunks on the stack.
func x86F32Gemm(n int, w, x []byte) float32 {
	if n%16 != 0 {
		return x86F32Vec(n, w, x)
	}
	var acc [16]float32
	var a, b [16]float32
	for i := 0; i < n; i += 16 {
		f32s(a[:], w[4*i:])
		f32s(b[:], x[4*i:])
		lanes16(&acc, &a, &b)
	}
	return HSum16(&acc)
}

func x86F32Vec(n int, w, x []byte) float32 {
	var v vecF32
	var a, b [64]float32
	np := n &^ 63
	for i := 0; i < np; i += 64 {
		f32s(a[:], w[4*i:])
		f32s(b[:], x[4*i:])
		v.step(&a, &b)
	}
	f32s(a[:n-np], w[4*np:])
	f32s(b[:n-np], x[4*np:])
	return v.finish(a[:n-np], b[:n-np])
}

// x86F16Gemm is tinyBLAS for F16 on AVX-512: the halves widened to float32 and summed in
// sixteen fused lanes as DotF32Lanes16.
func x86F16Gemm(n int, w, x []byte) float32 {
	if n%16 != 0 {
		return x86F16Vec(n, w, x)
	}
	var acc, a, b [16]float32
	for i := 0; i < n; i += 16 {
		for r := range a {
			a[r] = f16le(w[2*(i+r):])
			b[r] = f16le(x[2*(i+r):])
		}
		lanes16(&acc, &a, &b)
	}
	return HSum16(&acc)
}

// x86F16Vec is ggml_vec_dot_f16 on AVX-512 without AVX512-FP16: the steps of 64 as
// ggml_vec_dot_f32, the reduced sum and then the remaining products (float32) added in
// float64.
func x86F16Vec(n int, w, x []byte) float32 {
	var v vecF32
	var a, b [64]float32
	np := n &^ 63
	for i := 0; i < np; i += 64 {
		for r := range a {
			a[r] = f16le(w[2*(i+r):])
			b[r] = f16le(x[2*(i+r):])
		}
		v.step(&a, &b)
	}
	sum := float64(v.finish(nil, nil))
	for i := np; i < n; i++ {
		sum += float64(f16le(w[2*i:]) * f16le(x[2*i:]))
	}
	return float32(sum)
}

// bf16daz widens a bfloat16, reading subnormals as zero as VDPBF16PS does.
func bf16daz(b []byte) float32 {
	h := binary.LittleEndian.Uint16(b)
	if h&0x7f80 == 0 {
		h &= 0x8000
	}
	return math.Float32frombits(uint32(h) << 16)
}

// dpbf16 is one lane of VDPBF16PS: the odd pair then the even pair fused into acc in float32,
// with subnormal inputs read as zero and subnormal results flushed to zero.
func dpbf16(acc float32, w, x []byte) float32 {
	ftz := func(v float32) float32 {
		if math.Float32bits(v)&0x7f800000 == 0 {
			return math.Float32frombits(math.Float32bits(v) & 0x80000000)
		}
		return v
	}
	acc = ftz(fma32(bf16daz(w[2:]), bf16daz(x[2:]), acc))
	return ftz(fma32(bf16daz(w), bf16daz(x), acc))
}

// x86BF16Gemm is tinyBLAS for BF16 with AVX512-BF16: sixteen lanes of VDPBF16PS, lane l taking
// the pair 2l, 2l+1 of every 32 elements, then _mm512_reduce_add_ps.
func x86BF16Gemm(n int, w, x []byte) float32 {
	if n%32 != 0 {
		return x86BF16Vec(n, w, x)
	}
	var acc [16]float32
	for i := 0; i < n; i += 32 {
		for l := range acc {
			k := 2 * (i + 2*l)
			acc[l] = dpbf16(acc[l], w[k:], x[k:])
		}
	}
	return HSum16(&acc)
}

// x86BF16Vec is ggml_vec_dot_bf16 with AVX512-BF16: two sets of VDPBF16PS lanes for the two
// halves of every 64 elements, each reduced and added in float64, then the remaining products
// (float32) added in float64.
func x86BF16Vec(n int, w, x []byte) float32 {
	var c [2][16]float32
	i := 0
	for ; i+64 <= n; i += 64 {
		for h := range c {
			for l := range c[h] {
				k := 2 * (i + 32*h + 2*l)
				c[h][l] = dpbf16(c[h][l], w[k:], x[k:])
			}
		}
	}
	sum := float64(HSum16(&c[0]))
	sum += float64(HSum16(&c[1]))
	for ; i < n; i++ {
		sum += float64(BF16ToFP32(binary.LittleEndian.Uint16(w[2*i:])) * BF16ToFP32(binary.LittleEndian.Uint16(x[2*i:])))
	}
	return float32(sum)
}

// X86Dot returns the dot product llama.cpp's x86 CPU backend (its AVX-512 build, zen4)
// computes between a row of a weight matrix of type t with rows rows and activation row i
// (already rounded to t.DotType()) of a product over batch activation rows; the kernel's
// arguments and preconditions are as for VecDot. Every weight type the engine supports has its
// x86 kernel here.
func X86Dot(t Type, rows, batch, i int) func(n int, w, x []byte) float32 {
	if f := fastX86(t, rows, batch, i); f != nil {
		return f
	}
	return x86Dot(t, rows, batch, i)
}

// repackedRows reports whether llama.cpp's CPU backend repacks a matrix of rows rows (of a
// type it repacks) into interleaved groups of 8: ggml_repack_get_optimal_repack_type asks
// that the row count divide.
func repackedRows(rows int) bool { return rows%8 == 0 }

// fastX86 returns the assembly kernel that computes exactly what x86Dot's Go kernel computes
// for the same product (TestFastMatchesX86 holds them to the bit), or nil where there is none
// or the CPU lacks AVX2/FMA/F16C.
func fastX86(t Type, rows, batch, i int) func(n int, w, x []byte) float32 {
	repacked := repackedRows(rows)
	switch t {
	case Q8_0, Q5_0, Q6_K:
		return vecDotFast[t]
	case Q4_0:
		if repacked {
			return fastRepackQ4_0
		}
		return vecDotFast[t]
	case Q4_K:
		switch {
		case repacked && i < batch-batch%4:
			return fastRepackGemmQ4K
		case repacked:
			return fastRepackQ4K
		}
		return vecDotFast[t]
	case Q4_1:
		return fastX86Q4_1
	case Q5_1:
		return fastX86Q5_1
	case IQ4_NL:
		switch {
		case repacked:
			return fastX86RepackIQ4NL
		case batch >= 2:
			return fastX86IQ4NL
		}
		return fastX86VecIQ4NL
	case MXFP4:
		if repacked {
			return fastX86RepackMXFP4
		}
		return fastX86VecMXFP4
	case Q5_K:
		return fastX86Q5K
	case Q3_K:
		return fastX86Q3K
	case Q2_K:
		switch {
		case repacked && i < batch-batch%4:
			return fastX86RepackGemmQ2K
		case repacked:
			return fastX86RepackQ2K
		}
		return fastX86Q2K
	case F32:
		if batch >= 2 && rows%4 == 0 {
			return fastX86F32Gemm
		}
		return fastX86F32Vec
	case F16:
		if batch >= 2 && rows%4 == 0 {
			return fastX86F16Gemm
		}
		return fastX86F16Vec
	case BF16:
		if batch >= 2 && rows%4 == 0 {
			return fastX86BF16Gemm
		}
		return fastX86BF16Vec
	}
	return nil
}

// x86Dot is X86Dot's choice among the Go kernels.
func x86Dot(t Type, rows, batch, i int) func(n int, w, x []byte) float32 {
	// ggml_repack_get_optimal_repack_type repacks Q4_0, IQ4_NL, MXFP4, Q4_K (AVX2) and Q2_K
	// (AVX-512) into groups of 8 rows when the row count allows; the repacked product takes
	// the activation rows in groups of four (GEMM) and the rest one at a time (GEMV). Other
	// products of two or more rows go through llamafile's tinyBLAS where it has a kernel
	// (F32, and Q8_0, Q5_0, IQ4_NL, Q4_0 against Q8_0), otherwise through ggml_vec_dot_*.
	repacked := repackedRows(rows)
	gemm := i < batch-batch%4
	switch t {
	case Q4_0:
		if repacked {
			return x86RepackQ4_0
		}
		return x86LanesQ4_0
	case IQ4_NL:
		switch {
		case repacked:
			return x86RepackIQ4NL
		case batch >= 2:
			return x86LanesIQ4NL
		}
		return x86VecIQ4NL
	case MXFP4:
		// GEMV and GEMM sum each block alike, so the group of four does not matter.
		if repacked {
			return x86RepackMXFP4
		}
		return x86VecMXFP4
	case Q5_0:
		return x86LanesQ5_0
	case Q8_0:
		return x86LanesQ8_0
	case Q4_1:
		return x86LanesQ4_1
	case Q5_1:
		return x86LanesQ5_1
	case Q2_K:
		switch {
		case repacked && gemm:
			return x86RepackGemmQ2K
		case repacked:
			return x86RepackQ2K
		}
		return x86Q2K
	case Q3_K:
		return x86Q3K
	case Q4_K:
		switch {
		case repacked && gemm:
			return x86RepackGemmQ4K
		case repacked:
			return x86RepackQ4K
		}
		return x86Q4K
	case Q5_K:
		return x86Q5K
	case Q6_K:
		return x86Q6K
	case F32:
		// tinyBLAS takes products of two or more rows when the matrix has a multiple of 4
		// rows and the row length is a multiple of its step (the kernels check the latter);
		// otherwise ggml_vec_dot_* runs.
		if batch >= 2 && rows%4 == 0 {
			return x86F32Gemm
		}
		return x86F32Vec
	case F16:
		if batch >= 2 && rows%4 == 0 {
			return x86F16Gemm
		}
		return x86F16Vec
	case BF16:
		if batch >= 2 && rows%4 == 0 {
			return x86BF16Gemm
		}
		return x86BF16Vec
	}
	return vecDot[t]
}
