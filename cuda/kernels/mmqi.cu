// mmqi.cu: batched products for prefill on the tensor cores. The activation is quantized once
// as the CPU reference quantizes it (mmvq.cu's planes: Q8_0, or Q8_1 for Q4_1 and Q5_1), each
// 32-value block of the weights is decoded to 32 signed 8-bit quants, and warps multiply the
// two as 8-bit integers with mma.sync (int8 in, int32 out: the tensor cores of sm_75 and every
// newer GPU; m8n8k16 on sm_75, m16n8k32 from sm_80), so a block's sum of 32 products is one
// integer, the CPU's exactly, and only its scaling and the sum over the blocks are float. The 32-value types Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, IQ4_NL and MXFP4; and against Q8_K's activation the K-quants: Q4_K and Q5_K with
// a scale and a minimum per 32 values, Q2_K (a scale and a minimum), Q3_K and Q6_K (a scale)
// per 16 values, an mma's half.
//
// Every mmqi_<type> kernel has mmvq's ABI (mmvq.cu):
//
//   (const unsigned char* w, const signed char* q, const float* d, const float* s, float* y,
//    int rows, int cols, int ntok)
//
//   w's rows in mmv.cu's layout; the activation's planes q (int8, token t at q + t*cols), d (a
//   scale per 32 values, or per 256 for the K-quants) and s (Q8_1's sums, read by Q4_1 and Q5_1
//   only); y[t*rows + r] = W[r] . x_t for r < rows, t < ntok, nothing else written. cols a
//   multiple of the weights' block (32 or 256); q 16-byte aligned; w 16-byte aligned for
//   Q4_K and Q5_K, 4-byte for Q4_1, Q5_1 and Q2_K, 2-byte for the others but MXFP4.
//   block (128, 1, 1): 4 warps.
//   grid (ceil(rows / 64), ceil(ntok / 64), 1): block (bx, by) computes the tile of rows
//   [64bx, 64bx+64) and tokens [64by, 64by+64), then tokens [64(by+gridDim.y), ...) and so on,
//   so any grid.y >= 1 is correct; blocks past the last row return at once.
//   14848 bytes of static shared memory (two buffers of the tiles), no dynamic shared memory.
//
// The tile's loop takes one 32-value block of each of its rows and tokens at a time:
//   - threads 0..63 decode a row's block (a K-quant's sub-block) into 8 words of quants, its
//     scale and (Q4_1, Q5_1, the K-quants) its minimum; threads 64..127 copy a token's 32
//     quants, scale and sum (the K-quants': the scale times the quants' sum);
//   - warp w computes rows 32(w%2) .. +31 by tokens 32(w/2) .. +31 of the tile as 2 x 4 tiles
//     of 16 x 8: each is one mma.m16n8k32 from 0 (cr_mma_s8_k32: sm_80's instruction in the
//     module sm80.cu builds, four m8n8k16 in the sm_75 one), the block's integer sums, and
//     each output adds (d_w d_x) * sum with a fused multiply-add (and then m_w s_x, as
//     mmvq_block and the CPU's dot add a minimum); the halves of 16 values of Q2_K, Q3_K and
//     Q6_K, one m16n8k16 each, are scaled apart and each add their own;
//   - double-buffered: each thread reads its share of the next block into registers before
//     the products and stores it into the other buffer after them, then one barrier; the
//     types with a scale per 16 values read two blocks ahead (a second stage of registers),
//     whose loads then have two blocks' products to land in.
// The tiles' rows are 12 words (8 of quants, 4 of padding), so that the 8 rows and 4 words a
// warp's fragment loads touch fall on 32 distinct banks. Not timed on a GPU yet
// (BenchmarkMMQ on a card).
//
// Numerics: every block's integer sum is exact; the blocks' scaled sums are added in column
// order, one fused multiply-add each, where the CPU's AVX2 dot adds them 8 lanes at a time: the
// two agree within float32 rounding of a sum of cols/32 terms, as mmvq's do.
#include "common.cuh"
#include "dequant.cuh"

