package models

import (
	"math"

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

// Forward implements Attention.
func (a *StdAttention) Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32) {
	qd, kd, vd := a.Heads*a.HeadDK, a.HeadsKV*a.HeadDK, a.HeadsKV*a.HeadDV
	q := make([]float32, T*qd)
	k := make([]float32, T*kd)
	v := make([]float32, T*vd)
	b.MatMul(a.Q, x, T, q)
	b.MatMul(a.K, x, T, k)
	b.MatMul(a.V, x, T, v)
	cs := make([]float32, a.Rope.Dims)
	for t := 0; t < T; t++ {
		qt, kt, vt := q[t*qd:(t+1)*qd], k[t*kd:(t+1)*kd], v[t*vd:(t+1)*vd]
		addBias(qt, a.BQ)
		addBias(kt, a.BK)
		addBias(vt, a.BV)
		switch a.QKNorm {
		case QKNormFull:
			RMSNorm(qt, qt, a.QNorm, a.Eps)
			RMSNorm(kt, kt, a.KNorm, a.Eps)
		case QKNormPerHead:
			for h := 0; h < a.Heads; h++ {
				RMSNorm(qt[h*a.HeadDK:(h+1)*a.HeadDK], qt[h*a.HeadDK:(h+1)*a.HeadDK], a.QNorm, a.Eps)
			}
			for h := 0; h < a.HeadsKV; h++ {
				RMSNorm(kt[h*a.HeadDK:(h+1)*a.HeadDK], kt[h*a.HeadDK:(h+1)*a.HeadDK], a.KNorm, a.Eps)
			}
		}
		a.Rope.cache(pos0+t, cs)
		for h := 0; h < a.Heads; h++ {
			a.Rope.apply(qt[h*a.HeadDK:], cs)
		}
		for h := 0; h < a.HeadsKV; h++ {
			a.Rope.apply(kt[h*a.HeadDK:], cs)
		}
		c.PutK(pos0+t, kt)
		c.PutV(pos0+t, vt)
	}
	ctx := make([]float32, T*a.Heads*a.HeadDV)
	group := a.Heads / a.HeadsKV
	b.Parallel(T*a.Heads, func(i int) {
		t, h := i/a.Heads, i%a.Heads
		kvh := h / group
		n := pos0 + t + 1
		qh := q[t*qd+h*a.HeadDK : t*qd+(h+1)*a.HeadDK]
		attend(c, qh, kvh*a.HeadDK, kvh*a.HeadDV, n, a.Scale, T > 1, ctx[(t*a.Heads+h)*a.HeadDV:(t*a.Heads+h+1)*a.HeadDV])
	})
	b.MatMul(a.O, ctx, T, out)
	if a.BO != nil {
		for t := 0; t < T; t++ {
			addBias(out[t*a.O.Rows:(t+1)*a.O.Rows], a.BO)
		}
	}
}

// attend computes softmax(scale * q·K[0:n]) · V[0:n] for one head whose key starts at kOff and
// value at vOff in each cached row, in the arithmetic of llama.cpp's attention without flash
// attention: the scores are ggml_vec_dot_f32 products, the softmax runs over the whole padded
// KV length, and the weighted sum of values is a matrix product over the positions (tinyBLAS
// when a batch of tokens is evaluated, ggml_vec_dot_f32 for one token). With an F16 cache, q
// and the probabilities are rounded to F16 first, as llama.cpp's matmuls against F16 K and V
// round their other operand.
func attend(c *LayerCache, q []float32, kOff, vOff, n int, scale float32, batched bool, out []float32) {
	if c.F16 {
		q = append([]float32(nil), q...)
		roundF16(q)
	}
	scores := make([]float32, n)
	krow := make([]float32, len(q))
	for p := 0; p < n; p++ {
		c.K(p, kOff, krow)
		scores[p] = quant.DotF32Vec(krow, q) * scale
	}
	SoftmaxPadded(scores)
	if c.F16 {
		roundF16(scores)
	}
	weightedSum(scores, len(out), batched, func(p int, v []float32) { c.V(p, vOff, v) }, out)
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

func addBias(x, b []float32) {
	if b != nil {
		AddTo(x, b)
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
