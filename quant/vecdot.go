package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The dot products follow ggml-cpu's portable kernels (ggml-cpu/quants.c *_generic and the
// scalar paths of vec.cpp): integer sums of quant products per block, then one scaling per
// block in the same float32 operations and order, so they agree with those kernels bit for
// bit. The K-quant kernels keep ggml's eight float32 lane accumulators (lane k collects the
// elements whose index is k mod 8) because the final result depends on that rounding order.
// llama.cpp's x86 SIMD kernels sum in another order and differ from these in the last bits;
// the golden tests bound that difference.
//
// float32(...) around a product forbids the compiler from fusing it with a following add,
// which ggml's portable code does not do either.

// vecDot is indexed by the weight Type; the activation side is always t.DotType().
var vecDot = [...]func(n int, w, x []byte) float32{
	F32:    dotF32,
	F16:    dotF16,
	BF16:   dotBF16,
	Q4_0:   dotQ4_0,
	Q4_1:   dotQ4_1,
	Q5_0:   dotQ5_0,
	Q5_1:   dotQ5_1,
	Q8_0:   dotQ8_0,
	IQ4_NL: dotIQ4NL,
	MXFP4:  dotMXFP4,
	Q2_K:   dotQ2K,
	Q3_K:   dotQ3K,
	Q4_K:   dotQ4K,
	Q5_K:   dotQ5K,
	Q6_K:   dotQ6K,
}

// VecDot returns the dot product of n elements of a weight row w of type t with an activation
// row x already quantized to t.DotType() (see QuantizeRow).
//
// Preconditions: t is a weight type, n is a whole number of t's blocks, len(w) is exactly
// t.RowBytes(n) and len(x) exactly t.DotType().RowBytes(n); violations panic. Any byte
// content is accepted without panicking.
func VecDot(t Type, n int, w, x []byte) float32 {
	var f func(int, []byte, []byte) float32
	if int(t) < len(vecDot) {
		f = vecDot[t]
	}
	if f == nil {
		panic(fmt.Sprintf("quant: VecDot: no dot product for %v weights", t))
	}
	checkRow("VecDot", t, n, len(w))
	checkRow("VecDot", t.DotType(), n, len(x))
	return f(n, w, x)
}

// The float kernels sum float32 products in float64 like vec.cpp's scalar path, but in four
// interleaved partial sums. ggml sums sequentially; the results are identical whenever the
// partial sums are exact in float64 (always for F16 and BF16 rows of ordinary range, whose
// products have at most 22 significant bits), and otherwise within rounding of the final
// float32.

func dotF32(n int, w, x []byte) float32 {
	w, x = w[:4*n], x[:4*n]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= n; i += 4 {
		a := (*[16]byte)(w[4*i:])
		b := (*[16]byte)(x[4*i:])
		s0 += float64(float32(f32le(a[0:]) * f32le(b[0:])))
		s1 += float64(float32(f32le(a[4:]) * f32le(b[4:])))
		s2 += float64(float32(f32le(a[8:]) * f32le(b[8:])))
		s3 += float64(float32(f32le(a[12:]) * f32le(b[12:])))
	}
	for ; i < n; i++ {
		s0 += float64(float32(f32le(w[4*i:]) * f32le(x[4*i:])))
	}
	return float32((s0 + s1) + (s2 + s3))
}

func f32le(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

func dotF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	t := fp16Table
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= n; i += 4 {
		a := binary.LittleEndian.Uint64(w[2*i:])
		b := binary.LittleEndian.Uint64(x[2*i:])
		s0 += float64(t[uint16(a)] * t[uint16(b)])
		s1 += float64(t[uint16(a>>16)] * t[uint16(b>>16)])
		s2 += float64(t[uint16(a>>32)] * t[uint16(b>>32)])
		s3 += float64(t[uint16(a>>48)] * t[uint16(b>>48)])
	}
	for ; i < n; i++ {
		s0 += float64(t[binary.LittleEndian.Uint16(w[2*i:])] * t[binary.LittleEndian.Uint16(x[2*i:])])
	}
	return float32((s0 + s1) + (s2 + s3))
}

func dotBF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= n; i += 4 {
		a := binary.LittleEndian.Uint64(w[2*i:])
		b := binary.LittleEndian.Uint64(x[2*i:])
		s0 += float64(bf16lo(a) * bf16lo(b))
		s1 += float64(bf16lo(a>>16) * bf16lo(b>>16))
		s2 += float64(bf16lo(a>>32) * bf16lo(b>>32))
		s3 += float64(bf16lo(a>>48) * bf16lo(b>>48))
	}
	for ; i < n; i++ {
		s0 += float64(BF16ToFP32(binary.LittleEndian.Uint16(w[2*i:])) * BF16ToFP32(binary.LittleEndian.Uint16(x[2*i:])))
	}
	return float32((s0 + s1) + (s2 + s3))
}

