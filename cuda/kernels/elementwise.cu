// elementwise.cu: element-wise kernels. Unless a kernel says otherwise:
//   grid (ceil(n / 256), 1, 1), block (256, 1, 1); each thread walks a grid-stride loop, so any
//   grid and block work (a grid capped at, say, 1024 blocks is fine); no shared memory.
//   Pointers are device pointers to float32 (or to halves as unsigned short) with no alignment
//   beyond their element's.
#include "common.cuh"

#define EW_LOOP(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (i64)(n); i += (i64)gridDim.x * blockDim.x)

// add_f32(float* dst, const float* src, int n): dst[i] += src[i] for i < n (the residual).
extern "C" __global__ void add_f32(float* dst, const float* src, int n) {
	EW_LOOP(i, n)
	dst[i] = cr_fadd(dst[i], src[i]);
}

// add_rows_f32(float* x, const float* bias, int n, int d): x[i] += bias[i % d] for i < n
// (a bias of d values added to every row of d values; n a multiple of d).
extern "C" __global__ void add_rows_f32(float* x, const float* bias, int n, int d) {
	EW_LOOP(i, n)
	x[i] = cr_fadd(x[i], bias[i % d]);
}

// swiglu_f32(float* g, const float* u, int n): g[i] = silu(g[i]) * u[i] for i < n, with
// silu(v) = v / (1 + exp(-v)) in the arithmetic of ggml_v_silu (models.SwiGLU's 16-wide path:
// the exp is cr_exp_v, the division and product correctly rounded). models.SwiGLU computes the
// last len%16 values of each row with glibc's expf instead; rows of a multiple of 16 values, as
// every expert width is, match it bit for bit.
extern "C" __global__ void swiglu_f32(float* g, const float* u, int n) {
	EW_LOOP(i, n) {
		float v = g[i];
		g[i] = cr_fmul(cr_fdiv(v, cr_fadd(1.0f, cr_exp_v(0.0f - v))), u[i]);
	}
}

// swiglu_oai_f32(float* g, const float* u, int n, float alpha, float limit): gpt-oss's clamped
// SwiGLU, g[i] = x / (1 + expf(alpha * -x)) * (y + 1) with x = min(g[i], limit) and y = u[i]
// clamped to [-limit, limit], in models.SwiGLUOAI's arithmetic (glibc's expf, each operation
// rounded), so bit for bit.
CR_FN float ew_swiglu_oai(float x, float y, float alpha, float limit) {
	if (limit < x)
		x = limit;
	if (y < -limit)
		y = -limit;
	else if (limit < y)
		y = limit;
	return cr_fmul(cr_fdiv(x, cr_fadd(1.0f, cr_expf(cr_fmul(alpha, -x)))), cr_fadd(y, 1.0f));
}

extern "C" __global__ void swiglu_oai_f32(float* g, const float* u, int n, float alpha, float limit) {
	EW_LOOP(i, n)
	g[i] = ew_swiglu_oai(g[i], u[i], alpha, limit);
}

// mul_sigmoid_f32(float* x, const float* gate, int n): x[i] *= 1 / (1 + expf(-gate[i])) for
// i < n (models.HostOps.MulSigmoid: ggml_sigmoid with glibc's expf, then the product).
extern "C" __global__ void mul_sigmoid_f32(float* x, const float* gate, int n) {
	EW_LOOP(i, n)
	x[i] = cr_fmul(x[i], cr_fdiv(1.0f, cr_fadd(1.0f, cr_expf(-gate[i]))));
}

// mul_f32(float* dst, const float* src, int n): dst[i] *= src[i] for i < n.
extern "C" __global__ void mul_f32(float* dst, const float* src, int n) {
	EW_LOOP(i, n)
	dst[i] = cr_fmul(dst[i], src[i]);
}

// scale_f32(float* x, float s, int n): x[i] *= s for i < n.
extern "C" __global__ void scale_f32(float* x, float s, int n) {
	EW_LOOP(i, n)
	x[i] = cr_fmul(x[i], s);
}

// scale_add_f32(float* dst, const float* src, float w, int n): dst[i] += w*src[i] for i < n,
// the product rounded before the sum (ggml_mul then ggml_add, as the engine's combine).
extern "C" __global__ void scale_add_f32(float* dst, const float* src, float w, int n) {
	EW_LOOP(i, n)
	dst[i] = cr_fadd(dst[i], cr_fmul(w, src[i]));
}

