// mmvq.cu: decode products with integer dot products. The activation is quantized once, as the
// CPU reference quantizes it before its dot products (Q8_0 for Q4_0, Q5_0, Q8_0, IQ4_NL and
// MXFP4 weights, Q8_1 for Q4_1 and Q5_1, Q8_K for the K-quants: quant.QuantizeRow's bytes, to the
// bit), and each warp multiplies a weight row's quants by the activation's with dp4a (four 8-bit
// products summed into a 32-bit integer in one instruction, sm_61 and newer) instead of decoding
// every weight to float: the sums over a sub-block are the CPU's integers exactly, and only the
// float sums of their scaled values add in another order than the CPU's.
//
// The quantized activation lives in three planes, so that every load is aligned: for token t of
// a row of cols values, its quants at q + t*cols (int8), one scale per block of 32 (Q8_0, Q8_1)
// or 256 (Q8_K) values at d + t*cols/QB (floats: Q8_0's and Q8_1's are their FP16 scales
// widened), and for Q8_1 the block's FP16 s = d * (sum of its quants), widened, at
// s + t*cols/32.
//
// Every mmvq_<type> kernel has the ABI
//
//   (const unsigned char* w, const signed char* q, const float* d, const float* s, float* y,
//    int rows, int cols, int ntok)
//
//   as mmv_<type>'s (mmv.cu) with the activation quantized (q, d, s above; s is read only by
//   Q4_1 and Q5_1): y[t*rows + r] = W[r] . x_t.
//   block (32, R, W); grid (ceil(rows / R), ceil(ntok / 8), 1) (any grid.y >= 1); no dynamic
//   shared memory (1 KiB static). W = 1 (R = 4 in the engine): a warp per row, R rows a block.
//   W > 1 (2, 4 or 8, with R = 1): a row's blocks dealt over W warps (below), for a card
//   whose one warp on a row keeps too few of its reads in flight.
//
// A row over W warps: its 32*W threads take the GGUF blocks as one warp's 32 lanes take them
// (thread p = 32*z + lane in place of the lane), each warp sums its lanes' partial sums by the
// butterfly, and the row's value is warp 0's sum plus warp 1's, ..., in order of z, in shared
// memory. The order depends on W alone, not on the tokens of a pass: mmvq, mmvq1 and the fused
// kernels' integer dots (fused.cu) give the same bits for the same W, and W = 1 gives a warp's
// sum as it is, the order of before W existed.
#include "common.cuh"
#include "dequant.cuh"

// ---- the activation ----

// cr_rne_i32 rounds to the nearest integer, ties to even (cvt.rni: the CPU's VROUNDPS and
// ggml's nearest_int for the magnitudes quantization meets).
CR_FN int cr_rne_i32(float v) {
#if defined(CR_DEVICE)
	int r;
	asm("cvt.rni.s32.f32 %0, %1;" : "=r"(r) : "f"(v));
	return r;
#else
	return (int)nearbyintf(v);
#endif
}

CR_FN int cr_warp_sum_i(int v) {
#if defined(CR_HOST)
	return cr_host_warp_reduce(v, [](int a, int o) { return (int)((u32)a + (u32)o); }); // wrapping, as the device's add
#else
	for (int m = 16; m > 0; m >>= 1)
		v += (int)cr_shfl_xor_u32((u32)v, m);
	return v;
#endif
}

