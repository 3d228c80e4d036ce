package models

import (
	"encoding/binary"
	"fmt"
	"github.com/commit-run/commit-run/device"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// The kernels of attn_kernels.go (the assembly ones where the CPU has them) against their
// plain-Go references, bit for bit: table tests over the shapes and values that matter, and
// differential fuzz targets whose seed corpora run as ordinary tests.

// specials are values whose arithmetic has edge cases: signed zeros, subnormals, the limits
// of float16, huge and tiny magnitudes.
var specials = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1e-45, -1e-45, 1e-38, 6e-8, 65504, 65520, -65536,
	1e30, -1e30, 1e-30, 3.4e38, 0.5, 88.7, -103.9, 200, -200}

func randFloats(r *rand.Rand, n int, scale float64, special bool) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
		if special && r.IntN(8) == 0 {
			x[i] = specials[r.IntN(len(specials))]
		}
	}
	return x
}

func randHalves(r *rand.Rand, n int, special bool) []uint16 {
	h := make([]uint16, n)
	for i := range h {
		h[i] = quant.FP32ToFP16(float32(r.NormFloat64()))
		if special && r.IntN(8) == 0 {
			h[i] = uint16(r.Uint32()) &^ 0x7c00 // a subnormal or zero
		}
	}
	return h
}

func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if !sameFloat(got[i], want[i]) {
			t.Fatalf("%s: [%d] = %g (%08x), want %g (%08x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

var dotLens = []int{1, 7, 8, 9, 16, 24, 63, 64, 65, 100, 128, 136, 144, 192, 576}

func TestAttnDots(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, dk := range dotLens {
		for _, n := range []int{1, 2, 17, 70} {
			for _, special := range []bool{false, true} {
				stride := dk + r.IntN(3)
				q := randFloats(r, dk, 1, special)
				scale := float32(0.125)
				got, want := make([]float32, n), make([]float32, n)
				k := randFloats(r, (n-1)*stride+dk, 1, special)
				dotsF32(got, q, k, stride, scale)
				dotsF32Go(want, q, k, stride, scale)
				sameFloats(t, fmt.Sprintf("F32 dk=%d n=%d", dk, n), got, want)
				k16 := randHalves(r, (n-1)*stride+dk, special)
				roundF16Go(q)
				dotsF16(got, q, k16, stride, scale)
				dotsF16Go(want, q, k16, stride, scale)
				sameFloats(t, fmt.Sprintf("F16 dk=%d n=%d", dk, n), got, want)
			}
		}
	}
}

// TestAttnDotsMulti: the queries that share keys, for the head sizes with unrolled kernels,
// one with a loop (320), and one the kernels leave to dotsF32/F16 (100).
func TestAttnDotsMulti(t *testing.T) {
	r := rand.New(rand.NewPCG(59, 60))
	for _, dk := range []int{64, 128, 192, 256, 320, 576, 100} {
		for nq := 1; nq <= 3; nq++ {
			for _, n := range []int{1, 5, 70} {
				stride, qs, os := dk+r.IntN(3), dk+r.IntN(3), n+r.IntN(3)
				q := randFloats(r, (nq-1)*qs+dk, 1, true)
				scale := float32(0.0883)
				got, want := make([]float32, (nq-1)*os+n), make([]float32, (nq-1)*os+n)
				k := randFloats(r, (n-1)*stride+dk, 1, true)
				dotsMultiF32(got, os, q, qs, nq, dk, k, stride, n, scale)
				dotsMultiF32Go(want, os, q, qs, nq, dk, k, stride, n, scale)
				sameFloats(t, fmt.Sprintf("F32 dk=%d nq=%d n=%d", dk, nq, n), got, want)
				k16 := randHalves(r, (n-1)*stride+dk, true)
				roundF16Go(q)
				dotsMultiF16(got, os, q, qs, nq, dk, k16, stride, n, scale)
				dotsMultiF16Go(want, os, q, qs, nq, dk, k16, stride, n, scale)
				sameFloats(t, fmt.Sprintf("F16 dk=%d nq=%d n=%d", dk, nq, n), got, want)
			}
		}
	}
}

func TestDotF16VecIsDotF32Vec(t *testing.T) {
	r := rand.New(rand.NewPCG(53, 54))
	for _, n := range dotLens {
		k, q := randHalves(r, n, true), randFloats(r, n, 1, true)
		kf := make([]float32, n)
		for i, h := range k {
			kf[i] = quant.FP16ToFP32(h)
		}
		if got, want := dotF16Vec(k, q), quant.DotF32Vec(kf, q); !sameFloat(got, want) {
			t.Errorf("n=%d: %g, want %g", n, got, want)
		}
	}
}

func TestAttnSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(55, 56))
	for _, n := range []int{1, 2, 15, 16, 17, 64, 65, 200, 1000} {
		for _, s := range []float64{0.1, 3, 30, 300} {
			x := randFloats(r, (n+15)&^15, s, s == 30)
			want := append([]float32(nil), x...)
			softmaxBlocks(x, n)
			softmaxBlocksGo(want, n)
			sameFloats(t, fmt.Sprintf("n=%d scale %g", n, s), x[:n], want[:n])
		}
	}
	// Equal scores, -Inf among them, and all -Inf.
	inf := float32(math.Inf(-1))
	for _, x := range [][]float32{{2, 2, 2}, {1, inf, 3, inf}, {inf, inf}} {
		got := append(make([]float32, 0, 16), x...)
		want := append([]float32(nil), x...)
		softmaxBlocks(got[:16], len(x))
		softmaxBlocksGo(want, len(x))
		sameFloats(t, fmt.Sprint(x), got[:len(x)], want)
	}
}

