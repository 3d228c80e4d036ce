package quant

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

// weightTypes are the types VecDot accepts; quantTypes also include the activation-only ones.
var (
	weightTypes = []Type{F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4}
	quantTypes  = append(append([]Type(nil), weightTypes...), Q8_1, Q8_K)
)

func TestTypeTable(t *testing.T) {
	tests := []struct {
		t          Type
		name       string
		block, sz  int
		dot        Type
		weight     bool
		rowOf, row int // RowBytes(rowOf) == row
	}{
		{F32, "F32", 1, 4, F32, true, 7, 28},
		{F16, "F16", 1, 2, F16, true, 7, 14},
		{BF16, "BF16", 1, 2, BF16, true, 3, 6},
		{Q4_0, "Q4_0", 32, 18, Q8_0, true, 64, 36},
		{Q4_1, "Q4_1", 32, 20, Q8_1, true, 64, 40},
		{Q5_0, "Q5_0", 32, 22, Q8_0, true, 1408, 968},
		{Q5_1, "Q5_1", 32, 24, Q8_1, true, 1408, 1056},
		{Q8_0, "Q8_0", 32, 34, Q8_0, true, 128, 136},
		{Q8_1, "Q8_1", 32, 36, Q8_1, false, 32, 36},
		{IQ4_NL, "IQ4_NL", 32, 18, Q8_0, true, 128, 72},
		{MXFP4, "MXFP4", 32, 17, Q8_0, true, 2880, 1530},
		{Q2_K, "Q2_K", 256, 84, Q8_K, true, 4096, 1344},
		{Q3_K, "Q3_K", 256, 110, Q8_K, true, 4096, 1760},
		{Q4_K, "Q4_K", 256, 144, Q8_K, true, 4096, 2304},
		{Q5_K, "Q5_K", 256, 176, Q8_K, true, 2048, 1408},
		{Q6_K, "Q6_K", 256, 210, Q8_K, true, 2048, 1680},
		{Q8_K, "Q8_K", 256, 292, Q8_K, false, 512, 584},
	}
	for _, tc := range tests {
		if tc.t.String() != tc.name || tc.t.BlockSize() != tc.block || tc.t.BlockBytes() != tc.sz ||
			tc.t.DotType() != tc.dot || tc.t.Weight() != tc.weight || !tc.t.Known() {
			t.Errorf("%v: got name %q block %d bytes %d dot %v weight %v", tc.t, tc.t.String(), tc.t.BlockSize(),
				tc.t.BlockBytes(), tc.t.DotType(), tc.t.Weight())
		}
		if n, err := tc.t.RowBytes(tc.rowOf); err != nil || n != tc.row {
			t.Errorf("%v.RowBytes(%d) = %d, %v; want %d", tc.t, tc.rowOf, n, err, tc.row)
		}
		if tc.block > 1 {
			if _, err := tc.t.RowBytes(tc.block + 1); err == nil {
				t.Errorf("%v.RowBytes(%d) accepted a partial block", tc.t, tc.block+1)
			}
		}
		if _, err := tc.t.RowBytes(-tc.block); err == nil {
			t.Errorf("%v.RowBytes(negative) accepted", tc.t)
		}
	}
	for _, u := range []Type{4, 5, 16, 19, 21, 29, 31, 38, 40, 1000} {
		if u.Known() || u.Weight() {
			t.Errorf("%v should be unknown", u)
		}
		if _, err := u.RowBytes(32); err == nil {
			t.Errorf("%v.RowBytes accepted an unknown type", u)
		}
	}
}

