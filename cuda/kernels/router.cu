// router.cu: the MoE gating (llama.cpp build_moe_ffn; the engine's route, gateProbs,
// gateWeights and topK in engine/moe.go).
#include "common.cuh"

// cr_softmax_block replaces the n values at x by their softmax, computed by the whole block
// in the arithmetic of models.Softmax (see softmax_rows_f32). shm and shd: 32 floats and 32
// doubles of shared memory.
CR_FN void cr_softmax_block(float* x, int n, float* shm, double* shd) {
	float m = -cr_inf();
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		m = x[i] > m ? x[i] : m;
	m = cr_block_max(m, shm);
	const int groups = n / 16;
	double s = 0.0;
	for (int g = threadIdx.x; g < groups; g += blockDim.x) {
		float e[16];
#pragma unroll
		for (int l = 0; l < 16; l++) {
			e[l] = cr_exp_v(x[16 * g + l] - m);
			x[16 * g + l] = e[l];
		}
		s += (double)cr_hsum16(e);
	}
	for (int i = 16 * groups + threadIdx.x; i < n; i += blockDim.x) {
		float e = cr_expf(x[i] - m);
		x[i] = e;
		s += (double)e;
	}
	s = cr_block_sum_d(s, shd); // its barrier also orders the writes above before the reads below
	const float inv = (float)(1.0 / s);
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		x[i] = cr_fmul(x[i], inv);
}

// cr_topk_warp writes to ids[0..k) the k largest selection scores' indices among p[i] +
// bias[i] (bias NULL: p[i]), computed by one warp, as topk_f32 describes. ids must be visible
// to the whole warp (shared or global memory).
CR_FN void cr_topk_warp(const float* p, const float* bias, int n, int k, int* ids) {
	const int lane = threadIdx.x;
	for (int j = 0; j < k; j++) {
		// Each lane's best unchosen candidate among i = lane, lane+32, ...; then the warp's.
		float best = 0.0f;
		int bi = -1;
		for (int i = lane; i < n; i += CR_WARP) {
			float s = bias ? cr_fadd(p[i], bias[i]) : p[i];
			if (s != s)
				continue;
			bool taken = false;
			for (int q = 0; q < j; q++)
				taken |= ids[q] == i;
			if (taken)
				continue;
			if (bi < 0 || s > best) { // i grows: an equal score keeps the lower index
				best = s;
				bi = i;
			}
		}
		for (int m = 16; m > 0; m >>= 1) {
			float ob = cr_shfl_xor(best, m);
			int oi = (int)cr_shfl_xor_u32((u32)bi, m);
			bool better = oi >= 0 && (bi < 0 || ob > best || (ob == best && oi < bi));
			if (better) {
				best = ob;
				bi = oi;
			}
		}
		if (lane == 0)
			ids[j] = bi >= 0 ? bi : j;
		__syncthreads(); // ids[j] is read by every lane in the next round
	}
}

// cr_gate_weights finishes k chosen experts' weights w in place, as norm_weights_f32
// describes (one thread).
CR_FN void cr_gate_weights(float* w, int k, int softmax, int normalize, float scale) {
	if (softmax) {
		float m = -cr_inf();
		for (int i = 0; i < k; i++)
			m = w[i] > m ? w[i] : m;
		double s = 0.0;
		int i = 0;
		for (; i + 16 <= k; i += 16) {
			float e[16];
#pragma unroll
			for (int l = 0; l < 16; l++) {
				e[l] = cr_exp_v(w[i + l] - m);
				w[i + l] = e[l];
			}
			s += (double)cr_hsum16(e);
		}
		for (; i < k; i++) {
			float e = cr_expf(w[i] - m);
			w[i] = e;
			s += (double)e;
		}
		const float inv = (float)(1.0 / s);
		for (int j = 0; j < k; j++)
			w[j] = cr_fmul(w[j], inv);
	}
	if (normalize) {
		double s = 0.0;
		for (int i = 0; i < k; i++)
			s += (double)w[i];
		float sum = (float)s;
		sum = sum > 6.103515625e-5f ? sum : 6.103515625e-5f;
		for (int i = 0; i < k; i++)
			w[i] = cr_fdiv(w[i], sum);
	}
	if (scale != 0.0f)
		for (int i = 0; i < k; i++)
			w[i] = cr_fmul(w[i], scale);
}