// bf16lo widens the bfloat16 in the low 16 bits of v.
func bf16lo(v uint64) float32 { return math.Float32frombits(uint32(v) << 16) }

func f16le(b []byte) float32 { return fp16Table[binary.LittleEndian.Uint16(b)] }

// i8 reads a byte as the signed quant it holds.
func i8(b byte) int32 { return int32(int8(b)) }

// The quant kernels take four products per step so the CPU has independent multiplies to
// overlap; Go does not unroll loops itself.

func dotQ4_0(n int, w, x []byte) float32 {
	var sumf float32
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
		sumf += float32(float32(s) * f16le(wb[0:]) * f16le(xb[0:]))
	}
	return sumf
}

func dotQ4_1(n int, w, x []byte) float32 {
	var sumf float32
	for i := 0; i < n/32; i++ {
		wb := (*[20]byte)(w[i*20:])
		xb := (*[36]byte)(x[i*36:])
		q := (*[16]byte)(wb[4:])
		ylo := (*[16]byte)(xb[4:])
		yhi := (*[16]byte)(xb[20:])
		var s int32
		for j := 0; j < 4; j++ {
			k := 4 * j
			s += int32(q[k]&0xf)*i8(ylo[k]) + int32(q[k+1]&0xf)*i8(ylo[k+1]) +
				int32(q[k+2]&0xf)*i8(ylo[k+2]) + int32(q[k+3]&0xf)*i8(ylo[k+3])
			s += int32(q[k]>>4)*i8(yhi[k]) + int32(q[k+1]>>4)*i8(yhi[k+1]) +
				int32(q[k+2]>>4)*i8(yhi[k+2]) + int32(q[k+3]>>4)*i8(yhi[k+3])
		}
		scaled := float32(f16le(wb[0:]) * f16le(xb[0:]) * float32(s))
		sumf += scaled + float32(f16le(wb[2:])*f16le(xb[2:]))
	}
	return sumf
}

// q5pair returns the 5-bit quants of elements k, k+1 (low nibbles) and k+16, k+17 (high
// nibbles) of a Q5 block, where hb is the block's qh shifted right by k.
func q5pair(q0, q1 byte, hb uint32) (l0, l1, h0, h1 int32) {
	return int32(q0&0xf | byte(hb<<4)&0x10), int32(q1&0xf | byte(hb<<3)&0x10),
		int32(q0>>4 | byte(hb>>12)&0x10), int32(q1>>4 | byte(hb>>13)&0x10)
}

func dotQ5_0(n int, w, x []byte) float32 {
	var sumf float32
	for i := 0; i < n/32; i++ {
		wb := (*[22]byte)(w[i*22:])
		xb := (*[34]byte)(x[i*34:])
		hb := binary.LittleEndian.Uint32(wb[2:])
		q := (*[16]byte)(wb[6:])
		ylo := (*[16]byte)(xb[2:])
		yhi := (*[16]byte)(xb[18:])
		var s int32
		for j := 0; j < 8; j++ {
			k := 2 * j
			l0, l1, h0, h1 := q5pair(q[k], q[k+1], hb)
			hb >>= 2
			s += (l0-16)*i8(ylo[k]) + (l1-16)*i8(ylo[k+1]) + (h0-16)*i8(yhi[k]) + (h1-16)*i8(yhi[k+1])
		}
		sumf += float32(f16le(wb[0:]) * f16le(xb[0:]) * float32(s))
	}
	return sumf
}

func dotQ5_1(n int, w, x []byte) float32 {
	var sumf float32
	for i := 0; i < n/32; i++ {
		wb := (*[24]byte)(w[i*24:])
		xb := (*[36]byte)(x[i*36:])
		hb := binary.LittleEndian.Uint32(wb[4:])
		q := (*[16]byte)(wb[8:])
		ylo := (*[16]byte)(xb[4:])
		yhi := (*[16]byte)(xb[20:])
		var s int32
		for j := 0; j < 8; j++ {
			k := 2 * j
			l0, l1, h0, h1 := q5pair(q[k], q[k+1], hb)
			hb >>= 2
			s += l0*i8(ylo[k]) + l1*i8(ylo[k+1]) + h0*i8(yhi[k]) + h1*i8(yhi[k+1])
		}
		scaled := float32(f16le(wb[0:]) * f16le(xb[0:]) * float32(s))
		sumf += scaled + float32(f16le(wb[2:])*f16le(xb[2:]))
	}
	return sumf
}

