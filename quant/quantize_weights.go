package quant

import (
	"encoding/binary"
	"math"
)

// Weight quantizers, used to write test models.
//
// Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL follow the same simple algorithms as ggml's *_ref
// quantizers (absmax or min/max scale per block; for IQ4_NL a least-squares refit of the
// scale), so they usually produce ggml's bytes. The K-quants use a plain min/max (Q2_K, Q4_K,
// Q5_K) or absmax (Q3_K, Q6_K) per sub-block, with the sub-block scales then quantized against
// the block's largest; ggml searches for better scales, so its error is somewhat lower. All
// decode with ggml's own dequantizers.

// absMaxSigned returns the largest |x| and the signed value that has it (the first one on a
// tie), which symmetric quantizers map to the most negative level so the range is used fully.
func absMaxSigned(x []float32) (amax, max float32) {
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, max = a, v
		}
	}
	return amax, max
}

func minMax(x []float32) (lo, hi float32) {
	lo, hi = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	return lo, hi
}

// truncLevel converts a biased, already shifted level to an integer by truncation (as C's
// float-to-int cast does) and clamps it to [0, top]; the clamp also tames NaN input.
func truncLevel(v float32, top int32) int32 {
	q := int32(v)
	if q < 0 || v != v {
		return 0
	}
	if q > top {
		return top
	}
	return q
}

func quantQ4_0(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*18 : i*18+18]
		_, max := absMaxSigned(x)
		d := max / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, 0, d)
		for j := 0; j < 16; j++ {
			lo := truncLevel(x[j]*id+8.5, 15)
			hi := truncLevel(x[j+16]*id+8.5, 15)
			b[2+j] = byte(lo | hi<<4)
		}
	}
}

func quantQ4_1(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*20 : i*20+20]
		lo, hi := minMax(x)
		d := (hi - lo) / 15
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, 0, d)
		putF16(b, 2, lo)
		for j := 0; j < 16; j++ {
			q0 := truncLevel((x[j]-lo)*id+0.5, 15)
			q1 := truncLevel((x[j+16]-lo)*id+0.5, 15)
			b[4+j] = byte(q0 | q1<<4)
		}
	}
}

func quantQ5_0(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*22 : i*22+22]
		_, max := absMaxSigned(x)
		d := max / -16
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, 0, d)
		var qh uint32
		for j := 0; j < 16; j++ {
			q0 := truncLevel(x[j]*id+16.5, 31)
			q1 := truncLevel(x[j+16]*id+16.5, 31)
			b[6+j] = byte(q0&0xf | (q1&0xf)<<4)
			qh |= uint32(q0>>4) << j
			qh |= uint32(q1>>4) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[2:], qh)
	}
}

func quantQ5_1(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*24 : i*24+24]
		lo, hi := minMax(x)
		d := (hi - lo) / 31
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, 0, d)
		putF16(b, 2, lo)
		var qh uint32
		for j := 0; j < 16; j++ {
			q0 := truncLevel((x[j]-lo)*id+0.5, 31)
			q1 := truncLevel((x[j+16]-lo)*id+0.5, 31)
			b[8+j] = byte(q0&0xf | (q1&0xf)<<4)
			qh |= uint32(q0>>4) << j
			qh |= uint32(q1>>4) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[4:], qh)
	}
}

// iq4nlIndex returns the codebook entry nearest to v, the upper one on an exact tie.
func iq4nlIndex(v float32) int {
	k := &iq4nlValues
	if v <= float32(k[0]) {
		return 0
	}
	if v >= float32(k[15]) {
		return 15
	}
	lo, hi := 0, 15
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if v < float32(k[mid]) {
			hi = mid
		} else {
			lo = mid
		}
	}
	if v-float32(k[hi-1]) < float32(k[hi])-v {
		return hi - 1
	}
	return hi
}