// softmax_rows_f32(float* x, int n, int rows)
//   Each row of n values (row r at x + r*n, r = blockIdx.x) replaced by its softmax, in the
//   arithmetic of models.Softmax: the maximum subtracted, exps of 16-value groups by cr_exp_v
//   (ggml_v_expf) summed in the order of _mm512_reduce_add_ps, the last n%16 by glibc's expf,
//   the sums accumulated in float64, then every value multiplied by float32(1/sum). Only the
//   order of the float64 additions differs from the CPU.
//   grid (rows, 1, 1); block (256, 1, 1) (any multiple of 32 up to 1024); no dynamic shared memory.
extern "C" __global__ void softmax_rows_f32(float* x, int n, int rows) {
	__shared__ float shm[32];
	__shared__ double shd[32];
	if ((int)blockIdx.x >= rows)
		return;
	cr_softmax_block(x + (i64)blockIdx.x * n, n, shm, shd);
}

// sigmoid_f32(float* x, int n): x[i] = 1 / (1 + exp(-x[i])) for i < n, with glibc's expf
// (models.Sigmoid, bit for bit). grid (ceil(n/256), 1, 1), block (256, 1, 1), grid-stride loop.
extern "C" __global__ void sigmoid_f32(float* x, int n) {
	for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
		x[i] = cr_fdiv(1.0f, cr_fadd(1.0f, cr_expf(-x[i])));
}

// topk_f32(const float* p, const float* bias, int n, int k, int rows, int* ids, float* w)
//   For each row r (r = blockIdx.x) of n gating probabilities p + r*n: the k experts with the
//   largest selection scores s[i] = p[i] + bias[i] (bias: n floats shared by all rows, or NULL
//   for s = p), largest first, ties to the lower index, NaN scores never chosen (engine topK).
//   Writes ids[r*k + j] = the j-th choice and w[r*k + j] = p[that expert] (the unbiased
//   probability). If fewer than k scores are not NaN, the missing choices are j itself, as the
//   engine does. 1 <= k <= n.
//   grid (rows, 1, 1); block (32, 1, 1) (one warp; exactly 32 threads); no dynamic shared memory.
extern "C" __global__ void topk_f32(const float* p, const float* bias, int n, int k, int rows, int* ids, float* w) {
	const int r = blockIdx.x;
	if (r >= rows)
		return;
	p += (i64)r * n;
	ids += (i64)r * k;
	w += (i64)r * k;
	cr_topk_warp(p, bias, n, k, ids);
	if (threadIdx.x == 0)
		for (int j = 0; j < k; j++)
			w[j] = p[ids[j]];
}

// norm_weights_f32(float* w, int k, int rows, int softmax, int normalize, float scale)
//   The chosen experts' weights of each row (w + r*k, k values) finished as the engine's
//   gateWeights: if softmax != 0, w = softmax(w) (gating softmax_weight, models.Softmax's
//   arithmetic); if normalize != 0, w /= max(float32(sum of w in float64), 6.103515625e-5);
//   then if scale != 0, w *= scale.
//   grid (ceil(rows / 256), 1, 1); block (256, 1, 1): one thread per row; no shared memory.
extern "C" __global__ void norm_weights_f32(float* w, int k, int rows, int softmax, int normalize, float scale) {
	const i64 r = (i64)blockIdx.x * blockDim.x + threadIdx.x;
	if (r >= rows)
		return;
	cr_gate_weights(w + r * k, k, softmax, normalize, scale);
}

// CR_COMMIT_MAX_EXPERTS bounds commit_weights_f32's experts (its probabilities live in shared
// memory) and CR_COMMIT_MAX_USED its experts per token (device.CommitMaxExperts and
// CommitMaxUsed).
#define CR_COMMIT_MAX_EXPERTS 512
#define CR_COMMIT_MAX_USED 16

// cr_member says whether e is one of the k values of ids.
CR_FN bool cr_member(const int* ids, int k, int e) {
	for (int j = 0; j < k; j++)
		if (ids[j] == e)
			return true;
	return false;
}

