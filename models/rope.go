package models

import (
	"math"

	"github.com/commit-run/commit-run/device"
)

// RoPE follows ggml's CPU rope op to the bit (ggml_rope_cache_init, rope_yarn and
// rotate_pairs as llama.cpp's x86 build compiles them, with fused multiply-adds).

// Params returns the rotation's parameters as the kernels take them, computed as ggml does.
func (r *Rope) Params() *device.RoPE {
	p := &device.RoPE{
		Dims:        r.Dims,
		NeoX:        r.NeoX,
		ThetaScale:  float32(math.Pow(float64(r.FreqBase), float64(-2/float32(r.Dims)))),
		FreqScale:   r.FreqScale,
		ExtFactor:   r.ExtFactor,
		MScale:      r.AttnFactor,
		FreqFactors: r.FreqFactors,
	}
	if r.ExtFactor != 0 {
		p.CorrLo, p.CorrHi = r.yarnCorrDims()
		p.MScale *= fma32(logf(1/r.FreqScale), 0.1, 1)
	}
	return p
}

// ropeCache fills cs with (cos, sin) pairs for every rotated pair at position pos, computed
// the way ggml does (float32 theta advanced by repeated multiplication), so long positions
// round the same as llama.cpp.
func ropeCache(p *device.RoPE, pos int, cs []float32) {
	theta := float32(pos)
	for i0 := 0; i0 < p.Dims; i0 += 2 {
		t := theta
		if p.FreqFactors != nil {
			t = theta / p.FreqFactors[i0/2]
		}
		c, s := ropeYarn(p, t, i0)
		cs[i0], cs[i0+1] = c, s
		theta *= p.ThetaScale
	}
}

func ropeYarn(p *device.RoPE, thetaExtrap float32, i0 int) (float32, float32) {
	thetaInterp := p.FreqScale * thetaExtrap
	theta := thetaInterp
	if p.ExtFactor != 0 {
		y := (float32(i0/2) - p.CorrLo) / max(0.001, p.CorrHi-p.CorrLo)
		ramp := (1 - min(1, max(0, y))) * p.ExtFactor
		theta = fma32(thetaInterp, 1-ramp, float32(thetaExtrap*ramp))
	}
	sin, cos := sincosf(theta)
	return cos * p.MScale, sin * p.MScale
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

// ropeApply rotates the first Dims values of one head vector x using a cache from ropeCache.
func ropeApply(p *device.RoPE, x, cs []float32) {
	if p.NeoX {
		half := p.Dims / 2
		for i := 0; i < half; i++ {
			c, s := cs[2*i], cs[2*i+1]
			x0, x1 := x[i], x[i+half]
			x[i] = fma32(x0, c, -float32(x1*s))
			x[i+half] = fma32(x0, s, float32(x1*c))
		}
		return
	}
	for i := 0; i < p.Dims; i += 2 {
		c, s := cs[i], cs[i+1]
		x0, x1 := x[i], x[i+1]
		x[i] = fma32(x0, c, -float32(x1*s))
		x[i+1] = fma32(x0, s, float32(x1*c))
	}
}