// quantize_q8_f32(const float* x, signed char* q, float* d, float* s, int cols, int ntok, int kind)
//   Quantizes ntok rows of cols floats into the planes above: kind 0 is Q8_0 (d = amax/127, the
//   quants round(x * 127/amax) ties to even, d stored as FP16), kind 1 Q8_1 (Q8_0 and s, from
//   the sum of the rounded quants), kind 2 Q8_K (blocks of 256: the value of largest magnitude,
//   the first of equals, gives iscale = -127/max, quants nearest_int(iscale*x) capped at 127,
//   d = 1/iscale as float32; an all-zero block d = 0). Bit for bit quant.QuantizeRow for finite
//   inputs (NaNs take other quants). s may be NULL for kinds 0 and 2.
//   One warp per block: grid (ceil(blocks / 8), 1, 1) with blocks = ntok*cols/QB; block (256, 1, 1).
extern "C" __global__ void quantize_q8_f32(const float* x, signed char* q, float* d, float* s, int cols, int ntok, int kind) {
	const int lane = threadIdx.x % CR_WARP;
	const i64 b = (i64)blockIdx.x * (blockDim.x / CR_WARP) + threadIdx.x / CR_WARP;
	const int qb = kind == 2 ? 256 : 32;
	if (b >= (i64)ntok * (cols / qb))
		return; // the whole warp
	const float* xb = x + b * qb;
	signed char* qq = q + b * qb;
	if (kind != 2) {
		const float v = xb[lane];
		const float amax = cr_warp_max(cr_fabs(v));
		const float dd = cr_fdiv(amax, 127.0f);
		const float id = amax != 0.0f ? cr_fdiv(127.0f, amax) : 0.0f;
		const int r = cr_rne_i32(cr_fmul(v, id));
		qq[lane] = (signed char)(r > 127 ? 127 : (r < -128 ? -128 : r));
		const int sum = kind == 1 ? cr_warp_sum_i(r) : 0;
		if (lane == 0) {
			d[b] = cr_round_h(dd);
			if (kind == 1)
				s[b] = cr_round_h(cr_fmul(dd, (float)sum));
		}
		return;
	}
	// Q8_K: lane takes values 8*lane .. 8*lane+7; the first largest magnitude, then the warp's.
	float amax = 0.0f, mx = 0.0f;
	int at = 256;
	for (int i = 0; i < 8; i++) {
		const float v = xb[8 * lane + i], a = cr_fabs(v);
		if (a > amax) {
			amax = a;
			mx = v;
			at = 8 * lane + i;
		}
	}
	for (int m = 16; m > 0; m >>= 1) {
		const float oa = cr_shfl_xor(amax, m), om = cr_shfl_xor(mx, m);
		const int oat = (int)cr_shfl_xor_u32((u32)at, m);
		if (oa > amax || (oa == amax && oat < at)) {
			amax = oa;
			mx = om;
			at = oat;
		}
	}
	if (amax == 0.0f) {
		for (int i = 0; i < 8; i++)
			qq[8 * lane + i] = 0;
		if (lane == 0)
			d[b] = 0.0f;
		return;
	}
	const float iscale = cr_fdiv(-127.0f, mx);
	for (int i = 0; i < 8; i++) {
		const int r = cr_rne_i32(cr_fmul(iscale, xb[8 * lane + i]));
		qq[8 * lane + i] = (signed char)(r > 127 ? 127 : r);
	}
	if (lane == 0)
		d[b] = cr_fdiv(1.0f, iscale);
}

// ---- the dot products ----

// q8act is one token's quantized activation: its quants as 32-bit words, scales and sums.
struct q8act {
	const int* q;
	const float* d;
	const float* s;
};

// ones sums the four bytes of a word with dp4a.
#define MMVQ_ONES 0x01010101

// mmvq_nibbles returns the bytes of w's low (hi = 0) or high (hi = 1) nibbles, one per byte.
CR_FN int mmvq_nibbles(u32 w, int hi) { return (int)((w >> (4 * hi)) & 0x0f0f0f0fu); }

// mmvq_x2 and mmvq_x4 read 2 and 4 words of the activation in one vector load each (every
// lane's share is aligned to its size): a warp's scalar loads of them were most of the
// products' load instructions, and Nsight Compute found the Q4_K product held by its on-chip
// loads (82% of the memory pipes' throughput, 26% of DRAM's) rather than by DRAM.
CR_FN void mmvq_x2(const int* p, int* v) {
	const cr_u2 a = cr_ldg_u2(p);
	v[0] = (int)a.x, v[1] = (int)a.y;
}
CR_FN void mmvq_x4(const int* p, int* v) {
	const cr_u4 a = cr_ldg_u4(p);
	v[0] = (int)a.x, v[1] = (int)a.y, v[2] = (int)a.z, v[3] = (int)a.w;
}

// mmvq_block is the end of the 32-value types' dot with a Q8_0 or Q8_1 activation for one
// token: lane s of a block holds 16 of its quants vq (signed, or offset by `off`, which it
// takes out with the activation's sums), matched with the activation's words xi[0..1] and
// xi[4..5]; the block's float is d_w * d_x * (the integer sum).
CR_FN float mmvq_block(const int* vq, const int* xi, int off, float dw, float dx, float acc) {
	int xi0[2], xi1[2];
	mmvq_x2(xi, xi0);
	mmvq_x2(xi + 4, xi1);
	int sum = 0, sx = 0;
#pragma unroll
	for (int i = 0; i < 2; i++) {
		sum = cr_dp4a(vq[i], xi0[i], sum);
		sum = cr_dp4a(vq[2 + i], xi1[i], sum);
		if (off) {
			sx = cr_dp4a(MMVQ_ONES, xi0[i], sx);
			sx = cr_dp4a(MMVQ_ONES, xi1[i], sx);
		}
	}
	return cr_fma(cr_fmul(dw, dx), (float)(sum - off * sx), acc);
}

// Each type below reads its raw words with mmv.cu's traits (load) and adds, for tokens t < nt,
// lane s's share of block b to acc[t] (dotq): the 32-value types' lanes take elements
// 8s..8s+7 and 16+8s..16+8s+7 (Q8_0: 16s..16s+15), the K-quants' the elements of their mmv
// lane mapping.