// route_topk_seq is models.TopK run by one thread: the indices of the k largest of v[0..n) in
// order, an earlier index first among equals, NaNs skipped, and where fewer than k are not
// NaN the missing ones padded with their positions.
CR_FN void route_topk_seq(const float* v, int n, int k, int* idx) {
	int m = 0;
	for (int i = 0; i < n; i++) {
		const float x = v[i];
		if (x != x)
			continue;
		int pos = m;
		while (pos > 0 && v[idx[pos - 1]] < x)
			pos--;
		if (pos >= k)
			continue;
		if (m < k)
			m++;
		for (int j = m - 1; j > pos; j--)
			idx[j] = idx[j - 1];
		idx[pos] = i;
	}
	for (; m < k; m++)
		idx[m] = m;
}

// route_groups writes to sel the selection scores p (+ bias) with every expert outside the
// used best of its groups at -Inf, as models.groupLimited: a group scores the sum of its two
// best. keep: ROUTE_MAX_GROUPS ints of shared memory. Every thread of the block must call it.
#define ROUTE_MAX_GROUPS 64
CR_FN void route_groups(const float* p, const float* bias, int n, int groups, int used, float* sel, int* keep) {
	const int tid = threadIdx.x, per = n / groups;
	for (int i = tid; i < n; i += blockDim.x)
		sel[i] = bias ? cr_fadd(p[i], bias[i]) : p[i];
	__syncthreads();
	if (tid == 0) {
		float score[ROUTE_MAX_GROUPS];
		int top[ROUTE_MAX_GROUPS];
		for (int g = 0; g < groups; g++) {
			route_topk_seq(sel + g * per, per, 2, top);
			score[g] = cr_fadd(sel[g * per + top[0]], sel[g * per + top[1]]);
			keep[g] = 0;
		}
		route_topk_seq(score, groups, used, top);
		for (int j = 0; j < used; j++)
			keep[top[j]] = 1;
	}
	__syncthreads();
	for (int i = tid; i < n; i += blockDim.x)
		if (!keep[i / per])
			sel[i] = -cr_inf();
	__syncthreads();
}

