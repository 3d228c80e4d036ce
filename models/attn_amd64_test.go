//go:build !purego

package models

import (
	"math"
	"testing"
)

// The assembly exponential against expAVX512, which softmax and SwiGLU reach only through
// their own kernels.

func checkExpAVX2(t *testing.T, x []float32) {
	t.Helper()
	x = x[:len(x)&^7]
	got := make([]float32, len(x))
	attnExpAVX2(got, x)
	for i, v := range x {
		if want := expAVX512(v); !sameFloat(got[i], want) {
			t.Fatalf("exp(%g) (%08x) = %g (%08x), want %g (%08x)", v, math.Float32bits(v), got[i], math.Float32bits(got[i]),
				want, math.Float32bits(want))
		}
	}
}

func TestAttnExp(t *testing.T) {
	if !attnAVX2 {
		t.Skip("no AVX2, FMA and F16C")
	}
	// Every 1009th float32 bit pattern of each sign below 256 in magnitude (the range whose
	// results are neither 0 nor +Inf, and then some), and the specials.
	var x []float32
	for b := uint32(0); b < 0x43800000; b += 1009 {
		x = append(x, math.Float32frombits(b), math.Float32frombits(b|1<<31))
	}
	x = append(x, specials...)
	x = append(x, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e10, -1e10)
	for len(x)%8 != 0 {
		x = append(x, 0)
	}
	checkExpAVX2(t, x)
}

func FuzzAttnExp(f *testing.F) {
	f.Add(seedBytes(13, 8, 50))
	f.Add(seedBytes(14, 64, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !attnAVX2 {
			t.Skip("no AVX2, FMA and F16C")
		}
		checkExpAVX2(t, floatsOf(data))
	})
}
