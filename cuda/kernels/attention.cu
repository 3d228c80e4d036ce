// attention.cu: causal softmax attention of a few tokens over the KV cache, one block per
// (query head, token), following models.attend / attendLatent: scores = (q . k) * scale, the
// softmax of models.SoftmaxPadded (maximum subtracted, exps by cr_exp_v summed in groups of 16
// in float32 and the groups in float64, times float32(1/sum)), then the probabilities times
// the values. With an F16 cache, q and the probabilities are rounded to F16 first, as the CPU
// does. The dot products and the weighted sum add in other orders than the CPU's, so results
// agree to float32 rounding, not bit for bit.
//
// Any context length works: the first ATT_SMAX scores of a row (of its window) stay in shared memory; the
// scores of later positions are kept as a running (max, sum) in the first pass and computed
// again in the second, so past ATT_SMAX positions the keys are read twice.
#include "common.cuh"

#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * CR_WARP)
#define ATT_SMAX 4096   // scores kept in shared memory
#define ATT_DK_MAX 1024 // largest key (and query) head size
#define ATT_DV_MAX 512  // largest value head size (16 values per lane)

CR_FN float att_ld(const float* p, i64 i) { return p[i]; }
CR_FN float att_ld(const u16* p, i64 i) { return cr_h2f(p[i]); }

// att_score returns q . key with the whole warp (every lane gets the same value).
template <class KV> CR_FN float att_score(const float* sq, const KV* kr, int dk) {
	float a = 0.0f;
	for (int i = threadIdx.x % CR_WARP; i < dk; i += CR_WARP)
		a = cr_fma(sq[i], att_ld(kr, i), a);
	return cr_warp_sum(a);
}

// att_slot returns the cache row of position p: p % ring in a sliding window's ring.
CR_FN i64 att_slot(int p, int ring) { return ring > 0 ? p % ring : p; }

