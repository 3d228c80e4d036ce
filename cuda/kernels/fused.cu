// fused.cu: a decode step's operations in fewer launches. Each kernel here computes what a
// sequence of the module's other kernels computes, with the same arithmetic in the same
// order, so that its results are theirs to the bit (the tests run both and compare): fusing
// saves launches and trips through memory, and changes no number.
//
// The products (mmv3, moe_up, moe_down) take each dot product from mmv.cu's mmv_dot, the
// code of mmv_<type> for one token, and the same vector or scalar path mmv would take for
// that matrix and input, or, given their input quantized (quantize_q8_f32), from mmvq.cu's
// integer mmvq_dot, mmvq_<type>'s code; so they read the weights once per token, which is
// what a decode step (one token, or a few of a decode batch) needs. The experts' kernels find an expert's
// weights in a table in device memory indexed by the expert ids the routing wrote there
// (llama.cpp's MUL_MAT_ID): the host never reads a layer's routing to enqueue its experts,
// and a CUDA graph replays them whatever the experts.
#include "common.cuh"
#include "dequant.cuh"

// ---- the residual and the next norm ----

// add_rms_norm_f32(float* x, const float* add, float* dst, const float* weight,
//                  const float* bias, int d, float eps)
//   Row r (r = blockIdx.x) of x (d floats) plus row r of add, stored back to x (add_f32: the
//   residual), then normalised into dst as rms_norm_f32 does: add_f32 and rms_norm_f32 in one
//   launch. dst must not overlap x or add.
//   grid (rows, 1, 1); block (256, 1, 1) (any multiple of 32 up to 1024, as rms_norm_f32's;
//   the same block size gives its results to the bit); no dynamic shared memory.
extern "C" __global__ void add_rms_norm_f32(float* x, const float* add, float* dst, const float* weight, const float* bias, int d,
                                            float eps) {
	const i64 r = blockIdx.x;
	rms_norm_row(dst + r * d, x + r * d, add + r * d, x + r * d, weight, bias, d, eps);
}

// ---- RoPE and the KV cache ----

#define ROPE_KV_MAX_PAIRS 512

// kv_put stores value v at index i of a cache of floats, or of halves when f16.
CR_FN void kv_put(void* c, i64 i, int f16, float v) {
	if (f16)
		((u16*)c)[i] = cr_f2h(v);
	else
		((float*)c)[i] = v;
}

// ---- the q/k norms, to the bit as rms_norm_f32 in a block of 256 threads ----

// qk_norm_warp normalises a row of d <= 256 floats (a head) with one warp. In rms_norm_f32's
// block of 256, thread v = lane + 32j (warp j) squares x[v], each warp sums its lanes by the
// butterfly, and the block's sum is a second butterfly over the 8 warps' sums and 24 zeros:
// ((W0+W4)+(W2+W6))+((W1+W5)+(W3+W7)) on every lane. The warp here runs the 8 warps'
// butterflies side by side and adds their sums in that order.
CR_FN double qk_square_sum(const float* v, int j) { return cr_warp_sum_d((double)cr_fmul(v[j], v[j])); }

CR_FN void qk_norm_warp(float* x, int d, const float* w, const float* b, float eps) {
	const int lane = threadIdx.x % CR_WARP;
	float v[8]; // 0 past d, whose square adds +0.0 as a thread with no element does
#pragma unroll
	for (int j = 0; j < 8; j++) {
		const int i = lane + CR_WARP * j;
		v[j] = i < d ? x[i] : 0.0f;
	}
	// The sums in the order they are added, few held at once: 8 doubles and the row's floats
	// took rope_kv_f32 past the 64 registers a thread of its 1024 may have.
	double s04 = qk_square_sum(v, 0);
	s04 += qk_square_sum(v, 4);
	double s26 = qk_square_sum(v, 2);
	s26 += qk_square_sum(v, 6);
	double s15 = qk_square_sum(v, 1);
	s15 += qk_square_sum(v, 5);
	double s37 = qk_square_sum(v, 3);
	s37 += qk_square_sum(v, 7);
	rms_norm_write(x, x, d, rms_norm_scale((s04 + s26) + (s15 + s37), d, eps), w, b, lane, CR_WARP);
}