// quantIQ4NL picks codebook indices with the scale that maps the largest magnitude to the
// codebook's end (-127), then refits the scale by least squares weighted by x^2, keeping the
// indices.
func quantIQ4NL(src []float32, dst []byte) {
	var idx [32]uint8
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*18 : i*18+18]
		amax, max := absMaxSigned(x)
		if !(amax >= 1e-15) {
			clear(b)
			continue
		}
		d := max / -127
		id := 1 / d
		var sumqx, sumq2 float32
		for j, v := range x {
			l := iq4nlIndex(id * v)
			idx[j] = uint8(l)
			q := float32(iq4nlValues[l])
			w := v * v
			sumqx += float32(float32(w*q) * v)
			sumq2 += float32(float32(w*q) * q)
		}
		putF16(b, 0, sumqx/sumq2)
		for j := 0; j < 16; j++ {
			b[2+j] = idx[j] | idx[j+16]<<4
		}
	}
}

// quantMXFP4 is quantize_row_mxfp4_ref: the block's E8M0 scale from the exponent of its
// largest magnitude, then each value's nearest codebook entry by a linear search.
func quantMXFP4(src []float32, dst []byte) {
	for i := 0; i < len(src)/32; i++ {
		x := src[i*32 : i*32+32]
		b := dst[i*17 : i*17+17]
		var amax float32
		for _, v := range x {
			// As ggml's loop: a NaN never becomes the maximum.
			if a := abs32(v); amax < a {
				amax = a
			}
		}
		var e uint8
		if amax > 0 {
			e = mxfp4Exponent(amax)
		}
		d := e8m0Half[e]
		b[0] = e
		for j := 0; j < 16; j++ {
			b[1+j] = mxfp4Index(x[j], d) | mxfp4Index(x[j+16], d)<<4
		}
	}
}

// mxfp4Exponent is ggml's (uint8_t)(floorf(log2f(amax)) - 2 + 127) for amax > 0 (x86-64, glibc).
// log2f rounds 7456 float32 values just below a power of two up to the integer, which moves
// the floor by one, so the logarithm is rounded to float32 here too; the floor of float64's
// log2 rounded to float32 is glibc's on every positive float32 (checked exhaustively once; the
// golden sweep keeps checking the patterns near powers of two, where they could part). The
// conversion to uint8 is x86's: CVTTSS2SI to int32, then the low byte, so the exponents of
// tiny amax wrap and an infinite one (the "integer indefinite" 0x80000000) gives 0.
func mxfp4Exponent(amax float32) uint8 {
	if math.IsInf(float64(amax), 1) {
		return 0
	}
	l := float32(math.Log2(float64(amax)))
	f := float32(math.Floor(float64(l)))
	return uint8(int32(f - 2 + 127))
}

// mxfp4Index is best_index_mxfp4: the first codebook entry k with the smallest |k*d - x|, each
// difference rounded to float32 as ggml's is (a NaN x picks entry 0).
func mxfp4Index(x, d float32) byte {
	kv := &mxfp4Values
	best, bestErr := 0, abs32(float32(float32(kv[0])*d)-x)
	for i := 1; i < 16; i++ {
		if err := abs32(float32(float32(kv[i])*d) - x); err < bestErr {
			best, bestErr = i, err
		}
	}
	return byte(best)
}

// roundClamp rounds v to the nearest integer (ties to even) limited to [lo, hi]; NaN gives
// lo. Out-of-range values are clamped before rounding because nearestInt only handles
// |v| < 2^22.
func roundClamp(v float32, lo, hi int32) int32 {
	if !(v > float32(lo)) {
		return lo
	}
	if v >= float32(hi) {
		return hi
	}
	return nearestInt(v)
}

// roundedF16 stores v as fp16 at b[off:] and returns the value actually stored, so the
// quants are chosen against the scale the decoder will see.
func roundedF16(b []byte, off int, v float32) float32 {
	h := FP32ToFP16(v)
	binary.LittleEndian.PutUint16(b[off:], h)
	return FP16ToFP32(h)
}

// affineScales computes, for each sub-block of size sub in x, the scale and (non-negative)
// min of the affine map value = scale*q - min with q in [0, top].
func affineScales(x []float32, sub int, top float32, scales, mins []float32) {
	for j := range scales {
		lo, hi := minMax(x[j*sub : j*sub+sub])
		if lo > 0 {
			lo = 0
		}
		scales[j] = (hi - lo) / top
		mins[j] = -lo
	}
}