template <class KV>
CR_FN void attn_body(const float* q, const KV* k, const KV* v, float* out, int ntok, int heads, int kv_heads, int dk, int dv,
                     int kstride, int vstride, int kh_stride, int vh_stride, const int* posp, int pos0, float scale, int window,
                     const float* sinks, int ring, int f16) {
	__shared__ float sq[ATT_DK_MAX];
	__shared__ float ss[ATT_SMAX];
	__shared__ float sred[ATT_WARPS][ATT_DV_MAX];
	__shared__ float swm[ATT_WARPS], swbm[ATT_WARPS], swbl[ATT_WARPS];
	__shared__ double sd[32];
	const int h = blockIdx.x, t = blockIdx.y;
	if (h >= heads || t >= ntok)
		return;
	const int tid = threadIdx.x, lane = tid % CR_WARP, warp = tid / CR_WARP;
	float* o = out + ((i64)t * heads + h) * dv;
	if (dk > ATT_DK_MAX || dv > ATT_DV_MAX || kv_heads <= 0 || heads % kv_heads != 0) {
		for (int d = tid; d < dv; d += ATT_THREADS)
			o[d] = cr_as_f(0x7fc00000u); // NaN: shapes this kernel does not take
		return;
	}
	const int g = h / (heads / kv_heads);
	const int n = pos0 + (posp ? *posp : 0) + t + 1; // causal: positions 0 .. pos0+t
	// A sliding window sees positions lo..n-1. The scores are kept from base, lo rounded down to
	// 16, with those before lo at -Inf (the CPU's mask), so that the sums of 16 exps group the
	// positions as the CPU's do.
	const int lo = window > 0 && n > window ? n - window : 0, base = lo & ~15;
	const float* qh = q + ((i64)t * heads + h) * dk;
	for (int i = tid; i < dk; i += ATT_THREADS)
		sq[i] = f16 ? cr_round_h(qh[i]) : qh[i];
	__syncthreads();
	const KV* kb = k + (i64)g * kh_stride;
	const KV* vb = v + (i64)g * vh_stride;

	// Pass 1: scores; the maximum; a running sum for the positions past ATT_SMAX.
	float wmax = -cr_inf(), bm = -cr_inf(), bl = 0.0f;
	for (int p = base + warp; p < n; p += ATT_WARPS) {
		float s = p < lo ? -cr_inf() : cr_fmul(att_score(sq, kb + att_slot(p, ring) * kstride, dk), scale);
		if (p - base < ATT_SMAX) {
			if (lane == 0)
				ss[p - base] = s;
		} else if (s > bm) {
			bl = cr_fma(bl, cr_exp_v(bm - s), 1.0f);
			bm = s;
		} else {
			bl = cr_fadd(bl, cr_exp_v(s - bm));
		}
		wmax = s > wmax ? s : wmax;
	}
	if (lane == 0) {
		swm[warp] = wmax;
		swbm[warp] = bm;
		swbl[warp] = bl;
	}
	__syncthreads();
	float m = -cr_inf();
	for (int w = 0; w < ATT_WARPS; w++)
		m = swm[w] > m ? swm[w] : m;
	const float sink = sinks ? sinks[h] : 0.0f;
	if (sinks && !(m > sink)) // ggml's MAX(max, sink)
		m = sink;

	// The sum of the exps: groups of 16 stored scores as the CPU's vectors, then the rest.
	const int ns = n - base < ATT_SMAX ? n - base : ATT_SMAX;
	double sum = 0.0;
	for (int gi = tid; 16 * gi < ns; gi += ATT_THREADS) {
		float e[16];
#pragma unroll
		for (int l = 0; l < 16; l++)
			e[l] = 16 * gi + l < ns ? cr_exp_v(ss[16 * gi + l] - m) : 0.0f;
		sum += (double)cr_hsum16(e);
	}
	sum = cr_block_sum_d(sum, sd);
	for (int w = 0; w < ATT_WARPS; w++)
		if (swbl[w] > 0.0f)
			sum += (double)swbl[w] * (double)cr_exp_v(swbm[w] - m);
	if (sinks) // in the denominator only, with the CPU's scalar exp
		sum += (double)cr_expf(sink - m);
	const float inv = (float)(1.0 / sum);

	// Pass 2: out = sum over p of prob_p * V[p], lanes over the value's elements.
	float acc[ATT_DV_MAX / CR_WARP];
#pragma unroll
	for (int j = 0; j < ATT_DV_MAX / CR_WARP; j++)
		acc[j] = 0.0f;
	for (int p = lo + warp; p < n; p += ATT_WARPS) {
		float s = p - base < ATT_SMAX ? ss[p - base] : cr_fmul(att_score(sq, kb + att_slot(p, ring) * kstride, dk), scale);
		float pr = cr_fmul(cr_exp_v(s - m), inv);
		if (f16)
			pr = cr_round_h(pr);
		const KV* vr = vb + att_slot(p, ring) * vstride;
#pragma unroll
		for (int j = 0; j < ATT_DV_MAX / CR_WARP; j++) {
			int d = lane + CR_WARP * j;
			if (d < dv)
				acc[j] = cr_fma(pr, att_ld(vr, d), acc[j]);
		}
	}
#pragma unroll
	for (int j = 0; j < ATT_DV_MAX / CR_WARP; j++) {
		int d = lane + CR_WARP * j;
		if (d < dv)
			sred[warp][d] = acc[j];
	}
	__syncthreads();
	for (int d = tid; d < dv; d += ATT_THREADS) {
		float a = sred[0][d];
		for (int w = 1; w < ATT_WARPS; w++)
			a = cr_fadd(a, sred[w][d]);
		o[d] = a;
	}
}