// qk_norm_block normalises a row of d floats (every head of a token) with the whole block of
// 256 or more threads: the first 256 add the squares as rms_norm_f32's block does, the others
// add zeros, which cr_block_sum_d's second butterfly adds as it adds the lanes past 8 warps.
CR_FN void qk_norm_block(float* x, int d, const float* w, const float* b, float eps, double* sh) {
	const int t = threadIdx.x;
	const double s = cr_block_sum_d(t < 256 ? rms_norm_squares(x, d, t, 256) : 0.0, sh);
	rms_norm_write(x, x, d, rms_norm_scale(s, d, eps), w, b, t, (int)blockDim.x);
}

// qk_norm_rows normalises the rows rows of dim floats at x in place, a warp a row where a row
// is a head (dim <= 256), else the block a row; every thread of the block calls it.
CR_FN void qk_norm_rows(float* x, int rows, int dim, const float* w, const float* b, float eps, double* sh) {
	if (dim <= 256) {
		const int nw = (int)blockDim.x / CR_WARP;
		for (int r = (int)threadIdx.x / CR_WARP; r < rows; r += nw)
			qk_norm_warp(x + (i64)r * dim, dim, w, b, eps);
		return;
	}
	for (int r = 0; r < rows; r++)
		qk_norm_block(x + (i64)r * dim, dim, w, b, eps, sh);
}

// rope_kv_f32(float* q, float* k, const float* v, void* kc, void* vc, int f16,
//             const int* posp, int pos0, int ntok, int heads, int kv_heads, int dk, int dv,
//             int n_dims, int neox, float theta_scale, float freq_scale, float ext_factor,
//             float mscale, float corr_lo, float corr_hi, const float* freq_factors, int ring,
//             const float* qnw, const float* qnb, int qdim, const float* knw, const float* knb,
//             int kdim, float eps)
//   Standard attention's q/k norms, RoPE and KV store in one launch: with qdim > 0 each row of
//   qdim query floats (a head, or all of a token's) normalised in place as rms_norm_f32 does
//   with weight qnw and bias qnb (either NULL: none), with kdim > 0 each row of kdim key
//   floats likewise with knw and knb (in place: k is left normalised, not rotated); then
//   rope_f32 on the queries (in place) and on the keys, and the keys and the values stored
//   into the cache at row p = pos0 + t (+ *posp when posp is not NULL; p % ring when ring >
//   0) as kv_store_f32 would: rms_norm_f32 twice, rope_f32 twice and kv_store_f32 twice, to
//   the bit. Token t's queries are heads rows of dk floats at q + t*heads*dk, its keys
//   kv_heads rows of dk at k + t*kv_heads*dk, its values kv_heads*dv floats at
//   v + t*kv_heads*dv; the cache holds kv_heads*dk keys and kv_heads*dv values per position
//   (floats, or IEEE halves when f16 != 0). The RoPE parameters are rope_f32's; n_dims/2 <=
//   512 pairs, n_dims <= dk; qdim divides heads*dk and kdim kv_heads*dk.
//   grid (ntok, 1, 1); block (256, 1, 1) to (1024, 1, 1), a multiple of 32; no dynamic shared
//   memory (4.25 KiB static).
extern "C" __global__ void rope_kv_f32(float* q, float* k, const float* v, void* kc, void* vc, int f16, const int* posp, int pos0,
                                       int ntok, int heads, int kv_heads, int dk, int dv, int n_dims, int neox, float theta_scale,
                                       float freq_scale, float ext_factor, float mscale, float corr_lo, float corr_hi,
                                       const float* freq_factors, int ring, const float* qnw, const float* qnb, int qdim,
                                       const float* knw, const float* knb, int kdim, float eps) {
	__shared__ float scs[ROPE_KV_MAX_PAIRS], ssn[ROPE_KV_MAX_PAIRS];
	__shared__ double shn[32];
	const int t = blockIdx.x;
	if (t >= ntok)
		return;
	const int tid = threadIdx.x, nth = blockDim.x, npairs = n_dims / 2;
	float* qt = q + (i64)t * heads * dk;
	float* kt = k + (i64)t * kv_heads * dk;
	if (qdim > 0)
		qk_norm_rows(qt, heads * dk / qdim, qdim, qnw, qnb, eps, shn);
	if (kdim > 0)
		qk_norm_rows(kt, kv_heads * dk / kdim, kdim, knw, knb, eps, shn);
	const int pos = pos0 + t + (posp ? *posp : 0);
	for (int i = tid; i < npairs; i += nth)
		rope_cs((float)pos, i, theta_scale, freq_scale, ext_factor, mscale, corr_lo, corr_hi, freq_factors, &scs[i], &ssn[i]);
	__syncthreads(); // the angles, and the normalised rows, which other threads rotate
	for (int j = tid; j < heads * npairs; j += nth) {
		const int h = j / npairs, i = j % npairs;
		const int i0 = neox ? i : 2 * i, i1 = neox ? i + npairs : 2 * i + 1;
		rope_pair(qt + (i64)h * dk + i0, qt + (i64)h * dk + i1, scs[i], ssn[i]);
	}
	const i64 row = ring > 0 ? pos % ring : pos;
	const i64 krow = row * kv_heads * dk;
	for (int j = tid; j < kv_heads * npairs; j += nth) {
		const int h = j / npairs, i = j % npairs;
		const int i0 = neox ? i : 2 * i, i1 = neox ? i + npairs : 2 * i + 1;
		float a = kt[(i64)h * dk + i0], b = kt[(i64)h * dk + i1];
		rope_pair(&a, &b, scs[i], ssn[i]);
		kv_put(kc, krow + (i64)h * dk + i0, f16, a);
		kv_put(kc, krow + (i64)h * dk + i1, f16, b);
	}
	const int rest = dk - n_dims; // the values past the rotated ones (partial RoPE)
	for (int j = tid; j < kv_heads * rest; j += nth) {
		const i64 c = (i64)(j / rest) * dk + n_dims + j % rest;
		kv_put(kc, krow + c, f16, kt[c]);
	}
	const float* vt = v + (i64)t * kv_heads * dv;
	const i64 vrow = row * kv_heads * dv;
	for (int j = tid; j < kv_heads * dv; j += nth)
		kv_put(vc, vrow + j, f16, vt[j]);
}