#define MMQI_ROWS 64
#define MMQI_TOK 64
#define MMQI_THREADS 128
#define MMQI_LD 12 // words per row of a tile: 8 of quants, 4 of padding

// mmqi_off turns four values n < 2*OFF (a byte each) into the signed bytes n - OFF (OFF a
// power of two up to 64): no byte carries into the next.
template <u32 OFF> CR_FN u32 mmqi_off(u32 n) { return (n + (0x80u - OFF) * 0x01010101u) ^ 0x80808080u; }

// Each type decodes piece j (of PIECES) of the block at b (any alignment), 32 values, into
// v[0..7], the quants of values 4k..4k+3 in word k as signed bytes, its scale dw[0] (with
// HALVES, dw[0] and dw[1] for its halves of 16 values, each an mma's own sums) and, with
// MIN = 1, its minimum mw (the weights are dw*q + mw). QB is the activation's block (32: Q8_0
// or Q8_1; 256: Q8_K); with KSUM the minimum multiplies the piece's activation sum, its scale
// times the sum of its quants, which the tile computes (Q8_K has no sums), else Q8_1's s.
// The decoders read the blocks with the widest loads their alignment allows (a row of a type
// starts where the one before ends, from a 16-byte aligned matrix): 16 bytes for Q4_K and
// Q5_K, whose 144- and 176-byte blocks keep that alignment, else aligned words realigned with
// byte permutes (cr_ldg_words), where a byte load each would take four times the instructions.

// mmqi_h is the half in the low (hi = 0) or high 16 bits of w.
CR_FN float mmqi_h(u32 w, int hi) { return cr_h2f((u16)(hi ? w >> 16 : w & 0xffffu)); }

// mmqi_nib decodes the 32-value types' nibbles, qs's low ones then its high ones, with Q5_0's
// and Q5_1's fifth bits from qh (bit j for value j; cr_spread4 moves four of them to bit 4 of
// four bytes; 0 for Q4_0 and Q4_1), less OFF (8 for Q4_0, 16 for Q5_0, 0 for the others).
template <u32 OFF> CR_FN void mmqi_nib(u32 qh, const u8* qs, u32* v) {
	u32 q[4];
	cr_ldg_words<4>(qs, q);
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const u32 lo = (q[k] & 0x0f0f0f0fu) | cr_spread4(qh >> 4 * k);
		const u32 hi = (q[k] >> 4 & 0x0f0f0f0fu) | cr_spread4(qh >> (16 + 4 * k));
		v[k] = OFF ? mmqi_off<OFF>(lo) : lo;
		v[4 + k] = OFF ? mmqi_off<OFF>(hi) : hi;
	}
}

struct mmqi_q4_0_t {
	enum { BB = CR_BB_Q4_0, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_h2f(cr_ldg_u16(b)), *mw = 0.0f;
		mmqi_nib<8>(0, b + 2, v);
	}
};

struct mmqi_q4_1_t {
	enum { BB = CR_BB_Q4_1, QB = 32, PIECES = 1, MIN = 1, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		const u32 dm = cr_ldg_u32(b);
		*dw = mmqi_h(dm, 0), *mw = mmqi_h(dm, 1);
		mmqi_nib<0>(0, b + 4, v);
	}
};

struct mmqi_q5_0_t {
	enum { BB = CR_BB_Q5_0, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		u32 qh;
		cr_ldg_words<1>(b + 2, &qh);
		*dw = cr_h2f(cr_ldg_u16(b)), *mw = 0.0f;
		mmqi_nib<16>(qh, b + 6, v);
	}
};

struct mmqi_q5_1_t {
	enum { BB = CR_BB_Q5_1, QB = 32, PIECES = 1, MIN = 1, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		const u32 dm = cr_ldg_u32(b);
		*dw = mmqi_h(dm, 0), *mw = mmqi_h(dm, 1);
		mmqi_nib<0>(cr_ldg_u32(b + 4), b + 8, v);
	}
};

