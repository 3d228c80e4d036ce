// deltanet.cu: a gated DeltaNet layer between its products (device.Ops.GatedDeltaNet,
// models.HostOps.GatedDeltaNet: llama.cpp's CPU gated_delta_net, token after token), in four
// launches: the causal convolution with its state; q and k to unit length, beta's sigmoid and
// the decay, in parallel over the tokens; each value head's recurrence; and its gated norm. Sums add in other orders than the CPU's (warp and block reductions), so results
// agree to float32 rounding, not bit for bit.
#include "common.cuh"

#define DN_MAX_TAPS 8
#define DN_MAX_DIM 256
#define DN_THREADS 128
#define DN_WARPS (DN_THREADS / CR_WARP)

// dn_log is log(x) for x >= 1 in double, rounded once to float (models.logf: Go's math.Log
// of the float): x = 2^e * m with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m-1)/(m+1)) by
// its series, to about 1e-17.
CR_FN float dn_log(float x) {
	u64 b = cr_d_bits((double)x);
	int e = (int)((b >> 52) & 0x7ff) - 1023;
	double m = cr_as_d((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
	if (m > 1.4142135623730951) {
		m = m * 0.5;
		e++;
	}
	const double f = (m - 1.0) / (m + 1.0), s = f * f;
	double p = 1.0 / 23.0;
	for (int k = 21; k >= 1; k -= 2)
		p = p * s + 1.0 / (double)k;
	return (float)(2.0 * f * p + (double)e * 0.6931471805599453);
}

// dn_softplus is models.softplus: x above 20, else log(1 + e^x).
CR_FN float dn_softplus(float x) { return x > 20.0f ? x : dn_log(cr_fadd(1.0f, cr_expf(x))); }

// dn_silu is models.SiLU of a value at position c of a row of n: ggml_v_silu's arithmetic for
// the row's 16-wide vectors, ggml_silu_f32's (glibc's expf) for the rest.
CR_FN float dn_silu(float x, int c, int n) {
	const float e = c < (n & ~15) ? cr_exp_v(0.0f - x) : cr_expf(-x);
	return cr_fdiv(x, cr_fadd(1.0f, e));
}

// deltanet_conv_f32(const float* qkv, float* conv, float* cst, float* csnap, const float* w,
//                   int ch, int taps, int ntok)
//   The causal convolution of ntok rows of ch channels (qkv) after the state cst (taps-1
//   inputs per channel, channel c's at c*(taps-1), oldest first), each output's taps summed
//   tap by tap with fused multiply-adds from 0 (w: channel c's taps at c*taps, oldest first),
//   and its SiLU (dn_silu) into conv. cst moves on to the last taps-1 inputs; csnap, when not
//   NULL, receives those before the last token. 2 <= taps <= 8.
//   grid (ceil(ch / 256), 1, 1); block (256, 1, 1): a thread per channel.
extern "C" __global__ void deltanet_conv_f32(const float* qkv, float* conv, float* cst, float* csnap, const float* w, int ch, int taps,
                                             int ntok) {
	const int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= ch || taps < 2 || taps > DN_MAX_TAPS)
		return;
	const int K1 = taps - 1;
	float* st = cst + (i64)c * K1;
	// in(j): input j of the channel, the state's K1 then qkv's rows.
#define DN_IN(j) ((j) < K1 ? st[(j)] : qkv[(i64)((j) - K1) * ch + c])
	float wk[DN_MAX_TAPS];
	for (int k = 0; k < taps; k++)
		wk[k] = w[(i64)c * taps + k];
	for (int t = 0; t < ntok; t++) {
		float sum = 0.0f;
		for (int k = 0; k < taps; k++)
			sum = cr_fma(DN_IN(t + k), wk[k], sum);
		conv[(i64)t * ch + c] = dn_silu(sum, c, ch);
	}
	float keep[DN_MAX_TAPS];
	if (csnap) {
		for (int j = 0; j < K1; j++)
			keep[j] = DN_IN(ntok - 1 + j);
		for (int j = 0; j < K1; j++)
			csnap[(i64)c * K1 + j] = keep[j];
	}
	for (int j = 0; j < K1; j++)
		keep[j] = DN_IN(ntok + j);
	for (int j = 0; j < K1; j++)
		st[j] = keep[j];
#undef DN_IN
}

// dn_sumsq is the sum of the squares of v[0..n) (shared memory), each a float32 product, in
// float64 over the block; every thread gets it.
CR_FN double dn_sumsq(const float* v, int n, double* sd) {
	double s = 0.0;
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s += (double)cr_fmul(v[i], v[i]);
	return cr_block_sum_d(s, sd);
}

// dn_rms_scale is RMSNorm's 1/sqrtf(mean + eps) of a sum of n squares (models.RMSNorm).
CR_FN float dn_rms_scale(double sum, int n, float eps) {
	return cr_fdiv(1.0f, cr_fsqrt(cr_fadd((float)(sum / (double)n), eps)));
}

// deltanet_prep_f32(float* conv, float* beta, float* alpha, const float* dt_bias, const float* a,
//                   int kheads, int vheads, int n, int ntok, float eps)
//   What deltanet_rec_f32 reads of each token that does not depend on the state, in place and
//   in parallel over the tokens, so that the recurrence's chain from token to token holds no
//   reduction over a block and no float64: q or k head blockIdx.y (of 2*kheads: the convolved q
//   of every key head, then their k, n values a head) of token t = blockIdx.x's row of conv
//   (rows of (2*kheads + vheads)*n) to unit length (RMSNorm with eps/n, times 1/sqrt(n)); and,
//   on the blocks of blockIdx.y 0, token t's beta (vheads values) to its sigmoid and alpha to
//   the decay expf(softplus(alpha + dt_bias[h]) * a[h]). n % 32 == 0, n <= 256.
//   grid (ntok, 2*kheads, 1); block (128, 1, 1) exactly (the order of dn_sumsq's sum).
extern "C" __global__ void deltanet_prep_f32(float* conv, float* beta, float* alpha, const float* dt_bias, const float* a, int kheads,
                                             int vheads, int n, int ntok, float eps) {
	__shared__ double sd[32];
	const int t = blockIdx.x, y = blockIdx.y;
	if (t >= ntok || y >= 2 * kheads || n % CR_WARP != 0 || n > DN_MAX_DIM)
		return;
	float* x = conv + (i64)t * (2 * kheads + vheads) * n + (i64)y * n;
	const float inv = cr_fdiv(1.0f, cr_fsqrt((float)n));
	// Each thread reads and writes only its own values, the block's sum between.
	const float sc = dn_rms_scale(dn_sumsq(x, n, sd), n, cr_fdiv(eps, (float)n));
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		x[i] = cr_fmul(cr_fmul(x[i], sc), inv);
	if (y == 0)
		for (int h = threadIdx.x; h < vheads; h += blockDim.x) {
			const i64 k = (i64)t * vheads + h;
			beta[k] = cr_fdiv(1.0f, cr_fadd(1.0f, cr_expf(-beta[k])));
			alpha[k] = cr_expf(cr_fmul(dn_softplus(cr_fadd(alpha[k], dt_bias[h])), a[h]));
		}
}

// deltanet_rec_f32(const float* conv, const float* beta, const float* decay, float* s, float* snap,
//                  float* o, int kheads, int vheads, int n, int ntok)
//   Rows blockIdx.y*4 .. blockIdx.y*4+3 of value head h = blockIdx.x's gated DeltaNet over ntok
//   tokens after deltanet_prep_f32, as models.deltaJob.head: for each token t, its row of conv
//   gives the unit q and k of key head h % kheads and v of h (the q of every key head, then
//   their k, then every value head's v, n values a head); the head's matrix (s + h*n*n,
//   transposed: row j is column j of S) decays by decay[t*vheads + h], each row r moves by k
//   times (v[r] - row r . k) * beta[t*vheads + h], and (row r . q)/sqrt(n) goes to
//   o + (t*vheads + h)*n + r, before the gated norm (deltanet_norm_f32). snap, when not NULL,
//   receives the rows after token ntok-2. n % 32 == 0, n <= 256.
//   grid (vheads, n/4, 1); block (128, 1, 1): a warp per row, the row in registers from the
//   first token to the last, so that a pass reads and writes the state once and a head's rows
//   run on n/4 blocks (llama.cpp's CUDA gated_delta_net spreads them so too). The warps never
//   wait for each other, and each loads a token's inputs while it computes the one before.
extern "C" __global__ void deltanet_rec_f32(const float* conv, const float* beta, const float* decay, float* s, float* snap, float* o,
                                            int kheads, int vheads, int n, int ntok) {
	const int h = blockIdx.x, lane = threadIdx.x % CR_WARP;
	const int r = blockIdx.y * DN_WARPS + threadIdx.x / CR_WARP;
	if (h >= vheads || n % CR_WARP != 0 || n > DN_MAX_DIM || r >= n || ntok < 1)
		return;
	const int kh = h % kheads, ch = (2 * kheads + vheads) * n, per = n / CR_WARP;
	const float* qp = conv + kh * n + lane;
	const float* kp = conv + (kheads + kh) * n + lane;
	const float* vp = conv + (2 * kheads + h) * n + r;
	float* Mr = s + ((i64)h * n + r) * n + lane;
	// The loops run to the bound, guarded, so that the arrays' indices are constants and the
	// arrays stay in registers.
	float m[DN_MAX_DIM / CR_WARP], q[DN_MAX_DIM / CR_WARP], k[DN_MAX_DIM / CR_WARP];
#pragma unroll
	for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
		if (j < per) {
			m[j] = Mr[CR_WARP * j];
			q[j] = qp[CR_WARP * j];
			k[j] = kp[CR_WARP * j];
		}
	float v = vp[0], b = beta[h], dc = decay[h];
	const float inv = cr_fdiv(1.0f, cr_fsqrt((float)n));
	for (int t = 0; t < ntok; t++) {
		// Token t+1's inputs, loaded before token t's chain needs the load units' results.
		const int tn = t + 1 < ntok ? t + 1 : t;
		const i64 rn = (i64)tn * ch, gn = (i64)tn * vheads + h;
		float qn[DN_MAX_DIM / CR_WARP], kn[DN_MAX_DIM / CR_WARP];
#pragma unroll
		for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
			if (j < per) {
				qn[j] = qp[rn + CR_WARP * j];
				kn[j] = kp[rn + CR_WARP * j];
			}
		const float vn = vp[rn], bn = beta[gn], dn = decay[gn];
		float d = 0.0f;
#pragma unroll
		for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
			if (j < per) {
				m[j] = cr_fmul(m[j], dc);
				d = cr_fma(m[j], k[j], d);
			}
		const float delta = cr_fmul(cr_fadd(v, -cr_warp_sum(d)), b);
		float y = 0.0f;
#pragma unroll
		for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
			if (j < per) {
				m[j] = cr_fma(k[j], delta, m[j]);
				y = cr_fma(m[j], q[j], y);
			}
		if (snap && t == ntok - 2) {
			float* Sr = snap + ((i64)h * n + r) * n + lane;
#pragma unroll
			for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
				if (j < per)
					Sr[CR_WARP * j] = m[j];
		}
		y = cr_fmul(cr_warp_sum(y), inv);
		if (lane == 0)
			o[((i64)t * vheads + h) * n + r] = y;
#pragma unroll
		for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
			if (j < per) {
				q[j] = qn[j];
				k[j] = kn[j];
			}
		v = vn, b = bn, dc = dn;
	}
#pragma unroll
	for (int j = 0; j < DN_MAX_DIM / CR_WARP; j++)
		if (j < per)
			Mr[CR_WARP * j] = m[j];
}

// deltanet_norm_f32(float* o, const float* z, const float* norm_w, const float* norm_b,
//                   int n, int rows, float eps)
//   The gated norm after deltanet_rec_f32, in place: row blockIdx.x of o (rows of n values,
//   a token's value head each) to its RMSNorm (norm_w, norm_b: n floats, norm_b may be NULL)
//   times silu(z's row). A head's rows are spread over blocks in deltanet_rec_f32, so its
//   norm, which needs all of them, is a launch of its own.
//   grid (rows, 1, 1); block (128, 1, 1) exactly (the order of dn_sumsq's sum).
extern "C" __global__ void deltanet_norm_f32(float* o, const float* z, const float* norm_w, const float* norm_b, int n, int rows,
                                             float eps) {
	__shared__ double sd[32];
	if ((int)blockIdx.x >= rows)
		return;
	float* ot = o + (i64)blockIdx.x * n;
	const float* zt = z + (i64)blockIdx.x * n;
	// Each thread reads and writes only its own values, and the block's sum lies between, so
	// the norm can overwrite its input.
	const float os = dn_rms_scale(dn_sumsq(ot, n, sd), n, eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		float y = cr_fmul(cr_fmul(ot[i], os), norm_w[i]);
		if (norm_b)
			y = cr_fadd(y, norm_b[i]);
		ot[i] = cr_fmul(y, dn_silu(zt[i], i, n));
	}
}
