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

// OnDevice implements OnDevice: Forward uses the backend's Ops alone.
func (a *MLAttention) OnDevice() {}

// Forward implements Attention. Everything goes through the backend's products and Ops, so
// that a GPU keeps the pass in its memory; HostOps computes each step as llama.cpp's CPU
// backend does, so that the CPU's numbers are those of the golden references.
func (a *MLAttention) Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32) {
	hk := a.Nope + a.RopeD
	qd := a.Heads * hk
	q := b.Floats(T * qd)
	if a.QA.Data != nil {
		qa := b.Floats(T * a.QA.Rows)
		b.MatMul(a.QA, x, T, qa)
		b.RMSNorm(qa, qa, a.QA.Rows, a.QANorm.Weight, a.QANorm.Bias, a.Eps)
		b.MatMul(a.QB, qa, T, q)
	} else {
		b.MatMul(a.Q, x, T, q)
	}
	// ckv holds per token [kv (rank) | k_pe (rope)]: the latent is normalised in place and
	// k_pe rotated, which makes the row the absorbed form caches.
	kvd := a.Rank + a.RopeD
	ckv := b.Floats(T * kvd)
	b.MatMul(a.KVA, x, T, ckv)
	rp := a.Rope.Params()
	b.Rope(q[a.Nope:], pos0, T, a.Heads, hk, qd, rp)
	b.RMSNormStrided(ckv, ckv, T, a.Rank, kvd, kvd, a.KVANorm.Weight, a.KVANorm.Bias, a.Eps)
	b.Rope(ckv[a.Rank:], pos0, T, 1, kvd, kvd, rp)
	if a.legacy() {
		a.forwardLegacy(b, c, q, ckv, T, pos0, out)
		return
	}
	b.StoreKV(&c.KVLayer, pos0, ckv, nil)
	// The absorbed queries [k_b^T q_nope | q_pe] of every (token, head), against the cached
	// [kv_norm | k_pe].
	qabs := b.Floats(T * a.Heads * kvd)
	kb := &device.HeadLayout{XTok: qd, XHead: hk, OutTok: a.Heads * kvd, OutHead: kvd}
	if a.KB[0].Type == quant.F32 && T > 1 {
		// llama.cpp multiplies k_b with a permuted (non-contiguous) view of q_nope: F32 k_b
		// then takes ggml_vec_dot_f32 row by row instead of tinyBLAS, as a product of one row
		// does, while the other types convert the view to their dot type first and so keep
		// the batched kernels.
		for t := 0; t < T; t++ {
			b.MatMulHeads(a.KB, q[t*qd:], 1, qabs[t*a.Heads*kvd:], kb)
		}
	} else {
		b.MatMulHeads(a.KB, q, T, qabs, kb)
	}
	b.Copy2D(qabs[a.Rank:], q[a.Nope:], T*a.Heads, a.RopeD, kvd, hk)
	// Each head's attention output in the latent space, then mapped to its value by v_b.
	lat := b.Floats(T * a.Heads * a.Rank)
	b.Attend(lat, qabs, &c.KVLayer, pos0, T, &device.AttnShape{
		Heads: a.Heads, KVHeads: 1, DK: kvd, DV: a.Rank, Scale: a.Scale, Latent: true,
	})
	ctx := b.Floats(T * a.Heads * a.HeadV)
	b.MatMulHeads(a.VB, lat, T, ctx, &device.HeadLayout{XTok: a.Heads * a.Rank, XHead: a.Rank, OutTok: a.Heads * a.HeadV, OutHead: a.HeadV})
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
	latent := b.Floats(T * a.Rank)
	b.Copy2D(latent, ckv, T, a.Rank, a.Rank, kvd)
	hkv := a.Nope + a.HeadV
	kv := b.Floats(T * a.Heads * hkv)
	b.MatMul(a.KVB, latent, T, kv)
	// Per token the heads' keys [k_nope | k_pe] and values, rows of the cache.
	k, v := b.Floats(T*qd), b.Floats(T*a.Heads*a.HeadV)
	b.Copy2D(k, kv, T*a.Heads, a.Nope, hk, hkv)
	b.Copy2D(v, kv[a.Nope:], T*a.Heads, a.HeadV, a.HeadV, hkv)
	// k_pe goes to every head: one copy per token (its row repeated) or per head, whichever
	// is fewer.
	if T < a.Heads {
		for t := 0; t < T; t++ {
			b.Copy2D(k[t*qd+a.Nope:], ckv[t*kvd+a.Rank:], a.Heads, a.RopeD, hk, 0)
		}
	} else {
		for h := 0; h < a.Heads; h++ {
			b.Copy2D(k[h*hk+a.Nope:], ckv[a.Rank:], T, a.RopeD, qd, kvd)
		}
	}
	b.StoreKV(&c.KVLayer, pos0, k, v)
	ctx := b.Floats(T * a.Heads * a.HeadV)
	b.Attend(ctx, q, &c.KVLayer, pos0, T, &device.AttnShape{
		Heads: a.Heads, KVHeads: a.Heads, DK: hk, DV: a.HeadV, KHeadStride: hk, VHeadStride: a.HeadV, Scale: a.Scale,
	})
	b.MatMul(a.O, ctx, T, out)
}

// attendLatentValues is attendValues for MLA's absorbed form, where every head attends over
// the one latent row per position and the values are its first DV (rank) values: the
// weighted sums run along the rows of the cache, accumulated lane-major, for the group's
// queries together where they see the same positions (the heads of a token).
func attendLatentValues(s *attnScratch, c *device.KVLayer, g *attnGroup, w []float32, ws int, batched bool) {
	acc := grow(&s.acc, 64*96)
	dv := len(g.out[0])
	for i := 0; i < g.nq; {
		k := i + 1 // queries i..k-1 see the same positions
		for k < g.nq && g.n[k] == g.n[i] {
			k++
		}
		o := grow(&s.o, (k-i)*dv)
		if c.F16 {
			wsumRowsMultiF16(o, dv, w[i*ws:], ws, c.K16, c.KDim, g.n[i], k-i, dv, batched, acc)
		} else {
			wsumRowsMulti(o, dv, w[i*ws:], ws, c.K, c.KDim, g.n[i], k-i, dv, batched, acc)
		}
		for j := i; j < k; j++ {
			copy(g.out[j], o[(j-i)*dv:(j-i+1)*dv])
		}
		i = k
	}
}

// mlaScale is DeepSeek-V2's attention scale: YaRN's magnitude correction moves from the rotary
// embedding into the softmax scale (llama.cpp's deepseek2 graph).
func mlaScale(r *Rope, yarnLogMul float32, headK int) float32 {
	orig := r.AttnFactor * (1 + 0.1*float32(math.Log(float64(1/r.FreqScale))))
	ms := orig * (1 + 0.1*yarnLogMul*float32(math.Log(float64(1/r.FreqScale))))
	return ms * ms / float32(math.Sqrt(float64(headK)))
}