struct mmvq_q4_0_t : mmv_q4_0_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		int v[4] = {mmvq_nibbles(r.q0, 0), mmvq_nibbles(r.q1, 0), mmvq_nibbles(r.q0, 1), mmvq_nibbles(r.q1, 1)};
		const float dw = cr_h2f((u16)r.d);
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xi = x[t].q + 8 * b + 2 * s;
				acc[t] = mmvq_block(v, xi, 8, dw, cr_ldg_f(x[t].d + b), acc[t]);
			}
	}
};

// mmvq_cb_dot is the codebook types' dotq: lane s's 16 nibbles through the codebook, as signed
// bytes against the Q8_0 activation, scaled by dw.
template <int NT>
CR_FN void mmvq_cb_dot(u32 q0, u32 q1, u32 w0, u32 w1, u32 w2, u32 w3, float dw, int s, int b, const q8act* x, int nt,
                       float* acc) {
	int v[4] = {cr_lut4(mmvq_nibbles(q0, 0), w0, w1, w2, w3), cr_lut4(mmvq_nibbles(q1, 0), w0, w1, w2, w3),
	            cr_lut4(mmvq_nibbles(q0, 1), w0, w1, w2, w3), cr_lut4(mmvq_nibbles(q1, 1), w0, w1, w2, w3)};
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt) {
			const int* xi = x[t].q + 8 * b + 2 * s;
			acc[t] = mmvq_block(v, xi, 0, dw, cr_ldg_f(x[t].d + b), acc[t]);
		}
}

struct mmvq_iq4_nl_t : mmv_iq4_nl_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		mmvq_cb_dot<NT>(r.q0, r.q1, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u, cr_h2f((u16)r.d), s, b, x, nt, acc);
	}
};

// MXFP4: ggml_vec_dot_mxfp4_q8_0's integer sums of the doubled codebook values, scaled by
// the activation's d times the weight's halved E8M0 scale.
struct mmvq_mxfp4_t : mmv_mxfp4_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		mmvq_cb_dot<NT>(r.q0, r.q1, 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu, cr_e8m0_half(r.e), s, b, x, nt, acc);
	}
};

struct mmvq_q5_0_t : mmv_q5_0_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		const u32 hl = r.qh >> (8 * s), hh = r.qh >> (16 + 8 * s);
		int v[4] = {(int)((r.q0 & 0x0f0f0f0fu) | cr_spread4(hl)), (int)((r.q1 & 0x0f0f0f0fu) | cr_spread4(hl >> 4)),
		            (int)(((r.q0 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh)), (int)(((r.q1 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh >> 4))};
		const float dw = cr_h2f((u16)r.d);
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xi = x[t].q + 8 * b + 2 * s;
				acc[t] = mmvq_block(v, xi, 16, dw, cr_ldg_f(x[t].d + b), acc[t]);
			}
	}
};

// The Q8_1 pairs: d*q + m per weight, so the dot is d_w d_x sum(q q_x) + m_w s_x, the block's
// min term taken by its lane 0.
struct mmvq_q4_1_t : mmv_q4_1_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		int v[4] = {mmvq_nibbles(r.q0, 0), mmvq_nibbles(r.q1, 0), mmvq_nibbles(r.q0, 1), mmvq_nibbles(r.q1, 1)};
		const float dw = cr_h2f((u16)(r.dm & 0xffffu)), mw = cr_h2f((u16)(r.dm >> 16));
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xi = x[t].q + 8 * b + 2 * s;
				float a = mmvq_block(v, xi, 0, dw, cr_ldg_f(x[t].d + b), acc[t]);
				acc[t] = s == 0 ? cr_fma(mw, cr_ldg_f(x[t].s + b), a) : a;
			}
	}
};

struct mmvq_q5_1_t : mmv_q5_1_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		const u32 hl = r.qh >> (8 * s), hh = r.qh >> (16 + 8 * s);
		int v[4] = {(int)((r.q0 & 0x0f0f0f0fu) | cr_spread4(hl)), (int)((r.q1 & 0x0f0f0f0fu) | cr_spread4(hl >> 4)),
		            (int)(((r.q0 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh)), (int)(((r.q1 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh >> 4))};
		const float dw = cr_h2f((u16)(r.dm & 0xffffu)), mw = cr_h2f((u16)(r.dm >> 16));
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xi = x[t].q + 8 * b + 2 * s;
				float a = mmvq_block(v, xi, 0, dw, cr_ldg_f(x[t].d + b), acc[t]);
				acc[t] = s == 0 ? cr_fma(mw, cr_ldg_f(x[t].s + b), a) : a;
			}
	}
};

struct mmvq_q8_0_t : mmv_q8_0_t {
	enum { QB = 32 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		const float dw = cr_h2f((u16)r.d);
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				int xi[4];
				mmvq_x4(x[t].q + 8 * b + 4 * s, xi);
				int sum = 0;
#pragma unroll
				for (int i = 0; i < 4; i++)
					sum = cr_dp4a((int)r.q[i], xi[i], sum);
				acc[t] = cr_fma(cr_fmul(dw, cr_ldg_f(x[t].d + b)), (float)sum, acc[t]);
			}
	}
};

