package quant

import "math"

// fp16Table maps every IEEE half bit pattern to its float32 value. ggml's CPU backend keeps the
// same 256 KiB table; a load is cheaper than the bit surgery, and block scales are read once per
// 32 or 256 elements, so the table stays hot in cache.
var fp16Table = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = fp16ToFP32Slow(uint16(i))
	}
	return &t
}()

// FP16ToFP32 converts an IEEE 754 half to float32. Every half is exactly representable; NaNs
// come back quiet with their payload, as x86's VCVTPH2PS and ggml's table give them.
func FP16ToFP32(h uint16) float32 { return fp16Table[h] }

func fp16ToFP32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if mant == 0 {
			return math.Float32frombits(sign | 0x7f800000)
		}
		return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal half: mant * 2^-24, exact in float32.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}

// FP32ToFP16 converts float32 to an IEEE 754 half with round-to-nearest-even, overflow to
// infinity and gradual underflow: what x86's F16C (VCVTPS2PH with imm 0) does, which is what
// llama.cpp's CPU backend uses for rows of F16 activations and the F16 KV cache. NaNs stay NaN
// with the quiet bit set and the payload's top bits kept, as F16C does (ggml's portable
// conversion returns one canonical NaN instead; no other input differs).
func FP32ToFP16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant == 0 {
			return sign | 0x7c00
		}
		return sign | 0x7e00 | uint16(mant>>13)
	}
	e := exp - 127 // unbiased
	if e > 15 {
		return sign | 0x7c00
	}
	if e >= -14 {
		// Normal half. A carry out of the mantissa moves into the exponent, and from the
		// largest finite half into infinity, which is the right answer in both cases.
		h := uint32(e+15)<<10 | mant>>13
		rest := mant & 0x1fff
		if rest > 0x1000 || rest == 0x1000 && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	if exp == 0 {
		// float32 subnormals are far below half's smallest subnormal.
		return sign
	}
	// Subnormal half: the value in units of 2^-24 is m * 2^(e+1) with the implicit bit set.
	m := mant | 0x800000
	shift := uint(-e - 1) // 14..
	if shift > 24 {
		return sign
	}
	h := m >> shift
	rest := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rest > half || rest == half && h&1 == 1 {
		h++
	}
	return sign | uint16(h)
}

// fp16Canonical is FP32ToFP16 with every NaN mapped to one quiet NaN, as ggml's portable
// GGML_FP32_TO_FP16 does. x86 llama.cpp uses that one for single values (block scales), and
// F16C only for bulk rows.
func fp16Canonical(f float32) uint16 {
	if f != f {
		return uint16(math.Float32bits(f)>>16)&0x8000 | 0x7e00
	}
	return FP32ToFP16(f)
}

// BF16ToFP32 widens a bfloat16, which is the top half of a float32.
func BF16ToFP32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// FP32ToBF16 rounds a float32 to bfloat16 the way ggml does (GGML_FP32_TO_BF16): nearest
// even, overflow to infinity, subnormals kept, NaNs made quiet by setting bit 6 of the result.
func FP32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	// Adding 0x7fff plus the lowest kept bit rounds half-way cases to the even neighbour.
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}
