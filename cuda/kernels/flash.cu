// flash.cu: a prompt's attention on the tensor cores, over an F16 KV cache (flash attention's
// tiling and online softmax). attn_f16kv (attention.cu) gives each (query head, token) a block
// whose warps score one position at a time with float32 products and warp sums: a prompt of n
// tokens does n^2/2 such steps a head, which at a few thousand tokens is most of its time. Here
// a block takes 64 tokens of one query head, a warp 16 of them (32 tokens for heads of 256,
// two warps sharing 16 tokens' values); each tile of BN positions' keys and values (64 for
// heads of 64, 32 for 128 and for MLA's 192/128, 16 for 256: two tiles of each fit the 48 KiB
// of static shared memory) is read once into shared memory for all of them (from sm_80 the
// next tile copied in while this one is used: FA_STAGES), and the scores (Q K^T) and the
// weighted values (P V) are mma.sync products of halves with float32 sums: m16n8k16 in the
// sm_80 module (sm80.cu), two m16n8k8 in the base module (sm_75) and the emulator.
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
// Shapes: standard and grouped-query attention with dk == dv == 64, 128 or 256, DeepSeek's MLA
// in the legacy layout (dk 192, dv 128), one entry point each; and MLA's absorbed layout (one
// latent KV head of 576, its values the first 512), whose kernel splits a block's rows' work
// over its warps (attn_fa_f16kv_latent576, at the end). Other heads take attn_f16kv.
#include "common.cuh"

#define FA_WARPS 4
#define FA_THREADS (FA_WARPS * CR_WARP)
// A warp takes 16 tokens, the rows of an m16 product; with a value split VS (heads of 256,
// whose outputs would not fit a thread's registers) VS warps take the same 16 tokens, each
// VS-th of the values (each computing the scores in full), so a block takes 16 * FA_WARPS / VS.
#define FA_BM(VS) (16 * FA_WARPS / (VS))
#define FA_PAD 8              // halves after each shared row: a fragment's loads hit distinct banks

// FA_STAGES: the tiles of keys and values a block holds. Where copies are asynchronous
// (CR_CP_ASYNC: the sm_80 module) two, the next copied in while this one is used. Before
// sm_80 one, as in llama.cpp's Turing kernels: there a copy is a load and a store, done before
// the barrier that follows it, so a second buffer overlaps nothing, and a block of half the
// shared memory (17-22 KiB instead of 33-42) lets two or three blocks share a 2080 Ti's SM
// (64 KiB) where one did, their warps hiding each other's loads.
#if defined(CR_CP_ASYNC)
#define FA_STAGES 2
#else
#define FA_STAGES 1
#endif

// fa_fetch starts the copies of the first W halves of the cache rows of positions base ..
// base+BN-1 (b: the cache, stride halves a row) into t, 16 bytes a copy, zeros past bhi.
template <int W, int BN>
CR_FN void fa_fetch(u32 (*t)[(W + FA_PAD) / 2], const u16* b, int stride, int base, int bhi, int ring, int tid) {
	for (int i = tid; i < BN * (W / 8); i += FA_THREADS) {
		const int r = i / (W / 8), c = 8 * (i % (W / 8)), p = base + r;
		const i64 slot = p < bhi ? cr_kv_row(p, ring) : 0;
		cr_cp_async16(&t[r][c / 2], b + slot * stride + c, p < bhi);
	}
}

// fa_scores sets s to the scores (unscaled) of the warp's 16 rows against a tile's BN positions
// (ks: their keys, W halves a row) over KS steps of 16 of the keys' values from step k0; qa
// holds the rows' queries at those steps.
template <int W, int BN, int KS>
CR_FN void fa_scores(const u32 (*ks)[(W + FA_PAD) / 2], const u32 (*qa)[4], float (*s)[4], int k0, int g, int tq) {
#pragma unroll
	for (int nt = 0; nt < BN / 8; nt++) {
		s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
		for (int kk = 0; kk < KS; kk++) {
			const u32 bf[2] = {ks[8 * nt + g][8 * (k0 + kk) + tq], ks[8 * nt + g][8 * (k0 + kk) + 4 + tq]};
			cr_mma_f16_k16(qa[kk], bf, s[nt]);
		}
	}
}