// mmvq_bytes returns byte k of w (0..3), as mmv's byte order.
CR_FN int mmvq_byte(u32 w, int k) { return (int)((w >> (8 * k)) & 0xffu); }

// Q4_K and Q5_K: lane s holds 16 quants of sub-block 2c (elements 64c + l0 + i) and 16 of
// 2c+1 (64c + 32 + l0 + i), c = s/2, l0 = 16(s&1), as four words each.
template <int NT>
CR_FN void mmvq_k_end(const int* lo, const int* hi, const cr_u4& h, int s, int b, const q8act* x, int nt, float* acc) {
	const int c = s >> 1, l0 = 16 * (s & 1);
	const float d = cr_h2f((u16)(h.x & 0xffffu)), dmin = cr_h2f((u16)(h.x >> 16));
	u32 sc1, m1, sc2, m2;
	cr_kscale_w(h.y, h.z, h.w, 2 * c, &sc1, &m1);
	cr_kscale_w(h.y, h.z, h.w, 2 * c + 1, &sc2, &m2);
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt) {
			const int* xp = x[t].q + 64 * b + (64 * c + l0) / 4;
			int x1[4], x2[4];
			mmvq_x4(xp, x1);
			mmvq_x4(xp + 8, x2);
			int s1 = 0, s2 = 0, n1 = 0, n2 = 0;
#pragma unroll
			for (int i = 0; i < 4; i++) {
				s1 = cr_dp4a(lo[i], x1[i], s1);
				s2 = cr_dp4a(hi[i], x2[i], s2);
				n1 = cr_dp4a(MMVQ_ONES, x1[i], n1);
				n2 = cr_dp4a(MMVQ_ONES, x2[i], n2);
			}
			const float dx = cr_ldg_f(x[t].d + b);
			float a = cr_fma(cr_fmul(d, dx), (float)((int)sc1 * s1 + (int)sc2 * s2), acc[t]);
			acc[t] = cr_fma(-cr_fmul(dmin, dx), (float)((int)m1 * n1 + (int)m2 * n2), a);
		}
}

struct mmvq_q4_K_t : mmv_q4_K_t {
	enum { QB = 256 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		const u32 q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
		int lo[4], hi[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			lo[i] = mmvq_nibbles(q[i], 0);
			hi[i] = mmvq_nibbles(q[i], 1);
		}
		mmvq_k_end<NT>(lo, hi, r.h, s, b, x, nt, acc);
	}
};

struct mmvq_q5_K_t : mmv_q5_K_t {
	enum { QB = 256 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		const int c = s >> 1;
		const u32 q[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
		int lo[4], hi[4];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			lo[i] = (int)((q[i] & 0x0f0f0f0fu) | ((qh[i] >> (2 * c)) & 0x01010101u) << 4);
			hi[i] = (int)(((q[i] >> 4) & 0x0f0f0f0fu) | ((qh[i] >> (2 * c + 1)) & 0x01010101u) << 4);
		}
		mmvq_k_end<NT>(lo, hi, r.h, s, b, x, nt, acc);
	}
};

// Q6_K: lane s, h = s/4, l0 = 8(s&3); group g (0..3) is elements 128h + 32g + l0 .. +7,
// quants 0..63 less 32, scale scales[8h + 2g + (s&3)/2] (int8).
struct mmvq_q6_K_t : mmv_q6_K_t {
	enum { QB = 256 };
	template <int NT> CR_FN void dotq(const raw& r, int s, int b, const q8act* x, int nt, float* acc) {
		const int h = s >> 2, l0 = 8 * (s & 3), is = (s & 3) >> 1;
		int sc[4];
#pragma unroll
		for (int g = 0; g < 4; g++) {
			const u32 w = g < 2 ? r.s0 : r.s1;
			sc[g] = (int)(signed char)(u8)(w >> (8 * (2 * (g & 1) + is)));
		}
		const u32 a[2] = {r.a0, r.a1}, bb[2] = {r.b0, r.b1}, c[2] = {r.c0, r.c1};
		int v[4][2];
#pragma unroll
		for (int i = 0; i < 2; i++) {
			v[0][i] = (int)((a[i] & 0x0f0f0f0fu) | (c[i] & 0x03030303u) << 4);
			v[1][i] = (int)((bb[i] & 0x0f0f0f0fu) | (c[i] & 0x0c0c0c0cu) << 2);
			v[2][i] = (int)(((a[i] >> 4) & 0x0f0f0f0fu) | (c[i] & 0x30303030u));
			v[3][i] = (int)(((bb[i] >> 4) & 0x0f0f0f0fu) | (c[i] & 0xc0c0c0c0u) >> 2);
		}
		const float d = cr_h2f((u16)r.d);
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xb = x[t].q + 64 * b + (128 * h + l0) / 4;
				int sum = 0;
#pragma unroll
				for (int g = 0; g < 4; g++) {
					int xg[2];
					mmvq_x2(xb + 8 * g, xg);
					int sg = cr_dp4a(v[g][1], xg[1], cr_dp4a(v[g][0], xg[0], 0));
					int ng = cr_dp4a(MMVQ_ONES, xg[1], cr_dp4a(MMVQ_ONES, xg[0], 0));
					sum += sc[g] * (sg - 32 * ng);
				}
				acc[t] = cr_fma(cr_fmul(d, cr_ldg_f(x[t].d + b)), (float)sum, acc[t]);
			}
	}
};