// kv_store_f32(void* cache, const float* src, int f16, const int* posp, int pos0, int dim,
//              int ntok, int ring)
//   Row t of src (dim floats) into row p = pos0 + t (+ *posp when posp is not NULL; p % ring
//   when ring > 0, a sliding window's ring) of a cache of dim values per position: copied, or
//   rounded to IEEE halves (ties to even) when f16 != 0, as copy_f32 and f32_to_f16 do.
//   grid (ceil(ntok*dim / 256), 1, 1); block (256, 1, 1); a grid-stride loop (any grid works).
extern "C" __global__ void kv_store_f32(void* cache, const float* src, int f16, const int* posp, int pos0, int dim, int ntok,
                                        int ring) {
	const i64 p0 = pos0 + (posp ? *posp : 0), n = (i64)ntok * dim;
	for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
		const i64 p = p0 + i / dim;
		kv_put(cache, (ring > 0 ? p % ring : p) * dim + i % dim, f16, src[i]);
	}
}

// ---- the routing ----

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_USED 16

// route_softmax replaces p[0..n) by its softmax in the arithmetic and order of models.Softmax,
// every float64 addition included (so unlike softmax_rows_f32 it is the CPU's to the bit):
// the groups of 16 exps (cr_exp_v) summed by cr_hsum16, their sums added in float64 in group
// order, then the last n%16 (glibc's expf) in order. gs: n/16 doubles, shm: 32 floats, inv: one
// float, all shared memory.
CR_FN void route_softmax(float* p, int n, double* gs, float* shm, float* inv) {
	const int tid = threadIdx.x, nth = blockDim.x;
	float m = -cr_inf();
	for (int i = tid; i < n; i += nth)
		m = p[i] > m ? p[i] : m;
	m = cr_block_max(m, shm);
	const int groups = n / 16;
	for (int g = tid; g < groups; g += nth) {
		float e[16];
#pragma unroll
		for (int l = 0; l < 16; l++) {
			e[l] = cr_exp_v(p[16 * g + l] - m);
			p[16 * g + l] = e[l];
		}
		gs[g] = (double)cr_hsum16(e);
	}
	for (int i = 16 * groups + tid; i < n; i += nth)
		p[i] = cr_expf(p[i] - m);
	__syncthreads();
	if (tid == 0) {
		double s = 0.0;
		for (int g = 0; g < groups; g++)
			s += gs[g];
		for (int i = 16 * groups; i < n; i++)
			s += (double)p[i];
		*inv = (float)(1.0 / s);
	}
	__syncthreads();
	for (int i = tid; i < n; i += nth)
		p[i] = cr_fmul(p[i], *inv);
}

