package models

import (
	"math"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// The host attention as it was before the kernels of attn_kernels.go (commit 1c8fc90): the
// reference that the new one must equal bit for bit. It reads a cache of its own layout,
// keys and values both in rows per position (refCache).

// refCache is a KV cache in the old layout.
type refCache struct {
	device.KVLayer
}

func newRefCache(kd, vd, size int, f16 bool) *refCache {
	c := &refCache{device.KVLayer{KDim: kd, VDim: vd, F16: f16}}
	if f16 {
		c.K16, c.V16 = make([]uint16, size*kd), make([]uint16, size*vd)
	} else {
		c.K, c.V = make([]float32, size*kd), make([]float32, size*vd)
	}
	return c
}

func refPut(f16 bool, dst32 []float32, dst16 []uint16, off int, src []float32) {
	if f16 {
		d := dst16[off : off+len(src)]
		for i, v := range src {
			d[i] = quant.FP32ToFP16(v)
		}
		return
	}
	copy(dst32[off:], src)
}

func refGet(f16 bool, src32 []float32, src16 []uint16, off int, dst []float32) {
	if f16 {
		s := src16[off : off+len(dst)]
		for i, v := range s {
			dst[i] = quant.FP16ToFP32(v)
		}
		return
	}
	copy(dst, src32[off:off+len(dst)])
}

func (c *refCache) store(pos0 int, k, v []float32) {
	for t := 0; t < len(k)/c.KDim; t++ {
		refPut(c.F16, c.K, c.K16, (pos0+t)*c.KDim, k[t*c.KDim:(t+1)*c.KDim])
		if v != nil {
			refPut(c.F16, c.V, c.V16, (pos0+t)*c.VDim, v[t*c.VDim:(t+1)*c.VDim])
		}
	}
}

func (c *refCache) rowK(pos, from int, dst []float32) {
	refGet(c.F16, c.K, c.K16, pos*c.KDim+from, dst)
}

func (c *refCache) rowV(pos, from int, dst []float32) {
	refGet(c.F16, c.V, c.V16, pos*c.VDim+from, dst)
}

func (c *refCache) attendAll(out, q []float32, pos0, T int, a *device.AttnShape) {
	group := a.Heads / a.KVHeads
	qd := a.Heads * a.DK
	for i := 0; i < T*a.Heads; i++ {
		t, h := i/a.Heads, i%a.Heads
		kvh := h / group
		n := pos0 + t + 1
		qh := q[t*qd+h*a.DK : t*qd+(h+1)*a.DK]
		dst := out[(t*a.Heads+h)*a.DV : (t*a.Heads+h+1)*a.DV]
		if a.Latent {
			c.attendLatent(append([]float32(nil), qh...), a.DV, n, a.Scale, T > 1, dst)
			continue
		}
		var sink *float32
		if a.Sinks != nil {
			sink = &a.Sinks[h]
		}
		c.attend(qh, kvh*a.KHeadStride, kvh*a.VHeadStride, n, a.Scale, T > 1, dst, a.Window, sink)
	}
}

// attend is one query's attention over n positions: llama.cpp's masked soft_max (the
// positions before a sliding window at -Inf, a sink in the denominator) over every position.
func (c *refCache) attend(q []float32, kOff, vOff, n int, scale float32, batched bool, out []float32, window int, sink *float32) {
	if c.F16 {
		q = append([]float32(nil), q...)
		roundF16Go(q)
	}
	scores := make([]float32, n)
	krow := make([]float32, len(q))
	for p := 0; p < n; p++ {
		c.rowK(p, kOff, krow)
		scores[p] = quant.DotF32Vec(krow, q) * scale
		if window > 0 && p <= n-1-window {
			scores[p] = float32(math.Inf(-1))
		}
	}
	if sink != nil {
		softmaxSink(scores, *sink)
	} else {
		SoftmaxPadded(scores)
	}
	if c.F16 {
		roundF16Go(scores)
	}
	refWeightedSum(scores, len(out), batched, func(p int, v []float32) { c.rowV(p, vOff, v) }, out)
}

func (c *refCache) attendLatent(q []float32, rank, n int, scale float32, batched bool, out []float32) {
	if c.F16 {
		roundF16Go(q)
	}
	scores := make([]float32, n)
	krow := make([]float32, len(q))
	for p := 0; p < n; p++ {
		c.rowK(p, 0, krow)
		scores[p] = quant.DotF32Vec(krow, q) * scale
	}
	SoftmaxPadded(scores)
	if c.F16 {
		roundF16Go(scores)
	}
	refWeightedSum(scores, rank, batched, func(p int, v []float32) { c.rowK(p, 0, v) }, out)
}

func refWeightedSum(w []float32, dim int, batched bool, row func(p int, v []float32), out []float32) {
	n := len(w)
	padded := (n + 63) &^ 63
	vt := make([]float32, dim*padded)
	v := make([]float32, dim)
	for p := 0; p < n; p++ {
		row(p, v)
		for d, x := range v {
			vt[d*padded+p] = x
		}
	}
	wp := make([]float32, padded)
	copy(wp, w)
	for d := range out[:dim] {
		col := vt[d*padded : (d+1)*padded]
		if batched {
			m := (n + 15) &^ 15
			out[d] = quant.DotF32Lanes16(col[:m], wp[:m])
		} else {
			out[d] = quant.DotF32Vec(col, wp)
		}
	}
}

// refSwiGLU is SwiGLU as it was.
func refSwiGLU(dst, g, u []float32) {
	n := len(g)
	u, dst = u[:n], dst[:n]
	i := 0
	for ; i < n&^15; i++ {
		dst[i] = siluAVX512(g[i]) * u[i]
	}
	for ; i < n; i++ {
		dst[i] = siluScalar(g[i]) * u[i]
	}
}