// Q2_K and Q3_K: lane k, h = k/4, part = (k/2)&1, l0 = 8(k&1); group j (0..3) is elements
// 128h + 32j + 16part + l0 .. +7 with scale byte 8h + 2j + part.
struct mmvq_q2_K_t : mmv_q2_K_t {
	enum { QB = 256 };
	template <int NT> CR_FN void dotq(const raw& r, int k, int b, const q8act* x, int nt, float* acc) {
		const int h = k >> 2, part = (k >> 1) & 1, l0 = 8 * (k & 1);
		const float d = cr_h2f((u16)(r.dm & 0xffffu)), dmin = cr_h2f((u16)(r.dm >> 16));
		int sc[4], mn[4], v[4][2];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const u32 sw = j < 2 ? r.s0 : r.s1;
			const u32 byte = (sw >> (8 * (2 * (j & 1) + part))) & 0xffu;
			sc[j] = (int)(byte & 0xf);
			mn[j] = (int)(byte >> 4);
			v[j][0] = (int)((r.q0 >> (2 * j)) & 0x03030303u);
			v[j][1] = (int)((r.q1 >> (2 * j)) & 0x03030303u);
		}
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xb = x[t].q + 64 * b + (128 * h + 16 * part + l0) / 4;
				int sd = 0, sm = 0;
#pragma unroll
				for (int j = 0; j < 4; j++) {
					int xg[2];
					mmvq_x2(xb + 8 * j, xg);
					sd += sc[j] * cr_dp4a(v[j][1], xg[1], cr_dp4a(v[j][0], xg[0], 0));
					sm += mn[j] * cr_dp4a(MMVQ_ONES, xg[1], cr_dp4a(MMVQ_ONES, xg[0], 0));
				}
				const float dx = cr_ldg_f(x[t].d + b);
				acc[t] = cr_fma(-cr_fmul(dmin, dx), (float)sm, cr_fma(cr_fmul(d, dx), (float)sd, acc[t]));
			}
	}
};

struct mmvq_q3_K_t : mmv_q3_K_t {
	enum { QB = 256 };
	template <int NT> CR_FN void dotq(const raw& r, int k, int b, const q8act* x, int nt, float* acc) {
		const int h = k >> 2, part = (k >> 1) & 1, l0 = 8 * (k & 1);
		const float d = cr_h2f((u16)r.d);
		int sc[4], v[4][2];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			const int idx = 8 * h + 2 * j + part;
			const u32 low = h == 0 ? byte12(r, idx) & 0xf : byte12(r, idx - 8) >> 4;
			const u32 top = (byte12(r, 8 + (idx & 3)) >> (2 * (idx >> 2))) & 3;
			sc[j] = (int)(low | top << 4) - 32;
			const u32 hb = 4 * h + j;
			v[j][0] = (int)(((r.q0 >> (2 * j)) & 0x03030303u) | ((r.m0 >> hb) & 0x01010101u) << 2);
			v[j][1] = (int)(((r.q1 >> (2 * j)) & 0x03030303u) | ((r.m1 >> hb) & 0x01010101u) << 2);
		}
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const int* xb = x[t].q + 64 * b + (128 * h + 16 * part + l0) / 4;
				int sum = 0;
#pragma unroll
				for (int j = 0; j < 4; j++) {
					int xg[2];
					mmvq_x2(xb + 8 * j, xg);
					const int sg = cr_dp4a(v[j][1], xg[1], cr_dp4a(v[j][0], xg[0], 0));
					const int ng = cr_dp4a(MMVQ_ONES, xg[1], cr_dp4a(MMVQ_ONES, xg[0], 0));
					sum += sc[j] * (sg - 4 * ng);
				}
				acc[t] = cr_fma(cr_fmul(d, cr_ldg_f(x[t].d + b)), (float)sum, acc[t]);
			}
	}
};

// ---- a row over the warps of blockDim.z ----

// MMVQ_RED is the floats of a block's shared table of its warps' sums: a slot of NT sums for
// each of its blockDim.y * blockDim.z warps (at most 32 warps of 8 tokens).
#define MMVQ_RED 256