// wsumVariant is one weighted sum and its reference.
type wsumVariant struct {
	name    string
	f16     bool
	rows    bool // values in rows per position; else transposed
	lanes   int
	f32     func(out, w, v []float32, stride, n int, acc []float32)
	f32Ref  func(out, w, v []float32, stride, n int, acc []float32)
	f16f    func(out, w []float32, v []uint16, stride, n int, acc []float32)
	f16fRef func(out, w []float32, v []uint16, stride, n int, acc []float32)
}

func wsumVariants() []wsumVariant {
	t32 := func(f func(out, w, v []float32, stride, n int)) func(out, w, v []float32, stride, n int, acc []float32) {
		return func(out, w, v []float32, stride, n int, _ []float32) { f(out, w, v, stride, n) }
	}
	t16 := func(f func(out, w []float32, v []uint16, stride, n int)) func(out, w []float32, v []uint16, stride, n int, acc []float32) {
		return func(out, w []float32, v []uint16, stride, n int, _ []float32) { f(out, w, v, stride, n) }
	}
	return []wsumVariant{
		{name: "vec", lanes: 64, f32: t32(wsumVec), f32Ref: t32(wsumVecGo)},
		{name: "lanes", lanes: 16, f32: t32(wsumLanes), f32Ref: t32(wsumLanesGo)},
		{name: "vecF16", f16: true, lanes: 64, f16f: t16(wsumVecF16), f16fRef: t16(wsumVecF16Go)},
		{name: "lanesF16", f16: true, lanes: 16, f16f: t16(wsumLanesF16), f16fRef: t16(wsumLanesF16Go)},
		{name: "rows", rows: true, lanes: 64, f32: wsumRows, f32Ref: wsumRowsGo},
		{name: "rows16", rows: true, lanes: 16, f32: wsumRows16, f32Ref: wsumRows16Go},
		{name: "rowsF16", f16: true, rows: true, lanes: 64, f16f: wsumRowsF16, f16fRef: wsumRowsF16Go},
		{name: "rows16F16", f16: true, rows: true, lanes: 16, f16f: wsumRows16F16, f16fRef: wsumRows16F16Go},
	}
}