struct mmqi_q8_0_t {
	enum { BB = CR_BB_Q8_0, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_h2f(cr_ldg_u16(b)), *mw = 0.0f;
		cr_ldg_words<8>(b + 2, v);
	}
};

// The codebook types: each nibble through its codebook's bytes (cr_lut4), IQ4_NL's values
// scaled by d, MXFP4's doubled values by half its E8M0 scale (the CPU's integers).
template <u32 W0, u32 W1, u32 W2, u32 W3>
CR_FN void mmqi_cb(const u8* qs, u32* v) {
	u32 q[4];
	cr_ldg_words<4>(qs, q);
#pragma unroll
	for (int k = 0; k < 4; k++) {
		v[k] = (u32)cr_lut4((int)(q[k] & 0x0f0f0f0fu), W0, W1, W2, W3);
		v[4 + k] = (u32)cr_lut4((int)(q[k] >> 4 & 0x0f0f0f0fu), W0, W1, W2, W3);
	}
}

struct mmqi_iq4_nl_t {
	enum { BB = CR_BB_IQ4_NL, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_h2f(cr_ldg_u16(b)), *mw = 0.0f;
		mmqi_cb<0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u>(b + 2, v);
	}
};

struct mmqi_mxfp4_t {
	enum { BB = CR_BB_MXFP4, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_e8m0_half(cr_ldg_u8(b)), *mw = 0.0f;
		mmqi_cb<0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu>(b + 1, v);
	}
};

// Q4_K and Q5_K: piece j is sub-block j of the 256-value block, its 6-bit scale and minimum
// (cr_kscale_w, from the header's 16 bytes h) times the block's d and dmin; its quants are the
// low (even j) or high (odd j) nibbles of qs[32(j/2) ..], Q5_K's fifth bits bit j of qh[0..31].
CR_FN void mmqi_kscale(const cr_u4& h, int j, float* dw, float* mw) {
	u32 sc, m;
	cr_kscale_w(h.y, h.z, h.w, j, &sc, &m);
	*dw = cr_fmul(mmqi_h(h.x, 0), (float)sc);
	*mw = -cr_fmul(mmqi_h(h.x, 1), (float)m);
}

// mmqi_ld32 reads 32 bytes from a 16-byte aligned p into w[0..7].
CR_FN void mmqi_ld32(const u8* p, u32* w) {
	const cr_u4 a = cr_ldg_u4(p), b = cr_ldg_u4(p + 16);
	w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

struct mmqi_q4_K_t {
	enum { BB = CR_BB_Q4_K, QB = 256, PIECES = 8, MIN = 1, KSUM = 1, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		mmqi_kscale(cr_ldg_u4(b), j, dw, mw);
		u32 qs[8];
		mmqi_ld32(b + 16 + 32 * (j / 2), qs);
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = qs[k] >> 4 * (j & 1) & 0x0f0f0f0fu;
	}
};

struct mmqi_q5_K_t {
	enum { BB = CR_BB_Q5_K, QB = 256, PIECES = 8, MIN = 1, KSUM = 1, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		mmqi_kscale(cr_ldg_u4(b), j, dw, mw);
		u32 qh[8], qs[8];
		mmqi_ld32(b + 16, qh);
		mmqi_ld32(b + 48 + 32 * (j / 2), qs);
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = (qs[k] >> 4 * (j & 1) & 0x0f0f0f0fu) | (qh[k] >> j & 0x01010101u) << 4;
	}
};

// Q2_K and Q3_K: piece j is values 32j .. 32j+31, bits 2(j%4), 2(j%4)+1 of qs[32(j/4) ..]
// (ggml's order: a byte's four pairs of bits are four pieces); each half of 16 values has its
// own scale, scales[2j + h]. Q2_K's is a nibble times d, with a minimum, the high nibble times
// dmin; Q3_K's a 6-bit signed scale (cr_q3k_scale's, here from the 12 bytes' words) times d,
// and its values are signed: less 4 where bit j of hmask[value] is clear.
struct mmqi_q2_K_t {
	enum { BB = CR_BB_Q2_K, QB = 256, PIECES = 8, MIN = 1, KSUM = 1, HALVES = 1 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		const u32 dd = cr_ldg_u32(b + 80), sc = cr_ldg_u16(b + 2 * j);
		const float d = mmqi_h(dd, 0), dmin = mmqi_h(dd, 1);
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const u32 s = sc >> 8 * h & 0xffu;
			dw[h] = cr_fmul(d, (float)(s & 0xf));
			mw[h] = -cr_fmul(dmin, (float)(s >> 4));
		}
		u32 qs[8];
		cr_ldg_words<8>(b + 16 + 32 * (j / 4), qs);
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = qs[k] >> 2 * (j % 4) & 0x03030303u;
	}
};

