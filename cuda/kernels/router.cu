// router.cu: the MoE gating (llama.cpp build_moe_ffn; the engine's route, gateProbs,
// gateWeights and topK in engine/moe.go).
#include "common.cuh"

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
	x += (i64)blockIdx.x * n;
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
	const int r = blockIdx.x, lane = threadIdx.x;
	if (r >= rows)
		return;
	p += (i64)r * n;
	ids += (i64)r * k;
	w += (i64)r * k;
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
		if (lane == 0) {
			int id = bi >= 0 ? bi : j;
			ids[j] = id;
			w[j] = p[id];
		}
		__syncthreads(); // ids[j] is read by every lane in the next round
	}
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
	w += r * k;
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