func dotQ8_0(n int, w, x []byte) float32 {
	var sumf float32
	for i := 0; i < n/32; i++ {
		wb := (*[34]byte)(w[i*34:])
		xb := (*[34]byte)(x[i*34:])
		a := (*[32]byte)(wb[2:])
		b := (*[32]byte)(xb[2:])
		var s int32
		for j := 0; j < 8; j++ {
			k := 4 * j
			s += i8(a[k])*i8(b[k]) + i8(a[k+1])*i8(b[k+1]) + i8(a[k+2])*i8(b[k+2]) + i8(a[k+3])*i8(b[k+3])
		}
		sumf += float32(float32(s) * (f16le(wb[0:]) * f16le(xb[0:])))
	}
	return sumf
}

func dotIQ4NL(n int, w, x []byte) float32 {
	kv := &iq4nlValues
	var sumf float32
	for i := 0; i < n/32; i++ {
		wb := (*[18]byte)(w[i*18:])
		xb := (*[34]byte)(x[i*34:])
		q := (*[16]byte)(wb[2:])
		s := codebookDot(kv, q, (*[16]byte)(xb[2:]), (*[16]byte)(xb[18:]))
		d := f16le(xb[0:]) * f16le(wb[0:])
		sumf += float32(d * float32(s))
	}
	return sumf
}

// codebookDot is the integer sum of a 4-bit codebook block (IQ4_NL's, MXFP4's) against a
// Q8_0 block's quants, the low nibbles against ylo and the high against yhi, in the generic
// kernels' order.
func codebookDot(kv *[16]int8, q, ylo, yhi *[16]byte) int32 {
	var s int32
	for j := 0; j < 4; j++ {
		k := 4 * j
		s += int32(kv[q[k]&0xf])*i8(ylo[k]) + int32(kv[q[k+1]&0xf])*i8(ylo[k+1]) +
			int32(kv[q[k+2]&0xf])*i8(ylo[k+2]) + int32(kv[q[k+3]&0xf])*i8(ylo[k+3])
		s += int32(kv[q[k]>>4])*i8(yhi[k]) + int32(kv[q[k+1]>>4])*i8(yhi[k+1]) +
			int32(kv[q[k+2]>>4])*i8(yhi[k+2]) + int32(kv[q[k+3]>>4])*i8(yhi[k+3])
	}
	return s
}

// dotMXFP4 is ggml_vec_dot_mxfp4_q8_0_generic: the codebook's doubled values against the
// activation, scaled by fp16(x.d) times the halved E8M0 scale.
func dotMXFP4(n int, w, x []byte) float32 {
	kv := &mxfp4Values
	var sumf float32
	for i := 0; i < n/32; i++ {
		wb := (*[17]byte)(w[i*17:])
		xb := (*[34]byte)(x[i*34:])
		q := (*[16]byte)(wb[1:])
		s := codebookDot(kv, q, (*[16]byte)(xb[2:]), (*[16]byte)(xb[18:]))
		d := f16le(xb[0:]) * e8m0Half[wb[0]]
		sumf += float32(d * float32(s))
	}
	return sumf
}

// q8K splits a Q8_K block into its scale, quants and group sums.
func q8K(x []byte, i int) (d float32, q8 *[256]byte, bsums *[32]byte) {
	b := (*[292]byte)(x[i*292:])
	return f32le(b[0:]), (*[256]byte)(b[4:260]), (*[32]byte)(b[260:292])
}

func bsum(bs *[32]byte, g int) int32 { return int32(int16(binary.LittleEndian.Uint16(bs[2*g:]))) }

