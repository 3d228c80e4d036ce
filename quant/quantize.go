package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// quantRow is indexed by Type. Q8_0, Q8_1, Q8_K, F16, BF16 and F32 are the activation
// quantizers of llama.cpp's x86 CPU backend and match it bit for bit; the other entries are
// weight quantizers for writing test models (see quantize_weights.go).
var quantRow = [...]func(src []float32, dst []byte){
	F32:    quantF32,
	F16:    quantF16,
	BF16:   quantBF16,
	Q4_0:   quantQ4_0,
	Q4_1:   quantQ4_1,
	Q5_0:   quantQ5_0,
	Q5_1:   quantQ5_1,
	Q8_0:   quantQ8_0,
	Q8_1:   quantQ8_1,
	IQ4_NL: quantIQ4NL,
	MXFP4:  quantMXFP4,
	Q2_K:   quantQ2K,
	Q3_K:   quantQ3K,
	Q4_K:   quantQ4K,
	Q5_K:   quantQ5K,
	Q6_K:   quantQ6K,
	Q8_K:   quantQ8K,
}

// quantRowRef holds the Go quantizers: quantRow as declared, before an architecture file puts
// its fast quantizers (quantRowFast) in. Package-level variables are initialized before any
// init function runs.
var quantRowRef = quantRow

// quantRowFast holds, for each activation type, the fast quantizer put into quantRow at
// start-up, or nil. Each writes exactly the bytes of its Go quantizer, for any input.
var quantRowFast [len(quantRow)]func(src []float32, dst []byte)

// QuantizeRow encodes src as type t into dst.
//
// For the activation types (t.DotType() of some weight type: F32, F16, BF16, Q8_0, Q8_1, Q8_K)
// the bytes are exactly those llama.cpp's CPU backend produces on an x86 machine with AVX2 and
// F16C before its vec_dot, so dot products can match it. MXFP4's is ggml's
// quantize_row_mxfp4_ref, byte for byte. For the other weight types it is a simple quantizer
// that gives valid blocks with reasonable error but not always ggml's bytes; it is meant for
// building test models, not for production quantization. Q8_0 serves both roles and follows
// the activation rules.
//
// Preconditions, as for DequantizeRow: t is known, len(src) is a whole number of blocks and
// len(dst) is exactly t.RowBytes(len(src)); violations panic. Any float input (NaN, Inf) is
// accepted without panicking.
func QuantizeRow(t Type, src []float32, dst []byte) {
	var f func([]float32, []byte)
	if int(t) < len(quantRow) {
		f = quantRow[t]
	}
	if f == nil {
		panic(fmt.Sprintf("quant: QuantizeRow: no quantizer for %v", t))
	}
	checkRow("QuantizeRow", t, len(src), len(dst))
	f(src, dst)
}

// putF16 stores a block scale the way ggml converts single values (canonical NaN).
func putF16(b []byte, off int, v float32) {
	binary.LittleEndian.PutUint16(b[off:], fp16Canonical(v))
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

func quantF32(src []float32, dst []byte) {
	dst = dst[:4*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

func quantF16(src []float32, dst []byte) {
	dst = dst[:2*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], FP32ToFP16(v))
	}
}

func quantBF16(src []float32, dst []byte) {
	dst = dst[:2*len(src)]
	for i, v := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], FP32ToBF16(v))
	}
}

// maxps is x86's MAXPS on one lane: the first operand if it is greater, else the second
// (so a NaN in either position yields the second operand).
func maxps(a, b float32) float32 {
	if a > b {
		return a
	}
	return b
}

// absMax32 is the largest |x| of a 32-value block, reduced in exactly the order of ggml's AVX2
// quantize_row_q8_0: four 8-lane vectors folded lane-wise, then 8 -> 4 -> 2 -> 1. For finite
// input any order gives the same answer; this one also agrees on NaN.
func absMax32(x []float32) float32 {
	x = x[:32]
	var lane [8]float32
	for l := 0; l < 8; l++ {
		m := abs32(x[l])
		m = maxps(m, abs32(x[8+l]))
		m = maxps(m, abs32(x[16+l]))
		m = maxps(m, abs32(x[24+l]))
		lane[l] = m
	}
	var q [4]float32
	for k := 0; k < 4; k++ {
		q[k] = maxps(lane[4+k], lane[k])
	}
	q[0], q[1] = maxps(q[0], q[2]), maxps(q[1], q[3])
	return maxps(q[0], q[1])
}

