package trace

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// TestToF16MatchesQuant checks the fast path against quant for every sign, exponent and
// kept mantissa, each with the dropped bits that decide rounding (zero, just above zero,
// just below half, half, just above half, all ones), and for random bit patterns.
func TestToF16MatchesQuant(t *testing.T) {
	check := func(b uint32) {
		v := math.Float32frombits(b)
		if got, want := toF16(v), quant.FP32ToFP16(v); got != want {
			t.Fatalf("toF16(%v = %#08x) = %#04x, quant gives %#04x", v, b, got, want)
		}
	}
	for hi := range uint32(1 << 19) {
		for _, lo := range []uint32{0, 1, 0xfff, 0x1000, 0x1001, 0x1fff} {
			check(hi<<13 | lo)
		}
	}
	rng := rand.New(rand.NewPCG(61, 62))
	for range 1 << 20 {
		check(rng.Uint32())
	}
}
