package models

import "math"

// sincosf and expf as glibc 2.36 computes them on x86-64 with FMA (the __sincosf_fma and
// __expf_fma variants its ifuncs pick on any AVX2 machine), which llama.cpp's rope and scalar
// SiLU/softmax call. They are not correctly rounded: near a rounding boundary they can differ
// by one unit in the last place from float32(math.Sin(x)) and float32(math.Exp(x)).
//
// Matching their rounding needs their polynomials: the coefficients and tables below are those
// of Arm's optimized-routines (MIT OR Apache-2.0 WITH LLVM-exception), which glibc ships as
// sysdeps/ieee754/flt-32 and whose copyright stays with Arm Limited.

var (
	sincosfTable = [2][14]float64{}
	invPio4      = [24]uint32{
		0xa2, 0xa2f9, 0xa2f983, 0xa2f9836e, 0xf9836e4e, 0x836e4e44, 0x6e4e4415, 0x4e441529,
		0x441529fc, 0x1529fc27, 0x29fc2757, 0xfc2757d1, 0x2757d1f5, 0x57d1f534, 0xd1f534dd, 0xf534ddc0,
		0x34ddc0db, 0xddc0db62, 0xc0db6295, 0xdb629599, 0x6295993c, 0x95993c43, 0x993c4390, 0x3c439041,
	}
	exp2fTab = [32]uint64{
		0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
		0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
		0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
		0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
		0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
		0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
		0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
		0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
	}
)

// Layout of one __sincosf_table entry (x86-64 variant): sign[4], hpi_inv (2/pi * 2^24), hpi,
// c0, c1, then the pairs {s1, c2}, {s2, c3}, {s3, c4}.
const (
	scHpiInv = 4 + iota
	scHpi
	scC0
	scC1
	scS1
	scC2
	scS2
	scC3
	scS3
	scC4
)

func init() {
	bits := [2][14]uint64{
		{0x3ff0000000000000, 0xbff0000000000000, 0xbff0000000000000, 0x3ff0000000000000,
			0x41645f306dc9c883, 0x3ff921fb54442d18, 0x3ff0000000000000, 0xbfdffffffd0c621c,
			0xbfc555545995a603, 0x3fa55553e1068f19, 0x3f81107605230bc4, 0xbf56c087e89a359d,
			0xbf2994eb3774cf24, 0x3ef99343027bf8c3},
		{0x3ff0000000000000, 0xbff0000000000000, 0xbff0000000000000, 0x3ff0000000000000,
			0x41645f306dc9c883, 0x3ff921fb54442d18, 0xbff0000000000000, 0x3fdffffffd0c621c,
			0xbfc555545995a603, 0xbfa55553e1068f19, 0x3f81107605230bc4, 0x3f56c087e89a359d,
			0xbf2994eb3774cf24, 0xbef99343027bf8c3},
	}
	for i := range bits {
		for j, b := range bits[i] {
			sincosfTable[i][j] = math.Float64frombits(b)
		}
	}
}

func abstop12(x float32) uint32 { return math.Float32bits(x) >> 20 & 0x7ff }

// sincosfPoly is the x86-64 sincosf_poly with the fused multiply-adds of its FMA build; xs is
// the reduced argument times the quadrant's sign and x2 the square of the reduced argument.
func sincosfPoly(xs, x2 float64, p *[14]float64, n int) (sin, cos float32) {
	x3, x4 := x2*xs, x2*x2
	vs1 := math.FMA(x2, p[scS3], p[scS2])
	vc2 := math.FMA(x2, p[scC4], p[scC3])
	x5, x6 := x2*x3, x2*x4
	c1 := math.FMA(x2, p[scC1], p[scC0])
	s := math.FMA(x3, p[scS1], xs)
	c := math.FMA(x4, p[scC2], c1)
	s = math.FMA(vs1, x5, s)
	c = math.FMA(vc2, x6, c)
	if n&1 != 0 {
		return float32(c), float32(s)
	}
	return float32(s), float32(c)
}

// sincosf is glibc's sincosf (FMA variant).
func sincosf(y float32) (float32, float32) {
	x := float64(y)
	switch t := abstop12(y); {
	case t < abstop12(0x1.921fb6p-1): // |y| < pi/4
		if t < abstop12(0x1p-12) {
			return y, 1
		}
		return sincosfPoly(x, x*x, &sincosfTable[0], 0)
	case t < abstop12(120):
		p := &sincosfTable[0]
		r := x * p[scHpiInv]
		n := (int32(r) + 0x800000) >> 24
		x = math.FMA(-float64(n), p[scHpi], x)
		s := p[n&3]
		if n&2 != 0 {
			p = &sincosfTable[1]
		}
		return sincosfPoly(x*s, x*x, p, int(n))
	case t < abstop12(float32(math.Inf(1))):
		xi := math.Float32bits(y)
		sign := int(xi >> 31)
		x, n := reduceLarge(xi)
		p := &sincosfTable[0]
		s := p[(n+sign)&3]
		if (n+sign)&2 != 0 {
			p = &sincosfTable[1]
		}
		return sincosfPoly(x*s, x*x, p, n)
	}
	nan := y - y
	return nan, nan
}

// reduceLarge is glibc's reduce_large for |x| >= 120: the argument modulo pi/2 from a 192-bit
// 4/pi, and the quadrant.
func reduceLarge(xi uint32) (float64, int) {
	arr := invPio4[(xi>>26)&15:]
	shift := (xi >> 23) & 7
	xi = (xi&0xffffff | 0x800000) << shift
	res0 := uint64(xi * arr[0])
	res1 := uint64(xi) * uint64(arr[4])
	res2 := uint64(xi) * uint64(arr[8])
	res0 = res2>>32 | res0<<32
	res0 += res1
	n := (res0 + 1<<61) >> 62
	res0 -= n << 62
	return float64(int64(res0)) * 0x1.921FB54442D18p-62, int(n)
}

// expf is glibc's expf (FMA variant).
func expf(x float32) float32 {
	if abstop12(x) >= abstop12(88) {
		switch {
		case math.Float32bits(x) == math.Float32bits(float32(math.Inf(-1))):
			return 0
		case abstop12(x) >= abstop12(float32(math.Inf(1))):
			return x + x
		case x > 0x1.62e42ep6:
			return float32(math.Inf(1))
		case x < -0x1.9fe368p6:
			return 0
		case x < -0x1.9d1d9ep6:
			return 0x1p-149
		}
	}
	const (
		invLn2N = 0x1.71547652b82fep+5 // 0x40471547652b82fe
		shift   = 0x1.8p+52
	)
	xd := float64(x)
	kd := math.FMA(invLn2N, xd, shift)
	ki := math.Float64bits(kd)
	kd -= shift
	r := math.FMA(invLn2N, xd, -kd)
	t := exp2fTab[ki%32] + ki<<47
	s := math.Float64frombits(t)
	z := math.FMA(r, math.Float64frombits(0x3ebc6af84b912394), math.Float64frombits(0x3f2ebfce50fac4f3))
	r2 := r * r
	y := math.FMA(r, math.Float64frombits(0x3f962e42ff0c52d6), 1)
	y = math.FMA(z, r2, y)
	return float32(y * s)
}
