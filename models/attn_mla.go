package models

import (
	"math"

	"github.com/commit-run/commit-run/quant"
)

// MLAttention is DeepSeek-V2's multi-head latent attention, computed in the absorbed form:
// the cache holds one compressed latent [kv_norm (rank) | k_pe (rope)] per position shared by
// all heads, queries are mapped into the latent space through k_b, and each head's output is
// mapped back through v_b. That is what llama.cpp does for MLA files; the legacy attn_kv_b
// layout is converted to the same form at load.
type MLAttention struct {
	// Q projects straight to heads (V2-Lite) unless QA is set (V2/V3: Q = QB(norm(QA x))).
	Q, QA, QB quant.Matrix
	QANorm    Norm
	KVA       quant.Matrix // attn_kv_a_mqa {n_embd, rank+rope}
	KVANorm   Norm
	// KB[h] maps a head's q_nope (nope values) to the latent (rank rows of nope columns).
	KB []quant.Matrix
	// VB[h] maps the latent to a head's value (headV rows of rank columns).
	VB    []quant.Matrix
	O     quant.Matrix
	Heads int
	Nope  int // per-head key dims without rope
	RopeD int
	Rank  int
	HeadV int
	Scale float32
	Eps   float32
	Rope  *Rope
}

// CacheDims implements Attention: the latent is the key, and the value is read from it.
func (a *MLAttention) CacheDims() (int, int) { return a.Rank + a.RopeD, 0 }

// Forward implements Attention.
func (a *MLAttention) Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32) {
	hk := a.Nope + a.RopeD
	qd := a.Heads * hk
	q := make([]float32, T*qd)
	if a.QA.Data != nil {
		qa := make([]float32, T*a.QA.Rows)
		b.MatMul(a.QA, x, T, qa)
		for t := 0; t < T; t++ {
			row := qa[t*a.QA.Rows : (t+1)*a.QA.Rows]
			RMSNorm(row, row, a.QANorm, a.Eps)
		}
		b.MatMul(a.QB, qa, T, q)
	} else {
		b.MatMul(a.Q, x, T, q)
	}
	kvd := a.Rank + a.RopeD
	ckv := make([]float32, T*kvd)
	b.MatMul(a.KVA, x, T, ckv)
	cs := make([]float32, a.RopeD)
	for t := 0; t < T; t++ {
		a.Rope.cache(pos0+t, cs)
		for h := 0; h < a.Heads; h++ {
			a.Rope.apply(q[t*qd+h*hk+a.Nope:], cs)
		}
		row := ckv[t*kvd : (t+1)*kvd]
		RMSNorm(row[:a.Rank], row[:a.Rank], a.KVANorm, a.Eps)
		a.Rope.apply(row[a.Rank:], cs)
		c.PutK(pos0+t, row)
	}
	ctx := make([]float32, T*a.Heads*a.HeadV)
	b.Parallel(T*a.Heads, func(i int) {
		t, h := i/a.Heads, i%a.Heads
		qh := q[t*qd+h*hk : t*qd+(h+1)*hk]
		// The absorbed query: [k_b^T q_nope | q_pe] against the cached [kv_norm | k_pe].
		qabs := make([]float32, kvd)
		matVec(a.KB[h], qh[:a.Nope], qabs[:a.Rank])
		copy(qabs[a.Rank:], qh[a.Nope:])
		latent := make([]float32, a.Rank)
		attendLatent(c, qabs, a.Rank, pos0+t+1, a.Scale, latent)
		matVec(a.VB[h], latent, ctx[(t*a.Heads+h)*a.HeadV:(t*a.Heads+h+1)*a.HeadV])
	})
	b.MatMul(a.O, ctx, T, out)
}

// attendLatent is attend for MLA, where the value is the first rank values of the key row.
func attendLatent(c *LayerCache, q []float32, rank, n int, scale float32, out []float32) {
	if c.F16 {
		roundF16(q)
	}
	scores := make([]float32, n)
	krow := make([]float32, len(q))
	for p := 0; p < n; p++ {
		c.K(p, 0, krow)
		scores[p] = dot(q, krow) * scale
	}
	Softmax(scores)
	if c.F16 {
		roundF16(scores)
	}
	for i := range out {
		out[i] = 0
	}
	vrow := make([]float32, rank)
	for p := 0; p < n; p++ {
		c.K(p, 0, vrow)
		w := scores[p]
		for i, v := range vrow {
			out[i] += w * v
		}
	}
}

// matVec is a single-threaded matrix-vector product in the matrix's stored type, with the
// vector rounded to the dot type as a ggml matmul would; MLA calls it inside a parallel loop.
func matVec(m quant.Matrix, x, out []float32) {
	dt := m.Type.DotType()
	n, _ := dt.RowBytes(m.Cols)
	xq := make([]byte, n)
	quant.QuantizeRow(dt, x, xq)
	for r := 0; r < m.Rows; r++ {
		out[r] = quant.VecDot(m.Type, m.Cols, m.Row(r), xq)
	}
}

// mlaScale is DeepSeek-V2's attention scale: YaRN's magnitude correction moves from the rotary
// embedding into the softmax scale (llama.cpp's deepseek2 graph).
func mlaScale(r *Rope, yarnLogMul float32, headK int) float32 {
	orig := r.AttnFactor * (1 + 0.1*float32(math.Log(float64(1/r.FreqScale))))
	ms := orig * (1 + 0.1*yarnLogMul*float32(math.Log(float64(1/r.FreqScale))))
	return ms * ms / float32(math.Sqrt(float64(headK)))
}
