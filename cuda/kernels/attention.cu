// attention.cu: causal softmax attention of a few tokens over the KV cache, one block per
// (query head, token) (attn_f32), or for a decoded token several a head, each a chunk of its
// positions (attn_split_*, below), following models.attend / attendLatent: scores =
// (q . k) * scale, the softmax of models.SoftmaxPadded (maximum subtracted, exps by cr_exp_v summed in groups of 16
// in float32 and the groups in float64, times float32(1/sum)), then the probabilities times
// the values. With an F16 cache, q and the probabilities are rounded to F16 first, as the CPU
// does. The dot products and the weighted sum add in other orders than the CPU's, so results
// agree to float32 rounding, not bit for bit.
//
// Any context length works: in attn_f32 the first ATT_SMAX scores of a row (of its window)
// stay in shared memory; the scores of later positions are kept as a running (max, sum) in the
// first pass and computed again in the second, so past ATT_SMAX positions the keys are read
// twice. The split kernels keep every score in a scratch.
#include "common.cuh"

#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * CR_WARP)
#define ATT_SMAX 4096   // scores kept in shared memory
#define ATT_DK_MAX 1024 // largest key (and query) head size
#define ATT_DV_MAX 512  // largest value head size (16 values per lane)

CR_FN float att_ld(const float* p, i64 i) { return p[i]; }
CR_FN float att_ld(const u16* p, i64 i) { return cr_h2f(p[i]); }

// att_score returns q . key with the whole warp (every lane gets the same value): lane l adds
// q[i] * key[i] for i = l, l+32, ... in that order, then a butterfly. The loads of four of a
// lane's values go out before their products: one after another, each waiting for the last
// product, they would leave a warp a single load in flight.
template <class KV> CR_FN float att_score(const float* sq, const KV* kr, int dk) {
	int i = threadIdx.x % CR_WARP;
	float a = 0.0f;
	for (; i + 3 * CR_WARP < dk; i += 4 * CR_WARP) {
		const float k0 = att_ld(kr, i), k1 = att_ld(kr, i + CR_WARP), k2 = att_ld(kr, i + 2 * CR_WARP), k3 = att_ld(kr, i + 3 * CR_WARP);
		a = cr_fma(sq[i], k0, a);
		a = cr_fma(sq[i + CR_WARP], k1, a);
		a = cr_fma(sq[i + 2 * CR_WARP], k2, a);
		a = cr_fma(sq[i + 3 * CR_WARP], k3, a);
	}
	for (; i < dk; i += CR_WARP)
		a = cr_fma(sq[i], att_ld(kr, i), a);
	return cr_warp_sum(a);
}

// att_score2 is att_score of two keys at once (each with att_score's bits), their loads
// together.
template <class KV> CR_FN void att_score2(const float* sq, const KV* kr0, const KV* kr1, int dk, float* s0, float* s1) {
	int i = threadIdx.x % CR_WARP;
	float a = 0.0f, b = 0.0f;
	for (; i + 3 * CR_WARP < dk; i += 4 * CR_WARP) {
		float k[4], l[4];
#pragma unroll
		for (int u = 0; u < 4; u++) {
			k[u] = att_ld(kr0, i + u * CR_WARP);
			l[u] = att_ld(kr1, i + u * CR_WARP);
		}
#pragma unroll
		for (int u = 0; u < 4; u++) {
			a = cr_fma(sq[i + u * CR_WARP], k[u], a);
			b = cr_fma(sq[i + u * CR_WARP], l[u], b);
		}
	}
	for (; i < dk; i += CR_WARP) {
		const float k0 = att_ld(kr0, i), l0 = att_ld(kr1, i);
		a = cr_fma(sq[i], k0, a);
		b = cr_fma(sq[i], l0, b);
	}
	*s0 = cr_warp_sum(a);
	*s1 = cr_warp_sum(b);
}