// mmqi_q3k_scale is cr_q3k_scale from the scales' three words s.
CR_FN int mmqi_q3k_scale(const u32* s, int j) {
	const u32 low = j < 8 ? cr_kbyte(s[0], s[1], s[2], j) & 0xf : cr_kbyte(s[0], s[1], s[2], j - 8) >> 4;
	const u32 top = cr_kbyte(s[0], s[1], s[2], 8 + (j & 3)) >> 2 * (j >> 2) & 3;
	return (int)(low | top << 4) - 32;
}

struct mmqi_q3_K_t {
	enum { BB = CR_BB_Q3_K, QB = 256, PIECES = 8, MIN = 0, KSUM = 0, HALVES = 1 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		u32 hm[8], qs[8], sc[3];
		cr_ldg_words<8>(b, hm);
		cr_ldg_words<8>(b + 32 + 32 * (j / 4), qs);
		cr_ldg_words<3>(b + 96, sc);
		const float d = cr_h2f(cr_ldg_u16(b + 108));
		dw[0] = cr_fmul(d, (float)mmqi_q3k_scale(sc, 2 * j));
		dw[1] = cr_fmul(d, (float)mmqi_q3k_scale(sc, 2 * j + 1));
		*mw = 0.0f;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = mmqi_off<4>((qs[k] >> 2 * (j % 4) & 0x03030303u) | (hm[k] >> j & 0x01010101u) << 2);
	}
};

// Q6_K: piece j is values 32j .. 32j+31, quarter q = j%4 of half n = j/4 of the block; their
// low 4 bits are the low (q < 2) or high nibbles of ql[64n + 32(q&1) ..], their high 2 bits
// bits 2q, 2q+1 of qh[32n ..], less 32 (signed, exact: no offset through the activation's sums);
// each half of 16 values has its own signed 8-bit scale, scales[8n + 2q + h], times d.
struct mmqi_q6_K_t {
	enum { BB = CR_BB_Q6_K, QB = 256, PIECES = 8, MIN = 0, KSUM = 0, HALVES = 1 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		const int n = j / 4, q = j % 4;
		u32 ql[8], qh[8];
		cr_ldg_words<8>(b + 64 * n + 32 * (q & 1), ql);
		cr_ldg_words<8>(b + 128 + 32 * n, qh);
		const u32 sc = cr_ldg_u16(b + 192 + 8 * n + 2 * q);
		const float d = cr_h2f(cr_ldg_u16(b + 208));
		dw[0] = cr_fmul(d, (float)(signed char)(sc & 0xffu));
		dw[1] = cr_fmul(d, (float)(signed char)(sc >> 8));
		*mw = 0.0f;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = mmqi_off<32>((ql[k] >> 4 * (q >> 1) & 0x0f0f0f0fu) | (qh[k] >> 2 * q & 0x03030303u) << 4);
	}
};

// mmqi_stage is one thread's share of a 32-value block of the tile, held in registers between
// its loads and its store to shared memory: a row's decoded quants, scales and minimums (one per
// half of 16 values with HALVES; threads 0..63), or a token's quants, scale and sums (threads
// 64..127).
struct mmqi_stage {
	u32 v[8];
	float d[2], m[2];
};

