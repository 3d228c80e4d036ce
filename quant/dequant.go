package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Each dequantizer reproduces ggml-quants.c's dequantize_row_* bit for bit: the same operations
// in the same order, each rounded to float32. The explicit float32(...) conversions around
// products are there to forbid fused multiply-add (the Go spec lets a compiler fuse x*y+z unless
// the product is explicitly converted); ggml's reference has no FMA either.

// dequantRow is indexed by Type.
var dequantRow = [...]func(src []byte, dst []float32){
	F32:    dequantF32,
	F16:    dequantF16,
	BF16:   dequantBF16,
	Q4_0:   dequantQ4_0,
	Q4_1:   dequantQ4_1,
	Q5_0:   dequantQ5_0,
	Q5_1:   dequantQ5_1,
	Q8_0:   dequantQ8_0,
	Q8_1:   dequantQ8_1,
	IQ4_NL: dequantIQ4NL,
	MXFP4:  dequantMXFP4,
	Q2_K:   dequantQ2K,
	Q3_K:   dequantQ3K,
	Q4_K:   dequantQ4K,
	Q5_K:   dequantQ5K,
	Q6_K:   dequantQ6K,
	Q8_K:   dequantQ8K,
}

// DequantizeRow decodes len(dst) values of type t from src.
//
// Preconditions (the loader checks shapes before any row reaches here): t is a type the
// package knows, len(dst) is a whole number of t's blocks and len(src) is exactly
// t.RowBytes(len(dst)). A violated precondition panics with a message saying which. Any byte
// content is accepted: garbage in gives garbage (possibly NaN or Inf) out, never a panic.
func DequantizeRow(t Type, src []byte, dst []float32) {
	var f func([]byte, []float32)
	if int(t) < len(dequantRow) {
		f = dequantRow[t]
	}
	if f == nil {
		panic(fmt.Sprintf("quant: DequantizeRow: no dequantizer for %v", t))
	}
	checkRow("DequantizeRow", t, len(dst), len(src))
	f(src, dst)
}

// checkRow panics unless n elements of t take exactly nbytes bytes.
func checkRow(op string, t Type, n, nbytes int) {
	want, err := t.RowBytes(n)
	if err != nil {
		panic(fmt.Sprintf("quant: %s: %v", op, err))
	}
	if nbytes != want {
		panic(fmt.Sprintf("quant: %s: %s row of %d elements needs %d bytes, got %d", op, t, n, want, nbytes))
	}
}

func f16At(b []byte, off int) float32 { return FP16ToFP32(binary.LittleEndian.Uint16(b[off:])) }

func dequantF32(src []byte, dst []float32) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func dequantF16(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = FP16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func dequantBF16(src []byte, dst []float32) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = BF16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func dequantQ4_0(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*18 : i*18+18]
		y := dst[i*32 : i*32+32]
		d := f16At(b, 0)
		qs := b[2:18]
		for j := 0; j < 16; j++ {
			y[j] = float32(int(qs[j]&0xf)-8) * d
			y[j+16] = float32(int(qs[j]>>4)-8) * d
		}
	}
}

func dequantQ4_1(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*20 : i*20+20]
		y := dst[i*32 : i*32+32]
		d, m := f16At(b, 0), f16At(b, 2)
		qs := b[4:20]
		for j := 0; j < 16; j++ {
			y[j] = float32(float32(qs[j]&0xf)*d) + m
			y[j+16] = float32(float32(qs[j]>>4)*d) + m
		}
	}
}

func dequantQ5_0(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*22 : i*22+22]
		y := dst[i*32 : i*32+32]
		d := f16At(b, 0)
		qh := binary.LittleEndian.Uint32(b[2:])
		qs := b[6:22]
		for j := 0; j < 16; j++ {
			lo := int(qs[j]&0xf) | int(qh>>j&1)<<4
			hi := int(qs[j]>>4) | int(qh>>(j+16)&1)<<4
			y[j] = float32(lo-16) * d
			y[j+16] = float32(hi-16) * d
		}
	}
}

func dequantQ5_1(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*24 : i*24+24]
		y := dst[i*32 : i*32+32]
		d, m := f16At(b, 0), f16At(b, 2)
		qh := binary.LittleEndian.Uint32(b[4:])
		qs := b[8:24]
		for j := 0; j < 16; j++ {
			lo := int(qs[j]&0xf) | int(qh>>j&1)<<4
			hi := int(qs[j]>>4) | int(qh>>(j+16)&1)<<4
			y[j] = float32(float32(lo)*d) + m
			y[j+16] = float32(float32(hi)*d) + m
		}
	}
}