// combine_f32(float* out, const float* ys, const float* weights, int k, int d)
//   One token's expert outputs summed into out: for i < d,
//   out[i] += w[0]*ys[i] + w[1]*ys[d+i] + ... + w[k-1]*ys[(k-1)*d+i], each product rounded and
//   added in turn to a sum that starts at 0 (the engine's combine), the sum then added to out
//   (out starting at 0 gives the engine's result exactly).
//   Several tokens: grid.y = ntok, token t reading ys + t*k*d and weights + t*k and writing
//   out + t*d. grid (ceil(d / 256), ntok, 1); block (256, 1, 1).
extern "C" __global__ void combine_f32(float* out, const float* ys, const float* weights, int k, int d) {
	const i64 t = blockIdx.y;
	out += t * d;
	ys += t * k * (i64)d;
	weights += t * k;
	for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < d; i += (i64)gridDim.x * blockDim.x) {
		float s = 0.0f;
		for (int j = 0; j < k; j++)
			s = cr_fadd(s, cr_fmul(weights[j], ys[(i64)j * d + i]));
		out[i] = cr_fadd(out[i], s);
	}
}

// f32_to_f16(unsigned short* dst, const float* src, int n): dst[i] = the IEEE half nearest to
// src[i] (ties to even, overflow to infinity: quant.FP32ToFP16) for i < n.
extern "C" __global__ void f32_to_f16(u16* dst, const float* src, int n) {
	EW_LOOP(i, n)
	dst[i] = cr_f2h(src[i]);
}

// f16_to_f32(float* dst, const unsigned short* src, int n): dst[i] = the half src[i] widened.
extern "C" __global__ void f16_to_f32(float* dst, const u16* src, int n) {
	EW_LOOP(i, n)
	dst[i] = cr_h2f(src[i]);
}

// copy_f32(float* dst, const float* src, int n): dst[i] = src[i] for i < n (no overlap).
extern "C" __global__ void copy_f32(float* dst, const float* src, int n) {
	EW_LOOP(i, n)
	dst[i] = src[i];
}

// copy2d_f32(float* dst, const float* src, int rows, int cols, int dst_stride, int src_stride)
//   dst[r*dst_stride + c] = src[r*src_stride + c] for r < rows, c < cols (strides in floats;
//   no overlap). Builds strided rows such as MLA's per-head [k_nope | k_pe] keys.
//   grid (ceil(cols / 256), rows, 1); block (256, 1, 1); any grid.x >= 1 works.
extern "C" __global__ void copy2d_f32(float* dst, const float* src, int rows, int cols, int dst_stride, int src_stride) {
	for (i64 r = blockIdx.y; r < rows; r += gridDim.y)
		for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
			dst[r * dst_stride + c] = src[r * src_stride + c];
}

// copy2d_f32_f16(unsigned short* dst, const float* src, int rows, int cols, int dst_stride,
//                int src_stride)
//   copy2d_f32 that rounds to halves as f32_to_f16 (storing rows into an F16 KV cache).
//   grid (ceil(cols / 256), rows, 1); block (256, 1, 1).
extern "C" __global__ void copy2d_f32_f16(u16* dst, const float* src, int rows, int cols, int dst_stride, int src_stride) {
	for (i64 r = blockIdx.y; r < rows; r += gridDim.y)
		for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x)
			dst[r * dst_stride + c] = cr_f2h(src[r * src_stride + c]);
}

// read_u4(const u8* p, i64 n, u32* out)
//   The xor of the n 16-byte words at p (16-byte aligned), each warp's share at out[warp]
//   (warp = blockIdx.x * blockDim.x/32 + threadIdx.x/32): a kernel that does nothing but read,
//   four loads in flight a thread, so that BenchmarkMMVDecode can set the products' rates beside
//   the rate a card reaches reading the same bytes the same way (the copies it cycles through).
//   A grid-stride loop; block a multiple of 32 threads; no shared memory.
extern "C" __global__ void read_u4(const u8* p, i64 n, u32* out) {
	const i64 nth = (i64)gridDim.x * blockDim.x;
	i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
	u32 acc = 0;
	for (; i + 3 * nth < n; i += 4 * nth) {
		const cr_u4 a = cr_ldg_u4(p + 16 * i), b = cr_ldg_u4(p + 16 * (i + nth)), c = cr_ldg_u4(p + 16 * (i + 2 * nth)),
		            d = cr_ldg_u4(p + 16 * (i + 3 * nth));
		acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
	}
	for (; i < n; i += nth) {
		const cr_u4 a = cr_ldg_u4(p + 16 * i);
		acc ^= a.x ^ a.y ^ a.z ^ a.w;
	}
	for (int m = 16; m > 0; m >>= 1)
		acc ^= cr_shfl_xor_u32(acc, m);
	if (threadIdx.x % CR_WARP == 0)
		out[((i64)blockIdx.x * blockDim.x + threadIdx.x) / CR_WARP] = acc;
}
