// norm.cu: RMSNorm in the arithmetic of models.RMSNorm: the squares are float32 products summed
// in float64, the scale is 1/sqrtf(float32(sum/d) + eps) with correctly rounded float32
// operations, and each output is (x*scale)*w (+ b), rounded at every step. Only the order of
// the float64 additions differs from the CPU, which almost never changes the float32 scale.
#include "common.cuh"

CR_FN void rms_norm_row(float* dst, const float* x, const float* weight, const float* bias, int d, float eps) {
	__shared__ double sh[32];
	double s = 0.0;
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float v = x[i];
		s += (double)cr_fmul(v, v);
	}
	s = cr_block_sum_d(s, sh);
	float mean = (float)(s / (double)d);
	float scale = cr_fdiv(1.0f, cr_fsqrt(cr_fadd(mean, eps)));
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float v = cr_fmul(x[i], scale);
		if (weight)
			v = cr_fmul(v, weight[i]);
		if (bias)
			v = cr_fadd(v, bias[i]);
		dst[i] = v;
	}
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
	rms_norm_row(dst + r * d, x + r * d, weight, bias, d, eps);
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
	rms_norm_row(dst + r * dst_stride, x + r * x_stride, weight, bias, d, eps);
}