func dequantQ8_0(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*34 : i*34+34]
		y := dst[i*32 : i*32+32]
		d := f16At(b, 0)
		qs := b[2:34]
		for j := range y {
			y[j] = float32(int8(qs[j])) * d
		}
	}
}

// dequantQ8_1 has no ggml counterpart (ggml never stores Q8_1 tensors); it decodes d*q and
// ignores the block's sum field.
func dequantQ8_1(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*36 : i*36+36]
		y := dst[i*32 : i*32+32]
		d := f16At(b, 0)
		qs := b[4:36]
		for j := range y {
			y[j] = float32(int8(qs[j])) * d
		}
	}
}

// iq4nlValues is IQ4_NL's non-linear 4-bit codebook (kvalues_iq4nl).
var iq4nlValues = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

func dequantIQ4NL(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*18 : i*18+18]
		y := dst[i*32 : i*32+32]
		d := f16At(b, 0)
		qs := b[2:18]
		for j := 0; j < 16; j++ {
			y[j] = d * float32(iq4nlValues[qs[j]&0xf])
			y[j+16] = d * float32(iq4nlValues[qs[j]>>4])
		}
	}
}

// mxfp4Values is MXFP4's codebook (kvalues_mxfp4): the E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6
// and their negatives, doubled so that they are integers; the block scale is halved to match.
var mxfp4Values = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// e8m0Half is GGML_E8M0_TO_FP32_HALF by E8M0 byte: 2^(e-128), which float32 holds exactly for
// every byte (the two smallest as subnormals). A table, because the dot products look one up
// per block.
var e8m0Half = func() (t [256]float32) {
	for e := range t {
		if e < 2 {
			t[e] = math.Float32frombits(0x00200000 << e)
		} else {
			t[e] = math.Float32frombits(uint32(e-1) << 23)
		}
	}
	return t
}()

// MXFP4 block: E8M0 scale e, qs[16] (element j in the low nibble of qs[j], j+16 in the high).
func dequantMXFP4(src []byte, dst []float32) {
	for i := 0; i < len(dst)/32; i++ {
		b := src[i*17 : i*17+17]
		y := dst[i*32 : i*32+32]
		d := e8m0Half[b[0]]
		qs := b[1:17]
		for j := 0; j < 16; j++ {
			y[j] = float32(mxfp4Values[qs[j]&0xf]) * d
			y[j+16] = float32(mxfp4Values[qs[j]>>4]) * d
		}
	}
}

// Q2_K block: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin.
func dequantQ2K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/256; i++ {
		b := src[i*84 : i*84+84]
		y := dst[i*256 : i*256+256]
		sc := b[0:16]
		d, dmin := f16At(b, 80), f16At(b, 82)
		for half := 0; half < 2; half++ {
			q := b[16+32*half : 16+32*half+32]
			for j := 0; j < 4; j++ {
				shift := uint(2 * j)
				for part := 0; part < 2; part++ {
					s := sc[8*half+2*j+part]
					dl := d * float32(s&0xf)
					ml := dmin * float32(s>>4)
					out := y[128*half+32*j+16*part : 128*half+32*j+16*part+16]
					qq := q[16*part : 16*part+16]
					for l := range out {
						out[l] = float32(dl*float32(qq[l]>>shift&3)) - ml
					}
				}
			}
		}
	}
}

// q3kScales unpacks Q3_K's sixteen 6-bit scales (stored as low nibbles in bytes 0-7, high
// nibbles in bytes 0-7 for scales 8-15, and 2-bit tops in bytes 8-11) and removes the bias 32.
func q3kScales(s []byte, out *[16]int32) {
	_ = s[11]
	for j := 0; j < 16; j++ {
		var low byte
		if j < 8 {
			low = s[j] & 0xf
		} else {
			low = s[j-8] >> 4
		}
		top := s[8+j%4] >> (2 * (j / 4)) & 3
		out[j] = int32(low|top<<4) - 32
	}
}