func TestFP16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := FP16ToFP32(uint16(h))
		exp, mant := h>>10&0x1f, h&0x3ff
		var want float64
		switch {
		case exp == 0x1f && mant != 0:
			if f == f {
				t.Fatalf("half %#04x should be NaN, got %g", h, f)
			}
			if back := FP32ToFP16(f); back != uint16(h)|0x200 {
				t.Errorf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		case exp == 0x1f:
			want = math.Inf(1)
		case exp == 0:
			want = math.Ldexp(float64(mant), -24)
		default:
			want = math.Ldexp(float64(mant|0x400), exp-25)
		}
		if h&0x8000 != 0 {
			want = -want
		}
		if float64(f) != want || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("FP16ToFP32(%#04x) = %g, want %g", h, f, want)
		}
		if back := FP32ToFP16(f); back != uint16(h) {
			t.Fatalf("FP32ToFP16(FP16ToFP32(%#04x)) = %#04x", h, back)
		}
	}

	// Against a brute-force nearest search over all positive finite halves.
	var halves []float64
	for h := 0; h <= 0x7bff; h++ {
		halves = append(halves, float64(FP16ToFP32(uint16(h))))
	}
	nearest := func(v float64) uint16 {
		a := math.Abs(v)
		var h uint16
		if a >= 65520 { // half-way between the largest half and the next power of two
			h = 0x7c00
		} else {
			i := sort.SearchFloat64s(halves, a) // halves[i] >= a
			switch {
			case i == 0:
				h = 0
			case halves[i] == a:
				h = uint16(i)
			default:
				lo, hi := halves[i-1], halves[i]
				switch {
				case a-lo < hi-a:
					h = uint16(i - 1)
				case a-lo > hi-a:
					h = uint16(i)
				case i%2 == 0:
					h = uint16(i)
				default:
					h = uint16(i - 1)
				}
			}
		}
		if math.Signbit(v) {
			h |= 0x8000
		}
		return h
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		var f float32
		switch i % 3 {
		case 0:
			f = math.Float32frombits(r.Uint32())
		case 1:
			f = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(50)-30))
		default: // exact ties between neighbouring halves
			h := uint16(r.IntN(0x7bff))
			f = float32((float64(FP16ToFP32(h)) + float64(FP16ToFP32(h+1))) / 2)
		}
		if f != f {
			continue
		}
		if got, want := FP32ToFP16(f), nearest(float64(f)); got != want {
			t.Fatalf("FP32ToFP16(%g / %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
}

func TestBF16(t *testing.T) {
	tests := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80},             // 1
		{0x3f808000, 0x3f80},             // tie, even stays
		{0x3f818000, 0x3f82},             // tie, odd rounds up
		{0x3f808001, 0x3f81},             // above half
		{0x7f7fffff, 0x7f80},             // max float rounds to inf
		{0x00000001, 0x0000},             // subnormal kept (rounds to 0 here)
		{0x00010000, 0x0001},             // subnormal kept
		{0x7f800001, 0x7fc0},             // signalling NaN made quiet
		{0xffc00000, 0xffc0},             // quiet NaN kept
		{0x80000000, 0x8000},             // -0
		{math.Float32bits(-2.5), 0xc020}, // exact
	}
	for _, tc := range tests {
		if got := FP32ToBF16(math.Float32frombits(tc.in)); got != tc.want {
			t.Errorf("FP32ToBF16(%#08x) = %#04x, want %#04x", tc.in, got, tc.want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		f := BF16ToFP32(uint16(h))
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToFP32(%#04x) bits %#08x", h, math.Float32bits(f))
		}
		if f == f && FP32ToBF16(f) != uint16(h) {
			t.Fatalf("BF16 %#04x does not round-trip", h)
		}
	}
}

// randomRow returns n roughly normal values with a few larger ones, like a weight row.
func randomRow(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
		if r.IntN(64) == 0 {
			x[i] *= 4
		}
	}
	return x
}