// mmqi_tiles is one buffer of the tile: sw[r] the block's quants of row r0 + r, dw and mw its
// scale and minimum (with HALVES, one per half of 16 values); sx[t], dx and sxs token t0 + t's
// quants, scale and sum (per half with HALVES).
struct mmqi_tiles {
	u32 sw[MMQI_ROWS][MMQI_LD], sx[MMQI_TOK][MMQI_LD];
	float dw[MMQI_ROWS][2], mw[MMQI_ROWS][2], dx[MMQI_TOK], sxs[MMQI_TOK][2];
};

// mmqi_fetch reads thread tid's share of block c (of the tile's rows from r0; a token thread's
// activation row xr, -1 past the tokens) into st.
template <class T>
CR_FN void mmqi_fetch(const u8* w, const signed char* xq, const float* xd, const float* xs, int rows, int cols, int r0, int xr,
                      int c, int tid, mmqi_stage& st) {
	if (tid < MMQI_ROWS) {
		// A row past the matrix repeats its last row: it only feeds outputs never stored.
		const i64 rb = (i64)(cols / (32 * T::PIECES)) * T::BB;
		const u8* row = w + (i64)(r0 + tid < rows ? r0 + tid : rows - 1) * rb;
		st.d[1] = st.m[1] = 0.0f;
		T::block(row + (i64)(c / T::PIECES) * T::BB, c % T::PIECES, st.v, st.d, st.m);
		return;
	}
	// Tokens past ntok are zeros with a zero scale and sum.
	const bool in = xr >= 0;
	if (in)
		mmqi_ld32((const u8*)xq + (i64)xr * cols + 32 * c, st.v);
	int n[2] = {0, 0}; // the quants' sums over each half
#pragma unroll
	for (int k = 0; k < 8; k++) {
		if (!in)
			st.v[k] = 0u;
		if (T::KSUM)
			n[k / 4] = cr_dp4a(0x01010101, (int)st.v[k], n[k / 4]);
	}
	const i64 bi = (i64)xr * (cols / T::QB) + 32 * c / T::QB;
	st.d[0] = in ? xd[bi] : 0.0f;
	if (!in || !T::MIN)
		st.m[0] = st.m[1] = 0.0f;
	else if (!T::KSUM)
		st.m[0] = xs[bi], st.m[1] = 0.0f;
	else if (T::HALVES)
		st.m[0] = cr_fmul(xd[bi], (float)n[0]), st.m[1] = cr_fmul(xd[bi], (float)n[1]);
	else
		st.m[0] = cr_fmul(xd[bi], (float)(n[0] + n[1])), st.m[1] = 0.0f;
}

// mmqi_store writes thread tid's share st into the tile buffer b.
CR_FN void mmqi_store(mmqi_tiles& b, int tid, const mmqi_stage& st) {
	if (tid < MMQI_ROWS) {
#pragma unroll
		for (int k = 0; k < 8; k++)
			b.sw[tid][k] = st.v[k];
		b.dw[tid][0] = st.d[0], b.dw[tid][1] = st.d[1], b.mw[tid][0] = st.m[0], b.mw[tid][1] = st.m[1];
		return;
	}
	const int t = tid - MMQI_ROWS;
#pragma unroll
	for (int k = 0; k < 8; k++)
		b.sx[t][k] = st.v[k];
	b.dx[t] = st.d[0], b.sxs[t][0] = st.m[0], b.sxs[t][1] = st.m[1];
}

