package quant

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// fma32Exact rounds a*b+c once to float32 with math/big.
func fma32Exact(a, b, c float32) float32 {
	p := new(big.Float).SetPrec(200).SetFloat64(float64(a))
	p.Mul(p, new(big.Float).SetPrec(200).SetFloat64(float64(b)))
	p.Add(p, new(big.Float).SetPrec(200).SetFloat64(float64(c)))
	f, _ := p.Float32()
	return f
}

func TestFMA32(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	check := func(a, b, c float32) {
		t.Helper()
		if got, want := fma32(a, b, c), fma32Exact(a, b, c); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %g (%08x), want %g (%08x)", a, b, c, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
	for i := 0; i < 200000; i++ {
		a := float32(r.NormFloat64())
		b := float32(r.NormFloat64() * math.Exp2(float64(r.IntN(40)-20)))
		check(a, b, float32(r.NormFloat64()))
		// Products far below c: the float64 sum is often a float32 tie.
		c := float32(r.NormFloat64())
		check(a, b*0x1p-30, c)
		// a*b exactly a half-ulp of c (a tie decided by the sign of nothing else), and
		// slightly off it.
		ulp := math.Nextafter32(c, float32(math.Inf(1))) - c
		check(ulp/2, 1, c)
		check(ulp/2, math.Nextafter32(1, 2), c)
		check(ulp/2, math.Nextafter32(1, 0), c)
		check(-ulp/2, 1, c)
	}
}

func TestHsumOrders(t *testing.T) {
	// Values whose sum depends on the order: the results are those of the x86 reductions.
	a := [8]float32{1, 1e8, -1e8, 3, 0.5, -0.5, 0.25, 1e-8}
	if got, want := hsum8(&a), ((a[4]+a[0])+(a[6]+a[2]))+((a[5]+a[1])+(a[7]+a[3])); got != want {
		t.Errorf("hsum8 = %g, want %g", got, want)
	}
	var b [16]float32
	for i := range b {
		b[i] = float32(i%5) * float32(math.Pow(10, float64(i%7)))
	}
	var h [8]float32
	for i := range h {
		h[i] = b[i+8] + b[i]
	}
	want := ((h[4] + h[0]) + (h[6] + h[2])) + ((h[5] + h[1]) + (h[7] + h[3]))
	if got := HSum16(&b); got != want {
		t.Errorf("hsum16 = %g, want %g", got, want)
	}
}

// TestX86DotAVX2 checks the x86 kernels of the types whose ggml_vec_dot_*_q8_* AVX2 code is
// the same in the llama.cpp of the fixtures (ollama's vendored copy) and in the one the golden
// fixtures were made with: bit for bit against the AVX2 results in testdata/golden.bin.gz.
// (Q6_K's AVX2 kernel changed in between; the F32/F16/BF16 fixtures come from AVX2 builds,
// while X86Dot follows the AVX-512 ones; the repacked kernels are not in these fixtures. The
// engine's golden tests check all of them against llama.cpp.)
func TestX86DotAVX2(t *testing.T) {
	same := map[Type]bool{Q4_0: true, Q4_1: true, Q5_0: true, Q5_1: true, Q8_0: true, IQ4_NL: true,
		MXFP4: true, Q2_K: true, Q3_K: true, Q4_K: true, Q5_K: true}
	seen := map[Type]int{}
	for _, r := range records(t, recVecDot) {
		if !same[r.typ] {
			continue
		}
		seen[r.typ]++
		// One row, one activation row: no repacking, the ggml_vec_dot kernel.
		got := X86Dot(r.typ, 1, 1, 0)(r.n, r.a, r.b)
		if math.Float32bits(got) != math.Float32bits(r.simd) {
			t.Errorf("%v n=%d: got %.9g, ggml AVX2 kernel %.9g", r.typ, r.n, got, r.simd)
		}
	}
	for typ := range same {
		if seen[typ] == 0 {
			t.Errorf("no vec_dot fixture for %v", typ)
		}
	}
}

// TestX86DotNearPortable checks every x86 kernel (repacked or not, GEMM or GEMV, tinyBLAS or
// vec_dot) against the portable one: they sum the same products in another order.
func TestX86DotNearPortable(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, typ := range weightTypes {
		for _, n := range []int{256, 768} {
			if n%typ.BlockSize() != 0 {
				continue
			}
			wb, _ := typ.RowBytes(n)
			xb, _ := typ.DotType().RowBytes(n)
			w, x := make([]byte, wb), make([]byte, xb)
			for trial := 0; trial < 20; trial++ {
				QuantizeRow(typ, randomRow(r, n, 0.05), w)
				QuantizeRow(typ.DotType(), randomRow(r, n, 1), x)
				want := VecDot(typ, n, w, x)
				scale := absDot(typ, n, w, x)
				for _, c := range [][3]int{{1, 1, 0}, {8, 1, 0}, {12, 6, 0}, {8, 6, 0}, {8, 6, 5}, {16, 9, 8}} {
					got := X86Dot(typ, c[0], c[1], c[2])(n, w, x)
					if d := math.Abs(float64(got) - float64(want)); d > 4e-6*scale+1e-30 {
						t.Errorf("%v n=%d rows=%d batch=%d row=%d: x86 %.9g, portable %.9g: |diff| %.3g > 4e-6 * %.3g",
							typ, n, c[0], c[1], c[2], got, want, d, scale)
					}
				}
			}
		}
	}
}

func TestDotF32(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, n := range []int{16, 48, 64, 77, 120, 144, 256, 1000} {
		a, b := randomRow(r, n, 1), randomRow(r, n, 1)
		var want, scale float64
		for i := range a {
			want += float64(a[i]) * float64(b[i])
			scale += math.Abs(float64(a[i]) * float64(b[i]))
		}
		if got := DotF32Vec(a, b); math.Abs(float64(got)-want) > 1e-6*scale {
			t.Errorf("DotF32Vec n=%d: %g, want %g", n, got, want)
		}
		if n%16 == 0 {
			if got := DotF32Lanes16(a, b); math.Abs(float64(got)-want) > 1e-6*scale {
				t.Errorf("DotF32Lanes16 n=%d: %g, want %g", n, got, want)
			}
		}
	}
	// The leftovers past the last 64: groups of 16 and 8 are multiplied then added in order,
	// the rest fused.
	a := make([]float32, 64+16+8+3)
	b := make([]float32, len(a))
	for i := range a {
		a[i], b[i] = 1+0x1p-20*float32(i), 1-0x1p-21*float32(i)
	}
	v := vecF32{}
	v.step((*[64]float32)(a), (*[64]float32)(b))
	want := v.finish(nil, nil)
	for i := 64; i < 88; i++ {
		want += float32(a[i] * b[i])
	}
	for i := 88; i < len(a); i++ {
		want = fma32(a[i], b[i], want)
	}
	if got := DotF32Vec(a, b); got != want {
		t.Errorf("DotF32Vec leftovers: %g, want %g", got, want)
	}
}