// TestRoundTrip quantizes random rows and checks the relative RMS error of decoding them.
func TestRoundTrip(t *testing.T) {
	// Bounds are about 1.3x what the quantizers achieve on this data.
	limit := map[Type]float64{
		F32: 0, F16: 3e-4, BF16: 2.5e-3,
		Q8_0: 0.009, Q8_1: 0.009, Q8_K: 0.018,
		Q6_K: 0.03, Q5_0: 0.075, Q5_1: 0.06, Q5_K: 0.06,
		Q4_0: 0.14, Q4_1: 0.11, IQ4_NL: 0.12, Q4_K: 0.12, MXFP4: 0.17,
		Q3_K: 0.23, Q2_K: 0.46,
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, typ := range quantTypes {
		n := 4096
		var se, ss float64
		for rep := 0; rep < 4; rep++ {
			x := randomRow(r, n, math.Ldexp(1, r.IntN(12)-8))
			nb, _ := typ.RowBytes(n)
			q := make([]byte, nb)
			QuantizeRow(typ, x, q)
			back := make([]float32, n)
			DequantizeRow(typ, q, back)
			for i := range x {
				d := float64(x[i]) - float64(back[i])
				se += d * d
				ss += float64(x[i]) * float64(x[i])
			}
		}
		rel := math.Sqrt(se / ss)
		t.Logf("%-6v relative rms error %.5f", typ, rel)
		if rel > limit[typ] {
			t.Errorf("%v: relative rms error %.5f above %.5f", typ, rel, limit[typ])
		}
	}
}

// TestRoundTripEdges covers constant, zero, one-hot and single-sign blocks.
func TestRoundTripEdges(t *testing.T) {
	n := 512
	rows := map[string][]float32{
		"zero":     make([]float32, n),
		"constant": make([]float32, n),
		"onehot":   make([]float32, n),
		"positive": make([]float32, n),
		"negative": make([]float32, n),
	}
	for i := 0; i < n; i++ {
		rows["constant"][i] = 0.75
		rows["positive"][i] = 1 + float32(i%17)/16
		rows["negative"][i] = -1 - float32(i%13)/12
	}
	rows["onehot"][300] = -2
	for _, typ := range quantTypes {
		nb, _ := typ.RowBytes(n)
		for name, x := range rows {
			q := make([]byte, nb)
			QuantizeRow(typ, x, q)
			back := make([]float32, n)
			DequantizeRow(typ, q, back)
			var worst, scale float64
			for i := range x {
				worst = math.Max(worst, math.Abs(float64(x[i])-float64(back[i])))
				scale = math.Max(scale, math.Abs(float64(x[i])))
			}
			// The coarsest grid (Q2_K: 4 levels) can be off by half a step of the range.
			if worst > 0.35*scale+1e-6 {
				t.Errorf("%v %s: max error %g for values up to %g", typ, name, worst, scale)
			}
			if name == "zero" && worst != 0 {
				t.Errorf("%v: zero row decodes with error %g", typ, worst)
			}
		}
	}
}

// TestVecDotMatchesDequantized checks each kernel against the float64 dot product of the very
// values it multiplies: only summation order separates them.
func TestVecDotMatchesDequantized(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, typ := range weightTypes {
		dt := typ.DotType()
		for _, n := range []int{256, 1024, 4096} {
			w := randomRow(r, n, 0.05)
			x := randomRow(r, n, 2)
			wb, _ := typ.RowBytes(n)
			xb, _ := dt.RowBytes(n)
			wq, xq := make([]byte, wb), make([]byte, xb)
			QuantizeRow(typ, w, wq)
			QuantizeRow(dt, x, xq)
			got := VecDot(typ, n, wq, xq)

			wf, xf := make([]float32, n), make([]float32, n)
			DequantizeRow(typ, wq, wf)
			DequantizeRow(dt, xq, xf)
			var want, mag, exact float64
			for i := range wf {
				want += float64(wf[i]) * float64(xf[i])
				mag += math.Abs(float64(wf[i]) * float64(xf[i]))
				exact += float64(w[i]) * float64(x[i])
			}
			if dt == Q8_1 {
				want += q8_1SumCorrection(typ, n, wq, xq)
			}
			if d := math.Abs(float64(got) - want); d > 1e-5*mag {
				t.Errorf("%v n=%d: VecDot %g, dequantized dot %g (diff %g, magnitude %g)", typ, n, got, want, d, mag)
			}
			// And it should still be a dot product of the original rows.
			if d := math.Abs(float64(got) - exact); d > 0.25*mag {
				t.Errorf("%v n=%d: VecDot %g far from float dot %g", typ, n, got, exact)
			}
		}
	}
}

// q8_1SumCorrection is what a Q4_1/Q5_1 dot gains over the dequantized rows' dot: ggml takes
// the min term as m * s, with s = d*sum(q) stored as fp16, not m * d * sum(q).
func q8_1SumCorrection(typ Type, n int, w, x []byte) float64 {
	var c float64
	wbs := typ.BlockBytes()
	for i := 0; i < n/32; i++ {
		m := float64(f16le(w[i*wbs+2:]))
		xb := x[i*36 : i*36+36]
		var sum int
		for _, q := range xb[4:] {
			sum += int(int8(q))
		}
		c += m * (float64(f16le(xb[2:])) - float64(f16le(xb[0:]))*float64(sum))
	}
	return c
}

func TestPreconditionsPanic(t *testing.T) {
	mustPanic := func(name, want string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil {
				t.Errorf("%s: no panic", name)
				return
			}
			if s, _ := r.(string); !strings.Contains(s, want) {
				t.Errorf("%s: panic %v, want it to mention %q", name, r, want)
			}
		}()
		f()
	}
	mustPanic("short src", "needs 36 bytes", func() { DequantizeRow(Q4_0, make([]byte, 35), make([]float32, 64)) })
	mustPanic("partial block", "whole number", func() { DequantizeRow(Q4_K, make([]byte, 144), make([]float32, 255)) })
	mustPanic("unknown type", "no dequantizer", func() { DequantizeRow(Type(4), nil, nil) })
	mustPanic("quantize long dst", "needs 34 bytes", func() { QuantizeRow(Q8_0, make([]float32, 32), make([]byte, 35)) })
	mustPanic("vecdot activation-only", "no dot product", func() { VecDot(Q8_K, 256, make([]byte, 292), make([]byte, 292)) })
	mustPanic("vecdot wrong x", "Q8_K row of 256", func() { VecDot(Q4_K, 256, make([]byte, 144), make([]byte, 290)) })
	mustPanic("vecdot wrong w", "Q4_0 row of 32", func() { VecDot(Q4_0, 32, make([]byte, 17), make([]byte, 34)) })
	mustPanic("mxfp4 partial block", "MXFP4 row of 33 elements is not a whole number", func() {
		DequantizeRow(MXFP4, make([]byte, 17), make([]float32, 33))
	})
	mustPanic("mxfp4 short src", "MXFP4 row of 64 elements needs 34 bytes, got 33", func() {
		DequantizeRow(MXFP4, make([]byte, 33), make([]float32, 64))
	})
	mustPanic("mxfp4 quantize long dst", "needs 17 bytes, got 18", func() { QuantizeRow(MXFP4, make([]float32, 32), make([]byte, 18)) })
	mustPanic("mxfp4 vecdot wrong w", "MXFP4 row of 64 elements needs 34 bytes, got 36", func() {
		VecDot(MXFP4, 64, make([]byte, 36), make([]byte, 68))
	})
	mustPanic("mxfp4 vecdot wrong x", "Q8_0 row of 64 elements needs 68 bytes, got 66", func() {
		VecDot(MXFP4, 64, make([]byte, 34), make([]byte, 66))
	})
	mustPanic("mxfp4 vecdot partial block", "MXFP4 row of 48 elements is not a whole number", func() {
		VecDot(MXFP4, 48, make([]byte, 17), make([]byte, 34))
	})
}