// quantizeScales maps each of vals (all >= 0) to an integer in [0, top] against a shared
// step max(vals)/top, stores that step as fp16 at b[off:] and returns the step as stored.
func quantizeScales(vals []float32, top float32, out []int32, b []byte, off int) float32 {
	var max float32
	for _, v := range vals {
		if v > max {
			max = v
		}
	}
	step := roundedF16(b, off, max/top)
	for j, v := range vals {
		if step > 0 {
			out[j] = roundClamp(v/step, 0, int32(top))
		} else {
			out[j] = 0
		}
	}
	return step
}

// affineLevel is the level in [0, top] nearest to x under value = d*q - m.
func affineLevel(x, d, m float32, top int32) int32 {
	if d == 0 {
		return 0
	}
	return roundClamp((x+m)/d, 0, top)
}

// Q2_K block: scales[16] (scale | min<<4), qs[64], d, dmin; 16 sub-blocks of 16, 2-bit quants.
func quantQ2K(src []float32, dst []byte) {
	var scales, mins [16]float32
	var sc, mn [16]int32
	var L [256]uint8
	for i := 0; i < len(src)/256; i++ {
		x := src[i*256 : i*256+256]
		b := dst[i*84 : i*84+84]
		affineScales(x, 16, 3, scales[:], mins[:])
		d := quantizeScales(scales[:], 15, sc[:], b, 80)
		dmin := quantizeScales(mins[:], 15, mn[:], b, 82)
		for j := 0; j < 16; j++ {
			b[j] = byte(sc[j] | mn[j]<<4)
			dl, ml := d*float32(sc[j]), dmin*float32(mn[j])
			for l := 16 * j; l < 16*j+16; l++ {
				L[l] = uint8(affineLevel(x[l], dl, ml, 3))
			}
		}
		pack2Bits(L[:], b[16:80])
	}
}

// pack2Bits stores 256 two-bit values the K-quant way: byte 32*h+l holds elements
// 128*h+l+32*s in bits 2s..2s+1.
func pack2Bits(L []uint8, qs []byte) {
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			e := 128*h + l
			qs[32*h+l] = L[e]&3 | (L[e+32]&3)<<2 | (L[e+64]&3)<<4 | (L[e+96]&3)<<6
		}
	}
}

// symmetricScales sets, per sub-block of size sub, the signed scale that maps the value of
// largest magnitude to level -neg.
func symmetricScales(x []float32, sub int, neg float32, scales []float32) {
	for j := range scales {
		_, max := absMaxSigned(x[j*sub : j*sub+sub])
		scales[j] = max / -neg
	}
}

// Q3_K block: hmask[32], qs[64], scales[12] (6-bit, biased by 32), d; 16 sub-blocks of 16,
// quants in [-4, 3].
func quantQ3K(src []float32, dst []byte) {
	var scales [16]float32
	var L [256]uint8
	for i := 0; i < len(src)/256; i++ {
		x := src[i*256 : i*256+256]
		b := dst[i*110 : i*110+110]
		clear(b)
		symmetricScales(x, 16, 4, scales[:])
		_, maxScale := absMaxSigned(scales[:])
		if maxScale == 0 {
			continue // all zero: d = 0 decodes everything to 0
		}
		iscale := -32 / maxScale
		d := roundedF16(b, 108, 1/iscale)
		s := b[96:108]
		for j := 0; j < 16; j++ {
			l := roundClamp(iscale*scales[j], -32, 31)
			u := byte(l + 32)
			if j < 8 {
				s[j] |= u & 0xf
			} else {
				s[j-8] |= (u & 0xf) << 4
			}
			s[8+j%4] |= (u >> 4) << (2 * (j / 4))
			dl := d * float32(l)
			for e := 16 * j; e < 16*j+16; e++ {
				q := int32(0)
				if dl != 0 {
					q = roundClamp(x[e]/dl, -4, 3)
				}
				L[e] = uint8(q + 4)
			}
		}
		hm := b[0:32]
		for e := 0; e < 256; e++ {
			if L[e] > 3 {
				hm[e%32] |= 1 << (e / 32)
			}
		}
		pack2Bits(L[:], b[32:96])
	}
}

