// moe.cu: the mixture-of-experts block's own element-wise kernels.
#include "common.cuh"

// combine_off_f32(float* out, const float* ys, const float* w, const int* off, const int* inv,
//                 int k, int d)
//   Each token's expert outputs summed, weighted, into out: for token t and i < d,
//   out[t*d + i] = sum over j in [off[t], off[t+1]) of w[j] * ys[inv[j]*d + i], each product
//   rounded and added in j order to a sum that starts at 0, as the engine's combine
//   (models.HostOps) does, so the result is the CPU's to the bit. off has ntok+1 ints, w off[ntok]
//   floats (device memory); tokens may have different numbers of experts (expanded drop). off
//   null: token t's are j in [t*k, t*k+k). inv null: ys's row j is slot j's, else row inv[j]
//   (the experts' outputs in their groups' order, GPU.MoEGrouped).
//   grid (ceil(d / 256), ntok, 1); block (256, 1, 1); no shared memory.
extern "C" __global__ void combine_off_f32(float* out, const float* ys, const float* w, const int* off, const int* inv, int k,
                                           int d) {
	const int t = blockIdx.y;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= d)
		return;
	const int j0 = off ? off[t] : t * k, j1 = off ? off[t + 1] : (t + 1) * k;
	float o = 0.0f;
	for (int j = j0; j < j1; j++)
		o = cr_fadd(o, cr_fmul(w[j], ys[(i64)(inv ? inv[j] : j) * d + i]));
	out[(i64)t * d + i] = o;
}

// add_rows_id_f32(float* y, const u64* tab, int ts, const int* off, const int* at, int d)
//   The grouped experts' biases (GPU.ExpertGroups): group z's bias (tab[ts*z], d floats; 0
//   for none) added to each of its off[z+1] - off[z] rows of y from row at[z] (at null: from
//   off[z]), as add_rows_f32 adds one expert's, so to the bit.
//   grid (ceil(d / 256), any, groups); block (256, 1, 1); no shared memory.
extern "C" __global__ void add_rows_id_f32(float* y, const u64* tab, int ts, const int* off, const int* at, int d) {
	const int z = blockIdx.z;
	const float* bias = (const float*)tab[(i64)ts * z];
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

// moe_group_ids(const int* ids, int nslots, int k, int* off, int* rows, int* inv)
//   A prompt's routed rows grouped by expert on the device, as the engine's groupByExpert
//   groups them on the host, so that the host need not read the routing back: slot s (token
//   s/k's choice s%k, of nslots) chose expert ids[s]; expert e's group (e = blockIdx.x) is its
//   slots in slot order, which take rows off[e] .. off[e+1]-1: off[e] is the number of slots
//   that chose an expert below e (block 0 writes off[0] = 0, block e off[e+1]), rows[off[e]+i]
//   is the token of the group's i-th slot and inv[s] = off[e]+i its row. A token chooses an
//   expert at most once (moe_route_f32's top-k), so a group's tokens ascend. Integer counts:
//   the same whatever the order of the adds.
//   grid (experts, 1, 1); block (B, 1, 1), B a multiple of 32 up to 1024; no dynamic shared
//   memory.
extern "C" __global__ void moe_group_ids(const int* ids, int nslots, int k, int* off, int* rows, int* inv) {
	__shared__ int below[32], mine[32], part[32];
	__shared__ int base;
	const int e = blockIdx.x, tid = threadIdx.x, lane = tid % CR_WARP, warp = tid / CR_WARP, nw = blockDim.x / CR_WARP;
	int b = 0, n = 0;
	for (int s = tid; s < nslots; s += blockDim.x) {
		const int id = ids[s];
		b += id < e;
		n += id == e;
	}
	for (int m = 16; m > 0; m >>= 1) {
		b += (int)cr_shfl_xor_u32((u32)b, m);
		n += (int)cr_shfl_xor_u32((u32)n, m);
	}
	if (lane == 0)
		below[warp] = b, mine[warp] = n;
	__syncthreads();
	if (tid == 0) {
		int sb = 0, sn = 0;
		for (int w = 0; w < nw; w++)
			sb += below[w], sn += mine[w];
		base = sb;
		off[e + 1] = sb + sn;
		if (e == 0)
			off[0] = 0;
	}
	__syncthreads();
	// The group's slots in order, a block's width at a time: a slot's row is the group's base
	// plus the hits before it in the warps before its own and in its own warp's lower lanes.
	for (int s0 = 0; s0 < nslots; s0 += blockDim.x) {
		const int s = s0 + tid;
		const bool hit = s < nslots && ids[s] == e;
		const u32 m = cr_ballot(hit);
		if (lane == 0)
			part[warp] = cr_popc(m);
		__syncthreads();
		int before = base, total = 0;
		for (int w = 0; w < nw; w++) {
			before += w < warp ? part[w] : 0;
			total += part[w];
		}
		if (hit) {
			const int r = before + cr_popc(m & ((1u << lane) - 1u));
			rows[r] = s / k;
			inv[s] = r;
		}
		__syncthreads();
		if (tid == 0)
			base += total;
		__syncthreads();
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