// mmqi_scale adds the warp's integer sums s (half h of the block with HALVES, else the whole
// block) into acc, scaled by the rows' and tokens' scales, then the rows' minimum times the
// tokens' sums. Fragment e of 16 x 8 tile (i, j) is row wr + 16i + 8(e/2) + g, token
// wt + 8j + 2k4 + e%2.
template <class T>
CR_FN void mmqi_scale(const mmqi_tiles& b, int wr, int wt, int g, int k4, int h, int s[2][4][4], float acc[2][4][4]) {
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int r = wr + 16 * i + 8 * (e >> 1) + g, t = wt + 8 * j + 2 * k4 + (e & 1);
				float a = cr_fma(cr_fmul(b.dw[r][h * T::HALVES], b.dx[t]), (float)s[i][j][e], acc[i][j][e]);
				if (T::MIN)
					a = cr_fma(b.mw[r][h * T::HALVES], b.sxs[t][h * T::HALVES], a);
				acc[i][j][e] = a;
			}
}

// mmqi_zero clears a warp's 2 x 4 tiles of 16 x 8, a lane's 4 values of each.
template <class V> CR_FN void mmqi_zero(V v[2][4][4]) {
#pragma unroll
	for (int i = 0; i < 2; i++)
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				v[i][j][e] = 0;
}

// mmqi_step is the tile loop's step for block c (in buf[c % 2]): it reads thread tid's share
// of block c+AHEAD into free (whose block is stored), adds block c's products into acc,
// stores next (block c+1's share; with AHEAD = 1, free itself) into the other buffer, and
// waits for the block's threads. The other buffer's last readers were block c-1's products,
// before the previous barrier.
template <class T, int AHEAD>
CR_FN void mmqi_step(mmqi_tiles* buf, const u8* w, const signed char* xq, const float* xd, const float* xs, int rows, int cols, int r0,
                     int xr, int c, int nb, int tid, int wr, int wt, int g, int k4, mmqi_stage& free, const mmqi_stage& next,
                     float acc[2][4][4]) {
	const mmqi_tiles& b = buf[c & 1];
	if (c + AHEAD < nb)
		mmqi_fetch<T>(w, xq, xd, xs, rows, cols, r0, xr, c + AHEAD, tid, free);

	// The warp's 32 rows by 32 tokens as 2 x 4 tiles of 16 x 8: one m16n8k32 each for the
	// block, or with HALVES one m16n8k16 per half of 16 values, scaled apart.
	int s[2][4][4];
#pragma unroll
	for (int h = 0; h < 1 + T::HALVES; h++) {
		mmqi_zero(s);
		// k16 reads half h's 4 words of a row, k32 all 8.
		u32 a[2][4], x[4][2];
#pragma unroll
		for (int i = 0; i < 2; i++)
#pragma unroll
			for (int q = 0; q < 4 - 2 * T::HALVES; q++) // q: rows +8 (odd q), words +4 (q >= 2)
				a[i][q] = b.sw[wr + 16 * i + 8 * (q & 1) + g][4 * h + 4 * (q >> 1) + k4];
#pragma unroll
		for (int j = 0; j < 4; j++)
#pragma unroll
			for (int q = 0; q < 2 - T::HALVES; q++)
				x[j][q] = b.sx[wt + 8 * j + g][4 * h + 4 * q + k4];
#pragma unroll
		for (int i = 0; i < 2; i++)
#pragma unroll
			for (int j = 0; j < 4; j++) {
				if (T::HALVES)
					cr_mma_s8_k16(a[i], x[j][0], s[i][j]);
				else
					cr_mma_s8_k32(a[i], x[j], s[i][j]);
			}
		mmqi_scale<T>(b, wr, wt, g, k4, h, s, acc);
	}

	if (c + 1 < nb)
		mmqi_store(buf[(c + 1) & 1], tid, next);
	__syncthreads();
}