// route_topk is cr_topk_warp (router.cu) by warp 0 alone, the other threads returning at
// once: the same experts in the same order (the largest score first, an equal one keeping the
// lower index, NaNs passed over, and expert j where no candidate is left in round j), with each
// lane's scores (p + bias) and which of them are out of the running held in registers. Reading
// the bias from global memory and every chosen id from shared memory in each of k rounds, with
// a block barrier between rounds, made moe_route_f32 10.4 us on the H200 (llama.cpp's top-k
// 4.3). The caller reads ids on lane 0 of warp 0, or after a barrier.
#define ROUTE_PER_LANE (ROUTE_MAX_EXPERTS / CR_WARP)
CR_FN void route_topk(const float* p, const float* bias, int n, int k, int* ids) {
	if (threadIdx.x >= CR_WARP)
		return;
	const int lane = threadIdx.x;
	float sv[ROUTE_PER_LANE];
	u32 out = 0; // bit m: candidate lane + 32m is past n, a NaN, or chosen already
#pragma unroll
	for (int m = 0; m < ROUTE_PER_LANE; m++) {
		const int i = lane + CR_WARP * m;
		const float s = i < n ? (bias ? cr_fadd(p[i], bias[i]) : p[i]) : 0.0f;
		sv[m] = s;
		if (i >= n || s != s)
			out |= 1u << m;
	}
	for (int j = 0; j < k; j++) {
		float best = 0.0f;
		int bi = -1;
#pragma unroll
		for (int m = 0; m < ROUTE_PER_LANE; m++)
			if (!((out >> m) & 1u) && (bi < 0 || sv[m] > best)) { // i grows: an equal score keeps the lower index
				best = sv[m];
				bi = lane + CR_WARP * m;
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
		const int c = bi >= 0 ? bi : j;
		if (lane == 0)
			ids[j] = c;
		if (c % CR_WARP == lane)
			out |= 1u << (c / CR_WARP);
	}
}

// moe_route_f32(const float* logits, int n, int k, int ntok, int gating, const float* bias,
//               int normalize, float scale, int* ids, float* w, const float* sh_gate_w,
//               const float* x, int d, float* sh_gate, int groups, int groups_used,
//               int sh_sigmoid)
//   Routes token t (t = blockIdx.x) from its n router logits (logits + t*n) as the engine's
//   route does on the host, to the bit: the gating (0: softmax over every expert, in
//   models.Softmax's order; 1: each logit's sigmoid; 2: the raw logits, the chosen experts'
//   weights then a softmax over them), the top-k of the probabilities plus bias (n floats, or
//   NULL) as topk_f32 chooses, and the weights finished as norm_weights_f32 does. Writes the
//   experts ids[t*k + j] and their weights w[t*k + j], j < k, in top-k order. With groups > 1
//   the experts are chosen among the groups_used best of groups equal groups only
//   (models.groupLimited: n % groups == 0, at least 2 experts a group, groups <= 64).
//   With sh_gate_w not NULL it also weighs the shared expert as gated_add_f32 does:
//   v = sh_gate_w . x[t*d ..] (d floats each) and sh_gate[t] = silu(v)/v (Qwen2-MoE), or
//   v's sigmoid with sh_sigmoid set (Qwen3.5).
//   1 <= k <= min(n, 16), n <= 512.
//   grid (ntok, 1, 1); block (256, 1, 1) exactly; no dynamic shared memory.
extern "C" __global__ void moe_route_f32(const float* logits, int n, int k, int ntok, int gating, const float* bias, int normalize,
                                         float scale, int* ids, float* w, const float* sh_gate_w, const float* x, int d,
                                         float* sh_gate, int groups, int groups_used, int sh_sigmoid) {
	__shared__ float p[ROUTE_MAX_EXPERTS], sel[ROUTE_MAX_EXPERTS];
	__shared__ int keep[ROUTE_MAX_GROUPS];
	__shared__ double gs[ROUTE_MAX_EXPERTS / 16];
	__shared__ int sids[ROUTE_MAX_USED];
	__shared__ float shm[32];
	__shared__ double shd[32];
	__shared__ float inv;
	const int t = blockIdx.x, tid = threadIdx.x;
	if (t >= ntok)
		return;
	const float* lt = logits + (i64)t * n;
	for (int i = tid; i < n; i += blockDim.x)
		p[i] = lt[i];
	__syncthreads();
	if (gating == 0) {
		route_softmax(p, n, gs, shm, &inv);
	} else if (gating == 1) {
		for (int i = tid; i < n; i += blockDim.x)
			p[i] = cr_fdiv(1.0f, cr_fadd(1.0f, cr_expf(-p[i])));
	}
	__syncthreads();
	if (groups > 1) {
		route_groups(p, bias, n, groups, groups_used, sel, keep);
		route_topk(sel, 0, n, k, sids);
	} else {
		route_topk(p, bias, n, k, sids);
	}
	if (tid == 0) {
		float wk[ROUTE_MAX_USED];
		for (int j = 0; j < k; j++)
			wk[j] = p[sids[j]];
		cr_gate_weights(wk, k, gating == 2, normalize, scale);
		for (int j = 0; j < k; j++) {
			ids[(i64)t * k + j] = sids[j];
			w[(i64)t * k + j] = wk[j];
		}
	}
	if (sh_gate_w) {
		const float* xt = x + (i64)t * d;
		double s = 0.0;
		for (int i = tid; i < d; i += blockDim.x)
			s += (double)cr_fmul(sh_gate_w[i], xt[i]);
		const float v = (float)cr_block_sum_d(s, shd);
		if (tid == 0)
			sh_gate[t] = moe_shared_gate(v, sh_sigmoid);
	}
}

// ---- the products ----

// silu_mul is swiglu_f32's arithmetic: silu(g) * u.
CR_FN float silu_mul(float g, float u) { return cr_fmul(cr_fdiv(g, cr_fadd(1.0f, cr_exp_v(0.0f - g))), u); }

template <class T>
CR_FN void mmv3_body(const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2, const float* b0, const float* b1,
                     const float* b2, int r0, int r1, int r2, const float* x, int cols, int ntok, q8planes xq, const float* tab,
                     float* red) {
	const int p = blockIdx.z;
	const u8* w = p == 0 ? w0 : (p == 1 ? w1 : w2);
	float* y = p == 0 ? y0 : (p == 1 ? y1 : y2);
	const float* b = p == 0 ? b0 : (p == 1 ? b1 : b2);
	const int rows = p == 0 ? r0 : (p == 1 ? r1 : r2);
	const int row = blockIdx.x * blockDim.y + threadIdx.y;
	if (row >= rows)
		return; // the whole warp (the whole block when W > 1)
	const bool vec = mmv_vec<T>(w, x, cols);
	const u8* wr = w + (i64)row * mmv_row_bytes<T>(cols);
	for (int t = 0; t < ntok; t++) {
		float v = mmv_any<T>::dot(wr, x + (i64)t * cols, cols, vec, tab, xq, t, red);
		if (b)
			v = cr_fadd(v, b[row]);
		if (mmvq_leader())
			y[(i64)t * rows + row] = v;
	}
}

// A layer's expert table: expert e's gate, up and down matrices at tab[MOE_TAB*e + 0..2], its
// gate, up and down biases at tab[MOE_TAB*e + 3..5] (0: none).
#define MOE_TAB 6

// moe_add_bias adds expert e's bias j (3 gate, 4 up, 5 down) of row to v, where it has one,
// as add_rows_f32 adds it.
CR_FN float moe_add_bias(float v, const u64* tab, int e, int j, int row) {
	const float* b = (const float*)tab[MOE_TAB * e + j];
	return b ? cr_fadd(v, b[row]) : v;
}

template <class T>
CR_FN void moe_up_body(const u64* tab, const int* ids, int k, int ntok, const float* x, int cols, float* g, int nff, const u8* sg,
                       const u8* su, float* sh_g, int sh_nff, int mode, q8planes xq, int oai, float alpha, float limit,
                       const float* cb, float* red) {
	const int z = blockIdx.z, routed = tab ? ntok * k : 0;
	const u8 *gw, *uw;
	float* out;
	int t, rows, e = -1;
	if (z < routed) {
		e = ids[z];
		t = z / k;
		gw = (const u8*)tab[MOE_TAB * e];
		uw = (const u8*)tab[MOE_TAB * e + 1];
		out = g + (i64)z * nff;
		rows = nff;
	} else {
		t = z - routed;
		gw = sg;
		uw = su;
		out = sh_g + (i64)t * sh_nff;
		rows = sh_nff;
	}
	const int row = blockIdx.x * blockDim.y + threadIdx.y;
	if (row >= rows || t >= ntok)
		return; // the whole warp (the whole block when W > 1)
	const float* xt = x + (i64)t * cols;
	const i64 rb = (i64)row * mmv_row_bytes<T>(cols);
	// Mode 2 takes the gate's product that mode 1 stored (the gate of another type), its bias
	// added. A routed expert's biases join its products as AddRows adds them.
	float gv, uv;
	if (mode == 0) {
		mmv_any<T>::dot2(gw + rb, uw + rb, xt, cols, mmv_vec<T>(gw, xt, cols), mmv_vec<T>(uw, xt, cols), cb, xq, t, &gv, &uv, red);
	} else {
		gv = mode == 2 ? out[row] : mmv_any<T>::dot(gw + rb, xt, cols, mmv_vec<T>(gw, xt, cols), cb, xq, t, red);
		if (mode == 1) {
			if (mmvq_leader())
				out[row] = e >= 0 ? moe_add_bias(gv, tab, e, 3, row) : gv;
			return;
		}
		uv = mmv_any<T>::dot(uw + rb, xt, cols, mmv_vec<T>(uw, xt, cols), cb, xq, t, red);
	}
	if (mode != 2 && e >= 0)
		gv = moe_add_bias(gv, tab, e, 3, row);
	if (e >= 0)
		uv = moe_add_bias(uv, tab, e, 4, row);
	if (mmvq_leader())
		out[row] = e >= 0 && oai ? ew_swiglu_oai(gv, uv, alpha, limit) : silu_mul(gv, uv);
}

// MOE_DOWN_WARPS bounds the warps of a moe_down block that compute its row's routed experts'
// products: min(k, MOE_DOWN_WARPS / W) groups of W = blockDim.z warps (expert j on group j mod
// the groups); the shared expert's takes one group more.
#define MOE_DOWN_WARPS 8

// A moe_down block computes one output row of one token: its warps multiply the row of the
// experts' down matrices side by side, rather than one warp walking the experts in turn, so
// that a token's reads of them are in flight together; the weighted sum then adds their
// products in order, as combine_off_f32 does. The groups take their experts in rounds, the
// same number for all (a group with no expert left in a round waits with the others), since
// with W > 1 a dot waits for the whole block.
template <class T>
CR_FN void moe_down_body(const u64* tab, const int* ids, const float* w, int k, int ntok, const float* g, int nff, float* out, int d,
                         const u8* sd, const float* sh_g, int sh_nff, const float* sh_gate, int acc, q8planes gq, q8planes hq,
                         const float* cb, float* red) {
	__shared__ float prod[ROUTE_MAX_USED];
	__shared__ float shv;
	const int t = blockIdx.y, row = blockIdx.x, warp = threadIdx.y, W = blockDim.z;
	const int most = MOE_DOWN_WARPS / W > 1 ? MOE_DOWN_WARPS / W : 1;
	const int rw = tab ? (k < most ? k : most) : 0; // the routed experts' groups
	const bool live = row < d && t < ntok;
	const int rounds = rw > 0 ? (k + rw - 1) / rw : (sd ? 1 : 0);
	for (int i = 0; i < rounds; i++) {
		if (warp < rw) {
			const int j = i * rw + warp;
			const bool on = live && j < k;
			const i64 z = (i64)t * k + (on ? j : 0);
			const u8* dw = on ? (const u8*)tab[MOE_TAB * ids[z] + 2] : (const u8*)0;
			const i64 rb = (i64)row * mmv_row_bytes<T>(nff);
			const float* gz = g + z * nff;
			const float y = mmv_any<T>::dot(dw + rb, gz, nff, on && mmv_vec<T>(dw, gz, nff), cb, gq, (int)z, red, on);
			if (on && mmvq_leader())
				prod[j] = cr_fmul(w[z], moe_add_bias(y, tab, ids[z], 5, row));
		} else {
			const bool on = live && sd && i == 0; // warp == rw: the shared expert's group
			const float* gt = sh_g + (i64)t * sh_nff;
			const u8* sr = on ? sd + (i64)row * mmv_row_bytes<T>(sh_nff) : (const u8*)0;
			const float s = mmv_any<T>::dot(sr, gt, sh_nff, on && mmv_vec<T>(sd, gt, sh_nff), cb, hq, t, red, on);
			if (on && mmvq_leader())
				shv = s;
		}
	}
	__syncthreads();
	if (!live || warp != 0 || !mmvq_leader())
		return;
	float o = acc ? out[(i64)t * d + row] : 0.0f;
	for (int j = 0; j < (tab ? k : 0); j++)
		o = cr_fadd(o, prod[j]);
	if (sd)
		o = sh_gate ? cr_fadd(o, cr_fmul(sh_gate[t], shv)) : cr_fadd(o, shv);
	out[(i64)t * d + row] = o;
}

// The products' kernels, one of each per weight type (mmv3 and moe_up: block (32, 4, 1), a
// warp per output row, 4 rows per block, or, for integer products, (32, 1, W) with W = 2, 4 or
// 8 warps on a row as mmvq.cu deals it; moe_down: below; no dynamic shared memory; weights and
// activations as mmv.cu's ABI says, expert tables and ids in device memory):
//
// Each takes its input's quantized planes (xq, xd, xs: mmvq.cu's q, d, s of the input's rows,
// as the weights' dot type quantizes them) or NULLs: with them its products are mmvq_<type>'s,
// without them mmv_<type>'s (the float types have no integer path and ignore them).
//
// mmv3_<type>(const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2,
//             const float* b0, const float* b1, const float* b2, int r0, int r1, int r2,
//             const float* x, int cols, int ntok, const signed char* xq, const float* xd,
//             const float* xs)
//   Up to three products of one input x (ntok rows of cols floats): product p = blockIdx.z
//   writes y_p[t*r_p + r] = W_p[r] . x_t (+ b_p[r] when b_p is not NULL) for r < r_p: mmv
//   (or mmvq) then add_rows_f32 of each, to the bit (attention's Q, K and V). Unused
//   products' pointers may be NULL. grid (ceil(max r_p / 4), 1, products).
//
// moe_up_<type>(const u64* tab, const int* ids, int k, int ntok, const float* x, int cols,
//               float* g, int nff, const u8* sg, const u8* su, float* sh_g, int sh_nff, int mode,
//               const signed char* xq, const float* xd, const float* xs, int oai, float alpha,
//               float limit)
//   Gate, up and SwiGLU of a layer's experts: for token t's j-th expert e = ids[t*k + j],
//   whose gate and up matrices (nff rows of cols) start at the device addresses tab[6e] and
//   tab[6e+1] (MOE_TAB), g[(t*k + j)*nff + r] = silu(gate_e[r] . x_t) * (up_e[r] . x_t): mmv of each
//   then swiglu_f32, to the bit. With sg not NULL, entries z >= ntok*k (or all, with tab NULL)
//   compute a shared expert of sh_nff rows (gate sg, up su) for token z - ntok*k into
//   sh_g + t*sh_nff. mode 0 takes gate and up of this type; where they differ, a launch of the
//   gate's type with mode 1 stores the gate's product alone, and one of the up's type with
//   mode 2 reads it back and finishes the SwiGLU (swiglu_f32's arithmetic either way).
//   A routed expert's gate and up biases (nff floats at tab[6e+3] and tab[6e+4], where not 0)
//   are added to its products as add_rows_f32 adds them; with oai set the routed experts'
//   activation is swiglu_oai_f32's with alpha and limit (gpt-oss). The shared expert has
//   neither.
//   grid (ceil(max(nff, sh_nff) / 4), 1, ntok*k (+ ntok)).
//
// moe_down_<type>(const u64* tab, const int* ids, const float* w, int k, int ntok,
//                 const float* g, int nff, float* out, int d, const u8* sd, const float* sh_g,
//                 int sh_nff, const float* sh_gate, int acc, const signed char* gq,
//                 const float* gd, const float* gs, const signed char* hq, const float* hd,
//                 const float* hs)
//   The experts' down products and their weighted sum: out[t*d + r] = the sum over j < k, in
//   order from 0, of w[t*k + j] times down_e[r] . g[(t*k + j)*nff ..] (e = ids[t*k + j], its
//   down matrix of d rows of nff at tab[6e+2]), each product rounded and added to a sum that
//   starts at 0 (combine_off_f32), or at out's value when acc != 0; then, with sd not NULL,
//   plus the shared expert's down product (d rows of sh_nff) of sh_g + t*sh_nff, times
//   sh_gate[t] when sh_gate is not NULL (gated_add_f32) or as it is (add_f32). tab NULL: the
//   shared expert alone (with acc, added to what a launch of the experts' type summed). A
//   routed expert's down bias (d floats at tab[6e+5], where not 0) is added to its down
//   product before it is weighed. k is at most ROUTE_MAX_USED.
//   grid (d, ntok, 1); block (32, Y, W): W warps a dot (1, or 2, 4 or 8 for integer products as
//   mmvq.cu deals them), Y = min(k, max(1, MOE_DOWN_WARPS / W)) groups where tab is not NULL
//   (else 0), plus 1 where sd is not NULL.
// q8p gathers a quantized activation's planes from a kernel's arguments.
CR_FN q8planes q8p(const signed char* q, const float* d, const float* s) {
	q8planes p;
	p.q = q;
	p.d = d;
	p.s = s;
	return p;
}

#define FUSED_KERNELS(sfx, T)                                                                                                  \
	extern "C" __global__ void mmv3_##sfx(const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1, float* y2,           \
	                                      const float* b0, const float* b1, const float* b2, int r0, int r1, int r2,           \
	                                      const float* x, int cols, int ntok, const signed char* xq, const float* xd,          \
	                                      const float* xs) {                                                                   \
		__shared__ float cb[16], red[MMVQ_RED];                                                                                \
		mmv3_body<T>(w0, w1, w2, y0, y1, y2, b0, b1, b2, r0, r1, r2, x, cols, ntok, q8p(xq, xd, xs), mmv_codebook<T>::load(cb), \
		             red);                                                                                                     \
	}                                                                                                                          \
	extern "C" __global__ void moe_up_##sfx(const u64* tab, const int* ids, int k, int ntok, const float* x, int cols, float* g, \
	                                        int nff, const u8* sg, const u8* su, float* sh_g, int sh_nff, int mode,            \
	                                        const signed char* xq, const float* xd, const float* xs, int oai, float alpha,     \
	                                        float limit) {                                                                     \
		__shared__ float cb[16], red[MMVQ_RED];                                                                                \
		moe_up_body<T>(tab, ids, k, ntok, x, cols, g, nff, sg, su, sh_g, sh_nff, mode, q8p(xq, xd, xs), oai, alpha, limit,     \
		               mmv_codebook<T>::load(cb), red);                                                                        \
	}                                                                                                                          \
	extern "C" __global__ void moe_down_##sfx(const u64* tab, const int* ids, const float* w, int k, int ntok, const float* g,  \
	                                          int nff, float* out, int d, const u8* sd, const float* sh_g, int sh_nff,         \
	                                          const float* sh_gate, int acc, const signed char* gq, const float* gd,           \
	                                          const float* gs, const signed char* hq, const float* hd, const float* hs) {      \
		__shared__ float cb[16], red[MMVQ_RED];                                                                                \
		moe_down_body<T>(tab, ids, w, k, ntok, g, nff, out, d, sd, sh_g, sh_nff, sh_gate, acc, q8p(gq, gd, gs), q8p(hq, hd, hs), \
		                 mmv_codebook<T>::load(cb), red);                                                                      \
	}

FUSED_KERNELS(f32, mmv_f32_t)
FUSED_KERNELS(f16, mmv_half_t<0>)
FUSED_KERNELS(bf16, mmv_half_t<1>)
FUSED_KERNELS(q4_0, mmv_q4_0_t)
FUSED_KERNELS(q4_1, mmv_q4_1_t)
FUSED_KERNELS(q5_0, mmv_q5_0_t)
FUSED_KERNELS(q5_1, mmv_q5_1_t)
FUSED_KERNELS(q8_0, mmv_q8_0_t)
FUSED_KERNELS(iq4_nl, mmv_iq4_nl_t)
FUSED_KERNELS(mxfp4, mmv_mxfp4_t)
FUSED_KERNELS(q2_K, mmv_q2_K_t)
FUSED_KERNELS(q3_K, mmv_q3_K_t)
FUSED_KERNELS(q4_K, mmv_q4_K_t)
FUSED_KERNELS(q5_K, mmv_q5_K_t)
FUSED_KERNELS(q6_K, mmv_q6_K_t)