// Q3_K block: hmask[32], qs[64], scales[12], d.
func dequantQ3K(src []byte, dst []float32) {
	var scales [16]int32
	for i := 0; i < len(dst)/256; i++ {
		b := src[i*110 : i*110+110]
		y := dst[i*256 : i*256+256]
		hm := b[0:32]
		q3kScales(b[96:108], &scales)
		d := f16At(b, 108)
		for half := 0; half < 2; half++ {
			q := b[32+32*half : 32+32*half+32]
			for j := 0; j < 4; j++ {
				shift := uint(2 * j)
				mask := byte(1) << uint(4*half+j)
				for part := 0; part < 2; part++ {
					dl := d * float32(scales[8*half+2*j+part])
					out := y[128*half+32*j+16*part : 128*half+32*j+16*part+16]
					qq := q[16*part : 16*part+16]
					hh := hm[16*part : 16*part+16]
					for l := range out {
						v := int32(qq[l] >> shift & 3)
						if hh[l]&mask == 0 {
							v -= 4
						}
						out[l] = dl * float32(v)
					}
				}
			}
		}
	}
}

// kScaleMin returns the 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block from
// its 12 packed scale bytes (ggml's get_scale_min_k4).
func kScaleMin(j int, s []byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// Q4_K block: d, dmin, scales[12], qs[128].
func dequantQ4K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/256; i++ {
		b := src[i*144 : i*144+144]
		y := dst[i*256 : i*256+256]
		d, dmin := f16At(b, 0), f16At(b, 2)
		s := b[4:16]
		for c := 0; c < 4; c++ {
			q := b[16+32*c : 16+32*c+32]
			sc1, m1 := kScaleMin(2*c, s)
			sc2, m2 := kScaleMin(2*c+1, s)
			d1, dm1 := d*float32(sc1), dmin*float32(m1)
			d2, dm2 := d*float32(sc2), dmin*float32(m2)
			lo := y[64*c : 64*c+32]
			hi := y[64*c+32 : 64*c+64]
			for l := 0; l < 32; l++ {
				lo[l] = float32(d1*float32(q[l]&0xf)) - dm1
				hi[l] = float32(d2*float32(q[l]>>4)) - dm2
			}
		}
	}
}

// Q5_K block: d, dmin, scales[12], qh[32], qs[128].
func dequantQ5K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/256; i++ {
		b := src[i*176 : i*176+176]
		y := dst[i*256 : i*256+256]
		d, dmin := f16At(b, 0), f16At(b, 2)
		s := b[4:16]
		qh := b[16:48]
		for c := 0; c < 4; c++ {
			q := b[48+32*c : 48+32*c+32]
			sc1, m1 := kScaleMin(2*c, s)
			sc2, m2 := kScaleMin(2*c+1, s)
			d1, dm1 := d*float32(sc1), dmin*float32(m1)
			d2, dm2 := d*float32(sc2), dmin*float32(m2)
			u1, u2 := uint(2*c), uint(2*c+1)
			lo := y[64*c : 64*c+32]
			hi := y[64*c+32 : 64*c+64]
			for l := 0; l < 32; l++ {
				h := qh[l]
				lo[l] = float32(d1*float32(q[l]&0xf|(h>>u1&1)<<4)) - dm1
				hi[l] = float32(d2*float32(q[l]>>4|(h>>u2&1)<<4)) - dm2
			}
		}
	}
}

// Q6_K block: ql[128], qh[64], int8 scales[16], d.
func dequantQ6K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/256; i++ {
		b := src[i*210 : i*210+210]
		y := dst[i*256 : i*256+256]
		d := f16At(b, 208)
		for half := 0; half < 2; half++ {
			ql := b[64*half : 64*half+64]
			qh := b[128+32*half : 128+32*half+32]
			sc := b[192+8*half : 192+8*half+8]
			out := y[128*half : 128*half+128]
			for l := 0; l < 32; l++ {
				is := l / 16
				h := qh[l]
				q1 := int32(ql[l]&0xf|(h&3)<<4) - 32
				q2 := int32(ql[l+32]&0xf|(h>>2&3)<<4) - 32
				q3 := int32(ql[l]>>4|(h>>4&3)<<4) - 32
				q4 := int32(ql[l+32]>>4|(h>>6&3)<<4) - 32
				out[l] = d * float32(int8(sc[is])) * float32(q1)
				out[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
				out[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
				out[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
			}
		}
	}
}

// Q8_K block: float32 d, int8 qs[256], int16 bsums[16].
func dequantQ8K(src []byte, dst []float32) {
	for i := 0; i < len(dst)/256; i++ {
		b := src[i*292 : i*292+292]
		y := dst[i*256 : i*256+256]
		d := math.Float32frombits(binary.LittleEndian.Uint32(b))
		qs := b[4:260]
		for j := range y {
			y[j] = d * float32(int8(qs[j]))
		}
	}
}