func dotQ2K(n int, w, x []byte) float32 {
	var sumf float32
	for i := 0; i < n/256; i++ {
		wb := (*[84]byte)(w[i*84:])
		yd, q8, bs := q8K(x, i)
		sc := (*[16]byte)(wb[0:16])
		var summs int32
		for j := 0; j < 16; j++ {
			summs += bsum(bs, j) * int32(sc[j]>>4)
		}
		dall := yd * f16le(wb[80:])
		dmin := yd * f16le(wb[82:])
		var isum int32
		for h := 0; h < 2; h++ {
			q2 := (*[32]byte)(wb[16+32*h:])
			for j := 0; j < 4; j++ {
				shift := uint(2 * j)
				y := (*[32]byte)(q8[128*h+32*j:])
				// Sub-block 8h+2j covers y[0:16] and 8h+2j+1 covers y[16:32].
				var s0, s1 int32
				for g := 0; g < 4; g++ {
					k := 4 * g
					s0 += i8(y[k])*int32(q2[k]>>shift&3) + i8(y[k+1])*int32(q2[k+1]>>shift&3) +
						i8(y[k+2])*int32(q2[k+2]>>shift&3) + i8(y[k+3])*int32(q2[k+3]>>shift&3)
					s1 += i8(y[k+16])*int32(q2[k+16]>>shift&3) + i8(y[k+17])*int32(q2[k+17]>>shift&3) +
						i8(y[k+18])*int32(q2[k+18]>>shift&3) + i8(y[k+19])*int32(q2[k+19]>>shift&3)
				}
				isum += int32(sc[8*h+2*j]&0xf)*s0 + int32(sc[8*h+2*j+1]&0xf)*s1
			}
		}
		sumf += float32(dall*float32(isum)) - float32(dmin*float32(summs))
	}
	return sumf
}

