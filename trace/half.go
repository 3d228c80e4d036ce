package trace

import (
	"math"

	"github.com/commit-run/commit-run/quant"
)

// toF16 is quant.FP32ToFP16 (round to nearest even), bit for bit, with the common case done
// inline and without a data-dependent branch: quant's rounding branch mispredicts about half
// the time on real activations, and f16 inputs are nearly all of a trace's bytes, so this
// roughly doubles the writer's speed. Zeros, subnormal halves, overflow and NaN take quant's
// path.
func toF16(v float32) uint16 {
	b := math.Float32bits(v)
	a := b & 0x7fffffff
	// 0x38800000 is 2^-14, the smallest normal half; 0x477ff000 is 65520, the first value
	// that rounds to infinity. One unsigned compare checks both ends.
	if a-0x38800000 < 0x477ff000-0x38800000 {
		// Adding 0xfff plus the lowest kept bit rounds half-way cases to the even neighbour;
		// a carry into the exponent is the right answer. Rebias the exponent from 127 to 15.
		a += 0xfff + (a>>13)&1
		return uint16(b>>16)&0x8000 | uint16(a>>13-(127-15)<<10)
	}
	return quant.FP32ToFP16(v)
}