// run computes the variant and its reference over the n positions of values v32 or v16,
// laid out for the variant with dv values, and compares them.
func (wv wsumVariant) run(t testing.TB, w []float32, v32 []float32, v16 []uint16, stride, n, dv int) {
	got, want := make([]float32, dv), make([]float32, dv)
	acc := make([]float32, 64*64)
	if wv.f16 {
		wv.f16f(got, w, v16, stride, n, acc)
		wv.f16fRef(want, w, v16, stride, n, nil)
	} else {
		wv.f32(got, w, v32, stride, n, acc)
		wv.f32Ref(want, w, v32, stride, n, nil)
	}
	for d := range want {
		if !sameFloat(got[d], want[d]) {
			t.Fatalf("%s n=%d dv=%d stride %d: out[%d] = %g (%08x), want %g (%08x)", wv.name, n, dv, stride, d,
				got[d], math.Float32bits(got[d]), want[d], math.Float32bits(want[d]))
		}
	}
}

// layout returns the number of values the variant reads for dv values of n positions with
// stride, the padding of the transposed layouts included.
func (wv wsumVariant) layout(n, dv, stride int) int {
	if wv.rows {
		return (n-1)*stride + dv
	}
	return (dv-1)*stride + (n+63)&^63
}

func TestAttnWSum(t *testing.T) {
	r := rand.New(rand.NewPCG(57, 58))
	for _, wv := range wsumVariants() {
		for _, n := range []int{1, 3, 15, 16, 17, 63, 64, 65, 130, 300} {
			for _, dv := range []int{1, 5, 8, 64, 72, 128, 512} {
				for _, special := range []bool{false, true} {
					stride := dv + r.IntN(4)
					if !wv.rows {
						stride = (n+63)&^63 + r.IntN(4)
					}
					w := make([]float32, (n+63)&^63)
					for p := range w[:n] {
						w[p] = float32(r.Float64())
						if special && r.IntN(4) == 0 {
							w[p] = specials[r.IntN(len(specials))]
						}
					}
					size := wv.layout(n, dv, stride)
					wv.run(t, w, randFloats(r, size, 1, special), randHalves(r, size, special), stride, n, dv)
				}
			}
		}
	}
}

// TestAttnWSumRowsMulti: MLA's weighted sums of several heads that share the latent rows,
// with value counts that the kernels take (whole tiles of 32) and not.
func TestAttnWSumRowsMulti(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, dv := range []int{32, 64, 128, 512, 48} {
		for nq := 1; nq <= 3; nq++ {
			for _, n := range []int{1, 15, 16, 17, 64, 65, 130} {
				for _, batched := range []bool{false, true} {
					stride, ws, os := dv+16+r.IntN(3), (n+63)&^63+r.IntN(3), dv+r.IntN(3)
					w := make([]float32, (nq-1)*ws+(n+63)&^63)
					for i := 0; i < nq; i++ {
						for p := 0; p < n; p++ {
							w[i*ws+p] = float32(r.Float64())
							if r.IntN(8) == 0 {
								w[i*ws+p] = specials[r.IntN(len(specials))]
							}
						}
					}
					size := (n-1)*stride + dv
					v32, v16 := randFloats(r, size, 1, true), randHalves(r, size, true)
					acc := make([]float32, 64*96)
					got, want := make([]float32, (nq-1)*os+dv), make([]float32, (nq-1)*os+dv)
					name := fmt.Sprintf("dv=%d nq=%d n=%d batched=%v", dv, nq, n, batched)
					wsumRowsMulti(got, os, w, ws, v32, stride, n, nq, dv, batched, acc)
					wsumRowsMultiGo(want, os, w, ws, v32, stride, n, nq, dv, batched, nil)
					sameFloats(t, "F32 "+name, got, want)
					wsumRowsMultiF16(got, os, w, ws, v16, stride, n, nq, dv, batched, acc)
					wsumRowsMultiF16Go(want, os, w, ws, v16, stride, n, nq, dv, batched, nil)
					sameFloats(t, "F16 "+name, got, want)
				}
			}
		}
	}
}

