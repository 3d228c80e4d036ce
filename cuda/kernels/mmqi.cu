// mmqi.cu: batched products for prefill on the tensor cores. The activation is quantized once
// as the CPU reference quantizes it (mmvq.cu's planes: Q8_0, or Q8_1 for Q4_1 and Q5_1), each
// 32-value block of the weights is decoded to 32 signed 8-bit quants, and warps multiply the
// two as 8-bit integers with mma.sync.m8n8k16 (int8 in, int32 out: the tensor cores of sm_75
// and every newer GPU), so a block's sum of 32 products is one integer, the CPU's exactly, and
// only its scaling and the sum over the blocks are float. The 32-value types Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, IQ4_NL and MXFP4; and against Q8_K's activation the K-quants with a scale and a
// minimum per 32 values, Q4_K and Q5_K, and Q6_K, with a scale per 16 values: an mma's half
// (Q2_K and Q3_K still run on mmq.cu).
//
// Every mmqi_<type> kernel has mmvq's ABI (mmvq.cu):
//
//   (const unsigned char* w, const signed char* q, const float* d, const float* s, float* y,
//    int rows, int cols, int ntok)
//
//   w's rows in mmv.cu's layout; the activation's planes q (int8, token t at q + t*cols), d (a
//   scale per 32 values, or per 256 for the K-quants) and s (Q8_1's sums, read by Q4_1 and Q5_1
//   only); y[t*rows + r] = W[r] . x_t for r < rows, t < ntok, nothing else written. cols a
//   multiple of the weights' block (32 or 256); q 4-byte aligned.
//   block (128, 1, 1): 4 warps.
//   grid (ceil(rows / 64), ceil(ntok / 64), 1): block (bx, by) computes the tile of rows
//   [64bx, 64bx+64) and tokens [64by, 64by+64), then tokens [64(by+gridDim.y), ...) and so on,
//   so any grid.y >= 1 is correct; blocks past the last row return at once.
//   7424 bytes of static shared memory, no dynamic shared memory.
//
// The tile's loop takes one 32-value block of each of its rows and tokens at a time:
//   - threads 0..63 decode a row's block (a K-quant's sub-block) into 8 words of quants, its
//     scale and (Q4_1, Q5_1, the K-quants) its minimum; threads 64..127 copy a token's 32
//     quants, scale and sum (the K-quants': the scale times the quants' sum);
//   - a barrier; warp w computes rows 32(w%2) .. +31 by tokens 32(w/2) .. +31 of the tile as
//     4 x 4 tiles of 8 x 8: for each, two mma (the block's halves of 16 values) from 0 give the
//     block's integer sums, and each output adds (d_w d_x) * sum with a fused multiply-add (and
//     then m_w s_x, as mmvq_block and the CPU's dot add a minimum); Q6_K's halves, scaled
//     apart, each add their own;
//   - a barrier before the next block overwrites the tiles.
// The tiles' rows are 12 words (8 of quants, 4 of padding), so that the 8 rows and 4 words a
// warp's fragment loads touch fall on 32 distinct banks. Single-buffered, like mmq.cu; not
// timed on a GPU yet (BenchmarkMMQ on a card).
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

// mmqi_off8 turns four nibbles (a byte each) into the signed bytes n - 8; mmqi_off16 four
// 5-bit values into n - 16. No byte carries into the next.
CR_FN u32 mmqi_off8(u32 n) { return (n + 0x78787878u) ^ 0x80808080u; }
CR_FN u32 mmqi_off16(u32 n) { return (n + 0x70707070u) ^ 0x80808080u; }

// Each type decodes piece j (of PIECES) of the block at b (any alignment), 32 values, into
// v[0..7], the quants of values 4k..4k+3 in word k as signed bytes, its scale dw[0] (with
// HALVES, dw[0] and dw[1] for its halves of 16 values, each an mma's own sums) and, with
// MIN = 1, its minimum mw (the weights are dw*q + mw). QB is the activation's block (32: Q8_0
// or Q8_1; 256: Q8_K); with KSUM the minimum multiplies the piece's activation sum, its scale
// times the sum of its quants, which the tile computes (Q8_K has no sums), else Q8_1's s.
// mmqi_q4 decodes Q4_0's and Q4_1's quants, qs's low nibbles then its high ones, less 8 for
// Q4_0 (off).
CR_FN void mmqi_q4(const u8* qs, u32* v, bool off) {
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const u32 w = cr_rd_u32(qs + 4 * k);
		const u32 lo = w & 0x0f0f0f0fu, hi = w >> 4 & 0x0f0f0f0fu;
		v[k] = off ? mmqi_off8(lo) : lo;
		v[4 + k] = off ? mmqi_off8(hi) : hi;
	}
}