// mmvq_leader is the thread that writes a row's result: lane 0 of the row's first warp.
CR_FN bool mmvq_leader() { return threadIdx.x == 0 && threadIdx.z == 0; }

// mmvq_combine ends a row's dot over blockDim.z = W warps. With W > 1 every thread of the block
// must call it at the same point (it waits at __syncthreads twice); with sum, acc[0..NT) of
// every thread becomes its row's sums, the W warps' in order of z (red: MMVQ_RED floats of
// shared memory); without, acc is left as it is (a float dot, whole on warp z = 0). W = 1: a
// warp's sums are the row's; nothing waits.
template <int NT> CR_FN void mmvq_combine(float* acc, float* red, bool sum) {
	const int W = (int)blockDim.z;
	if (W == 1)
		return;
	const int g = (int)threadIdx.y * W; // the row's first slot
	if (sum && threadIdx.x == 0) {
#pragma unroll
		for (int t = 0; t < NT; t++)
			red[(g + (int)threadIdx.z) * NT + t] = acc[t];
	}
	__syncthreads();
	if (sum) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float o = red[g * NT + t];
			for (int z = 1; z < W; z++)
				o = cr_fadd(o, red[(g + z) * NT + t]);
			acc[t] = o;
		}
	}
	__syncthreads(); // every read done before red is written again
}

// mmvq_sums is mmv_sums (mmv.cu) with the integer dots: every thread of the row gets its sums
// for tokens t < nt in acc[0..nt) (mmvq_combine's, so with W > 1 every thread of the block calls
// it; a thread with on false reads nothing and adds nothing, for a row that has no dot here).
//
// The weights are read ahead of the dots by mmv_walk (mmv.cu): two blocks for one token (a
// decoded token's products, mmvq1 and the fused kernels), one with several.
template <class T, int NT>
CR_FN void mmvq_sums(const u8* wr, const q8act* x, int cols, int nt, float* acc, float* red, bool on = true) {
	const int p = (int)(threadIdx.z * CR_WARP + threadIdx.x), s = p % T::LPB, step = (int)blockDim.z * CR_WARP / T::LPB;
	const int nb = on ? cols / T::QK : 0;
#pragma unroll
	for (int t = 0; t < NT; t++)
		acc[t] = 0.0f;
	mmv_walk<T, NT == 1 ? 2 : 1>(wr, p / T::LPB, nb, step, s,
	                             [&](const typename T::raw& r, int b) { T::template dotq<NT>(r, s, b, x, nt, acc); });
	if (on) {
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt)
				acc[t] = cr_warp_sum(acc[t]);
	}
	mmvq_combine<NT>(acc, red, true);
}

// mmvq_act returns token t's quantized activation of a row of cols values.
template <class T> CR_FN q8act mmvq_act(const signed char* q, const float* d, const float* s, int cols, int t) {
	q8act a;
	a.q = (const int*)(q + (i64)t * cols);
	a.d = d + (i64)t * (cols / T::QB);
	a.s = s ? s + (i64)t * (cols / 32) : 0;
	return a;
}

// mmvq_dot is one token's integer dot product with row wr, for the fused kernels (on as
// mmvq_sums's).
template <class T> CR_FN float mmvq_dot(const u8* wr, const q8act& x, int cols, float* red, bool on) {
	float acc[1];
	mmvq_sums<T, 1>(wr, &x, cols, 1, acc, red, on);
	return acc[0];
}

// mmvq_dot2 is mmvq_dot of rows wa and wb (an expert's gate and up) with the same activation,
// each to the bit as mmvq_dot computes it alone, with the loads of both rows in flight
// together: a warp that took the two in turn would wait for memory twice as often.
template <class T> CR_FN void mmvq_dot2(const u8* wa, const u8* wb, const q8act& x, int cols, float* a, float* b, float* red) {
	const int p = (int)(threadIdx.z * CR_WARP + threadIdx.x), s = p % T::LPB, step = (int)blockDim.z * CR_WARP / T::LPB;
	const int nb = cols / T::QK;
	float acc[2] = {0.0f, 0.0f};
	int blk = p / T::LPB;
	if (blk < nb) {
		typename T::raw ra = T::load(wa + (i64)blk * T::BB, s), rb = T::load(wb + (i64)blk * T::BB, s);
		for (;;) {
			const int bn = blk + step;
			typename T::raw ran = ra, rbn = rb;
			if (bn < nb) {
				ran = T::load(wa + (i64)bn * T::BB, s);
				rbn = T::load(wb + (i64)bn * T::BB, s);
			}
			T::template dotq<1>(ra, s, blk, &x, 1, &acc[0]);
			T::template dotq<1>(rb, s, blk, &x, 1, &acc[1]);
			if (bn >= nb)
				break;
			ra = ran;
			rb = rbn;
			blk = bn;
		}
	}
	acc[0] = cr_warp_sum(acc[0]);
	acc[1] = cr_warp_sum(acc[1]);
	mmvq_combine<2>(acc, red, true);
	*a = acc[0];
	*b = acc[1];
}