// TestAttnWSumSignedZeros: weights and values whose products underflow to -0, in sums that
// stay zero, where the padding's zero products (+0) decide the sign.
func TestAttnWSumSignedZeros(t *testing.T) {
	for _, wv := range wsumVariants() {
		for _, n := range []int{1, 16, 17, 64, 65} {
			dv := 64
			stride := dv
			if !wv.rows {
				stride = (n + 63) &^ 63
			}
			size := wv.layout(n, dv, stride)
			w := make([]float32, (n+63)&^63)
			for p := range w[:n] {
				w[p] = 1e-30
			}
			v32 := make([]float32, size)
			v16 := make([]uint16, size)
			for i := range v32 {
				v32[i] = -1e-30
				v16[i] = 0x8001 // the negative smallest subnormal half
			}
			wv.run(t, w, v32, v16, stride, n, dv)
		}
	}
}

func TestAttnRoundF16(t *testing.T) {
	x := make([]float32, 0, 1<<17+len(specials))
	for h := 0; h < 1<<16; h++ {
		f := quant.FP16ToFP32(uint16(h))
		x = append(x, f, math.Float32frombits(math.Float32bits(f)+0x1000)) // a half, and halfway up
	}
	x = append(x, specials...)
	got, want := append([]float32(nil), x...), append([]float32(nil), x...)
	roundF16(got)
	roundF16Go(want)
	sameFloats(t, "roundF16", got, want)
	h, hw := make([]uint16, len(x)), make([]uint16, len(x))
	toF16(h, x)
	toF16Go(hw, x)
	for i := range h {
		if h[i] != hw[i] && !(x[i] != x[i]) {
			t.Fatalf("toF16(%g) = %04x, want %04x", x[i], h[i], hw[i])
		}
	}
}

// floatsOf decodes the little-endian floats of data.
func floatsOf(data []byte) []float32 {
	x := make([]float32, len(data)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return x
}

// halvesOf decodes the little-endian halves of data.
func halvesOf(data []byte) []uint16 {
	h := make([]uint16, len(data)/2)
	for i := range h {
		h[i] = binary.LittleEndian.Uint16(data[2*i:])
	}
	return h
}

func seedBytes(seed uint64, n int, scale float64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64()*scale)))
	}
	return b
}

func FuzzAttnDots(f *testing.F) {
	f.Add(uint16(128), uint8(3), false, seedBytes(1, 600, 1))
	f.Add(uint16(65), uint8(2), true, seedBytes(2, 400, 1))
	f.Add(uint16(7), uint8(9), false, seedBytes(3, 100, 1e20))
	f.Fuzz(func(t *testing.T, dk uint16, n uint8, f16 bool, data []byte) {
		x := floatsOf(data)
		d := int(dk)%200 + 1
		if len(x) < 2*d+1 {
			return
		}
		q, rest := x[:d], x[d:]
		scale := rest[0]
		rest = rest[1:]
		np := min(int(n)+1, len(rest)/d)
		got, want := make([]float32, np), make([]float32, np)
		if f16 {
			k := halvesOf(data[4*(d+1):])[:np*d]
			roundF16Go(q)
			dotsF16(got, q, k, d, scale)
			dotsF16Go(want, q, k, d, scale)
		} else {
			dotsF32(got, q, rest, d, scale)
			dotsF32Go(want, q, rest, d, scale)
		}
		sameFloats(t, "dots", got, want)
	})
}

func FuzzAttnDotsMulti(f *testing.F) {
	f.Add(uint8(1), uint8(3), uint8(9), false, seedBytes(15, 3000, 1))
	f.Add(uint8(8), uint8(2), uint8(3), true, seedBytes(16, 6000, 1))
	f.Add(uint8(4), uint8(3), uint8(2), true, seedBytes(17, 3000, 1e10))
	f.Fuzz(func(t *testing.T, steps, nq8, n8 uint8, f16 bool, data []byte) {
		dk, nq, n := 64*(int(steps)%10+1), int(nq8)%3+1, int(n8)%20+1
		x := floatsOf(data)
		if len(x) < nq*dk+1+n*dk {
			return
		}
		q, scale, k := x[:nq*dk], x[nq*dk], x[nq*dk+1:nq*dk+1+n*dk]
		got, want := make([]float32, nq*n), make([]float32, nq*n)
		if f16 {
			k16 := halvesOf(data[4*(nq*dk+1):])[:n*dk]
			roundF16Go(q)
			dotsMultiF16(got, n, q, dk, nq, dk, k16, dk, n, scale)
			dotsMultiF16Go(want, n, q, dk, nq, dk, k16, dk, n, scale)
		} else {
			dotsMultiF32(got, n, q, dk, nq, dk, k, dk, n, scale)
			dotsMultiF32Go(want, n, q, dk, nq, dk, k, dk, n, scale)
		}
		sameFloats(t, "dots", got, want)
	})
}