func dotQ3K(n int, w, x []byte) float32 {
	var sums [8]float32
	var scales [16]int32
	for i := 0; i < n/256; i++ {
		wb := (*[110]byte)(w[i*110:])
		yd, q8, _ := q8K(x, i)
		hm := (*[32]byte)(wb[0:32])
		q3kScales(wb[96:108], &scales)
		var aux [8]int32
		for h := 0; h < 2; h++ {
			q3 := (*[32]byte)(wb[32+32*h:])
			for s := 0; s < 4; s++ {
				shift := uint(2 * s)
				hbit := uint(4*h + s)
				y := (*[32]byte)(q8[128*h+32*s:])
				// Elements 128h+32s+l; l < 16 is sub-block 8h+2s, the rest 8h+2s+1. A quant
				// is its two low bits plus 4 when the hmask bit is set, minus 4.
				sc0, sc1 := scales[8*h+2*s], scales[8*h+2*s+1]
				for k := 0; k < 8; k++ {
					a0 := int32(q3[k]>>shift&3|(hm[k]>>hbit&1)<<2) - 4
					a1 := int32(q3[k+8]>>shift&3|(hm[k+8]>>hbit&1)<<2) - 4
					a2 := int32(q3[k+16]>>shift&3|(hm[k+16]>>hbit&1)<<2) - 4
					a3 := int32(q3[k+24]>>shift&3|(hm[k+24]>>hbit&1)<<2) - 4
					aux[k] += sc0*(a0*i8(y[k])+a1*i8(y[k+8])) + sc1*(a2*i8(y[k+16])+a3*i8(y[k+24]))
				}
			}
		}
		d := f16le(wb[108:]) * yd
		for k := range sums {
			sums[k] += float32(d * float32(aux[k]))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// kMins returns the integer min term of a Q4_K/Q5_K block against Q8_K: the sum over the
// sixteen 16-element groups of bsum times the 6-bit min of the group's sub-block.
func kMins(s []byte, bs *[32]byte) int32 {
	var sumi int32
	for j := 0; j < 8; j++ {
		_, m := kScaleMin(j, s)
		sumi += (bsum(bs, 2*j) + bsum(bs, 2*j+1)) * int32(m)
	}
	return sumi
}

func dotQ4K(n int, w, x []byte) float32 {
	var sums [8]float32
	var sumf float32
	for i := 0; i < n/256; i++ {
		wb := (*[144]byte)(w[i*144:])
		yd, q8, bs := q8K(x, i)
		s := wb[4:16]
		var aux [8]int32
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(wb[16+32*c:])
			ylo := (*[32]byte)(q8[64*c:])
			yhi := (*[32]byte)(q8[64*c+32:])
			sc1, _ := kScaleMin(2*c, s)
			sc2, _ := kScaleMin(2*c+1, s)
			for k := 0; k < 8; k++ {
				lo := int32(q[k]&0xf)*i8(ylo[k]) + int32(q[k+8]&0xf)*i8(ylo[k+8]) +
					int32(q[k+16]&0xf)*i8(ylo[k+16]) + int32(q[k+24]&0xf)*i8(ylo[k+24])
				hi := int32(q[k]>>4)*i8(yhi[k]) + int32(q[k+8]>>4)*i8(yhi[k+8]) +
					int32(q[k+16]>>4)*i8(yhi[k+16]) + int32(q[k+24]>>4)*i8(yhi[k+24])
				aux[k] += int32(sc1)*lo + int32(sc2)*hi
			}
		}
		d := f16le(wb[0:]) * yd
		for k := range sums {
			sums[k] += float32(d * float32(aux[k]))
		}
		dmin := f16le(wb[2:]) * yd
		sumf -= float32(dmin * float32(kMins(s, bs)))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

func dotQ5K(n int, w, x []byte) float32 {
	var sums [8]float32
	var sumf float32
	for i := 0; i < n/256; i++ {
		wb := (*[176]byte)(w[i*176:])
		yd, q8, bs := q8K(x, i)
		s := wb[4:16]
		qh := (*[32]byte)(wb[16:48])
		var aux [8]int32
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(wb[48+32*c:])
			ylo := (*[32]byte)(q8[64*c:])
			yhi := (*[32]byte)(q8[64*c+32:])
			sc1, _ := kScaleMin(2*c, s)
			sc2, _ := kScaleMin(2*c+1, s)
			u1, u2 := uint(2*c), uint(2*c+1)
			for k := 0; k < 8; k++ {
				lo := int32(q[k]&0xf|(qh[k]>>u1&1)<<4)*i8(ylo[k]) +
					int32(q[k+8]&0xf|(qh[k+8]>>u1&1)<<4)*i8(ylo[k+8]) +
					int32(q[k+16]&0xf|(qh[k+16]>>u1&1)<<4)*i8(ylo[k+16]) +
					int32(q[k+24]&0xf|(qh[k+24]>>u1&1)<<4)*i8(ylo[k+24])
				hi := int32(q[k]>>4|(qh[k]>>u2&1)<<4)*i8(yhi[k]) +
					int32(q[k+8]>>4|(qh[k+8]>>u2&1)<<4)*i8(yhi[k+8]) +
					int32(q[k+16]>>4|(qh[k+16]>>u2&1)<<4)*i8(yhi[k+16]) +
					int32(q[k+24]>>4|(qh[k+24]>>u2&1)<<4)*i8(yhi[k+24])
				aux[k] += int32(sc1)*lo + int32(sc2)*hi
			}
		}
		d := f16le(wb[0:]) * yd
		for k := range sums {
			sums[k] += float32(d * float32(aux[k]))
		}
		dmin := f16le(wb[2:]) * yd
		sumf -= float32(dmin * float32(kMins(s, bs)))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// q6 returns the four 6-bit quants (minus 32) that ql[l], ql[l+32] and qh[l] encode, for
// outputs l, l+32, l+64 and l+96 of a half block.
func q6(ql *[64]byte, qh *[32]byte, l int) (a1, a2, a3, a4 int32) {
	h := qh[l]
	lo, hi := ql[l], ql[l+32]
	return int32(lo&0xf|(h&3)<<4) - 32, int32(hi&0xf|(h>>2&3)<<4) - 32,
		int32(lo>>4|(h>>4&3)<<4) - 32, int32(hi>>4|(h>>6)<<4) - 32
}

func dotQ6K(n int, w, x []byte) float32 {
	var sums [8]float32
	for i := 0; i < n/256; i++ {
		wb := (*[210]byte)(w[i*210:])
		yd, q8, _ := q8K(x, i)
		sc := (*[16]byte)(wb[192:208])
		var aux [8]int32
		for h := 0; h < 2; h++ {
			ql := (*[64]byte)(wb[64*h:])
			qh := (*[32]byte)(wb[128+32*h:])
			y := (*[128]byte)(q8[128*h:])
			// Outputs l, l+32, l+64, l+96 of this half; l in [16p, 16p+16) uses sub-block
			// scales 8h+p, +2, +4, +6. Lane k gets l = 16p+k and 16p+k+8.
			for p := 0; p < 2; p++ {
				s1, s2 := i8(sc[8*h+p]), i8(sc[8*h+p+2])
				s3, s4 := i8(sc[8*h+p+4]), i8(sc[8*h+p+6])
				for k := 0; k < 8; k++ {
					l := 16*p + k
					a1, a2, a3, a4 := q6(ql, qh, l)
					b1, b2, b3, b4 := q6(ql, qh, l+8)
					aux[k] += s1*(a1*i8(y[l])+b1*i8(y[l+8])) + s2*(a2*i8(y[l+32])+b2*i8(y[l+40])) +
						s3*(a3*i8(y[l+64])+b3*i8(y[l+72])) + s4*(a4*i8(y[l+96])+b4*i8(y[l+104]))
				}
			}
		}
		d := f16le(wb[208:]) * yd
		for k := range sums {
			sums[k] += float32(d * float32(aux[k]))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}