template <class T, int NT>
CR_FN void mmvq_row(const u8* wr, const signed char* q, const float* d, const float* s, float* y, int rows, int cols, int row,
                    int t0, int nt, float* red) {
	q8act x[NT];
#pragma unroll
	for (int t = 0; t < NT; t++)
		x[t] = mmvq_act<T>(q, d, s, cols, t0 + (t < nt ? t : 0));
	float acc[NT];
	mmvq_sums<T, NT>(wr, x, cols, nt, acc, red);
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt && mmvq_leader())
			y[(i64)(t0 + t) * rows + row] = acc[t];
}

// With W > 1 a block is one row (R = 1), so a row past the end is the whole block's, and the
// passes over tokens are the same for all its threads: every thread meets mmvq_combine's waits
// together.
template <class T>
CR_FN void mmvq_entry(const u8* w, const signed char* q, const float* d, const float* s, float* y, int rows, int cols, int ntok,
                      float* red) {
	const int row = blockIdx.x * blockDim.y + threadIdx.y;
	if (row >= rows)
		return; // the whole warp (the whole block when W > 1)
	const u8* wr = w + (i64)row * mmv_row_bytes<T>(cols);
	for (int t0 = blockIdx.y * MMV_TOKENS; t0 < ntok; t0 += gridDim.y * MMV_TOKENS) {
		const int nt = ntok - t0 < MMV_TOKENS ? ntok - t0 : MMV_TOKENS;
		if (nt == 1)
			mmvq_row<T, 1>(wr, q, d, s, y, rows, cols, row, t0, 1, red);
		else if (nt == 2)
			mmvq_row<T, 2>(wr, q, d, s, y, rows, cols, row, t0, 2, red);
		else if (nt <= 4)
			mmvq_row<T, 4>(wr, q, d, s, y, rows, cols, row, t0, nt, red);
		else
			mmvq_row<T, 8>(wr, q, d, s, y, rows, cols, row, t0, nt, red);
	}
}

// mmvq1_entry is mmvq_entry for one token, in a kernel of its own: a kernel's registers are
// those of its widest path, and mmvq_entry's is a pass of 8 tokens, whose sums and
// activation pointers would bound the warps an SM keeps in flight, and with them how much of
// the weights' bandwidth a decoded token's product reaches. Its arithmetic is mmvq_entry's
// for one token, to the bit.
template <class T>
CR_FN void mmvq1_entry(const u8* w, const signed char* q, const float* d, const float* s, float* y, int rows, int cols,
                       float* red) {
	const int row = blockIdx.x * blockDim.y + threadIdx.y;
	if (row >= rows)
		return; // the whole warp (the whole block when W > 1)
	mmvq_row<T, 1>(w + (i64)row * mmv_row_bytes<T>(cols), q, d, s, y, rows, cols, row, 0, 1, red);
}

#define MMVQ_KERNEL(sfx, T)                                                                                                    \
	extern "C" __global__ void mmvq_##sfx(const u8* w, const signed char* q, const float* d, const float* s, float* y, int rows, \
	                                      int cols, int ntok) {                                                                  \
		__shared__ float red[MMVQ_RED];                                                                                        \
		mmvq_entry<T>(w, q, d, s, y, rows, cols, ntok, red);                                                                     \
	}                                                                                                                          \
	extern "C" __global__ void mmvq1_##sfx(const u8* w, const signed char* q, const float* d, const float* s, float* y,         \
	                                       int rows, int cols, int ntok) {                                                       \
		(void)ntok;                                                                                                              \
		__shared__ float red[MMVQ_RED];                                                                                        \
		mmvq1_entry<T>(w, q, d, s, y, rows, cols, red);                                                                          \
	}

// mmvq_q4_0 .. mmvq_q6_K: the ABI at the top of this file; the activation quantized as the
// weight type's dot type (Q8_0, Q8_1 for Q4_1 and Q5_1, Q8_K for the K-quants).
// mmvq1_q4_0 .. mmvq1_q6_K: the same for ntok = 1 alone (grid.y = 1), with the same ABI.
MMVQ_KERNEL(q4_0, mmvq_q4_0_t)
MMVQ_KERNEL(q4_1, mmvq_q4_1_t)
MMVQ_KERNEL(q5_0, mmvq_q5_0_t)
MMVQ_KERNEL(q5_1, mmvq_q5_1_t)
MMVQ_KERNEL(q8_0, mmvq_q8_0_t)
MMVQ_KERNEL(iq4_nl, mmvq_iq4_nl_t)
MMVQ_KERNEL(mxfp4, mmvq_mxfp4_t)
MMVQ_KERNEL(q2_K, mmvq_q2_K_t)
MMVQ_KERNEL(q3_K, mmvq_q3_K_t)
MMVQ_KERNEL(q4_K, mmvq_q4_K_t)
MMVQ_KERNEL(q5_K, mmvq_q5_K_t)
MMVQ_KERNEL(q6_K, mmvq_q6_K_t)

