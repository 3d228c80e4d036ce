// flash.cu: a prompt's attention on the tensor cores, over an F16 KV cache (flash attention's
// tiling and online softmax). attn_f16kv (attention.cu) gives each (query head, token) a block
// whose warps score one position at a time with float32 products and warp sums: a prompt of n
// tokens does n^2/2 such steps a head, which at a few thousand tokens is most of its time. Here
// a block takes 64 tokens of one query head, a warp 16 of them (32 tokens for heads of 256,
// two warps sharing 16 tokens' values); each tile of BN positions' keys and values (64 for
// heads of 64, 32 for 128, 16 for 256: two tiles of each fit the 48 KiB of static shared
// memory) is read once into shared memory for all of them, the next tile
// copied in while this one is used (cp.async from sm_80), and the scores
// (Q K^T) and the weighted values (P V) are mma.sync products of halves with float32 sums:
// m16n8k16 in the sm_80 module (sm80.cu), two m16n8k8 in the base module (sm_75) and the
// emulator.
//
// What it computes is attn_f16kv's (models.attend with an F16 cache): q rounded to F16, scores
// (q . k) * scale, the causal mask, a sliding window, a ring, attention sinks, the softmax, the
// values weighed by F16 probabilities. What differs is the order of the sums and the softmax's
// form: each row keeps a running maximum m and sum l over the tiles, rescaling its sum and its
// output by exp(m_old - m_new) when the maximum grows; a probability is exp(s - m_running)
// rounded to F16 before it weighs a value, and the output is divided by l at the end, where the
// CPU rounds exp(s - m) / sum. So results agree with attn_f16kv's to about F16 rounding of the
// probabilities (the tests' bounds), not bit for bit.
//
// Shapes: standard and grouped-query attention with dk == dv == 64, 128 or 256 (one entry
// point each). Other heads take attn_f16kv.
#include "common.cuh"

#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * CR_WARP)
// A warp takes 16 tokens, the rows of an m16 product; with a value split VS (heads of 256,
// whose outputs would not fit a thread's registers) VS warps take the same 16 tokens, each
// VS-th of the values (each computing the scores in full), so a block takes 16 * FA_WARPS / VS.
#define FA_BM(VS) (16 * FA_WARPS / (VS))
#define FA_PAD 8              // halves after each shared row: a fragment's loads hit distinct banks

// fa_fetch starts the copies of the keys and values of positions base .. base+BN-1 into ks and
// vs, 16 bytes a copy, zeros past bhi.
template <int D, int BN>
CR_FN void fa_fetch(u32 (*ks)[(D + FA_PAD) / 2], u32 (*vs)[(D + FA_PAD) / 2], const u16* kb, const u16* vb, int kstride, int vstride,
                    int base, int bhi, int ring, int tid) {
	for (int i = tid; i < BN * (D / 8); i += FA_THREADS) {
		const int r = i / (D / 8), c = 8 * (i % (D / 8)), p = base + r;
		const i64 slot = p < bhi ? cr_kv_row(p, ring) : 0;
		cr_cp_async16(&ks[r][c / 2], kb + slot * kstride + c, p < bhi);
		cr_cp_async16(&vs[r][c / 2], vb + slot * vstride + c, p < bhi);
	}
}

// fa_tile takes one tile of positions base .. base+BN-1 (ks, vs) into the warp's rows: their
// scores, the running maxima (ma, mb) and the lane's shares of the sums (la, lb), rescaled as
// the maxima grow, and the outputs o.
template <int D, int BN, int VS>
CR_FN void fa_tile(const u32 (*ks)[(D + FA_PAD) / 2], const u32 (*vs)[(D + FA_PAD) / 2], const u32 (*qa)[4], float (*o)[4], float& ma,
                   float& mb, float& la, float& lb, int base, int na, int nb, int loa, int lob, float scale, int g, int tq, int v0) {
	// Scores of the warp's 16 rows against the tile's positions.
	float s[BN / 8][4];
#pragma unroll
	for (int nt = 0; nt < BN / 8; nt++) {
		s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < D / 16; kk++) {
			const u32 bf[2] = {ks[8 * nt + g][8 * kk + tq], ks[8 * nt + g][8 * kk + 4 + tq]};
			cr_mma_f16_k16(qa[kk], bf, s[nt]);
		}
	}
	// Scale and mask; the tile's maxima of the two rows.
	float xa = -cr_inf(), xb = -cr_inf();