func FuzzAttnSoftmax(f *testing.F) {
	f.Add(seedBytes(4, 40, 3))
	f.Add(seedBytes(5, 16, 100))
	f.Add(seedBytes(6, 1, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		x := floatsOf(data)
		n := len(x)
		got := make([]float32, (n+15)&^15)
		copy(got, x)
		softmaxBlocks(got, n)
		softmaxBlocksGo(x, n)
		sameFloats(t, "softmax", got[:n], x)
	})
}

func FuzzAttnWSum(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint8(64), seedBytes(7, 2000, 1))
	f.Add(uint8(5), uint8(17), uint8(64), seedBytes(8, 3000, 1))
	f.Add(uint8(2), uint8(70), uint8(3), seedBytes(9, 3000, 1))
	f.Add(uint8(7), uint8(33), uint8(128), seedBytes(10, 9000, 1))
	f.Fuzz(func(t *testing.T, variant, n8, dv8 uint8, data []byte) {
		wv := wsumVariants()[int(variant)%8]
		n, dv := int(n8)+1, int(dv8)%192+1
		if wv.rows && variant&8 != 0 {
			dv = (dv + 63) &^ 63 // the assembly's whole tiles
		}
		x := floatsOf(data)
		stride := dv
		if !wv.rows {
			stride = (n + 63) &^ 63
		}
		size := wv.layout(n, dv, stride)
		if len(x) < n+size {
			return
		}
		w := make([]float32, (n+63)&^63)
		copy(w, x[:n])
		v := x[n:]
		wv.run(t, w, v[:size], halvesOf(data[4*n:])[:size], stride, n, dv)
	})
}

func FuzzAttnWSumRowsMulti(f *testing.F) {
	f.Add(uint8(3), uint8(2), uint8(70), false, seedBytes(18, 3000, 1))
	f.Add(uint8(0), uint8(3), uint8(16), true, seedBytes(19, 3000, 1))
	f.Fuzz(func(t *testing.T, tiles, nq8, n8 uint8, batched bool, data []byte) {
		dv, nq, n := 32*(int(tiles)%4+1), int(nq8)%3+1, int(n8)%100+1
		x := floatsOf(data)
		ws := (n + 63) &^ 63
		if len(x) < nq*ws+n*dv {
			return
		}
		w := make([]float32, nq*ws)
		for i := 0; i < nq; i++ {
			copy(w[i*ws:i*ws+n], x[i*n:(i+1)*n])
		}
		v := x[nq*n : nq*n+n*dv]
		v16 := halvesOf(data[4*nq*n:])[:n*dv]
		got, want := make([]float32, nq*dv), make([]float32, nq*dv)
		acc := make([]float32, 64*96)
		wsumRowsMulti(got, dv, w, ws, v, dv, n, nq, dv, batched, acc)
		wsumRowsMultiGo(want, dv, w, ws, v, dv, n, nq, dv, batched, nil)
		sameFloats(t, "F32", got, want)
		wsumRowsMultiF16(got, dv, w, ws, v16, dv, n, nq, dv, batched, acc)
		wsumRowsMultiF16Go(want, dv, w, ws, v16, dv, n, nq, dv, batched, nil)
		sameFloats(t, "F16", got, want)
	})
}

// refSiLU is ggml_vec_silu_f32: ggml_v_silu over 16-wide vectors, the scalar SiLU for the rest.
func refSiLU(dst, x []float32) {
	n := len(x)
	for i := range x {
		if i < n&^15 {
			dst[i] = siluAVX512(x[i])
		} else {
			dst[i] = siluScalar(x[i])
		}
	}
}

func TestSiLUMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(43, 44))
	for _, n := range []int{1, 8, 15, 16, 17, 31, 40, 128, 1000, 8192} {
		for _, special := range []bool{false, true} {
			x := randFloats(r, n, 10, special)
			got, want := make([]float32, n), make([]float32, n)
			SiLU(got, x)
			refSiLU(want, x)
			sameFloats(t, fmt.Sprintf("SiLU of %d", n), got, want)
			SiLU(x, x) // in place, as DeltaNet calls it
			sameFloats(t, fmt.Sprintf("SiLU of %d in place", n), x, want)
		}
	}
}

func FuzzAttnSwiGLU(f *testing.F) {
	f.Add(seedBytes(11, 64, 3))
	f.Add(seedBytes(12, 34, 100))
	f.Fuzz(func(t *testing.T, data []byte) {
		x := floatsOf(data)
		n := len(x) / 2
		g, u := x[:n], x[n:2*n]
		got, want := make([]float32, n), make([]float32, n)
		SwiGLU(got, g, u)
		refSwiGLU(want, g, u)
		sameFloats(t, "SwiGLU", got, want)
		SiLU(got, g)
		refSiLU(want, g)
		sameFloats(t, "SiLU", got, want)
	})
}

func BenchmarkAttnSwiGLU(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	g, u := randFloats(r, 1024, 3, false), randFloats(r, 1024, 1, false)
	dst := make([]float32, 1024)
	for _, impl := range []struct {
		name string
		f    func(dst, g, u []float32)
	}{{"fast", SwiGLU}, {"go", refSwiGLU}} {
		b.Run(impl.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				impl.f(dst, g, u)
			}
		})
	}
}

// BenchmarkAttnWSumLayout sets the two layouts of the values against each other for one
// head of 128 values of an F16 cache: rows of V^T (the host's V cache) and rows per position
// summed lane-major (MLA's latent rows).
func BenchmarkAttnWSumLayout(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	const dv = 128
	for _, n := range []int{256, 2048} {
		w := make([]float32, (n+63)&^63)
		for p := range w[:n] {
			w[p] = float32(r.Float64())
		}
		v := randHalves(r, dv*((n+63)&^63), false)
		out, acc := make([]float32, dv), make([]float32, 64*64)
		for _, l := range []struct {
			name string
			f    func()
		}{
			{"transposed/vec", func() { wsumVecF16(out, w, v, (n+63)&^63, n) }},
			{"transposed/lanes16", func() { wsumLanesF16(out, w, v, (n+63)&^63, n) }},
			{"rows/vec", func() { wsumRowsF16(out, w, v, dv, n, acc) }},
			{"rows/lanes16", func() { wsumRows16F16(out, w, v, dv, n, acc) }},
		} {
			b.Run(fmt.Sprintf("n=%d/%s", n, l.name), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					l.f()
				}
			})
		}
	}
}

// TestExpInPlace holds ExpInPlace, in place and with a tail past the vector lanes, to
// expAVX512 value by value.
func TestExpInPlace(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 72))
	for _, n := range []int{0, 1, 7, 8, 9, 37, 2048} {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 30)
		}
		if n > 3 {
			x[0], x[1], x[2], x[3] = float32(math.Inf(-1)), -100, 0, 88.5
		}
		want := make([]float32, n)
		for i, v := range x {
			want[i] = expAVX512(v)
		}
		ExpInPlace(x)
		for i := range x {
			if !sameFloat(x[i], want[i]) {
				t.Fatalf("n=%d: value %d: %g, want %g", n, i, x[i], want[i])
			}
		}
	}
}