// ---- for the fused kernels (fused.cu) ----

// mmvq_of maps mmv.cu's traits to the integer ones; the float types have none (ok = 0).
template <class T> struct mmvq_of {
	enum { ok = 0 };
	typedef T type;
};
#define MMVQ_OF(T, Q)                                                                                                          \
	template <> struct mmvq_of<T> {                                                                                            \
		enum { ok = 1 };                                                                                                       \
		typedef Q type;                                                                                                        \
	};
MMVQ_OF(mmv_q4_0_t, mmvq_q4_0_t)
MMVQ_OF(mmv_q4_1_t, mmvq_q4_1_t)
MMVQ_OF(mmv_q5_0_t, mmvq_q5_0_t)
MMVQ_OF(mmv_q5_1_t, mmvq_q5_1_t)
MMVQ_OF(mmv_q8_0_t, mmvq_q8_0_t)
MMVQ_OF(mmv_iq4_nl_t, mmvq_iq4_nl_t)
MMVQ_OF(mmv_mxfp4_t, mmvq_mxfp4_t)
MMVQ_OF(mmv_q2_K_t, mmvq_q2_K_t)
MMVQ_OF(mmv_q3_K_t, mmvq_q3_K_t)
MMVQ_OF(mmv_q4_K_t, mmvq_q4_K_t)
MMVQ_OF(mmv_q5_K_t, mmvq_q5_K_t)
MMVQ_OF(mmv_q6_K_t, mmvq_q6_K_t)

// q8planes are a quantized activation's planes (q NULL: the activation is not quantized).
struct q8planes {
	const signed char* q;
	const float* d;
	const float* s;
};

// mmv_any computes one token's product with row wr as the unfused kernels would: mmvq's
// integer dot on row `row` of the quantized activation xq (rows of cols) when it is given, else
// mmv's float dot on xt, the path vec as mmv chooses it. With W = blockDim.z > 1 every thread
// of the block calls it at the same point (mmvq_combine), and its value is the row's on the
// thread that writes it (mmvq_leader): the float dot is warp z = 0's alone. on false: a row
// with no dot here, which reads nothing but waits with the others.
//
// dot2 is dot of rows wa and wb (their paths va and vb), each to the bit as dot computes it;
// the integer path keeps the loads of both in flight together (mmvq_dot2).
template <class T> CR_FN float mmv_any_float(const u8* wr, const float* xt, int cols, bool vec, const float* cb, float* red, bool on) {
	float v = on && threadIdx.z == 0 ? mmv_dot<T>(wr, xt, cols, vec, cb) : 0.0f;
	mmvq_combine<1>(&v, red, false);
	return v;
}

template <class T, int OK = mmvq_of<T>::ok> struct mmv_any {
	CR_FN float dot(const u8* wr, const float* xt, int cols, bool vec, const float* cb, const q8planes& xq, int row, float* red,
	                bool on = true) {
		(void)xq, (void)row;
		return mmv_any_float<T>(wr, xt, cols, vec, cb, red, on);
	}
	CR_FN void dot2(const u8* wa, const u8* wb, const float* xt, int cols, bool va, bool vb, const float* cb, const q8planes& xq,
	                int row, float* a, float* b, float* red) {
		*a = dot(wa, xt, cols, va, cb, xq, row, red);
		*b = dot(wb, xt, cols, vb, cb, xq, row, red);
	}
};
template <class T> struct mmv_any<T, 1> {
	CR_FN float dot(const u8* wr, const float* xt, int cols, bool vec, const float* cb, const q8planes& xq, int row, float* red,
	                bool on = true) {
		typedef typename mmvq_of<T>::type Q;
		if (!xq.q)
			return mmv_any_float<T>(wr, xt, cols, vec, cb, red, on);
		return mmvq_dot<Q>(wr, mmvq_act<Q>(xq.q, xq.d, xq.s, cols, row), cols, red, on);
	}
	CR_FN void dot2(const u8* wa, const u8* wb, const float* xt, int cols, bool va, bool vb, const float* cb, const q8planes& xq,
	                int row, float* a, float* b, float* red) {
		typedef typename mmvq_of<T>::type Q;
		if (!xq.q) {
			*a = mmv_any_float<T>(wa, xt, cols, va, cb, red, true);
			*b = mmv_any_float<T>(wb, xt, cols, vb, cb, red, true);
			return;
		}
		mmvq_dot2<Q>(wa, wb, mmvq_act<Q>(xq.q, xq.d, xq.s, cols, row), cols, a, b, red);
	}
};