#pragma unroll
	for (int nt = 0; nt < BN / 8; nt++) {
#pragma unroll
		for (int e = 0; e < 2; e++) {
			const int p = base + 8 * nt + 2 * tq + e;
			s[nt][e] = p >= loa && p < na ? cr_fmul(s[nt][e], scale) : -cr_inf();
			s[nt][2 + e] = p >= lob && p < nb ? cr_fmul(s[nt][2 + e], scale) : -cr_inf();
			xa = s[nt][e] > xa ? s[nt][e] : xa;
			xb = s[nt][2 + e] > xb ? s[nt][2 + e] : xb;
		}
	}
#pragma unroll
	for (int m = 1; m < 4; m <<= 1) { // the four lanes of a row
		const float ya = cr_shfl_xor(xa, m), yb = cr_shfl_xor(xb, m);
		xa = ya > xa ? ya : xa;
		xb = yb > xb ? yb : xb;
	}
	const float na_m = xa > ma ? xa : ma, nb_m = xb > mb ? xb : mb;
	// exp(-Inf - -Inf) would be NaN: a row with nothing seen yet subtracts 0 instead.
	const float ra = na_m == -cr_inf() ? 0.0f : na_m, rb = nb_m == -cr_inf() ? 0.0f : nb_m;
	const float fa = cr_exp_v(ma - ra), fb = cr_exp_v(mb - rb);
	ma = na_m;
	mb = nb_m;
	la = cr_fmul(la, fa);
	lb = cr_fmul(lb, fb);
#pragma unroll
	for (int j = 0; j < D / VS / 8; j++) {
		o[j][0] = cr_fmul(o[j][0], fa);
		o[j][1] = cr_fmul(o[j][1], fa);
		o[j][2] = cr_fmul(o[j][2], fb);
		o[j][3] = cr_fmul(o[j][3], fb);
	}
	// Probabilities (unnormalised) as A fragments, and the values they weigh.
	u32 pa[BN / 16][4];
#pragma unroll
	for (int nt = 0; nt < BN / 8; nt++) {
		const float e0 = cr_exp_v(s[nt][0] - ra), e1 = cr_exp_v(s[nt][1] - ra);
		const float e2 = cr_exp_v(s[nt][2] - rb), e3 = cr_exp_v(s[nt][3] - rb);
		la = cr_fadd(la, cr_fadd(e0, e1));
		lb = cr_fadd(lb, cr_fadd(e2, e3));
		pa[nt / 2][2 * (nt % 2)] = cr_pack_h2(e0, e1);
		pa[nt / 2][2 * (nt % 2) + 1] = cr_pack_h2(e2, e3);
	}
#pragma unroll
	for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
		for (int j = 0; j < D / VS / 8; j++) {
			const u16* vc = (const u16*)&vs[16 * kk + 2 * tq][0] + v0 + 8 * j + g; // rows 2t, 2t+1, 2t+8, 2t+9
			const u32 bf[2] = {(u32)vc[0] | (u32)vc[D + FA_PAD] << 16, (u32)vc[8 * (D + FA_PAD)] | (u32)vc[9 * (D + FA_PAD)] << 16};
			cr_mma_f16_k16(pa[kk], bf, o[j]);
		}
	}
}

