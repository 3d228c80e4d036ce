package models

import "math"

// RoPE follows ggml's CPU rope op to the bit (ggml_rope_cache_init, rope_yarn and
// rotate_pairs as llama.cpp's x86 build compiles them, with fused multiply-adds).

// cache fills cs with (cos, sin) pairs for every rotated pair at position pos, computed the
// way ggml does (float32 theta advanced by repeated multiplication), so long positions round
// the same as llama.cpp.
func (r *Rope) cache(pos int, cs []float32) {
	thetaScale := float32(math.Pow(float64(r.FreqBase), float64(-2/float32(r.Dims))))
	var lo, hi float32
	if r.ExtFactor != 0 {
		lo, hi = r.yarnCorrDims()
	}
	theta := float32(pos)
	for i0 := 0; i0 < r.Dims; i0 += 2 {
		t := theta
		if r.FreqFactors != nil {
			t = theta / r.FreqFactors[i0/2]
		}
		c, s := r.yarn(t, lo, hi, i0)
		cs[i0], cs[i0+1] = c, s
		theta *= thetaScale
	}
}

func (r *Rope) yarn(thetaExtrap, lo, hi float32, i0 int) (float32, float32) {
	thetaInterp := r.FreqScale * thetaExtrap
	theta := thetaInterp
	mscale := r.AttnFactor
	if r.ExtFactor != 0 {
		y := (float32(i0/2) - lo) / max(0.001, hi-lo)
		ramp := (1 - min(1, max(0, y))) * r.ExtFactor
		theta = fma32(thetaInterp, 1-ramp, float32(thetaExtrap*ramp))
		mscale *= fma32(logf(1/r.FreqScale), 0.1, 1)
	}
	sin, cos := sincosf(theta)
	return cos * mscale, sin * mscale
}

// logf is the C library's logf, correctly rounded in practice.
func logf(x float32) float32 { return float32(math.Log(float64(x))) }

func (r *Rope) yarnCorrDims() (float32, float32) {
	dim := func(beta float32) float32 {
		return float32(r.Dims) * float32(math.Log(float64(float32(r.OrigCtx)/(beta*2*math.Pi)))) / (2 * float32(math.Log(float64(r.FreqBase))))
	}
	lo := float32(math.Floor(float64(dim(r.BetaFast))))
	hi := float32(math.Ceil(float64(dim(r.BetaSlow))))
	return max(0, lo), min(float32(r.Dims-1), hi)
}

// apply rotates the first Dims values of one head vector x using a cache from r.cache.
func (r *Rope) apply(x, cs []float32) {
	if r.NeoX {
		half := r.Dims / 2
		for i := 0; i < half; i++ {
			c, s := cs[2*i], cs[2*i+1]
			x0, x1 := x[i], x[i+half]
			x[i] = fma32(x0, c, -float32(x1*s))
			x[i+half] = fma32(x0, s, float32(x1*c))
		}
		return
	}
	for i := 0; i < r.Dims; i += 2 {
		c, s := cs[i], cs[i+1]
		x0, x1 := x[i], x[i+1]
		x[i] = fma32(x0, c, -float32(x1*s))
		x[i+1] = fma32(x0, s, float32(x1*c))
	}
}