// roundToInt32 is VROUNDPS (nearest-even) followed by VCVTPS2DQ: values that do not fit,
// and NaN, become the "integer indefinite" value math.MinInt32.
func roundToInt32(v float32) int32 {
	if abs32(v) < 1<<22 {
		return nearestInt(v) // same result in this range, without the float64 round trip
	}
	r := math.RoundToEven(float64(v))
	if !(r >= -(1<<31) && r < 1<<31) {
		return math.MinInt32
	}
	return int32(r)
}

// sat8 is the signed saturation of VPACKSSDW followed by VPACKSSWB.
func sat8(v int32) int8 {
	if v > 127 {
		return 127
	}
	if v < -128 {
		return -128
	}
	return int8(v)
}

// quantQ8_0 is ggml-cpu's x86 quantize_row_q8_0 (AVX2 path): d = amax/127 and the multiplier
// 127/amax (not 1/d as in the portable reference), rounding half to even (the reference
// quantize_row_q8_0_ref uses roundf, half away from zero, and so differs on exact ties).
func quantQ8_0(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*34 : i*34+34]
		amax := absMax32(x)
		d := amax / 127
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		putF16(b, 0, d)
		qs := b[2:34]
		for j, v := range x {
			qs[j] = byte(sat8(roundToInt32(v * id)))
		}
	}
}

// quantQ8_1 is ggml-cpu's x86 quantize_row_q8_1 (AVX2 path): as Q8_0, plus s = d * sum(q),
// where the sum is taken over the rounded 32-bit values before saturation, as the AVX2 code
// does.
func quantQ8_1(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*36 : i*36+36]
		amax := absMax32(x)
		d := amax / 127
		var id float32
		if amax != 0 {
			id = 127 / amax
		}
		putF16(b, 0, d)
		qs := b[4:36]
		var sum int32
		for j, v := range x {
			q := roundToInt32(v * id)
			sum += q
			qs[j] = byte(sat8(q))
		}
		putF16(b, 2, d*float32(sum))
	}
}

// nearestInt rounds to nearest-even for |f| < 2^22 the way ggml's nearest_int does, by adding
// 1.5*2^23 and reading the mantissa; outside that range it returns what ggml returns.
func nearestInt(f float32) int32 {
	v := f + 12582912
	return int32(math.Float32bits(v)&0x7fffff) - 0x400000
}

// quantQ8K is ggml's quantize_row_q8_K_ref, which x86 builds use as is: the scale comes from
// the signed value of largest magnitude with iscale = -127/max, and bsums holds the sum of each
// 16 quants. An all-zero block gets d = 0, zero quants and zero bsums (ggml leaves bsums of
// such a block unwritten).
func quantQ8K(src []float32, dst []byte) {
	for i := 0; i < len(src)/256; i++ {
		x := src[i*256 : i*256+256]
		b := dst[i*292 : i*292+292]
		var amax, max float32
		for _, v := range x {
			if a := abs32(v); a > amax {
				amax, max = a, v
			}
		}
		qs := b[4:260]
		bsums := b[260:292]
		if amax == 0 {
			clear(b)
			continue
		}
		iscale := -127 / max
		for j, v := range x {
			q := nearestInt(iscale * v)
			if q > 127 {
				q = 127
			}
			qs[j] = byte(int8(q))
		}
		for g := 0; g < 16; g++ {
			var s int32
			for _, q := range qs[16*g : 16*g+16] {
				s += int32(int8(q))
			}
			binary.LittleEndian.PutUint16(bsums[2*g:], uint16(int16(s)))
		}
		binary.LittleEndian.PutUint32(b, math.Float32bits(1/iscale))
	}
}