// packKScales stores eight 6-bit scales and mins in the 12-byte K-quant layout that
// kScaleMin reads.
func packKScales(sc, mn []int32, s []byte) {
	for j := 0; j < 8; j++ {
		ls, lm := byte(sc[j]), byte(mn[j])
		if j < 4 {
			s[j] = ls
			s[j+4] = lm
		} else {
			s[j+4] = ls&0xf | (lm&0xf)<<4
			s[j-4] |= (ls >> 4) << 6
			s[j] |= (lm >> 4) << 6
		}
	}
}

// quantAffineK quantizes Q4_K (top 15) or Q5_K (top 31) levels into L and the block header
// (d, dmin, scales) into b[0:16].
func quantAffineK(x []float32, top int32, b []byte, L *[256]uint8) {
	var scales, mins [8]float32
	var sc, mn [8]int32
	affineScales(x, 32, float32(top), scales[:], mins[:])
	d := quantizeScales(scales[:], 63, sc[:], b, 0)
	dmin := quantizeScales(mins[:], 63, mn[:], b, 2)
	packKScales(sc[:], mn[:], b[4:16])
	for j := 0; j < 8; j++ {
		dl, ml := d*float32(sc[j]), dmin*float32(mn[j])
		for e := 32 * j; e < 32*j+32; e++ {
			L[e] = uint8(affineLevel(x[e], dl, ml, top))
		}
	}
}

// Q4_K block: d, dmin, scales[12], qs[128]; 8 sub-blocks of 32, 4-bit quants.
func quantQ4K(src []float32, dst []byte) {
	var L [256]uint8
	for i := 0; i < len(src)/256; i++ {
		x := src[i*256 : i*256+256]
		b := dst[i*144 : i*144+144]
		clear(b)
		quantAffineK(x, 15, b, &L)
		qs := b[16:144]
		for c := 0; c < 4; c++ {
			for l := 0; l < 32; l++ {
				qs[32*c+l] = L[64*c+l] | L[64*c+32+l]<<4
			}
		}
	}
}

// Q5_K block: d, dmin, scales[12], qh[32], qs[128]; as Q4_K with a fifth bit in qh.
func quantQ5K(src []float32, dst []byte) {
	var L [256]uint8
	for i := 0; i < len(src)/256; i++ {
		x := src[i*256 : i*256+256]
		b := dst[i*176 : i*176+176]
		clear(b)
		quantAffineK(x, 31, b, &L)
		qh := b[16:48]
		qs := b[48:176]
		for c := 0; c < 4; c++ {
			for l := 0; l < 32; l++ {
				lo, hi := L[64*c+l], L[64*c+32+l]
				qs[32*c+l] = lo&0xf | (hi&0xf)<<4
				qh[l] |= (lo>>4)<<(2*c) | (hi>>4)<<(2*c+1)
			}
		}
	}
}

// Q6_K block: ql[128], qh[64], int8 scales[16], d; 16 sub-blocks of 16, quants in [-32, 31].
func quantQ6K(src []float32, dst []byte) {
	var scales [16]float32
	var L [256]uint8
	for i := 0; i < len(src)/256; i++ {
		x := src[i*256 : i*256+256]
		b := dst[i*210 : i*210+210]
		clear(b)
		symmetricScales(x, 16, 32, scales[:])
		_, maxScale := absMaxSigned(scales[:])
		if maxScale == 0 {
			continue
		}
		iscale := -128 / maxScale
		d := roundedF16(b, 208, 1/iscale)
		for j := 0; j < 16; j++ {
			l := roundClamp(iscale*scales[j], -128, 127)
			b[192+j] = byte(int8(l))
			dl := d * float32(l)
			for e := 16 * j; e < 16*j+16; e++ {
				q := int32(0)
				if dl != 0 {
					q = roundClamp(x[e]/dl, -32, 31)
				}
				L[e] = uint8(q + 32)
			}
		}
		for h := 0; h < 2; h++ {
			ql := b[64*h : 64*h+64]
			qh := b[128+32*h : 128+32*h+32]
			for l := 0; l < 32; l++ {
				e := 128*h + l
				ql[l] = L[e]&0xf | (L[e+64]&0xf)<<4
				ql[l+32] = L[e+32]&0xf | (L[e+96]&0xf)<<4
				qh[l] = L[e]>>4 | (L[e+32]>>4)<<2 | (L[e+64]>>4)<<4 | (L[e+96]>>4)<<6
			}
		}
	}
}