// fa_body is the kernel for heads of D values (dk == dv == D), in tiles of BN positions, the
// values split VS ways.
template <int D, int BN, int VS>
CR_FN void fa_body(const float* q, const u16* k, const u16* v, float* out, int ntok, int heads, int kv_heads, int dk, int dv,
                   int kstride, int vstride, int kh_stride, int vh_stride, const int* posp, int pos0, float scale, int window,
                   const float* sinks, int ring) {
	// A tile's keys and values, a position a row, two halves a word (clang splits a 32-bit
	// load from an array of halves in two). The values stay in rows too: a B fragment of P V
	// pairs two positions' halves of one value index, which two 16-bit loads from rows 2t and
	// 2t+1 give without bank conflicts, where storing the tile transposed would put the lanes
	// of a store in one bank.
	// Two of each: the next tile is copied in (cp.async from sm_80) while this one is used.
	__shared__ __attribute__((aligned(16))) u32 ks[2][BN][(D + FA_PAD) / 2];
	__shared__ __attribute__((aligned(16))) u32 vs[2][BN][(D + FA_PAD) / 2];
	const int h = blockIdx.y, t0 = blockIdx.x * FA_BM(VS);
	if (h >= heads || t0 >= ntok)
		return;
	const int tid = threadIdx.x, lane = tid % CR_WARP, g = lane / 4, tq = lane % 4;
	const int warp = tid / CR_WARP / VS, v0 = tid / CR_WARP % VS * (D / VS); // the warp's 16 tokens, its values from v0
	const int tlast = (t0 + FA_BM(VS) < ntok ? t0 + FA_BM(VS) : ntok) - 1; // the block's last token
	if (dk != D || dv != D || kv_heads <= 0 || heads % kv_heads != 0) {
		for (int i = tid; i < (tlast - t0 + 1) * dv; i += FA_THREADS)
			out[((i64)(t0 + i / dv) * heads + h) * dv + i % dv] = cr_as_f(0x7fc00000u); // NaN: shapes it does not take
		return;
	}
	const int kvh = h / (heads / kv_heads);
	const int p0 = pos0 + (posp ? *posp : 0); // token t is at position p0 + t
	// The lane's two rows: tokens ta and ta + 8 of the warp's 16. Rows past the last token
	// repeat it (finite, never stored).
	const int ta = t0 + 16 * warp + g, tb = ta + 8;
	const int ca = ta < ntok ? ta : ntok - 1, cb = tb < ntok ? tb : ntok - 1;
	const int na = p0 + ca + 1, nb = p0 + cb + 1; // each row sees positions lo .. n-1
	const int loa = window > 0 && na > window ? na - window : 0, lob = window > 0 && nb > window ? nb - window : 0;
	// The positions the block reads, and those its warp's rows see.
	const int bhi = p0 + tlast + 1, blo = window > 0 && p0 + t0 + 1 > window ? p0 + t0 + 1 - window : 0;
	const int w0 = t0 + 16 * warp < ntok ? t0 + 16 * warp : ntok - 1, w1 = w0 + 15 < ntok ? w0 + 15 : ntok - 1;
	const int whi = p0 + w1 + 1, wlo = window > 0 && p0 + w0 + 1 > window ? p0 + w0 + 1 - window : 0;

	// The queries as A fragments of m16n8k16, rounded to F16 as the CPU rounds them.
	u32 qa[D / 16][4];
	{
		const float* qra = q + ((i64)ca * heads + h) * D;
		const float* qrb = q + ((i64)cb * heads + h) * D;
#pragma unroll
		for (int kk = 0; kk < D / 16; kk++) {
			const int c = 16 * kk + 2 * tq;
			qa[kk][0] = cr_pack_h2(qra[c], qra[c + 1]);
			qa[kk][1] = cr_pack_h2(qrb[c], qrb[c + 1]);
			qa[kk][2] = cr_pack_h2(qra[c + 8], qra[c + 9]);
			qa[kk][3] = cr_pack_h2(qrb[c + 8], qrb[c + 9]);
		}
	}
	float o[D / VS / 8][4];
#pragma unroll
	for (int j = 0; j < D / VS / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	// Running maxima and the lane's share of the running sums. A sink joins the maximum from
	// the start (ggml's MAX(max, sink)) and the sum at the end.
	const float sink = sinks ? sinks[h] : -cr_inf();
	float ma = sink, mb = sink, la = 0.0f, lb = 0.0f;
	const u16* kb = k + (i64)kvh * kh_stride;
	const u16* vb = v + (i64)kvh * vh_stride;

	fa_fetch<D, BN>(ks[0], vs[0], kb, vb, kstride, vstride, blo, bhi, ring, tid);
	cr_cp_async_commit();
	for (int base = blo, buf = 0; base < bhi; base += BN, buf ^= 1) {
		if (base + BN < bhi)
			fa_fetch<D, BN>(ks[buf ^ 1], vs[buf ^ 1], kb, vb, kstride, vstride, base + BN, bhi, ring, tid);
		cr_cp_async_commit(); // a group each round, empty at the last, so that wait1 waits for this tile's
		cr_cp_async_wait1();
		__syncthreads(); // this tile is in ks[buf], vs[buf] for every thread
		if (base < whi && base + BN > wlo) // a position of the tile is seen by the warp's rows
			fa_tile<D, BN, VS>(ks[buf], vs[buf], qa, o, ma, mb, la, lb, base, na, nb, loa, lob, scale, g, tq, v0);
		__syncthreads(); // every warp is done with ks[buf], vs[buf]: the next round copies into them
	}

	// The rows' sums over their four lanes, the sink's share, and the output.
#pragma unroll
	for (int m = 1; m < 4; m <<= 1) {
		la = cr_fadd(la, cr_shfl_xor(la, m));
		lb = cr_fadd(lb, cr_shfl_xor(lb, m));
	}
	if (sinks) { // the CPU's scalar exp, in the denominator only
		la = cr_fadd(la, cr_expf(sink - ma));
		lb = cr_fadd(lb, cr_expf(sink - mb));
	}
	const float ia = 1.0f / la, ib = 1.0f / lb;
#pragma unroll
	for (int j = 0; j < D / VS / 8; j++) {
		const int d = v0 + 8 * j + 2 * tq;
		if (ta < ntok) {
			float* oa = out + ((i64)ta * heads + h) * D + d;
			oa[0] = cr_fmul(o[j][0], ia);
			oa[1] = cr_fmul(o[j][1], ia);
		}
		if (tb < ntok) {
			float* ob = out + ((i64)tb * heads + h) * D + d;
			ob[0] = cr_fmul(o[j][2], ib);
			ob[1] = cr_fmul(o[j][3], ib);
		}
	}
}

// attn_fa_f16kv_d64, attn_fa_f16kv_d128, attn_fa_f16kv_d256(const float* q,
//          const unsigned short* k, const unsigned short* v, float* out, int ntok, int heads,
//          int kv_heads, int dk, int dv, int kstride, int vstride, int kh_stride, int vh_stride,
//          const int* posp, int pos0, float scale, int window, const float* sinks, int ring)
//   attn_f16kv's arguments and meaning (attention.cu), for heads of 64, 128 or 256 values: dk ==
//   dv == 64 (128, 256), else every output of the block is NaN. The keys and values are read
//   16 bytes at a time: k, v, kstride, vstride, kh_stride and vh_stride must keep every row
//   16-byte aligned (multiples of 8 halves). The ring, when > 0, must hold the positions every
//   token of a block sees: its window and the block's tokens (the engine's rings hold the
//   window and a whole pass).
//   A block takes 64 tokens (32 for heads of 256, whose values two warps share): grid
//   (ceil(ntok / 64), heads, 1) (ceil(ntok / 32) for 256); block (128, 1, 1) exactly; no
//   dynamic shared memory (36 KiB static for 64, 34 KiB for 128 and 256).
#define FA_KERNEL(D, BN, VS)                                                                                                 \
	extern "C" __global__ void attn_fa_f16kv_d##D(const float* q, const u16* k, const u16* v, float* out, int ntok, int heads, \
	                                              int kv_heads, int dk, int dv, int kstride, int vstride, int kh_stride,      \
	                                              int vh_stride, const int* posp, int pos0, float scale, int window,          \
	                                              const float* sinks, int ring) {                                             \
		fa_body<D, BN, VS>(q, k, v, out, ntok, heads, kv_heads, dk, dv, kstride, vstride, kh_stride, vh_stride, posp, pos0,    \
		                   scale, window, sinks, ring);                                                                       \
	}
FA_KERNEL(64, 64, 1)
FA_KERNEL(128, 32, 1)
FA_KERNEL(256, 16, 2)