// mmqi_entry is the body of every mmqi kernel (the ABI at the top of this file), token t's
// activation row rix[t] where rix is not null (mmqi_id's gathered groups), else t.
template <class T>
CR_FN void mmqi_entry(const u8* w, const signed char* xq, const float* xd, const float* xs, float* y, int rows, int cols, int ntok,
                      const int* rix) {
	// Double-buffered: block c's tiles are in buf[c % 2], one barrier a block (mmqi_step).
	// The types with a scale per 16 values (HALVES: Q2_K, Q3_K, Q6_K) take 200 to 250
	// registers a thread whatever the stages, so two blocks share an SM: their loads go two
	// blocks ahead, where a second stage costs no block. The others' one stage keeps them
	// under 170 registers, three blocks an SM (a second would take about 200: two).
	enum { AHEAD = T::HALVES ? 2 : 1 };
	__shared__ mmqi_tiles buf[2];

	const int tid = threadIdx.x, warp = tid / CR_WARP, lane = tid % CR_WARP;
	const int g = lane / 4, k4 = lane % 4; // the lane's row (or column) of a fragment, and its word
	const int wr = 32 * (warp & 1), wt = 32 * (warp >> 1);
	const int r0 = blockIdx.x * MMQI_ROWS;
	if (r0 >= rows || cols % (32 * T::PIECES) != 0)
		return; // the whole block
	const int nb = cols / 32;

	for (int t0 = blockIdx.y * MMQI_TOK; t0 < ntok; t0 += gridDim.y * MMQI_TOK) {
		float acc[2][4][4];
		mmqi_zero(acc);

		// A token thread's activation row, read once a tile.
		const int tt = t0 + tid - MMQI_ROWS;
		const int xr = tid < MMQI_ROWS || tt >= ntok ? -1 : rix ? rix[tt] : tt;
		// With AHEAD = 2 a block's loads are issued two blocks ahead, in a second stage of
		// registers (the loop unrolled by two, so that each stage is registers, not a local
		// array); with 1, one stage, each block's loads issued before the previous block's
		// products.
		mmqi_stage st0, st1;
		mmqi_fetch<T>(w, xq, xd, xs, rows, cols, r0, xr, 0, tid, st0);
		if (AHEAD == 2 && nb > 1)
			mmqi_fetch<T>(w, xq, xd, xs, rows, cols, r0, xr, 1, tid, st1);
		mmqi_store(buf[0], tid, st0);
		__syncthreads();
		if (AHEAD == 2) {
			for (int c = 0; c < nb; c += 2) {
				mmqi_step<T, 2>(buf, w, xq, xd, xs, rows, cols, r0, xr, c, nb, tid, wr, wt, g, k4, st0, st1, acc);
				if (c + 1 < nb)
					mmqi_step<T, 2>(buf, w, xq, xd, xs, rows, cols, r0, xr, c + 1, nb, tid, wr, wt, g, k4, st1, st0, acc);
			}
		} else {
			for (int c = 0; c < nb; c++)
				mmqi_step<T, 1>(buf, w, xq, xd, xs, rows, cols, r0, xr, c, nb, tid, wr, wt, g, k4, st0, st0, acc);
		}

#pragma unroll
		for (int i = 0; i < 2; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int r = r0 + wr + 16 * i + 8 * (e >> 1) + g, t = t0 + wt + 8 * j + 2 * k4 + (e & 1);
					if (r < rows && t < ntok)
						y[(i64)t * rows + r] = acc[i][j][e];
				}
	}
}

