package models

import (
	"math"
	"math/rand/v2"
	"testing"
)

// glibcVectors are sincosf and expf as glibc 2.36 (x86-64, FMA variants) returns them:
// x, sin(x), cos(x), exp(x) as float32 bits. The first is a case where glibc's result is not
// the correctly rounded one (cos(x) lies 0.50002 ulp from it).
var glibcVectors = [][4]uint32{
	{0x3e5247f1, 0x3e50ce65, 0x3f7a9f09, 0x3f9d2dba},
	{0x3f836cf9, 0x3f5b0a71, 0x3f0480da, 0x4032b05a},
	{0x3e605cf4, 0x3e5e927f, 0x3f79e132, 0x3f9f5ae6},
	{0x3e9598a9, 0x3e937a17, 0x3f752676, 0x3fab6fa4},
	{0x42f00000, 0x3f14a2ef, 0x3f506e2a, 0x7f800000},
	{0x44fa0000, 0x3f6e1712, 0xbebc23a8, 0x7f800000},
	{0xc1200000, 0x3f0b44f8, 0xbf56cd64, 0x383e6bce},
	{0x3c000000, 0x3bffff55, 0x3f7ffe00, 0x3f810101},
	{0x39800000, 0x39800000, 0x3f800000, 0x3f800800},
	{0xc2c80000, 0x3f01a12e, 0x3f5cc0ee, 0x0000001b},
	{0x42b00000, 0x3d10fdd0, 0x3f7fd6ed, 0x7ef882b7},
	{0x3f000000, 0x3ef57744, 0x3f60a940, 0x3fd3094c},
	{0xbf9d70a4, 0xbf7146f2, 0x3eab2135, 0x3e95a75f},
	{0x41c80000, 0xbe078738, 0x3f7dbf78, 0x51861e9d},
}

func TestGlibcVectors(t *testing.T) {
	for _, v := range glibcVectors {
		x := math.Float32frombits(v[0])
		s, c := sincosf(x)
		e := expf(x)
		if math.Float32bits(s) != v[1] || math.Float32bits(c) != v[2] || math.Float32bits(e) != v[3] {
			t.Errorf("x=%g (%08x): sincosf %08x %08x, expf %08x; glibc %08x %08x, %08x",
				x, v[0], math.Float32bits(s), math.Float32bits(c), math.Float32bits(e), v[1], v[2], v[3])
		}
	}
	// The reason for emulating glibc: the correctly rounded cosine differs here.
	x := math.Float32frombits(glibcVectors[0][0])
	if math.Float32bits(float32(math.Cos(float64(x)))) == glibcVectors[0][2] {
		t.Errorf("expected the correctly rounded cos(%g) to differ from glibc's", x)
	}
}

func TestLibmAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	ulps := func(got float32, want float64) float64 {
		u := math.Abs(float64(math.Nextafter32(float32(want), float32(math.Inf(1))) - float32(want)))
		return math.Abs(float64(got)-want) / u
	}
	for i := 0; i < 100000; i++ {
		x := float32(r.Float64()*400 - 200)
		s, c := sincosf(x)
		if ulps(s, math.Sin(float64(x))) > 1 || ulps(c, math.Cos(float64(x))) > 1 {
			t.Fatalf("sincosf(%g) = %g, %g", x, s, c)
		}
		y := float32(r.Float64()*170 - 85)
		if u := ulps(expf(y), math.Exp(float64(y))); u > 1 {
			t.Fatalf("expf(%g) = %g, %g ulp off", y, expf(y), u)
		}
		// ggml: "the maximum error is 1.45358 plus 0.5 ulps"
		if u := ulps(expAVX512(y), math.Exp(float64(y))); u > 2.5 {
			t.Fatalf("expAVX512(%g) = %g, %g ulp off", y, expAVX512(y), u)
		}
	}
	if expAVX512(-110) != 0 || !math.IsInf(float64(expAVX512(100)), 1) || expf(-110) != 0 {
		t.Errorf("exp overflow/underflow: %g %g %g", expAVX512(-110), expAVX512(100), expf(-110))
	}
}

func TestSoftmaxAndSwiGLU(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 34))
	for _, n := range []int{1, 8, 16, 40, 256} {
		for _, padded := range []bool{false, true} {
			x := make([]float32, n)
			ref := make([]float64, n)
			for i := range x {
				x[i] = float32(r.NormFloat64() * 3)
			}
			var mx, sum float64 = math.Inf(-1), 0
			for _, v := range x {
				mx = math.Max(mx, float64(v))
			}
			for i, v := range x {
				ref[i] = math.Exp(float64(v) - mx)
				sum += ref[i]
			}
			softmax(x, padded)
			for i := range x {
				if d := math.Abs(float64(x[i]) - ref[i]/sum); d > 1e-6 {
					t.Errorf("softmax n=%d padded=%v: p[%d] = %g, want %g", n, padded, i, x[i], ref[i]/sum)
				}
			}
		}
		g, u, y := make([]float32, n), make([]float32, n), make([]float32, n)
		for i := range g {
			g[i], u[i] = float32(r.NormFloat64()*4), float32(r.NormFloat64())
		}
		SwiGLU(y, g, u)
		for i := range y {
			want := float64(g[i]) / (1 + math.Exp(-float64(g[i]))) * float64(u[i])
			if math.Abs(float64(y[i])-want) > 1e-6*math.Abs(want)+1e-30 {
				t.Errorf("SwiGLU n=%d: y[%d] = %g, want %g", n, i, y[i], want)
			}
		}
	}
}

func TestRopeRotation(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 36))
	for _, neox := range []bool{false, true} {
		ro := &Rope{Dims: 64, NeoX: neox, FreqBase: 10000, FreqScale: 1, AttnFactor: 1, BetaFast: 32, BetaSlow: 1, OrigCtx: 4096}
		cs := make([]float32, ro.Dims)
		for _, pos := range []int{0, 1, 7, 130} {
			ropeCache(ro.Params(), pos, cs)
			x := make([]float32, ro.Dims)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			y := append([]float32(nil), x...)
			ropeApply(ro.Params(), y, cs)
			for i := 0; i < ro.Dims/2; i++ {
				a, b := 2*i, 2*i+1
				if neox {
					a, b = i, i+ro.Dims/2
				}
				theta := float64(pos) * math.Pow(10000, -2*float64(i)/float64(ro.Dims))
				c, s := math.Cos(theta), math.Sin(theta)
				w0 := float64(x[a])*c - float64(x[b])*s
				w1 := float64(x[a])*s + float64(x[b])*c
				if math.Abs(float64(y[a])-w0) > 1e-4 || math.Abs(float64(y[b])-w1) > 1e-4 {
					t.Errorf("neox=%v pos %d pair %d: (%g, %g), want (%g, %g)", neox, pos, i, y[a], y[b], w0, w1)
				}
			}
		}
	}
}