// att_score_run scores a warp's positions p = from, from+ATT_WARPS, ... < to, two keys at a
// time, into sc[p - base] (lane 0 writes; a position before lo gets -Inf, its key read but not
// used), and returns the maximum of wmax and of those scores, taken in the positions' order.
template <class KV>
CR_FN float att_score_run(float* sc, int base, const float* sq, const KV* kb, int kstride, int ring, int dk, float scale, int lo,
                          int from, int to, float wmax) {
	const int lane = threadIdx.x % CR_WARP;
	int p = from;
	for (; p + ATT_WARPS < to; p += 2 * ATT_WARPS) {
		float x0, x1;
		att_score2(sq, kb + cr_kv_row(p, ring) * kstride, kb + cr_kv_row(p + ATT_WARPS, ring) * kstride, dk, &x0, &x1);
		x0 = p < lo ? -cr_inf() : cr_fmul(x0, scale);
		x1 = p + ATT_WARPS < lo ? -cr_inf() : cr_fmul(x1, scale);
		if (lane == 0) {
			sc[p - base] = x0;
			sc[p + ATT_WARPS - base] = x1;
		}
		wmax = x0 > wmax ? x0 : wmax;
		wmax = x1 > wmax ? x1 : wmax;
	}
	if (p < to) {
		const float x = p < lo ? -cr_inf() : cr_fmul(att_score(sq, kb + cr_kv_row(p, ring) * kstride, dk), scale);
		if (lane == 0)
			sc[p - base] = x;
		wmax = x > wmax ? x : wmax;
	}
	return wmax;
}

// att_prob is the probability of score sc: exp(sc - m) * inv, rounded to F16 with an F16
// cache.
CR_FN float att_prob(float sc, float m, float inv, int f16) {
	const float pr = cr_fmul(cr_exp_v(sc - m), inv);
	return f16 ? cr_round_h(pr) : pr;
}

// att_weigh adds the probability of score sc (att_prob) times the value row vr to the lane's
// accumulators: values lane, lane+32, ...
template <class KV> CR_FN void att_weigh(float* acc, float sc, float m, float inv, const KV* vr, int dv, int f16) {
	const float pr = att_prob(sc, m, inv, f16);
	const int lane = threadIdx.x % CR_WARP;
#pragma unroll
	for (int j = 0; j < ATT_DV_MAX / CR_WARP; j++) {
		int d = lane + CR_WARP * j;
		if (d < dv)
			acc[j] = cr_fma(pr, att_ld(vr, d), acc[j]);
	}
}

// att_ld_row loads a lane's NJ values of a value row (lane, lane+32, ...), unguarded.
template <int NJ, class KV> CR_FN void att_ld_row(float* x, const KV* vr) {
	const int lane = threadIdx.x % CR_WARP;
#pragma unroll
	for (int j = 0; j < NJ; j++)
		x[j] = att_ld(vr, lane + CR_WARP * j);
}

// att_fma_row adds pr times a lane's NJ values x to its accumulators.
template <int NJ> CR_FN void att_fma_row(float* acc, float pr, const float* x) {
#pragma unroll
	for (int j = 0; j < NJ; j++)
		acc[j] = cr_fma(pr, x[j], acc[j]);
}

// att_weigh_run is att_weigh over a warp's positions p = from, from+ATT_WARPS, ... < to, with
// their scores at sc[p - base], for values of exactly 32*NJ floats: each lane's NJ values of
// two positions are loaded together, unguarded, before their products, which add in the
// positions' order as att_weigh's.
template <int NJ, class KV>
CR_FN void att_weigh_run(float* acc, const float* sc, int base, float m, float inv, const KV* vb, int vstride, int ring, int from, int to,
                         int f16) {
	float x0[NJ], x1[NJ];
	int p = from;
	for (; p + ATT_WARPS < to; p += 2 * ATT_WARPS) {
		att_ld_row<NJ>(x0, vb + cr_kv_row(p, ring) * vstride);
		att_ld_row<NJ>(x1, vb + cr_kv_row(p + ATT_WARPS, ring) * vstride);
		att_fma_row<NJ>(acc, att_prob(sc[p - base], m, inv, f16), x0);
		att_fma_row<NJ>(acc, att_prob(sc[p + ATT_WARPS - base], m, inv, f16), x1);
	}
	if (p < to) {
		att_ld_row<NJ>(x0, vb + cr_kv_row(p, ring) * vstride);
		att_fma_row<NJ>(acc, att_prob(sc[p - base], m, inv, f16), x0);
	}
}

