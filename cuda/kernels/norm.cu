// norm.cu: RMSNorm in the arithmetic of models.RMSNorm: the squares are float32 products summed
// in float64, the scale is 1/sqrtf(float32(sum/d) + eps) with correctly rounded float32
// operations, and each output is (x*scale)*w (+ b), rounded at every step. Only the order of
// the float64 additions differs from the CPU, which almost never changes the float32 scale.
#include "common.cuh"

// NORM_REG is how many values of a row each thread holds in registers: a row of up to
// NORM_REG * blockDim.x values (8192 at 1024 threads, 2048 at 256) is read once, all of a
// thread's loads in flight together, and normalised from the registers. A loop that read a
// value, then added its square, waited for memory at every value: on the H200 a 2048-value norm
// took 8.4 us, twice llama.cpp's. A longer row takes the loop. Each thread adds its squares in
// the same order either way (i = threadIdx.x, + blockDim.x, ...), so both give the same bits.
#define NORM_REG 8

// rms_norm_squares is one thread's share of a row's sum of squares: the float32 squares of
// x[i], i = t, t + step, ..., added in float64 in that order.
CR_FN double rms_norm_squares(const float* x, int d, int t, int step) {
	double s = 0.0;
#pragma unroll 4
	for (int i = t; i < d; i += step) {
		const float v = x[i];
		s += (double)cr_fmul(v, v);
	}
	return s;
}

// rms_norm_scale is 1/sqrt(mean + eps) of a row of d values whose squares sum to s.
CR_FN float rms_norm_scale(double s, int d, float eps) { return cr_fdiv(1.0f, cr_fsqrt(cr_fadd((float)(s / (double)d), eps))); }

// rms_norm_value is one normalised value: (v * scale) * w (+ b), rounded at each step, w
// where has_w and b where has_b.
CR_FN float rms_norm_value(float v, float scale, bool has_w, float w, bool has_b, float b) {
	float o = cr_fmul(v, scale);
	if (has_w)
		o = cr_fmul(o, w);
	if (has_b)
		o = cr_fadd(o, b);
	return o;
}

// rms_norm_write normalises x[i] into dst[i] (dst may be x) for i = t, t + step, ...
CR_FN void rms_norm_write(float* dst, const float* x, int d, float scale, const float* w, const float* b, int t, int step) {
	for (int i = t; i < d; i += step)
		dst[i] = rms_norm_value(x[i], scale, w, w ? w[i] : 1.0f, b, b ? b[i] : 0.0f);
}

// rms_norm_row normalises x (d floats) into dst. With add, x + add is the row (x[i] + add[i],
// rounded), stored to xw first: the residual add of add_rms_norm_f32, in the same pass.
CR_FN void rms_norm_row(float* dst, const float* x, const float* add, float* xw, const float* weight, const float* bias, int d,
                        float eps) {
	__shared__ double sh[32];
	const int n = (int)blockDim.x, t = (int)threadIdx.x;
	if (d <= NORM_REG * n) {
		// Every load before the first store, which the compiler cannot move a load above.
		float v[NORM_REG], a[NORM_REG], w[NORM_REG], b[NORM_REG];
#pragma unroll
		for (int k = 0; k < NORM_REG; k++) {
			const int i = t + k * n;
			v[k] = i < d ? x[i] : 0.0f;
			a[k] = i < d && add ? add[i] : 0.0f;
			w[k] = i < d && weight ? weight[i] : 1.0f;
			b[k] = i < d && bias ? bias[i] : 0.0f;
		}
		if (add) {
#pragma unroll
			for (int k = 0; k < NORM_REG; k++) {
				const int i = t + k * n;
				if (i < d) {
					v[k] = cr_fadd(v[k], a[k]);
					xw[i] = v[k];
				}
			}
		}
		double s = 0.0;
#pragma unroll
		for (int k = 0; k < NORM_REG; k++)
			if (t + k * n < d)
				s += (double)cr_fmul(v[k], v[k]);
		const float scale = rms_norm_scale(cr_block_sum_d(s, sh), d, eps);
#pragma unroll
		for (int k = 0; k < NORM_REG; k++) {
			const int i = t + k * n;
			if (i >= d)
				break;
			dst[i] = rms_norm_value(v[k], scale, weight, w[k], bias, b[k]);
		}
		return;
	}
	if (add) {
		// rms_norm's loop below reads each x[i] on the thread that writes it here.
		for (int i = t; i < d; i += n)
			xw[i] = cr_fadd(x[i], add[i]);
		x = xw;
	}
	const float scale = rms_norm_scale(cr_block_sum_d(rms_norm_squares(x, d, t, n), sh), d, eps);
	rms_norm_write(dst, x, d, scale, weight, bias, t, n);
}

// rms_norm_f32(float* dst, const float* x, const float* weight, const float* bias, int d, float eps)
//   Row r (r = blockIdx.x) of x (x + r*d, d floats) normalised to dst + r*d:
//   dst = x / sqrt(mean(x^2) + eps) * weight (+ bias), with weight and bias d floats each, and
//   either may be NULL (no multiplication / no addition). dst may equal x (in place).
//   Per-head norms (Qwen3's q/k norm) are this kernel with rows = ntok*heads, d = head_dim and a
//   weight of head_dim values: the heads of a row of heads*head_dim are consecutive rows here.
//   grid (rows, 1, 1); block (256, 1, 1) (any multiple of 32 up to 1024); no dynamic shared memory.
extern "C" __global__ void rms_norm_f32(float* dst, const float* x, const float* weight, const float* bias, int d, float eps) {
	const i64 r = blockIdx.x;
	rms_norm_row(dst + r * d, x + r * d, 0, 0, weight, bias, d, eps);
}

// rms_norm_strided_f32(float* dst, const float* x, const float* weight, const float* bias, int d,
//                      float eps, int dst_stride, int x_stride)
//   rms_norm_f32 for rows that are not packed: row r is x + r*x_stride (d floats normalised) and
//   goes to dst + r*dst_stride; the values between d and the stride are not touched. (DeepSeek's
//   MLA normalises the first rank values of each kv_a row of rank+rope values this way.)
//   grid (rows, 1, 1); block (256, 1, 1) (any multiple of 32 up to 1024); no dynamic shared memory.
extern "C" __global__ void rms_norm_strided_f32(float* dst, const float* x, const float* weight, const float* bias, int d,
                                                float eps, int dst_stride, int x_stride) {
	const i64 r = blockIdx.x;
	rms_norm_row(dst + r * dst_stride, x + r * x_stride, 0, 0, weight, bias, d, eps);
}