struct mmqi_q4_0_t {
	enum { BB = CR_BB_Q4_0, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_rd_h(b), *mw = 0.0f;
		mmqi_q4(b + 2, v, true);
	}
};

struct mmqi_q4_1_t {
	enum { BB = CR_BB_Q4_1, QB = 32, PIECES = 1, MIN = 1, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_rd_h(b), *mw = cr_rd_h(b + 2);
		mmqi_q4(b + 4, v, false);
	}
};

// mmqi_q5 decodes Q5_0's and Q5_1's quants, qs's nibbles with their fifth bits from qh (bit j
// for value j; mmv_spread4 moves four of them to bit 4 of four bytes), less 16 for Q5_0 (off).
CR_FN void mmqi_q5(u32 qh, const u8* qs, u32* v, bool off) {
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const u32 w = cr_rd_u32(qs + 4 * k);
		const u32 lo = (w & 0x0f0f0f0fu) | mmv_spread4(qh >> 4 * k);
		const u32 hi = (w >> 4 & 0x0f0f0f0fu) | mmv_spread4(qh >> (16 + 4 * k));
		v[k] = off ? mmqi_off16(lo) : lo;
		v[4 + k] = off ? mmqi_off16(hi) : hi;
	}
}

struct mmqi_q5_0_t {
	enum { BB = CR_BB_Q5_0, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_rd_h(b), *mw = 0.0f;
		mmqi_q5(cr_rd_u32(b + 2), b + 6, v, true);
	}
};

struct mmqi_q5_1_t {
	enum { BB = CR_BB_Q5_1, QB = 32, PIECES = 1, MIN = 1, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_rd_h(b), *mw = cr_rd_h(b + 2);
		mmqi_q5(cr_rd_u32(b + 4), b + 8, v, false);
	}
};

struct mmqi_q8_0_t {
	enum { BB = CR_BB_Q8_0, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_rd_h(b), *mw = 0.0f;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = cr_rd_u32(b + 2 + 4 * k);
	}
};

// The codebook types: each nibble through its codebook's bytes (mmvq_lut), IQ4_NL's values
// scaled by d, MXFP4's doubled values by half its E8M0 scale (the CPU's integers).
template <u32 W0, u32 W1, u32 W2, u32 W3>
CR_FN void mmqi_cb(const u8* qs, u32* v) {
#pragma unroll
	for (int k = 0; k < 4; k++) {
		const u32 w = cr_rd_u32(qs + 4 * k);
		v[k] = (u32)mmvq_lut((int)(w & 0x0f0f0f0fu), W0, W1, W2, W3);
		v[4 + k] = (u32)mmvq_lut((int)(w >> 4 & 0x0f0f0f0fu), W0, W1, W2, W3);
	}
}

struct mmqi_iq4_nl_t {
	enum { BB = CR_BB_IQ4_NL, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_rd_h(b), *mw = 0.0f;
		mmqi_cb<0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u>(b + 2, v);
	}
};

struct mmqi_mxfp4_t {
	enum { BB = CR_BB_MXFP4, QB = 32, PIECES = 1, MIN = 0, KSUM = 0, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		(void)j;
		*dw = cr_e8m0_half(b[0]), *mw = 0.0f;
		mmqi_cb<0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu>(b + 1, v);
	}
};

// Q4_K and Q5_K: piece j is sub-block j of the 256-value block, its 6-bit scale and minimum
// (mmv_kscale) times the block's d and dmin; its quants are the low (even j) or high (odd j)
// nibbles of qs[32(j/2) ..], Q5_K's fifth bits bit j of qh[0..31].
CR_FN void mmqi_kscale(const u8* b, int j, float* dw, float* mw) {
	u32 sc, m;
	mmv_kscale(cr_rd_u32(b + 4), cr_rd_u32(b + 8), cr_rd_u32(b + 12), j, &sc, &m);
	*dw = cr_fmul(cr_rd_h(b), (float)sc);
	*mw = -cr_fmul(cr_rd_h(b + 2), (float)m);
}

struct mmqi_q4_K_t {
	enum { BB = CR_BB_Q4_K, QB = 256, PIECES = 8, MIN = 1, KSUM = 1, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		mmqi_kscale(b, j, dw, mw);
		const u8* qs = b + 16 + 32 * (j / 2);
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = cr_rd_u32(qs + 4 * k) >> 4 * (j & 1) & 0x0f0f0f0fu;
	}
};