// att_weigh_all weighs the values of a warp's positions p = from, from+ATT_WARPS, ... < to,
// their scores at sc[p - base]: att_weigh_run for the common head sizes, att_weigh for any.
template <class KV>
CR_FN void att_weigh_all(float* acc, const float* sc, int base, float m, float inv, const KV* vb, int vstride, int ring, int from, int to,
                         int dv, int f16) {
	switch (dv) {
	case 32:
		att_weigh_run<1>(acc, sc, base, m, inv, vb, vstride, ring, from, to, f16);
		break;
	case 64:
		att_weigh_run<2>(acc, sc, base, m, inv, vb, vstride, ring, from, to, f16);
		break;
	case 128:
		att_weigh_run<4>(acc, sc, base, m, inv, vb, vstride, ring, from, to, f16);
		break;
	case 256:
		att_weigh_run<8>(acc, sc, base, m, inv, vb, vstride, ring, from, to, f16);
		break;
	case 512:
		att_weigh_run<16>(acc, sc, base, m, inv, vb, vstride, ring, from, to, f16);
		break;
	default:
		for (int p = from; p < to; p += ATT_WARPS)
			att_weigh(acc, sc[p - base], m, inv, vb + cr_kv_row(p, ring) * vstride, dv, f16);
	}
}