// checkDelta runs one token of the DeltaNet recurrence (the assembly where the CPU has it)
// against deltaStepGo, and deltaStepGo against ggml's gated_delta_net as it sweeps the whole
// head (ggmlDeltaStep), on a state of len(v) rows of len(k) values: the states and outputs
// bit for bit.
func checkDelta(t *testing.T, m, k, q, v []float32, decay, beta, scale float32) {
	t.Helper()
	what := fmt.Sprintf("%d rows of %d", len(v), len(k))
	got, want, ggml := slices.Clone(m), slices.Clone(m), slices.Clone(m)
	gotOut, wantOut, ggmlOut := make([]float32, len(v)), make([]float32, len(v)), make([]float32, len(v))
	deltaStep(got, k, q, v, gotOut, decay, beta, scale)
	deltaStepGo(want, k, q, v, wantOut, decay, beta, scale)
	ggmlDeltaStep(ggml, k, q, v, ggmlOut, decay, beta, scale)
	sameFloats(t, "deltaStep's state, "+what, got, want)
	sameFloats(t, "deltaStep's output, "+what, gotOut, wantOut)
	sameFloats(t, "deltaStepGo's state against ggml's order, "+what, want, ggml)
	sameFloats(t, "deltaStepGo's output against ggml's order, "+what, wantOut, ggmlOut)
}

// ggmlDeltaStep is ggml_compute_forward_gated_delta_net's token: the whole head decayed, every
// row's delta, the whole head's rank-1 update, then every row's output.
func ggmlDeltaStep(m, k, q, v, out []float32, decay, beta, scale float32) {
	n := len(k)
	scaleF32Go(m, decay)
	delta := make([]float32, len(v))
	dotsF32Go(delta, k, m, n, 1)
	for r := range delta {
		delta[r] = (v[r] - delta[r]) * beta
	}
	for r, d := range delta {
		madF32Go(m[r*n:(r+1)*n], k, d)
	}
	dotsF32Go(out, q, m, n, scale)
}

func TestDeltaKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	for _, n := range []int{1, 7, 8, 16, 33, 64, 128, 192, 256} {
		for _, special := range []bool{false, true} {
			checkDelta(t, randFloats(r, n*n, 1, special), randFloats(r, n, 1, special), randFloats(r, n, 1, special),
				randFloats(r, n, 1, special), 0.93, 0.4, 0.088)
		}
	}
	// A product that float32 cannot hold, whose fused sum with the state keeps what an
	// unfused one loses: row 0's dot with k is -(1+2^-22)(1+2^-23), rounded to
	// -(1+3*2^-23), so its delta is exactly 1+2^-23, and its value becomes
	// (1+2^-23)^2 - (1+2^-22) = 2^-46, which its dot with q passes to the output. Row 1's
	// dot with k is 0.5, its delta 2^-23, and its value 1 moves to 1 + 2^-24, halfway
	// between two float32 values, which rounds to the even one, 1.
	const n = 64
	m, k, q, v := make([]float32, 2*n), make([]float32, n), make([]float32, n), []float32{-0x1p-22, 0x1.000004p-1}
	m[0], k[0], q[0] = -0x1.000004p0, 0x1.000002p0, 1
	m[n+3], k[3] = 1, 0.5
	out := make([]float32, 2)
	got := slices.Clone(m)
	deltaStep(got, k, q, v, out, 1, 1, 1)
	if got[0] != 0x1p-46 || out[0] != 0x1p-46 {
		t.Errorf("deltaStep's fused multiply-add gave %g and output %g, want 2^-46", got[0], out[0])
	}
	if got[n+3] != 1 {
		t.Errorf("deltaStep rounded 1 + 2^-24 to %g, want 1", got[n+3])
	}
	checkDelta(t, m, k, q, v, 1, 1, 1)
}

func FuzzDeltaKernels(f *testing.F) {
	f.Add(seedBytes(71, 64*3+64*2+3+3, 1), uint8(0))
	f.Add(seedBytes(72, 16*3+16*2+3+3, 3), uint8(4))
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		x := floatsOf(data)
		n := []int{64, 128, 192, 8, 33}[int(size)%5]
		rows := (len(x) - 2*n - 3) / (n + 1)
		if rows < 1 {
			return
		}
		m, k, q, v := x[:rows*n], x[rows*n:rows*n+n], x[rows*n+n:rows*n+2*n], x[rows*n+2*n:rows*n+2*n+rows]
		e := x[len(x)-3:]
		checkDelta(t, m, k, q, v, e[0], e[1], e[2])
	})
}