struct mmqi_q5_K_t {
	enum { BB = CR_BB_Q5_K, QB = 256, PIECES = 8, MIN = 1, KSUM = 1, HALVES = 0 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		mmqi_kscale(b, j, dw, mw);
		const u8* qh = b + 16;
		const u8* qs = b + 48 + 32 * (j / 2);
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = (cr_rd_u32(qs + 4 * k) >> 4 * (j & 1) & 0x0f0f0f0fu) | (cr_rd_u32(qh + 4 * k) >> j & 0x01010101u) << 4;
	}
};

// Q6_K: piece j is values 32j .. 32j+31, quarter q = j%4 of half n = j/4 of the block; their
// low 4 bits are the low (q < 2) or high nibbles of ql[64n + 32(q&1) ..], their high 2 bits
// bits 2q, 2q+1 of qh[32n ..], less 32 (signed, exact: no offset through the activation's sums);
// each half of 16 values has its own signed 8-bit scale, scales[8n + 2q + h], times d.
CR_FN u32 mmqi_off32(u32 n) { return (n + 0x60606060u) ^ 0x80808080u; }

struct mmqi_q6_K_t {
	enum { BB = CR_BB_Q6_K, QB = 256, PIECES = 8, MIN = 0, KSUM = 0, HALVES = 1 };
	CR_FN void block(const u8* b, int j, u32* v, float* dw, float* mw) {
		const int n = j / 4, q = j % 4;
		const u8* ql = b + 64 * n + 32 * (q & 1);
		const u8* qh = b + 128 + 32 * n;
		const float d = cr_rd_h(b + 208);
		dw[0] = cr_fmul(d, (float)(signed char)b[192 + 8 * n + 2 * q]);
		dw[1] = cr_fmul(d, (float)(signed char)b[192 + 8 * n + 2 * q + 1]);
		*mw = 0.0f;
#pragma unroll
		for (int k = 0; k < 8; k++)
			v[k] = mmqi_off32((cr_rd_u32(ql + 4 * k) >> 4 * (q >> 1) & 0x0f0f0f0fu) | (cr_rd_u32(qh + 4 * k) >> 2 * q & 0x03030303u) << 4);
	}
};