// att_sum_warps writes to o[0..dv) the sum of the block's warps' accumulators, added in the
// warps' order. Every thread of the block calls it.
CR_FN void att_sum_warps(float (*sred)[ATT_DV_MAX], const float* acc, int dv, float* o) {
	const int tid = threadIdx.x, lane = tid % CR_WARP, warp = tid / CR_WARP;
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

template <class KV>
CR_FN void attn_body(const float* q, const KV* k, const KV* v, float* out, int ntok, int heads, int kv_heads, int dk, int dv,
                     int kstride, int vstride, int kh_stride, int vh_stride, const int* posp, int pos0, float scale, int window,
                     const float* sinks, int ring, int f16) {
	__shared__ float sq[ATT_DK_MAX];
	// The scores, then the warps' sums of the values (att_sum_warps, once every warp is done
	// with the scores), in the same shared memory: 20.5 KiB a block where both apart took
	// 36.5, so that an SM holds three blocks (as many as its registers allow) where it held one
	// on an RTX 2080 Ti (64 KiB) and two on an RTX 3090 or 4090 (100 KiB).
	__shared__ union {
		float ss[ATT_SMAX];
		float sred[ATT_WARPS][ATT_DV_MAX];
	} sm;
	float* ss = sm.ss;
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
	const int stored = n - base < ATT_SMAX ? n : base + ATT_SMAX; // positions base..stored-1 in ss
	float wmax = att_score_run(ss, base, sq, kb, kstride, ring, dk, scale, lo, base + warp, stored, -cr_inf()), bm = -cr_inf(),
	      bl = 0.0f;
	const int past = base + warp < stored ? base + warp + ((stored - 1 - base - warp) / ATT_WARPS + 1) * ATT_WARPS : base + warp;
	for (int p = past; p < n; p += ATT_WARPS) { // the warp's positions past them
		float s = p < lo ? -cr_inf() : cr_fmul(att_score(sq, kb + cr_kv_row(p, ring) * kstride, dk), scale);
		if (s > bm) {
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
	if (stored == n) { // every score in ss
		att_weigh_all(acc, ss, base, m, inv, vb, vstride, ring, lo + warp, n, dv, f16);
	} else {
		for (int p = lo + warp; p < n; p += ATT_WARPS) {
			float s = p - base < ATT_SMAX ? ss[p - base] : cr_fmul(att_score(sq, kb + cr_kv_row(p, ring) * kstride, dk), scale);
			att_weigh(acc, s, m, inv, vb + cr_kv_row(p, ring) * vstride, dv, f16);
		}
	}
	__syncthreads(); // every warp is done with ss, which sred overwrites
	att_sum_warps(sm.sred, acc, dv, o);
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
//   grid (heads, ntok, 1); block (256, 1, 1) exactly; no dynamic shared memory (about 20.5 KiB
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

// ---- a decoded token's attention, split over its context ----
//
// attn_f32 gives a query head one block: a decoded token (one query) fills as many blocks as
// the model has heads (16 to 64) on a card of 80 to 132 SMs, and each block's warps walk the
// whole context in turn. The split kernels give a head `splits` blocks, each a chunk of its
// positions (flash-decoding's split of the context), in two launches that keep attn_f32's
// softmax, the CPU's:
//   attn_split_scores: each chunk's scores to a scratch, and its maximum; the last block of a
//     head to finish then takes the maximum of them all and the sum of the exps in the CPU's
//     groups of 16 (float32 within a group, float64 between) and stores m and 1/sum.
//   attn_split_pv: each chunk's probabilities times its values, summed to a scratch; the last
//     block of a head to finish adds the chunks' sums in the chunks' order.
// So the results depend on the number of splits (the order of those last additions) and not
// on which block finishes last, and a graph that replays them gets the same bits. Up to
// ATT_SMAX positions, m, 1/sum and so each probability are attn_f32's to the bit (the same
// threads sum the same groups); past them the sum keeps the CPU's grouping, which attn_f32's
// running sums do not. Only the order in which the weighted values add differs.

#define ATS_CHUNK_MIN 32 // positions: 4 a warp

// ats_span is what token t sees: positions lo..n-1, their scores kept from base (lo rounded
// down to 16, those before lo at -Inf, as in attn_body), in nchunks chunks of chunk positions
// from base: a multiple of 16 (whole groups of the sum), at least ATS_CHUNK_MIN, and no more
// chunks than splits.
struct ats_span {
	int n, lo, base, chunk, nchunks;
};

CR_FN ats_span ats_span_of(int t, const int* posp, int pos0, int window, int splits) {
	ats_span s;
	s.n = pos0 + (posp ? *posp : 0) + t + 1;
	s.lo = window > 0 && s.n > window ? s.n - window : 0;
	s.base = s.lo & ~15;
	const int len = s.n - s.base, per = ((len + splits - 1) / splits + 15) & ~15;
	s.chunk = per > ATS_CHUNK_MIN ? per : ATS_CHUNK_MIN;
	s.nchunks = (len + s.chunk - 1) / s.chunk;
	return s;
}

// ats_last reports to the whole block whether it is the last of the blocks that count on
// *cnt to get here (each of a head's chunks calls it once; the blocks past them end before,
// all of them alike, since the chunks depend on the token alone); the last sets the counter
// back to 0 for the next launch. What the others wrote before they called it, the last
// reads with cr_ld_cg.
CR_FN bool ats_last(u32* cnt, int blocks, int* sh) {
	cr_fence_gpu();
	__syncthreads();
	if (threadIdx.x == 0) {
		const int last = cr_atomic_inc(cnt) == (u32)(blocks - 1);
		if (last)
			*cnt = 0;
		*sh = last;
	}
	__syncthreads();
	if (!*sh)
		return false;
	cr_fence_gpu(); // the others' writes before the last block's reads (an acquire)
	return true;
}

template <class KV>
CR_FN void ats_scores(const float* q, const KV* k, float* sc, float* st, u32* cnt, int ntok, int heads, int kv_heads, int dk,
                      int kstride, int kh_stride, const int* posp, int pos0, float scale, int window, const float* sinks, int ring,
                      int sstride, int splits, int f16) {
	__shared__ float sq[ATT_DK_MAX];
	__shared__ float swm[ATT_WARPS];
	__shared__ double sd[32];
	__shared__ int slast;
	const int h = blockIdx.x, c = blockIdx.y, t = blockIdx.z;
	if (h >= heads || c >= splits || t >= ntok)
		return;
	const int tid = threadIdx.x, lane = tid % CR_WARP, warp = tid / CR_WARP, row = t * heads + h;
	const ats_span s = ats_span_of(t, posp, pos0, window, splits);
	float* stt = st + (i64)row * (splits + 2);
	float* sct = sc + (i64)row * sstride;
	if (dk > ATT_DK_MAX || kv_heads <= 0 || heads % kv_heads != 0 || s.n - s.base > sstride) {
		if (c == 0 && tid == 0)
			stt[splits] = cr_as_f(0x7fc00000u); // attn_split_pv's NaN: shapes these kernels do not take
		return;
	}
	const int g = h / (heads / kv_heads);
	const int p0 = s.base + c * s.chunk, p1 = p0 + s.chunk < s.n ? p0 + s.chunk : s.n;
	if (p0 >= s.n) // past the last chunk: nothing to do, and not counted
		return;
	const float* qh = q + (i64)row * dk;
	for (int i = tid; i < dk; i += ATT_THREADS)
		sq[i] = f16 ? cr_round_h(qh[i]) : qh[i];
	__syncthreads();
	const KV* kb = k + (i64)g * kh_stride;
	const float wmax = att_score_run(sct, s.base, sq, kb, kstride, ring, dk, scale, s.lo, p0 + warp, p1, -cr_inf());
	if (lane == 0)
		swm[warp] = wmax;
	__syncthreads();
	if (tid == 0) {
		float m = -cr_inf();
		for (int w = 0; w < ATT_WARPS; w++)
			m = swm[w] > m ? swm[w] : m;
		stt[c] = m;
	}
	if (!ats_last(cnt + row, s.nchunks, &slast))
		return;

	// The last block: the maximum of the chunks' (and the sink), the sum of the exps.
	float m = -cr_inf();
	for (int i = 0; i < s.nchunks; i++) {
		const float x = cr_ld_cg(stt + i);
		m = x > m ? x : m;
	}
	const float sink = sinks ? sinks[h] : 0.0f;
	if (sinks && !(m > sink)) // ggml's MAX(max, sink)
		m = sink;
	const int ns = s.n - s.base;
	double sum = 0.0;
	for (int gi = tid; 16 * gi < ns; gi += ATT_THREADS) {
		float e[16];
#pragma unroll
		for (int l = 0; l < 16; l++)
			e[l] = 16 * gi + l < ns ? cr_exp_v(cr_ld_cg(sct + 16 * gi + l) - m) : 0.0f;
		sum += (double)cr_hsum16(e);
	}
	sum = cr_block_sum_d(sum, sd);
	if (sinks) // in the denominator only, with the CPU's scalar exp
		sum += (double)cr_expf(sink - m);
	if (tid == 0) {
		stt[splits] = m;
		stt[splits + 1] = (float)(1.0 / sum);
	}
}

template <class KV>
CR_FN void ats_pv(const float* sc, const float* st, const KV* v, float* part, u32* cnt, float* out, int ntok, int heads, int kv_heads,
                  int dv, int vstride, int vh_stride, const int* posp, int pos0, int window, int ring, int sstride, int splits, int f16) {
	__shared__ float sred[ATT_WARPS][ATT_DV_MAX];
	__shared__ int slast;
	const int h = blockIdx.x, c = blockIdx.y, t = blockIdx.z;
	if (h >= heads || c >= splits || t >= ntok)
		return;
	const int tid = threadIdx.x, warp = tid / CR_WARP, row = t * heads + h;
	const ats_span s = ats_span_of(t, posp, pos0, window, splits);
	const float* stt = st + (i64)row * (splits + 2);
	const float m = stt[splits], inv = stt[splits + 1];
	float* o = out + (i64)row * dv;
	if (dv > ATT_DV_MAX || kv_heads <= 0 || heads % kv_heads != 0 || s.n - s.base > sstride || m != m) {
		if (c == 0)
			for (int d = tid; d < dv; d += ATT_THREADS)
				o[d] = cr_as_f(0x7fc00000u);
		return;
	}
	const int g = h / (heads / kv_heads);
	const int p0 = s.base + c * s.chunk, p1 = p0 + s.chunk < s.n ? p0 + s.chunk : s.n;
	if (p0 >= s.n) // past the last chunk: nothing to add, and not counted
		return;
	const float* sct = sc + (i64)row * sstride;
	const KV* vb = v + (i64)g * vh_stride;
	float acc[ATT_DV_MAX / CR_WARP];
#pragma unroll
	for (int j = 0; j < ATT_DV_MAX / CR_WARP; j++)
		acc[j] = 0.0f;
	att_weigh_all(acc, sct, s.base, m, inv, vb, vstride, ring, (p0 > s.lo ? p0 : s.lo) + warp, p1, dv, f16);
	float* pt = part + (i64)row * splits * dv;
	att_sum_warps(sred, acc, dv, pt + (i64)c * dv);
	if (!ats_last(cnt + row, s.nchunks, &slast))
		return;
	for (int d = tid; d < dv; d += ATT_THREADS) {
		float a = cr_ld_cg(pt + d);
		for (int i = 1; i < s.nchunks; i++)
			a = cr_fadd(a, cr_ld_cg(pt + (i64)i * dv + d));
		o[d] = a;
	}
}

// attn_split_scores_f32(const float* q, const float* k, float* sc, float* st, unsigned* cnt,
//                       int ntok, int heads, int kv_heads, int dk, int kstride, int kh_stride,
//                       const int* posp, int pos0, float scale, int window, const float* sinks,
//                       int ring, int sstride, int splits)
// attn_split_pv_f32(const float* sc, const float* st, const float* v, float* part,
//                   unsigned* cnt, float* out, int ntok, int heads, int kv_heads, int dv,
//                   int vstride, int vh_stride, const int* posp, int pos0, int window,
//                   int ring, int sstride, int splits)
//   attn_f32 in two launches, the first then the second, each on grid (heads, splits, ntok)
//   and block (256, 1, 1) exactly; q, k, v, out, the shapes, posp, pos0, scale, window, sinks
//   and ring as attn_f32's (its layouts and limits, dk <= 1024 and dv <= 512; outputs of NaN
//   where they do not hold).
//   sc     the scores: ntok*heads rows of sstride floats; sstride is at least the positions a
//          token sees plus 15 (the cache's rows plus 16 always are).
//   st     ntok*heads rows of splits+2 floats: the chunks' maxima, then m and 1/sum.
//   part   the chunks' weighted values: ntok*heads*splits rows of dv floats.
//   cnt    ntok*heads counters, 0 before the first launch; each launch leaves them at 0.
//   splits the blocks of a head: its positions go in chunks of a multiple of 16, at least 32,
//          to as many of them as needed (the rest end at once), so splits can be sized for
//          the longest context and a captured launch replayed at any position.
#define ATS_KERNELS(sfx, KV, F16)                                                                                                  \
	extern "C" __global__ void attn_split_scores_##sfx(const float* q, const KV* k, float* sc, float* st, u32* cnt, int ntok, int heads,   \
	                                                   int kv_heads, int dk, int kstride, int kh_stride, const int* posp, int pos0,        \
	                                                   float scale, int window, const float* sinks, int ring, int sstride, int splits) {   \
		ats_scores<KV>(q, k, sc, st, cnt, ntok, heads, kv_heads, dk, kstride, kh_stride, posp, pos0, scale, window, sinks, ring, sstride, \
		               splits, F16);                                                                                                     \
	}                                                                                                                                    \
	extern "C" __global__ void attn_split_pv_##sfx(const float* sc, const float* st, const KV* v, float* part, u32* cnt, float* out,      \
	                                               int ntok, int heads, int kv_heads, int dv, int vstride, int vh_stride, const int* posp, \
	                                               int pos0, int window, int ring, int sstride, int splits) {                              \
		ats_pv<KV>(sc, st, v, part, cnt, out, ntok, heads, kv_heads, dv, vstride, vh_stride, posp, pos0, window, ring, sstride, splits, F16); \
	}
ATS_KERNELS(f32, float, 0)
// attn_split_scores_f16kv, attn_split_pv_f16kv: the same with an F16 cache (k and v of
// unsigned shorts), rounding as attn_f16kv: q before the dot products, each probability
// before it weighs the values.
ATS_KERNELS(f16kv, u16, 1)
