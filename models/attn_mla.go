package models

import (
	"math"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// MLAttention is DeepSeek-V2's multi-head latent attention, computed the way llama.cpp computes
// each file layout, because the two forms round activations at different points and so give
// different numbers on quantized weights:
//
//   - MLA files (attn_k_b/attn_v_b) use the absorbed form: the cache holds one compressed
//     latent [kv_norm (rank) | k_pe (rope)] per position shared by all heads, queries are
//     mapped into the latent space through k_b, and each head's output is mapped back through
//     v_b.
//   - Legacy files (one attn_kv_b) are decompressed: kv_b maps each position's kv_norm to
//     every head's k_nope and value, and the cache holds per-head keys [k_nope | k_pe] and
//     values, as ordinary multi-head attention.
type MLAttention struct {
	// Q projects straight to heads (V2-Lite) unless QA is set (V2/V3: Q = QB(norm(QA x))).
	Q, QA, QB quant.Matrix
	QANorm    Norm
	KVA       quant.Matrix // attn_kv_a_mqa {n_embd, rank+rope}
	KVANorm   Norm
	// KB[h] maps a head's q_nope (nope values) to the latent (rank rows of nope columns).
	KB []quant.Matrix
	// VB[h] maps the latent to a head's value (headV rows of rank columns).
	VB []quant.Matrix
	// KVB is the legacy attn_kv_b {rank, heads*(nope+headV)}; when set, KB and VB are unused
	// and attention is not absorbed.
	KVB   quant.Matrix
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

// CacheDims implements Attention: in the absorbed form the latent is the key, and the value
// is read from it; the legacy form caches every head's key and value.
func (a *MLAttention) CacheDims() (int, int) {
	if a.legacy() {
		return a.Heads * (a.Nope + a.RopeD), a.Heads * a.HeadV
	}
	return a.Rank + a.RopeD, 0
}

func (a *MLAttention) legacy() bool { return a.KVB.Data != nil }

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
	rp := a.Rope.Params()
	for t := 0; t < T; t++ {
		ropeCache(rp, pos0+t, cs)
		for h := 0; h < a.Heads; h++ {
			ropeApply(rp, q[t*qd+h*hk+a.Nope:], cs)
		}
		row := ckv[t*kvd : (t+1)*kvd]
		RMSNorm(row[:a.Rank], row[:a.Rank], a.KVANorm, a.Eps)
		ropeApply(rp, row[a.Rank:], cs)
		if !a.legacy() {
			putK(&c.KVLayer, pos0+t, row)
		}
	}
	if a.legacy() {
		a.forwardLegacy(b, c, q, ckv, T, pos0, out)
		return
	}
	ctx := make([]float32, T*a.Heads*a.HeadV)
	b.Parallel(T*a.Heads, func(i int) {
		t, h := i/a.Heads, i%a.Heads
		qh := q[t*qd+h*hk : t*qd+(h+1)*hk]
		// The absorbed query: [k_b^T q_nope | q_pe] against the cached [kv_norm | k_pe].
		qabs := make([]float32, kvd)
		// llama.cpp multiplies k_b with a permuted (non-contiguous) view of q_nope: F32 k_b
		// then takes ggml_vec_dot_f32 row by row instead of tinyBLAS, while the other types
		// convert the view to their dot type first and so keep the batched kernels.
		kbBatch := T
		if a.KB[h].Type == quant.F32 {
			kbBatch = 1
		}
		matVec(a.KB[h], qh[:a.Nope], qabs[:a.Rank], kbBatch, t)
		copy(qabs[a.Rank:], qh[a.Nope:])
		latent := make([]float32, a.Rank)
		attendLatent(&c.KVLayer, qabs, a.Rank, pos0+t+1, a.Scale, T > 1, latent)
		matVec(a.VB[h], latent, ctx[(t*a.Heads+h)*a.HeadV:(t*a.Heads+h+1)*a.HeadV], T, t)
	})
	b.MatMul(a.O, ctx, T, out)
}

// forwardLegacy finishes Forward for the legacy attn_kv_b layout as llama.cpp's deepseek2 graph
// does without MLA: kv_b decompresses each position's normalised latent (rounded once to kv_b's
// dot type) into every head's k_nope and value, keys are [k_nope | k_pe] with k_pe shared by
// the heads, and each head attends over the cache like ordinary multi-head attention.
func (a *MLAttention) forwardLegacy(b Backend, c *LayerCache, q, ckv []float32, T, pos0 int, out []float32) {
	hk := a.Nope + a.RopeD
	qd := a.Heads * hk
	kvd := a.Rank + a.RopeD
	latent := make([]float32, T*a.Rank)
	for t := 0; t < T; t++ {
		copy(latent[t*a.Rank:(t+1)*a.Rank], ckv[t*kvd:t*kvd+a.Rank])
	}
	hkv := a.Nope + a.HeadV
	kv := make([]float32, T*a.Heads*hkv)
	b.MatMul(a.KVB, latent, T, kv)
	krow := make([]float32, qd)
	vrow := make([]float32, a.Heads*a.HeadV)
	for t := 0; t < T; t++ {
		kpe := ckv[t*kvd+a.Rank : (t+1)*kvd]
		for h := 0; h < a.Heads; h++ {
			src := kv[(t*a.Heads+h)*hkv : (t*a.Heads+h+1)*hkv]
			copy(krow[h*hk:h*hk+a.Nope], src[:a.Nope])
			copy(krow[h*hk+a.Nope:(h+1)*hk], kpe)
			copy(vrow[h*a.HeadV:(h+1)*a.HeadV], src[a.Nope:])
		}
		putK(&c.KVLayer, pos0+t, krow)
		putV(&c.KVLayer, pos0+t, vrow)
	}
	ctx := make([]float32, T*a.Heads*a.HeadV)
	b.Parallel(T*a.Heads, func(i int) {
		t, h := i/a.Heads, i%a.Heads
		qh := q[t*qd+h*hk : t*qd+(h+1)*hk]
		attend(&c.KVLayer, qh, h*hk, h*a.HeadV, pos0+t+1, a.Scale, T > 1, ctx[(t*a.Heads+h)*a.HeadV:(t*a.Heads+h+1)*a.HeadV])
	})
	b.MatMul(a.O, ctx, T, out)
}

// attendLatent is attend for MLA, where the value is the first rank values of the key row.
func attendLatent(c *device.KVLayer, q []float32, rank, n int, scale float32, batched bool, out []float32) {
	if c.F16 {
		roundF16(q)
	}
	scores := make([]float32, n)
	krow := make([]float32, len(q))
	for p := 0; p < n; p++ {
		rowK(c, p, 0, krow)
		scores[p] = quant.DotF32Vec(krow, q) * scale
	}
	SoftmaxPadded(scores)
	if c.F16 {
		roundF16(scores)
	}
	weightedSum(scores, rank, batched, func(p int, v []float32) { rowK(c, p, 0, v) }, out)
}

// matVec is a single-threaded matrix-vector product in the matrix's stored type, with the
// vector rounded to the dot type as a ggml matmul would, and the kernel llama.cpp uses for
// activation row t of a batch of T; MLA calls it inside a parallel loop.
func matVec(m quant.Matrix, x, out []float32, T, t int) {
	dt := m.Type.DotType()
	n, _ := dt.RowBytes(m.Cols)
	xq := make([]byte, n)
	quant.QuantizeRow(dt, x, xq)
	dot := quant.X86Dot(m.Type, m.Rows, T, t)
	for r := 0; r < m.Rows; r++ {
		out[r] = dot(m.Cols, m.Row(r), xq)
	}
}

// mlaScale is DeepSeek-V2's attention scale: YaRN's magnitude correction moves from the rotary
// embedding into the softmax scale (llama.cpp's deepseek2 graph).
func mlaScale(r *Rope, yarnLogMul float32, headK int) float32 {
	orig := r.AttnFactor * (1 + 0.1*float32(math.Log(float64(1/r.FreqScale))))
	ms := orig * (1 + 0.1*yarnLogMul*float32(math.Log(float64(1/r.FreqScale))))
	return ms * ms / float32(math.Sqrt(float64(headK)))
}