// commit_weights_f32(const float* logits, const float* bias, int n, int k, int gating,
//     int normalize, float scale, const int* pred, int owa, double alpha1, double alpha2,
//     int min_correct, int max_correct, float* w, float* rec, int groups, int groups_used)
//   Committed routing of one token (the engine's commitRouting; CommitMoE §4.3), so that the
//   host enqueues the experts it committed to without reading the router's logits first.
//   From the n router logits and the model's gating (gating 0: softmax, 1: sigmoid, 2: softmax
//   over the chosen logits; bias: the selection bias, or NULL; normalize and scale as in
//   norm_weights_f32) it routes the token as topk_f32 does (the router's own top-k, "truth"),
//   then writes the mixing weights of the k predicted experts pred to w:
//   - Output Weight Adjustment (owa != 0, package owa's Adjust) when the number of predicted
//     experts in truth is in [min_correct, max_correct] and they carry some score: every
//     expert's score is the weight it would get beside truth (owaScores), a correct one's is
//     multiplied by (1 + missed/correct) * alpha1, and all are rescaled to truth's total
//     times alpha2, in float64 as the engine does;
//   - else the router's probabilities of the predicted experts finished as norm_weights_f32
//     (commitRoute).
//   rec receives what the host reads later, for its statistics: rec[j] = truth's j-th expert
//   (j < k) and rec[k] = 1 if OWA applied, else 0, as floats.
//   With groups > 1 truth is chosen among the groups_used best of groups equal groups only,
//   as moe_route_f32 chooses (models.groupLimited; n % groups == 0, at least 2 experts a
//   group, groups <= ROUTE_MAX_GROUPS).
//   n <= CR_COMMIT_MAX_EXPERTS, 1 <= k <= min(n, CR_COMMIT_MAX_USED).
//   grid (1, 1, 1); block (32, 1, 1) (one warp); no dynamic shared memory.
extern "C" __global__ void commit_weights_f32(const float* logits, const float* bias, int n, int k, int gating,
                                              int normalize, float scale, const int* pred, int owa, double alpha1,
                                              double alpha2, int min_correct, int max_correct, float* w, float* rec,
                                              int groups, int groups_used) {
	__shared__ float p[CR_COMMIT_MAX_EXPERTS], sel[CR_COMMIT_MAX_EXPERTS];
	__shared__ int keep[ROUTE_MAX_GROUPS];
	__shared__ int truth[CR_COMMIT_MAX_USED];
	__shared__ float shm[32];
	__shared__ double shd[32];
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		p[i] = logits[i];
	__syncthreads();
	if (gating == 0) {
		cr_softmax_block(p, n, shm, shd);
	} else if (gating == 1) {
		for (int i = threadIdx.x; i < n; i += blockDim.x)
			p[i] = cr_fdiv(1.0f, cr_fadd(1.0f, cr_expf(-p[i])));
	}
	__syncthreads();
	if (groups > 1) {
		route_groups(p, bias, n, groups, groups_used, sel, keep);
		cr_topk_warp(sel, 0, n, k, truth);
	} else {
		cr_topk_warp(p, bias, n, k, truth);
	}
	if (threadIdx.x != 0)
		return;

	int correct_n = 0;
	for (int j = 0; j < k; j++)
		correct_n += cr_member(truth, k, pred[j]);
	bool adjusted = false;
	if (owa && correct_n >= min_correct && correct_n <= max_correct && correct_n > 0) {
		// The scores of owaScores: the gating's probability (for gating 2, the exp of the
		// logit less truth's largest, over truth's sum), renormalised over truth when the
		// model renormalises, times its scale.
		float mx = -cr_inf(), d1 = 1.0f, d2 = 1.0f;
		if (gating == 2) {
			for (int j = 0; j < k; j++)
				mx = logits[truth[j]] > mx ? logits[truth[j]] : mx;
			double s = 0.0;
			for (int j = 0; j < k; j++)
				s += (double)cr_expf(cr_fadd(logits[truth[j]], -mx));
			d1 = (float)s > 6.103515625e-5f ? (float)s : 6.103515625e-5f;
		}
#define CR_OWA_BASE(e) (gating == 2 ? cr_fdiv(cr_expf(cr_fadd(logits[e], -mx)), d1) : p[e])
		if (normalize) {
			double s = 0.0;
			for (int j = 0; j < k; j++)
				s += (double)CR_OWA_BASE(truth[j]);
			d2 = (float)s > 6.103515625e-5f ? (float)s : 6.103515625e-5f;
		}
#define CR_OWA_SCORE(e) (normalize ? cr_fdiv(CR_OWA_BASE(e), d2) : CR_OWA_BASE(e))
		double correct = 0.0, missed = 0.0;
		for (int j = 0; j < k; j++) {
			float sc = CR_OWA_SCORE(truth[j]);
			if (scale != 0.0f)
				sc = cr_fmul(sc, scale);
			if (cr_member(pred, k, truth[j]))
				correct = cr_dadd(correct, (double)sc);
			else
				missed = cr_dadd(missed, (double)sc);
		}
		if (correct > 0.0) {
			const double boost = cr_dmul(cr_dadd(1.0, missed / correct), alpha1);
			double g[CR_COMMIT_MAX_USED], sum = 0.0;
			for (int j = 0; j < k; j++) {
				float sc = CR_OWA_SCORE(pred[j]);
				if (scale != 0.0f)
					sc = cr_fmul(sc, scale);
				g[j] = (double)sc;
				if (cr_member(truth, k, pred[j]))
					g[j] = cr_dmul(g[j], boost);
				sum = cr_dadd(sum, g[j]);
			}
			const double rescale = cr_dmul(cr_dadd(correct, missed) / sum, alpha2);
			for (int j = 0; j < k; j++)
				w[j] = (float)cr_dmul(g[j], rescale);
			adjusted = true;
		}
#undef CR_OWA_SCORE
#undef CR_OWA_BASE
	}
	if (!adjusted) {
		for (int j = 0; j < k; j++)
			w[j] = p[pred[j]];
		cr_gate_weights(w, k, gating == 2, normalize, scale);
	}
	for (int j = 0; j < k; j++)
		rec[j] = (float)truth[j];
	rec[k] = adjusted ? 1.0f : 0.0f;
}