// fa_softmax takes the scores s of a tile of positions from base into the lane's two rows:
// scaled and masked (row a sees positions loa .. na-1, b lob .. nb-1), their maxima folded into
// the running maxima (ma, mb), the lane's shares of the running sums (la, lb) and the outputs o
// (NO tiles of 8 values) rescaled by what the maxima grew, the tile's exps added to the sums,
// and the probabilities exp(s - m), rounded to halves, written as A fragments to pa.
template <int BN, int NO>
CR_FN void fa_softmax(float (*s)[4], u32 (*pa)[4], float (*o)[4], float& ma, float& mb, float& la, float& lb, int base, int na, int nb,
                      int loa, int lob, float scale, int tq) {
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
	for (int j = 0; j < NO; j++) {
		o[j][0] = cr_fmul(o[j][0], fa);
		o[j][1] = cr_fmul(o[j][1], fa);
		o[j][2] = cr_fmul(o[j][2], fb);
		o[j][3] = cr_fmul(o[j][3], fb);
	}
	// Probabilities (unnormalised) as A fragments.
#pragma unroll
	for (int nt = 0; nt < BN / 8; nt++) {
		const float e0 = cr_exp_v(s[nt][0] - ra), e1 = cr_exp_v(s[nt][1] - ra);
		const float e2 = cr_exp_v(s[nt][2] - rb), e3 = cr_exp_v(s[nt][3] - rb);
		la = cr_fadd(la, cr_fadd(e0, e1));
		lb = cr_fadd(lb, cr_fadd(e2, e3));
		pa[nt / 2][2 * (nt % 2)] = cr_pack_h2(e0, e1);
		pa[nt / 2][2 * (nt % 2) + 1] = cr_pack_h2(e2, e3);
	}
}

// fa_pv adds to o (NO tiles of 8 values from v0) the tile's values (vs, W halves a row)
// weighed by the probabilities pa.
template <int W, int BN, int NO>
CR_FN void fa_pv(const u32 (*vs)[(W + FA_PAD) / 2], const u32 (*pa)[4], float (*o)[4], int v0, int g, int tq) {
#pragma unroll
	for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
		for (int j = 0; j < NO; j++) {
			const u16* vc = (const u16*)&vs[16 * kk + 2 * tq][0] + v0 + 8 * j + g; // rows 2t, 2t+1, 2t+8, 2t+9
			const u32 bf[2] = {(u32)vc[0] | (u32)vc[W + FA_PAD] << 16, (u32)vc[8 * (W + FA_PAD)] | (u32)vc[9 * (W + FA_PAD)] << 16};
			cr_mma_f16_k16(pa[kk], bf, o[j]);
		}
	}
}

// fa_store sums the lane's two rows' shares (la, lb) over their four lanes, adds the sinks'
// shares (sa, sb, when sinks is not NULL) and stores the outputs o divided by the sums: row a's
// values 8j + 2tq and the next at oa (NULL: a row past the last token), row b's at ob.
template <int NO>
CR_FN void fa_store(float (*o)[4], float la, float lb, float ma, float mb, const float* sinks, float sa, float sb, float* oa, float* ob,
                    int tq) {
#pragma unroll
	for (int m = 1; m < 4; m <<= 1) {
		la = cr_fadd(la, cr_shfl_xor(la, m));
		lb = cr_fadd(lb, cr_shfl_xor(lb, m));
	}
	if (sinks) { // the CPU's scalar exp, in the denominator only
		la = cr_fadd(la, cr_expf(sa - ma));
		lb = cr_fadd(lb, cr_expf(sb - mb));
	}
	const float ia = 1.0f / la, ib = 1.0f / lb;
#pragma unroll
	for (int j = 0; j < NO; j++) {
		const int d = 8 * j + 2 * tq;
		if (oa) {
			oa[d] = cr_fmul(o[j][0], ia);
			oa[d + 1] = cr_fmul(o[j][1], ia);
		}
		if (ob) {
			ob[d] = cr_fmul(o[j][2], ib);
			ob[d + 1] = cr_fmul(o[j][3], ib);
		}
	}
}