// attn_f32(const float* q, const float* k, const float* v, float* out, int ntok, int heads,
//          int kv_heads, int dk, int dv, int kstride, int vstride, int kh_stride, int vh_stride,
//          const int* posp, int pos0, float scale, int window, const float* sinks, int ring)
//   q     ntok rows of heads*dk floats: query head h of token t at q + (t*heads + h)*dk, after
//         RoPE (and the q norm).
//   k     the key cache: the key of KV head g at position p is k + p*kstride + g*kh_stride
//         (dk floats).
//   v     the value cache: the value of KV head g at position p is v + p*vstride + g*vh_stride
//         (dv floats).
//   out   ntok rows of heads*dv floats: head h of token t at out + (t*heads + h)*dv.
//   Token t is at position pos0 + t (plus *posp when posp is not NULL: one int in device memory,
//   the position of a decode step that a CUDA graph replays) and attends to positions 0 .. pos0+t, which the cache must
//   already hold (its own key and value included). Query head h reads KV head
//   h / (heads/kv_heads); heads % kv_heads == 0. scale multiplies q.k before the softmax.
//   window, when > 0, is a sliding window: token t attends to the last window positions only,
//   pos0+t-window+1 .. pos0+t (llama.cpp's standard SWA mask); the cache must hold those.
//   sinks, when not NULL, holds a logit per query head (heads floats) that joins the softmax's
//   maximum and denominator but weighs no value (gpt-oss's attention sinks).
//   ring, when > 0, says that the cache is a sliding window's ring: position p's key and value
//   are at row p % ring (device.KVLayer.Ring); the window and the tokens must fit it.
//   Layouts:
//     standard/GQA: kstride = kv_heads*dk, vstride = kv_heads*dv, kh_stride = dk, vh_stride = dv.
//     MLA absorbed (attn_k_b/attn_v_b files, models.attendLatent): q = the absorbed queries
//       [k_b^T q_nope | q_pe] of rank+rope values per head, k = v = the latent cache
//       [kv_norm | k_pe] of rank+rope values per position, kv_heads = 1, dk = rank+rope,
//       dv = rank, kstride = vstride = rank+rope, kh_stride = vh_stride = 0.
//     MLA legacy (attn_kv_b files): kv_heads = heads, dk = nope+rope, dv = head_v, the cache
//       laid out as standard attention.
//   Limits: dk <= 1024, dv <= 512 (else the output is NaN). No limit on the context: past 4096
//   positions the keys are read twice.
//   grid (heads, ntok, 1); block (256, 1, 1) exactly; no dynamic shared memory (about 36 KiB
//   static).
extern "C" __global__ void attn_f32(const float* q, const float* k, const float* v, float* out, int ntok, int heads, int kv_heads,
                                    int dk, int dv, int kstride, int vstride, int kh_stride, int vh_stride, const int* posp, int pos0,
                                    float scale, int window, const float* sinks, int ring) {
	attn_body<float>(q, k, v, out, ntok, heads, kv_heads, dk, dv, kstride, vstride, kh_stride, vh_stride, posp, pos0, scale, window,
	                 sinks, ring, 0);
}

// attn_f16kv(const float* q, const unsigned short* k, const unsigned short* v, float* out,
//            int ntok, int heads, int kv_heads, int dk, int dv, int kstride, int vstride,
//            int kh_stride, int vh_stride, const int* posp, int pos0, float scale, int window,
//            const float* sinks, int ring)
//   attn_f32 with an F16 cache (IEEE halves; strides and offsets in halves). As the CPU with an
//   F16 cache, q is rounded to F16 before the dot products and each probability before it
//   weighs the values. Same grid (heads, ntok, 1), block (256, 1, 1), limits and layouts.
extern "C" __global__ void attn_f16kv(const float* q, const u16* k, const u16* v, float* out, int ntok, int heads, int kv_heads,
                                      int dk, int dv, int kstride, int vstride, int kh_stride, int vh_stride, const int* posp, int pos0,
                                      float scale, int window, const float* sinks, int ring) {
	attn_body<u16>(q, k, v, out, ntok, heads, kv_heads, dk, dv, kstride, vstride, kh_stride, vh_stride, posp, pos0, scale, window,
	               sinks, ring, 1);
}
