// moe.cu: the mixture-of-experts block's own element-wise kernels.
#include "common.cuh"

// combine_off_f32(float* out, const float* ys, const float* w, const int* off, int d)
//   Each token's expert outputs summed, weighted, into out: for token t and i < d,
//   out[t*d + i] = sum over j in [off[t], off[t+1]) of w[j] * ys[j*d + i], each product rounded
//   and added in j order to a sum that starts at 0, as the engine's combine (models.HostOps)
//   does, so the result is the CPU's to the bit. off has ntok+1 ints, w off[ntok] floats (device
//   memory); tokens may have different numbers of experts (expanded drop).
//   grid (ceil(d / 256), ntok, 1); block (256, 1, 1); no shared memory.
extern "C" __global__ void combine_off_f32(float* out, const float* ys, const float* w, const int* off, int d) {
	const int t = blockIdx.y;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= d)
		return;
	float o = 0.0f;
	for (int j = off[t]; j < off[t + 1]; j++)
		o = cr_fadd(o, cr_fmul(w[j], ys[(i64)j * d + i]));
	out[(i64)t * d + i] = o;
}

// add_rows_id_f32(float* y, const u64* tab, const int* off, const int* at, int d)
//   The grouped experts' biases (GPU.ExpertGroups): group z's bias (tab[z], d floats; 0 for
//   none) added to each of its off[z+1] - off[z] rows of y from row at[z] (at null: from
//   off[z]), as add_rows_f32 adds one expert's, so to the bit.
//   grid (ceil(d / 256), any, groups); block (256, 1, 1); no shared memory.
extern "C" __global__ void add_rows_id_f32(float* y, const u64* tab, const int* off, const int* at, int d) {
	const int z = blockIdx.z;
	const float* bias = (const float*)tab[z];
	const int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (!bias || c >= d)
		return;
	const int n = off[z + 1] - off[z];
	const i64 r0 = at ? at[z] : off[z];
	const float b = bias[c];
	for (int r = blockIdx.y; r < n; r += gridDim.y) {
		float* p = y + (r0 + r) * d + c;
		*p = cr_fadd(*p, b);
	}
}

// moe_shared_gate is the shared expert's gate of v as the graphs compute it: ggml_sigmoid's
// 1 / (1 + expf(-v)) with sigmoid set (Qwen3.5, models.Sigmoid), else silu(v)/v (Qwen2-MoE,
// models.SiLUOverX), glibc's expf either way.
CR_FN float moe_shared_gate(float v, int sigmoid) {
	if (sigmoid)
		return cr_fdiv(1.0f, cr_fadd(1.0f, cr_expf(-v)));
	return cr_fdiv(cr_fdiv(v, cr_fadd(1.0f, cr_expf(0.0f - v))), v);
}

// gated_add_f32(float* out, const float* sh, const float* x, const float* gate, int d,
//               int sigmoid)
//   The gated shared expert: for token t, v = gate . x[t*d ...] and
//   out[t*d + i] += moe_shared_gate(v) * sh[t*d + i], the product rounded before the sum. The dot product adds in
//   float64, where the CPU adds float32 lanes: the gate agrees to float32 rounding.
//   grid (ntok, 1, 1); block (256, 1, 1) (any multiple of 32 up to 1024); no dynamic shared
//   memory.
extern "C" __global__ void gated_add_f32(float* out, const float* sh, const float* x, const float* gate, int d, int sigmoid) {
	__shared__ double sd[32];
	const i64 t = blockIdx.x;
	const float* xt = x + t * d;
	double s = 0.0;
	for (int i = threadIdx.x; i < d; i += blockDim.x)
		s += (double)cr_fmul(gate[i], xt[i]);
	const float v = (float)cr_block_sum_d(s, sd);
	const float g = moe_shared_gate(v, sigmoid);
	float* o = out + t * d;
	const float* st = sh + t * d;
	for (int i = threadIdx.x; i < d; i += blockDim.x)
		o[i] = cr_fadd(o[i], cr_fmul(g, st[i]));
}