// TestMXFP4Sizes: the sizes a loader checks before any row reaches the kernels come back as
// errors that name the type and the count.
func TestMXFP4Sizes(t *testing.T) {
	for _, n := range []int{1, 16, 31, 33, 2881, -32} {
		_, err := MXFP4.RowBytes(n)
		if err == nil || !strings.Contains(err.Error(), "MXFP4 row of") {
			t.Errorf("MXFP4.RowBytes(%d) = %v, want an error naming MXFP4", n, err)
		}
	}
	for n, want := range map[int]int{0: 0, 32: 17, 2880: 1530} {
		if got, err := MXFP4.RowBytes(n); err != nil || got != want {
			t.Errorf("MXFP4.RowBytes(%d) = %d, %v; want %d", n, got, err, want)
		}
	}
}

// TestMXFP4Codebook decodes a block by hand: the E2M1 values 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
// negatives (both zeros are +0), times 2^(e-127), for e around 127 and at the ends of the
// E8M0 range, where the scale is subnormal or the products overflow.
func TestMXFP4Codebook(t *testing.T) {
	e2m1 := [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}
	var b [17]byte
	for j := 0; j < 16; j++ {
		b[1+j] = byte(j) | byte(15-j)<<4
	}
	for _, e := range []int{0, 1, 2, 100, 126, 127, 128, 200, 254, 255} {
		b[0] = byte(e)
		var y [32]float32
		DequantizeRow(MXFP4, b[:], y[:])
		for j := 0; j < 32; j++ {
			k := j
			if j >= 16 {
				k = 15 - (j - 16)
			}
			want := float32(e2m1[k] * math.Ldexp(1, e-127))
			if math.Float32bits(y[j]) != math.Float32bits(want) {
				t.Errorf("e=%d element %d: %g, want %g", e, j, y[j], want)
			}
		}
	}
}

func TestNonFiniteInputsDoNotPanic(t *testing.T) {
	n := 512
	x := randomRow(rand.New(rand.NewPCG(7, 8)), n, 1)
	x[3] = float32(math.NaN())
	x[40] = float32(math.Inf(1))
	x[300] = float32(math.Inf(-1))
	x[301] = 1e-42 // float32 subnormal
	x[302] = math.MaxFloat32
	for _, typ := range quantTypes {
		nb, _ := typ.RowBytes(n)
		q := make([]byte, nb)
		QuantizeRow(typ, x, q)
		DequantizeRow(typ, q, make([]float32, n))
	}
}

func TestZeroAllocs(t *testing.T) {
	n := 1024
	r := rand.New(rand.NewPCG(9, 10))
	x := randomRow(r, n, 1)
	for _, typ := range weightTypes {
		wb, _ := typ.RowBytes(n)
		xb, _ := typ.DotType().RowBytes(n)
		wq, xq, out := make([]byte, wb), make([]byte, xb), make([]float32, n)
		allocs := testing.AllocsPerRun(10, func() {
			QuantizeRow(typ, x, wq)
			QuantizeRow(typ.DotType(), x, xq)
			DequantizeRow(typ, wq, out)
			VecDot(typ, n, wq, xq)
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocations per row", typ, allocs)
		}
	}
}