// checkConvolve compares convolveOut (the assembly where the CPU has it) with convolveOutGo
// bit for bit on a layer of kh key heads, vh value heads of hd values and K taps.
func checkConvolve(t *testing.T, kh, vh, hd, K, T int, taps, state, qkv []float32) {
	t.Helper()
	l := &device.DeltaNetLayer{Conv: taps, KHeads: kh, VHeads: vh, HeadDim: hd, ConvK: K}
	ch := l.Channels()
	got, want := make([]float32, T*ch), make([]float32, T*ch)
	convolveOut(l, state, qkv, got, T)
	convolveOutGo(l, state, qkv, want, T)
	sameFloats(t, fmt.Sprintf("the convolution of %d channels, %d taps, %d tokens", ch, K, T), got, want)
}

// TestConvolveMatchesReference: DeltaNet's convolution, on the assembly for a decoded token
// and from convMinTokens tokens, gives the Go loop's bits, also where only a fused multiply-add keeps a product and
// where every product is -0 (a sum from +0 stays +0; one that started from the first product
// would be -0).
func TestConvolveMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	for _, c := range []struct{ kh, vh, hd, K int }{{1, 2, 8, 4}, {2, 4, 8, 4}, {1, 1, 4, 4}, {1, 2, 8, 3}, {2, 2, 16, 4}} {
		ch := (2*c.kh + c.vh) * c.hd
		for _, T := range []int{1, 3, 7, 8, 9, 40} {
			for _, special := range []bool{false, true} {
				checkConvolve(t, c.kh, c.vh, c.hd, c.K, T, randFloats(r, ch*c.K, 1, special),
					randFloats(r, ch*(c.K-1), 1, special), randFloats(r, ch*T, 1, special))
			}
		}
	}
	// A decoded token (its own kernel) and a pass of the tap-major one.
	for _, T := range []int{1, 9} {
		ch := 32
		taps, state, qkv := make([]float32, ch*4), make([]float32, ch*3), make([]float32, ch*T)
		for i := range state {
			state[i] = -1
		}
		for i := range qkv {
			qkv[i] = -1
		}
		// Channel 0's first output: (1+2^-22) - (1+2^-23)^2 = -2^-46, 0 unless fused.
		taps[0*4+2], taps[0*4+3] = 1, -0x1.000002p0
		state[0*3+2], qkv[0] = 0x1.000004p0, 0x1.000002p0
		checkConvolve(t, 1, 2, 8, 4, T, taps, state, qkv)
		out := make([]float32, T*ch)
		convolveOut(&device.DeltaNetLayer{Conv: taps, KHeads: 1, VHeads: 2, HeadDim: 8, ConvK: 4}, state, qkv, out, T)
		if out[0] != -0x1p-46 {
			t.Errorf("%d tokens: the fused sum: %g, want -2^-46", T, out[0])
		}
		// Channel 1's taps are 0 and its inputs -1.
		if out[1] != 0 || math.Signbit(float64(out[1])) {
			t.Errorf("%d tokens: a sum of -0 products: %g (sign %v), want +0", T, out[1], math.Signbit(float64(out[1])))
		}
	}
}

func FuzzConvolve(f *testing.F) {
	f.Add(seedBytes(91, 4*32+3*32+9*32, 1), uint8(9))
	f.Add(seedBytes(92, 4*16+3*16+20*16, 3), uint8(20))
	f.Fuzz(func(t *testing.T, data []byte, steps uint8) {
		x := floatsOf(data)
		T := 1 + int(steps)%24
		hd := 8 // one key head and two value heads of 8: 32 channels
		ch := 4 * hd
		if len(x) < ch*(4+3+T) {
			return
		}
		checkConvolve(t, 1, 2, hd, 4, T, x[:4*ch], x[4*ch:7*ch], x[7*ch:(7+T)*ch])
	})
}
