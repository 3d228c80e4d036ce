package models

import (
	"math"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// QKNorm says where an architecture normalises queries and keys before RoPE.
type QKNorm int

// The q/k normalisations of our architectures.
const (
	QKNormNone    QKNorm = iota
	QKNormPerHead        // Qwen3: RMSNorm over each head's vector
	QKNormFull           // OLMoE: RMSNorm over the whole projection
)

// StdAttention is multi-head attention with grouped KV heads, optional biases and q/k norms,
// and RoPE: llama, Mixtral, Qwen2/3(-MoE) and OLMoE use it.
type StdAttention struct {
	Q, K, V, O             quant.Matrix
	BQ, BK, BV, BO         []float32
	QNorm, KNorm           Norm
	QKNorm                 QKNorm
	Heads, HeadsKV, HeadDK int
	HeadDV                 int
	Scale                  float32
	Eps                    float32
	Rope                   *Rope
}

// CacheDims implements Attention.
func (a *StdAttention) CacheDims() (int, int) { return a.HeadsKV * a.HeadDK, a.HeadsKV * a.HeadDV }

// OnDevice implements OnDevice: Forward uses the backend's Ops alone.
func (a *StdAttention) OnDevice() {}

// Forward implements Attention.
func (a *StdAttention) Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32) {
	qd, kd, vd := a.Heads*a.HeadDK, a.HeadsKV*a.HeadDK, a.HeadsKV*a.HeadDV
	q, k, v := b.Floats(T*qd), b.Floats(T*kd), b.Floats(T*vd)
	b.MatMul(a.Q, x, T, q)
	b.MatMul(a.K, x, T, k)
	b.MatMul(a.V, x, T, v)
	addBias(b, q, a.BQ)
	addBias(b, k, a.BK)
	addBias(b, v, a.BV)
	switch a.QKNorm {
	case QKNormFull:
		b.RMSNorm(q, q, qd, a.QNorm.Weight, a.QNorm.Bias, a.Eps)
		b.RMSNorm(k, k, kd, a.KNorm.Weight, a.KNorm.Bias, a.Eps)
	case QKNormPerHead:
		b.RMSNorm(q, q, a.HeadDK, a.QNorm.Weight, a.QNorm.Bias, a.Eps)
		b.RMSNorm(k, k, a.HeadDK, a.KNorm.Weight, a.KNorm.Bias, a.Eps)
	}
	rp := a.Rope.Params()
	b.Rope(q, pos0, T, a.Heads, a.HeadDK, qd, rp)
	b.Rope(k, pos0, T, a.HeadsKV, a.HeadDK, kd, rp)
	b.StoreKV(&c.KVLayer, pos0, k, v)
	ctx := b.Floats(T * a.Heads * a.HeadDV)
	b.Attend(ctx, q, &c.KVLayer, pos0, T, &device.AttnShape{
		Heads: a.Heads, KVHeads: a.HeadsKV, DK: a.HeadDK, DV: a.HeadDV,
		KHeadStride: a.HeadDK, VHeadStride: a.HeadDV, Scale: a.Scale,
	})
	b.MatMul(a.O, ctx, T, out)
	addBias(b, out, a.BO)
}

// attend computes softmax(scale * q·K[0:n]) · V[0:n] for one head whose key starts at kOff and
// value at vOff in each cached row, in the arithmetic of llama.cpp's attention without flash
// attention: the scores are ggml_vec_dot_f32 products, the softmax runs over the whole padded
// KV length, and the weighted sum of values is a matrix product over the positions (tinyBLAS
// when a batch of tokens is evaluated, ggml_vec_dot_f32 for one token). With an F16 cache, q
// and the probabilities are rounded to F16 first, as llama.cpp's matmuls against F16 K and V
// round their other operand.
func attend(c *device.KVLayer, q []float32, kOff, vOff, n int, scale float32, batched bool, out []float32) {
	if c.F16 {
		q = append([]float32(nil), q...)
		roundF16(q)
	}
	scores := make([]float32, n)
	krow := make([]float32, len(q))
	for p := 0; p < n; p++ {
		rowK(c, p, kOff, krow)
		scores[p] = quant.DotF32Vec(krow, q) * scale
	}
	SoftmaxPadded(scores)
	if c.F16 {
		roundF16(scores)
	}
	weightedSum(scores, len(out), batched, func(p int, v []float32) { rowV(c, p, vOff, v) }, out)
}

// weightedSum writes out[d] = sum over p of w[p]*V[p][d], with V's rows read by row, as
// llama.cpp's kq·V product over a KV length padded with zero weights: 16 fused lanes over the
// positions (tinyBLAS) when batched, ggml_vec_dot_f32 otherwise.
func weightedSum(w []float32, dim int, batched bool, row func(p int, v []float32), out []float32) {
	n := len(w)
	padded := (n + 63) &^ 63
	vt := make([]float32, dim*padded) // V transposed: dim rows of the positions
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

// addBias adds bias, when there is one, to every row of x.
func addBias(b Backend, x, bias []float32) {
	if bias != nil {
		b.AddRows(x, bias)
	}
}

// defaultScale is 1/sqrt(head size) (1.0f/sqrtf in float32, as llama.cpp), unless the file
// sets attention.scale.
func defaultScale(r *kvReader, headDim int) float32 {
	if s := r.float(".attention.scale", 0); s != 0 {
		return s
	}
	return 1 / float32(math.Sqrt(float64(headDim)))
}