// The kernels, mmqi_<type> with the ABI at the top of this file:
//   (const unsigned char* w, const signed char* q, const float* d, const float* s, float* y,
//    int rows, int cols, int ntok)
//   block (128, 1, 1); grid (ceil(rows/64), ceil(ntok/64), 1) (any grid.y >= 1 is correct).
//
// And mmqi_id_<type>, a layer's experts' token groups in one launch (llama.cpp's MUL_MAT_ID):
//   (const unsigned long long* tab, int ts, const int* off, const int* at, const int* rix,
//    const signed char* q, const float* d, const float* s, float* y, int rows, int cols)
//   group z multiplies the rows x cols weights at tab[ts*z] by its off[z+1]-off[z] rows of the
//   activation (the planes q, d and s as above): rows off[z] .. off[z+1]-1 (the groups' rows
//   one after another), or where rix is not null rows rix[off[z]] .. rix[off[z+1]-1] (a
//   prompt's tokens, each group's gathered by index: GPU.MoEGrouped); into the off[z+1]-off[z]
//   rows of y from row at[z] (from off[z] where at is null; y[t*rows + r]): each group as
//   mmqi_<type> on its rows, to the bit. ts spaces the table's entries (1: a table of the
//   groups' matrices alone; moe tables hold each expert's 6).
//   block (128, 1, 1); grid (ceil(rows/64), gy, groups): any gy >= 1, each group's token tiles
//   spread over the gy block rows; a block past its group's tokens returns at once.
#define MMQI_KERNEL(name, id, T)                                                                                      \
	extern "C" __global__ void name(const u8* w, const signed char* q, const float* d, const float* s, float* y, int rows, \
	                                int cols, int ntok) {                                                               \
		mmqi_entry<T>(w, q, d, s, y, rows, cols, ntok, (const int*)0);                                                \
	}                                                                                                                 \
	extern "C" __global__ void id(const u64* tab, int ts, const int* off, const int* at, const int* rix,                \
	                              const signed char* q, const float* d, const float* s, float* y, int rows, int cols) { \
		mmqi_group<T>(tab, ts, off, at, rix, q, d, s, y, rows, cols);                                                 \
	}

// mmqi_group is the body of mmqi_id_<type>: group blockIdx.z's rows as mmqi_entry's ntok.
template <class T>
CR_FN void mmqi_group(const u64* tab, int ts, const int* off, const int* at, const int* rix, const signed char* q, const float* d,
                      const float* s, float* y, int rows, int cols) {
	const int z = blockIdx.z, t0 = off[z], n = off[z + 1] - t0;
	if (n <= 0)
		return; // an expert no token chose
	const u8* w = (const u8*)tab[(i64)ts * z];
	float* yz = y + (i64)(at ? at[z] : t0) * rows;
	if (rix) {
		mmqi_entry<T>(w, q, d, s, yz, rows, cols, n, rix + t0);
		return;
	}
	const i64 blocks = (i64)t0 * (cols / T::QB); // the group's first activation block
	mmqi_entry<T>(w, q + (i64)t0 * cols, d + blocks, T::MIN && !T::KSUM ? s + blocks : s, yz, rows, cols, n, (const int*)0);
}

// mmqi_q4_0: Q4_0 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_q4_0, mmqi_id_q4_0, mmqi_q4_0_t)
// mmqi_q4_1: Q4_1 weights, a Q8_1 activation.
MMQI_KERNEL(mmqi_q4_1, mmqi_id_q4_1, mmqi_q4_1_t)
// mmqi_q5_0: Q5_0 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_q5_0, mmqi_id_q5_0, mmqi_q5_0_t)
// mmqi_q5_1: Q5_1 weights, a Q8_1 activation.
MMQI_KERNEL(mmqi_q5_1, mmqi_id_q5_1, mmqi_q5_1_t)
// mmqi_q8_0: Q8_0 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_q8_0, mmqi_id_q8_0, mmqi_q8_0_t)
// mmqi_iq4_nl: IQ4_NL weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_iq4_nl, mmqi_id_iq4_nl, mmqi_iq4_nl_t)
// mmqi_mxfp4: MXFP4 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_mxfp4, mmqi_id_mxfp4, mmqi_mxfp4_t)
// mmqi_q2_K: Q2_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q2_K, mmqi_id_q2_K, mmqi_q2_K_t)
// mmqi_q3_K: Q3_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q3_K, mmqi_id_q3_K, mmqi_q3_K_t)
// mmqi_q4_K: Q4_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q4_K, mmqi_id_q4_K, mmqi_q4_K_t)
// mmqi_q5_K: Q5_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q5_K, mmqi_id_q5_K, mmqi_q5_K_t)
// mmqi_q6_K: Q6_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q6_K, mmqi_id_q6_K, mmqi_q6_K_t)