// fa_nan stores NaN in the n outputs at out: a block's answer to shapes its kernel does not take.
CR_FN void fa_nan(float* out, int n, int tid) {
	for (int i = tid; i < n; i += FA_THREADS)
		out[i] = cr_as_f(0x7fc00000u);
}

// fa_body is the kernel for heads of DK key and DV value halves, in tiles of BN positions, the
// values split VS ways.
template <int DK, int DV, int BN, int VS>
CR_FN void fa_body(const float* q, const u16* k, const u16* v, float* out, int ntok, int heads, int kv_heads, int dk, int dv,
                   int kstride, int vstride, int kh_stride, int vh_stride, const int* posp, int pos0, float scale, int window,
                   const float* sinks, int ring) {
	// A tile's keys and values, a position a row, two halves a word (clang splits a 32-bit
	// load from an array of halves in two). The values stay in rows too: a B fragment of P V
	// pairs two positions' halves of one value index, which two 16-bit loads from rows 2t and
	// 2t+1 give without bank conflicts, where storing the tile transposed would put the lanes
	// of a store in one bank.
	// FA_STAGES of each.
	__shared__ __attribute__((aligned(16))) u32 ks[FA_STAGES][BN][(DK + FA_PAD) / 2];
	__shared__ __attribute__((aligned(16))) u32 vs[FA_STAGES][BN][(DV + FA_PAD) / 2];
	const int h = blockIdx.y, t0 = blockIdx.x * FA_BM(VS);
	if (h >= heads || t0 >= ntok)
		return;
	const int tid = threadIdx.x, lane = tid % CR_WARP, g = lane / 4, tq = lane % 4;
	const int warp = tid / CR_WARP / VS, v0 = tid / CR_WARP % VS * (DV / VS); // the warp's 16 tokens, its values from v0
	const int tlast = (t0 + FA_BM(VS) < ntok ? t0 + FA_BM(VS) : ntok) - 1; // the block's last token
	if (dk != DK || dv != DV || kv_heads <= 0 || heads % kv_heads != 0) {
		for (int t = t0; t <= tlast; t++)
			fa_nan(out + ((i64)t * heads + h) * dv, dv, tid);
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
	u32 qa[DK / 16][4];
	{
		const float* qra = q + ((i64)ca * heads + h) * DK;
		const float* qrb = q + ((i64)cb * heads + h) * DK;
#pragma unroll
		for (int kk = 0; kk < DK / 16; kk++) {
			const int c = 16 * kk + 2 * tq;
			qa[kk][0] = cr_pack_h2(qra[c], qra[c + 1]);
			qa[kk][1] = cr_pack_h2(qrb[c], qrb[c + 1]);
			qa[kk][2] = cr_pack_h2(qra[c + 8], qra[c + 9]);
			qa[kk][3] = cr_pack_h2(qrb[c + 8], qrb[c + 9]);
		}
	}
	float o[DV / VS / 8][4];
#pragma unroll
	for (int j = 0; j < DV / VS / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	// Running maxima and the lane's share of the running sums. A sink joins the maximum from
	// the start (ggml's MAX(max, sink)) and the sum at the end.
	const float sink = sinks ? sinks[h] : -cr_inf();
	float ma = sink, mb = sink, la = 0.0f, lb = 0.0f;
	const u16* kb = k + (i64)kvh * kh_stride;
	const u16* vb = v + (i64)kvh * vh_stride;

	if (FA_STAGES > 1) {
		fa_fetch<DK, BN>(ks[0], kb, kstride, blo, bhi, ring, tid);
		fa_fetch<DV, BN>(vs[0], vb, vstride, blo, bhi, ring, tid);
		cr_cp_async_commit();
	}
	for (int base = blo, buf = 0; base < bhi; base += BN, buf = (buf + 1) % FA_STAGES) {
		// Each round copies the tile FA_STAGES - 1 ahead: the next, into the other buffer, or
		// with one stage this one.
		const int ahead = base + (FA_STAGES - 1) * BN, into = (buf + FA_STAGES - 1) % FA_STAGES;
		if (ahead < bhi) {
			fa_fetch<DK, BN>(ks[into], kb, kstride, ahead, bhi, ring, tid);
			fa_fetch<DV, BN>(vs[into], vb, vstride, ahead, bhi, ring, tid);
		}
		cr_cp_async_commit(); // a group each round, empty at the last, so that the wait waits for this tile's
		cr_cp_async_wait<FA_STAGES - 1>();
		__syncthreads(); // this tile is in ks[buf], vs[buf] for every thread
		if (base < whi && base + BN > wlo) { // a position of the tile is seen by the warp's rows
			float s[BN / 8][4];
			u32 pa[BN / 16][4];
			const int z = cr_opaque_zero(); // see cr_opaque_zero: with one stage, ks[buf] is a fixed address
			fa_scores<DK, BN, DK / 16>(ks[buf] + z, qa, s, 0, g, tq);
			fa_softmax<BN, DV / VS / 8>(s, pa, o, ma, mb, la, lb, base, na, nb, loa, lob, scale, tq);
			fa_pv<DV, BN, DV / VS / 8>(vs[buf] + z, pa, o, v0, g, tq);
		}
		__syncthreads(); // every warp is done with ks[buf], vs[buf]: a later round copies into them
	}
	fa_store<DV / VS / 8>(o, la, lb, ma, mb, sinks, sink, sink, ta < ntok ? out + ((i64)ta * heads + h) * DV + v0 : nullptr,
	                      tb < ntok ? out + ((i64)tb * heads + h) * DV + v0 : nullptr, tq);
}

// attn_fa_f16kv_d64, attn_fa_f16kv_d128, attn_fa_f16kv_d256, attn_fa_f16kv_d192v128(
//          const float* q, const unsigned short* k, const unsigned short* v, float* out,
//          int ntok, int heads, int kv_heads, int dk, int dv, int kstride, int vstride,
//          int kh_stride, int vh_stride, const int* posp, int pos0, float scale, int window,
//          const float* sinks, int ring)
//   attn_f16kv's arguments and meaning (attention.cu), for heads of 64, 128 or 256 values (dk
//   == dv), or of 192 keys and 128 values (DeepSeek's MLA in the legacy attn_kv_b layout:
//   nope 128 + rope 64), else every output of the block is NaN. The keys and values are read
//   16 bytes at a time: k, v, kstride, vstride, kh_stride and vh_stride must keep every row
//   16-byte aligned (multiples of 8 halves). The ring, when > 0, must hold the positions every
//   token of a block sees: its window and the block's tokens (the engine's rings hold the
//   window and a whole pass).
//   A block takes 64 tokens (32 for heads of 256, whose values two warps share): grid
//   (ceil(ntok / 64), heads, 1) (ceil(ntok / 32) for 256); block (128, 1, 1) exactly; no
//   dynamic shared memory (static, in the sm_80 module: 36 KiB for 64, 34 KiB for 128 and 256,
//   42 KiB for 192; half that in the base module, FA_STAGES).
#define FA_KERNEL(NAME, DK, DV, BN, VS)                                                                                        \
	extern "C" __global__ void attn_fa_f16kv_##NAME(const float* q, const u16* k, const u16* v, float* out, int ntok, int heads, \
	                                                int kv_heads, int dk, int dv, int kstride, int vstride, int kh_stride,      \
	                                                int vh_stride, const int* posp, int pos0, float scale, int window,          \
	                                                const float* sinks, int ring) {                                             \
		fa_body<DK, DV, BN, VS>(q, k, v, out, ntok, heads, kv_heads, dk, dv, kstride, vstride, kh_stride, vh_stride, posp, pos0, \
		                        scale, window, sinks, ring);                                                                     \
	}
FA_KERNEL(d64, 64, 64, 64, 1)
FA_KERNEL(d128, 128, 128, 32, 1)
FA_KERNEL(d256, 256, 256, 16, 2)
FA_KERNEL(d192v128, 192, 128, 32, 1)

// ---- MLA's absorbed attention ----
//
// DeepSeek's multi-head latent attention in the absorbed layout (attn_k_b/attn_v_b files) has
// one KV head: each position's row is the latent [kv_norm | k_pe] of 576 halves (rank 512, rope
// 64), its keys, whose first 512 halves are its values; every query head reads it. A row's
// queries (576 halves) and outputs (512 floats) do not fit a warp's registers as the kernels
// above hold them, so here the four warps of a block share its 16 rows and split the work: a
// warp scores the rows over its quarter of the 576 key values, the four partial scores are
// summed through shared memory (every warp the same sums in the same order, so every warp has
// the same softmax), and a warp weighs its quarter of the 512 values. A row is a (token, head)
// pair, t * heads + h, in the order of q and out: the rows of a block are mostly one token's
// heads, which see the same positions.
#define FA_LAT_K 576
#define FA_LAT_V 512
#define FA_LAT_BN 16                          // positions a tile: two tiles of 576 halves take 36.5 KiB
#define FA_LAT_KS (FA_LAT_K / 16 / FA_WARPS) // steps of 16 key values a warp scores

// attn_fa_f16kv_latent576(attn_f16kv's arguments)
//   attn_f16kv in MLA's absorbed layout (attention.cu's "MLA absorbed"): kv_heads == 1, dk ==
//   576, dv == 512, v == k and vstride == kstride (the values are the keys' first 512 halves),
//   else the block's outputs are NaN. The keys are read 16 bytes at a time: k and kstride must
//   keep every row 16-byte aligned. Windows, rings and sinks as attn_fa_f16kv_d64's.
//   A block takes 16 rows (token, head): grid (ceil(ntok * heads / 16), 1, 1); block (128, 1, 1)
//   exactly; no dynamic shared memory (40.5 KiB static in the sm_80 module, 22.3 KiB in the
//   base module).
extern "C" __global__ void attn_fa_f16kv_latent576(const float* q, const u16* k, const u16* v, float* out, int ntok, int heads,
                                                   int kv_heads, int dk, int dv, int kstride, int vstride, int kh_stride,
                                                   int vh_stride, const int* posp, int pos0, float scale, int window,
                                                   const float* sinks, int ring) {
	(void)kh_stride, (void)vh_stride; // one KV head
	__shared__ __attribute__((aligned(16))) u32 ks[FA_STAGES][FA_LAT_BN][(FA_LAT_K + FA_PAD) / 2];
	__shared__ float sp[FA_WARPS][FA_LAT_BN / 8][CR_WARP][4]; // the warps' partial scores, as their fragments
	const int rows = ntok * heads, r0 = blockIdx.x * 16;
	if (heads <= 0 || r0 >= rows)
		return;
	const int tid = threadIdx.x, lane = tid % CR_WARP, g = lane / 4, tq = lane % 4, warp = tid / CR_WARP;
	const int rlast = (r0 + 16 < rows ? r0 + 16 : rows) - 1; // the block's last row
	if (dk != FA_LAT_K || dv != FA_LAT_V || kv_heads != 1 || v != k || vstride != kstride) {
		fa_nan(out + (i64)r0 * dv, (rlast - r0 + 1) * dv, tid);
		return;
	}
	const int p0 = pos0 + (posp ? *posp : 0); // token t is at position p0 + t
	// The lane's two rows, ra and ra + 8 of the block's 16; rows past the last repeat it.
	const int ra = r0 + g, rb = ra + 8;
	const int ca = ra < rlast ? ra : rlast, cb = rb < rlast ? rb : rlast;
	const int na = p0 + ca / heads + 1, nb = p0 + cb / heads + 1; // each row sees positions lo .. n-1
	const int loa = window > 0 && na > window ? na - window : 0, lob = window > 0 && nb > window ? nb - window : 0;
	const int bhi = p0 + rlast / heads + 1, f = p0 + r0 / heads + 1; // the positions the block reads: blo .. bhi-1
	const int blo = window > 0 && f > window ? f - window : 0;

	// The warp's quarter of the rows' queries, rounded to F16, as A fragments of m16n8k16.
	u32 qa[FA_LAT_KS][4];
	{
		const float* qra = q + (i64)ca * FA_LAT_K;
		const float* qrb = q + (i64)cb * FA_LAT_K;
#pragma unroll
		for (int kk = 0; kk < FA_LAT_KS; kk++) {
			const int c = 16 * (FA_LAT_KS * warp + kk) + 2 * tq;
			qa[kk][0] = cr_pack_h2(qra[c], qra[c + 1]);
			qa[kk][1] = cr_pack_h2(qrb[c], qrb[c + 1]);
			qa[kk][2] = cr_pack_h2(qra[c + 8], qra[c + 9]);
			qa[kk][3] = cr_pack_h2(qrb[c + 8], qrb[c + 9]);
		}
	}
	const int v0 = warp * (FA_LAT_V / FA_WARPS); // the warp's values
	float o[FA_LAT_V / FA_WARPS / 8][4];
#pragma unroll
	for (int j = 0; j < FA_LAT_V / FA_WARPS / 8; j++)
		o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
	const float sa = sinks ? sinks[ca % heads] : -cr_inf(), sb = sinks ? sinks[cb % heads] : -cr_inf();
	float ma = sa, mb = sb, la = 0.0f, lb = 0.0f;

	if (FA_STAGES > 1) {
		fa_fetch<FA_LAT_K, FA_LAT_BN>(ks[0], k, kstride, blo, bhi, ring, tid);
		cr_cp_async_commit();
	}
	for (int base = blo, buf = 0; base < bhi; base += FA_LAT_BN, buf = (buf + 1) % FA_STAGES) {
		const int ahead = base + (FA_STAGES - 1) * FA_LAT_BN; // as fa_body's rounds
		if (ahead < bhi)
			fa_fetch<FA_LAT_K, FA_LAT_BN>(ks[(buf + FA_STAGES - 1) % FA_STAGES], k, kstride, ahead, bhi, ring, tid);
		cr_cp_async_commit();
		cr_cp_async_wait<FA_STAGES - 1>();
		__syncthreads(); // this tile is in ks[buf] for every thread
		float s[FA_LAT_BN / 8][4];
		const u32(*kt)[(FA_LAT_K + FA_PAD) / 2] = ks[buf] + cr_opaque_zero(); // as fa_body's
		fa_scores<FA_LAT_K, FA_LAT_BN, FA_LAT_KS>(kt, qa, s, FA_LAT_KS * warp, g, tq);
#pragma unroll
		for (int nt = 0; nt < FA_LAT_BN / 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				sp[warp][nt][lane][e] = s[nt][e];
		__syncthreads(); // every warp's partial scores are in sp
#pragma unroll
		for (int nt = 0; nt < FA_LAT_BN / 8; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				s[nt][e] = cr_fadd(cr_fadd(cr_fadd(sp[0][nt][lane][e], sp[1][nt][lane][e]), sp[2][nt][lane][e]), sp[3][nt][lane][e]);
		u32 pa[FA_LAT_BN / 16][4];
		fa_softmax<FA_LAT_BN, FA_LAT_V / FA_WARPS / 8>(s, pa, o, ma, mb, la, lb, base, na, nb, loa, lob, scale, tq);
		fa_pv<FA_LAT_K, FA_LAT_BN, FA_LAT_V / FA_WARPS / 8>(kt, pa, o, v0, g, tq);
		__syncthreads(); // every warp is done with ks[buf] and sp: a later round writes them
	}
	fa_store<FA_LAT_V / FA_WARPS / 8>(o, la, lb, ma, mb, sinks, sa, sb, ra <= rlast ? out + (i64)ra * FA_LAT_V + v0 : nullptr,
	                                  rb <= rlast ? out + (i64)rb * FA_LAT_V + v0 : nullptr, tq);
}