// mmqi_entry is the body of every mmqi kernel (the ABI at the top of this file).
template <class T>
CR_FN void mmqi_entry(const u8* w, const signed char* xq, const float* xd, const float* xs, float* y, int rows, int cols, int ntok) {
	// sw[r]: the block's quants of row r0 + r, dw and mw its scale (with HALVES, one per half
	// of 16 values) and minimum; sx[t], dx and sxs: token t0 + t's quants, scale and sum.
	__shared__ u32 sw[MMQI_ROWS][MMQI_LD], sx[MMQI_TOK][MMQI_LD];
	__shared__ float dw[MMQI_ROWS][2], mw[MMQI_ROWS], dx[MMQI_TOK], sxs[MMQI_TOK];

	const int tid = threadIdx.x, warp = tid / CR_WARP, lane = tid % CR_WARP;
	const int g = lane / 4, k4 = lane % 4; // the lane's row (or column) of a fragment, and its word
	const int wr = 32 * (warp & 1), wt = 32 * (warp >> 1);
	const int r0 = blockIdx.x * MMQI_ROWS;
	if (r0 >= rows || cols % (32 * T::PIECES) != 0)
		return; // the whole block
	const int nb = cols / 32;
	const i64 rb = (i64)(nb / T::PIECES) * T::BB;

	for (int t0 = blockIdx.y * MMQI_TOK; t0 < ntok; t0 += gridDim.y * MMQI_TOK) {
		float acc[4][4][2];
#pragma unroll
		for (int i = 0; i < 4; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				acc[i][j][0] = acc[i][j][1] = 0.0f;

		for (int c = 0; c < nb; c++) {
			if (tid < MMQI_ROWS) {
				// A row past the matrix repeats its last row: it only feeds outputs never stored.
				const u8* row = w + (i64)(r0 + tid < rows ? r0 + tid : rows - 1) * rb;
				u32 v[8];
				T::block(row + (i64)(c / T::PIECES) * T::BB, c % T::PIECES, v, dw[tid], &mw[tid]);
#pragma unroll
				for (int k = 0; k < 8; k++)
					sw[tid][k] = v[k];
			} else {
				// Tokens past ntok are zeros with a zero scale and sum.
				const int t = tid - MMQI_ROWS;
				const bool in = t0 + t < ntok;
				const u32* q = (const u32*)(xq + (i64)(t0 + t) * cols + 32 * c);
				int n = 0;
#pragma unroll
				for (int k = 0; k < 8; k++) {
					const u32 w = in ? q[k] : 0u;
					sx[t][k] = w;
					if (T::KSUM)
						n = cr_dp4a(0x01010101, (int)w, n);
				}
				const i64 bi = (i64)(t0 + t) * (cols / T::QB) + 32 * c / T::QB;
				dx[t] = in ? xd[bi] : 0.0f;
				sxs[t] = !in || !T::MIN ? 0.0f : T::KSUM ? cr_fmul(xd[bi], (float)n) : xs[bi];
			}
			__syncthreads();

			int sum[4][4][2];
#pragma unroll
			for (int h = 0; h < 2; h++) {
				if (h == 0 || T::HALVES)
#pragma unroll
					for (int i = 0; i < 4; i++)
#pragma unroll
						for (int j = 0; j < 4; j++)
							sum[i][j][0] = sum[i][j][1] = 0;
				u32 a[4], b[4];
#pragma unroll
				for (int i = 0; i < 4; i++) {
					a[i] = sw[wr + 8 * i + g][4 * h + k4];
					b[i] = sx[wt + 8 * i + g][4 * h + k4];
				}
#pragma unroll
				for (int i = 0; i < 4; i++)
#pragma unroll
					for (int j = 0; j < 4; j++)
						cr_mma_s8(a[i], b[j], sum[i][j]);
				// The sums scaled into acc: after both halves, or after each with HALVES.
				if (h == 0 && !T::HALVES)
					continue;
#pragma unroll
				for (int i = 0; i < 4; i++) {
					const int r = wr + 8 * i + g;
#pragma unroll
					for (int j = 0; j < 4; j++)
#pragma unroll
						for (int e = 0; e < 2; e++) {
							const int t = wt + 8 * j + 2 * k4 + e;
							float a = cr_fma(cr_fmul(dw[r][h * T::HALVES], dx[t]), (float)sum[i][j][e], acc[i][j][e]);
							if (T::MIN)
								a = cr_fma(mw[r], sxs[t], a);
							acc[i][j][e] = a;
						}
				}
			}
			__syncthreads(); // before the next block overwrites the tiles
		}

#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int r = r0 + wr + 8 * i + g;
			if (r >= rows)
				continue;
#pragma unroll
			for (int j = 0; j < 4; j++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					const int t = t0 + wt + 8 * j + 2 * k4 + e;
					if (t < ntok)
						y[(i64)t * rows + r] = acc[i][j][e];
				}
		}
	}
}

// The kernels, each with the ABI at the top of this file:
//   (const unsigned char* w, const signed char* q, const float* d, const float* s, float* y,
//    int rows, int cols, int ntok)
//   block (128, 1, 1); grid (ceil(rows/64), ceil(ntok/64), 1) (any grid.y >= 1 is correct).
#define MMQI_KERNEL(name, T)                                                                                        \
	extern "C" __global__ void name(const u8* w, const signed char* q, const float* d, const float* s, float* y, int rows, \
	                                int cols, int ntok) {                                                             \
		mmqi_entry<T>(w, q, d, s, y, rows, cols, ntok);                                                             \
	}

// mmqi_q4_0: Q4_0 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_q4_0, mmqi_q4_0_t)
// mmqi_q4_1: Q4_1 weights, a Q8_1 activation.
MMQI_KERNEL(mmqi_q4_1, mmqi_q4_1_t)
// mmqi_q5_0: Q5_0 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_q5_0, mmqi_q5_0_t)
// mmqi_q5_1: Q5_1 weights, a Q8_1 activation.
MMQI_KERNEL(mmqi_q5_1, mmqi_q5_1_t)
// mmqi_q8_0: Q8_0 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_q8_0, mmqi_q8_0_t)
// mmqi_iq4_nl: IQ4_NL weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_iq4_nl, mmqi_iq4_nl_t)
// mmqi_mxfp4: MXFP4 weights, a Q8_0 activation.
MMQI_KERNEL(mmqi_mxfp4, mmqi_mxfp4_t)
// mmqi_q4_K: Q4_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q4_K, mmqi_q4_K_t)
// mmqi_q5_K: Q5_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q5_K, mmqi_q5_K_t)
// mmqi_q6_K: Q6_K weights, a Q8_K activation; cols % 256 == 0.
MMQI_KERNEL(mmqi_q6_K, mmqi_q6_K_t)
