// mmq.cu: batched products for prefill, Y = X W^T, with weights in their GGUF types: a tiled
// matrix product (no tensor cores: compute capability 7.5 and up, float32 FMAs) that reads
// each weight once per 64 tokens, where mmv.cu reads it once per 8. The GPU runs the products
// of the 32-value quantized types, Q4_K, Q5_K and Q6_K on mmqi.cu's tensor cores instead;
// these tiles serve the float types, Q2_K and Q3_K.
//
// Every mmq_<type> kernel has the same ABI, mmv's and the quantized activation's planes:
//
//   (const unsigned char* w, const float* x, float* y, int rows, int cols, int ntok,
//    const signed char* xq, const float* xd, const float* xs, int qb)
//
//   w     the matrix: rows rows of cols values in mmv.cu's layout (row r at byte r*rowBytes,
//         rowBytes = cols/QK*BB; for F32, F16 and BF16 cols*4, cols*2, cols*2). Read a byte or
//         an element at a time, so any alignment mmv accepts works (mmv's rules hold).
//   x     ntok rows of cols floats (token t at x + t*cols), 16-byte aligned (when cols % 4 != 0
//         or x is not 16-byte aligned, x is read a float at a time).
//   y     ntok rows of rows floats: y[t*rows + r] = sum over c of W[r][c] * x[t*cols + c].
//         Only those rows*ntok floats are written.
//   rows  output rows, >= 1.
//   cols  a multiple of QK (any cols >= 1 for F32, F16 and BF16).
//   ntok  tokens, >= 1 (any count is correct; cuda.GPU takes mmv below mmqMinTokens).
//   xq, xd, xs, qb  when xq is not NULL, the activation quantized (quantize_q8_f32's planes,
//         blocks of qb values: 32 or 256; xs Q8_1's sums) takes x's place: its values q*d, each
//         product rounded, as the CPU reference multiplies them (x is not read); Q4_1's and
//         Q5_1's minimum m then multiplies the block's s, as the CPU's dot with Q8_1 does,
//         rather than the sum of its values. NULL: x as it is.
//
//   block (256, 1, 1).
//   grid  (ceil(rows / 64), ceil(ntok / 64), 1): block (bx, by) computes the tile of rows
//         [64bx, 64bx+64) and tokens [64by, 64by+64), then tokens [64(by+gridDim.y), ...) and
//         so on, so any grid.y >= 1 is correct; blocks past the last row return at once.
//   18944 bytes of static shared memory (MMQ_SMEM and 512 bytes), no dynamic shared memory.
//
// The tile's loop runs over the columns 32 at a time: one block of the 32-value types, one
// 32-value piece (dequant.cuh's unit) of a K-quant block, 32 columns of the float types. Each
// step:
//   - threads 0..63 each decode one row's 32 weights with dequant.cuh's decoders, straight
//     into shared memory (their loops stay loops, so a register array would live in local
//     memory; the price is 4-way bank conflicts on these 32 scalar stores);
//   - all 256 threads load the 64 tokens' 32 activations (two 16-byte loads each, 128
//     contiguous bytes per token);
//   - a barrier; each thread adds the step to its 4x4 register tile of outputs (rows
//     tr + 16i, tokens tt + 16j, tr = tid % 16, tt = tid / 16) from 16-byte shared loads:
//     64 FMAs per 8 loads, without bank conflicts (rows of 36 floats put a quarter-warp's 8
//     rows on distinct banks; the token operand is a broadcast);
//   - a barrier before the next step overwrites the tiles.
// A warp's stores cover 16 consecutive rows of y for each of 2 tokens. The tiles are single-
// buffered: other blocks on the SM hide a block's load latency (18 KiB of shared memory
// allows 3 per SM on sm_75's 64 KiB, more on newer GPUs; registers, not measured here, may
// allow fewer). The weights are read through the L1 a byte at a time, each row's block by
// one thread. Not tuned on a GPU: double buffering and mmv's wide, coalesced loads are the
// obvious next steps.
//
// Numerics: the weights are decoded to exactly quant.DequantizeRow's float32 values, and
// each output is a float32 sum in column order: each step's 32 products in a chain of fused
// multiply-adds from 0, the steps' partial sums then added one by one. A product w*x thus
// passes through at most 32 + ceil(cols/32) roundings, so the result is within
// gamma(32 + ceil(cols/32)) * sum |w*x| of the exact product of the decoded weights (gamma(n)
// = n*u/(1-n*u), u = 2^-24). An output depends only on its row and token: the same on any
// grid, tile or token count, bit for bit; it is not bit for bit mmv's (another order, and
// mmv decodes d*q - m with one rounding).
#include "common.cuh"
#include "dequant.cuh"

#define MMQ_ROWS 64     // output rows per tile
#define MMQ_TOK 64      // tokens per tile
#define MMQ_K 32        // columns per step: one dequant.cuh piece
#define MMQ_THREADS 256 // 16 x 16 threads, each a 4 x 4 tile of outputs
#define MMQ_LD 9        // 16-byte words per row of a shared tile: 8 of values, 1 of padding
#define MMQ_SMEM (2 * 64 * MMQ_LD * 16)

// mmq_f4 is a 16-byte-aligned float4: mmq_ld and mmq_st move 4 floats of a shared tile (at a
// 16-byte-aligned address) in one access.
struct __attribute__((aligned(16))) mmq_f4 {
	float x, y, z, w;
};
CR_FN mmq_f4 mmq_ld(const float* p) { return *(const mmq_f4*)p; }
CR_FN void mmq_st(float* p, mmq_f4 v) { *(mmq_f4*)p = v; }

// Each type below is a traits struct:
//   row_bytes(cols)         the bytes of one row;
//   piece(row, c, cols, v)  writes columns [32c, 32c+32) of the row at row to v[0..31] (a
//                           row of a shared tile), zeros past cols (the float types' last
//                           step; the block types never have one);
//   MIN, nomin(row, c, v), min(row, c)  for Q4_1 and Q5_1 (MIN = 1), d*q of the block's
//                           weights without their minimum, and the minimum m.

// mmq_block_t: a GGUF block type through its dequant.cuh decoder, QK/32 pieces a block.
#define MMQ_BLOCK_TYPE(name, qk, bb, deq)                                                                   \
	struct name {                                                                                           \
		CR_FN i64 row_bytes(int cols) { return (i64)(cols / (qk)) * (bb); }                                 \
		CR_FN void piece(const u8* row, int c, int cols, float* v) {                                        \
			(void)cols;                                                                                     \
			deq(row + (i64)(c / ((qk) / MMQ_K)) * (bb), c % ((qk) / MMQ_K), v);                               \
		}                                                                                                   \
		enum { MIN = 0 };                                                                                   \
		CR_FN void nomin(const u8* row, int c, float* v) { (void)row, (void)c, (void)v; }                   \
		CR_FN float min(const u8* row, int c) { return (void)row, (void)c, 0.0f; }                          \
	};

MMQ_BLOCK_TYPE(mmq_q4_0_t, CR_QK_Q4_0, CR_BB_Q4_0, cr_deq_q4_0)
MMQ_BLOCK_TYPE(mmq_q4_1_base_t, CR_QK_Q4_1, CR_BB_Q4_1, cr_deq_q4_1)
MMQ_BLOCK_TYPE(mmq_q5_0_t, CR_QK_Q5_0, CR_BB_Q5_0, cr_deq_q5_0)
MMQ_BLOCK_TYPE(mmq_q5_1_base_t, CR_QK_Q5_1, CR_BB_Q5_1, cr_deq_q5_1)

// Q4_1 and Q5_1 with their minimum apart (nomin, min): the quants of d*q + m decoded as in
// dequant.cuh, less the m.
struct mmq_q4_1_t : mmq_q4_1_base_t {
	enum { MIN = 1 };
	CR_FN void nomin(const u8* b, int c, float* y) {
		b += (i64)c * CR_BB_Q4_1;
		const float d = cr_rd_h(b);
		const u8* qs = b + 4;
		for (int j = 0; j < 16; j++) {
			y[j] = cr_fmul((float)(qs[j] & 0xf), d);
			y[j + 16] = cr_fmul((float)(qs[j] >> 4), d);
		}
	}
	CR_FN float min(const u8* b, int c) { return cr_rd_h(b + (i64)c * CR_BB_Q4_1 + 2); }
};
struct mmq_q5_1_t : mmq_q5_1_base_t {
	enum { MIN = 1 };
	CR_FN void nomin(const u8* b, int c, float* y) {
		b += (i64)c * CR_BB_Q5_1;
		const float d = cr_rd_h(b);
		const u32 qh = cr_rd_u32(b + 4);
		const u8* qs = b + 8;
		for (int j = 0; j < 16; j++) {
			y[j] = cr_fmul((float)(int)((qs[j] & 0xf) | ((qh >> j) & 1) << 4), d);
			y[j + 16] = cr_fmul((float)(int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4), d);
		}
	}
	CR_FN float min(const u8* b, int c) { return cr_rd_h(b + (i64)c * CR_BB_Q5_1 + 2); }
};
MMQ_BLOCK_TYPE(mmq_q8_0_t, CR_QK_Q8_0, CR_BB_Q8_0, cr_deq_q8_0)
MMQ_BLOCK_TYPE(mmq_iq4_nl_t, CR_QK_IQ4_NL, CR_BB_IQ4_NL, cr_deq_iq4_nl)
MMQ_BLOCK_TYPE(mmq_mxfp4_t, CR_QK_MXFP4, CR_BB_MXFP4, cr_deq_mxfp4)
MMQ_BLOCK_TYPE(mmq_q2_K_t, CR_QK_Q2_K, CR_BB_Q2_K, cr_deq_q2_K)
MMQ_BLOCK_TYPE(mmq_q3_K_t, CR_QK_Q3_K, CR_BB_Q3_K, cr_deq_q3_K)
MMQ_BLOCK_TYPE(mmq_q4_K_t, CR_QK_Q4_K, CR_BB_Q4_K, cr_deq_q4_K)
MMQ_BLOCK_TYPE(mmq_q5_K_t, CR_QK_Q5_K, CR_BB_Q5_K, cr_deq_q5_K)
MMQ_BLOCK_TYPE(mmq_q6_K_t, CR_QK_Q6_K, CR_BB_Q6_K, cr_deq_q6_K)

// mmq_nomin_t: the types whose weights have no minimum apart (all but Q4_1 and Q5_1).
struct mmq_nomin_t {
	enum { MIN = 0 };
	CR_FN void nomin(const u8* row, int c, float* v) { (void)row, (void)c, (void)v; }
	CR_FN float min(const u8* row, int c) { return (void)row, (void)c, 0.0f; }
};

// F32: 4-byte values (4-byte-aligned rows).
struct mmq_f32_t : mmq_nomin_t {
	CR_FN i64 row_bytes(int cols) { return (i64)cols * 4; }
	CR_FN void piece(const u8* row, int c, int cols, float* v) {
		const float* p = (const float*)row + MMQ_K * c;
		const int n = cols - MMQ_K * c;
#pragma unroll
		for (int l = 0; l < MMQ_K; l++)
			v[l] = l < n ? cr_ldg_f(p + l) : 0.0f;
	}
};

// F16 (BF = 0) and BF16 (BF = 1): 2-byte values (2-byte-aligned rows), widened exactly.
template <int BF> struct mmq_half_t : mmq_nomin_t {
	CR_FN i64 row_bytes(int cols) { return (i64)cols * 2; }
	CR_FN void piece(const u8* row, int c, int cols, float* v) {
		const u8* p = row + 2 * MMQ_K * (i64)c;
		const int n = cols - MMQ_K * c;
#pragma unroll
		for (int l = 0; l < MMQ_K; l++) {
			u16 h = l < n ? cr_ldg_u16(p + 2 * l) : (u16)0; // +0 in both formats
			v[l] = BF ? cr_bf2f(h) : cr_h2f(h);
		}
	}
};

// mmq_entry is the body of every mmq kernel (the ABI at the top of this file).
template <class T>
CR_FN void mmq_entry(const u8* w, const float* x, float* y, int rows, int cols, int ntok, const signed char* xq, const float* xd,
                     const float* xsum, int qb) {
	// ws[r]: the step's 32 weights of row r0 + r; xs[t]: its 32 activations of token t0 + t.
	// The last 4 floats of a row are padding. With the minimum apart (Q4_1, Q5_1 on a
	// quantized activation), ms[r] is the step's block's minimum of row r0 + r and ss[t] its
	// activation's sum s of token t0 + t.
	__shared__ __attribute__((aligned(16))) float ws[MMQ_ROWS][4 * MMQ_LD];
	__shared__ __attribute__((aligned(16))) float xs[MMQ_TOK][4 * MMQ_LD];
	__shared__ float ms[MMQ_ROWS], ss[MMQ_TOK];
	const bool apart = T::MIN && xq;

	const int tid = threadIdx.x, tr = tid % 16, tt = tid / 16;
	const int r0 = blockIdx.x * MMQ_ROWS;
	if (r0 >= rows)
		return; // the whole block
	const i64 rb = T::row_bytes(cols);
	const int steps = (cols + MMQ_K - 1) / MMQ_K;
	// The 16-byte path needs every token's row 16-byte aligned.
	const bool xvec = cols % 4 == 0 && ((u64)x & 15) == 0;
	const mmq_f4 zero = {0.0f, 0.0f, 0.0f, 0.0f};

	for (int t0 = blockIdx.y * MMQ_TOK; t0 < ntok; t0 += gridDim.y * MMQ_TOK) {
		float acc[4][4];
#pragma unroll
		for (int i = 0; i < 4; i++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				acc[i][j] = 0.0f;

		for (int c = 0; c < steps; c++) {
			// Two warps decode the tile's 64 rows. A row past the matrix repeats its last row:
			// it only feeds outputs that are never stored.
			if (tid < MMQ_ROWS) {
				const u8* row = w + (i64)(r0 + tid < rows ? r0 + tid : rows - 1) * rb;
				if (apart) {
					T::nomin(row, c, ws[tid]);
					ms[tid] = T::min(row, c);
				} else {
					T::piece(row, c, cols, ws[tid]);
				}
			} else if (apart && tid < MMQ_ROWS + MMQ_TOK) {
				const int t = tid - MMQ_ROWS;
				ss[t] = t0 + t < ntok ? xsum[(i64)(t0 + t) * (cols / 32) + c] : 0.0f;
			}
			// The 64 tokens' 32 columns: 512 words, two per thread (tokens past ntok and
			// columns past cols are zeros).
#pragma unroll
			for (int k = 0; k < MMQ_TOK * (MMQ_K / 4) / MMQ_THREADS; k++) {
				const int q = tid + k * MMQ_THREADS, t = q / (MMQ_K / 4), col = MMQ_K * c + 4 * (q % (MMQ_K / 4));
				mmq_f4 f = zero;
				if (t0 + t < ntok && xq) {
					if (col < cols) { // a quantized block: whole groups of 4 columns
						const i64 i = (i64)(t0 + t) * cols + col;
						const u32 v = *(const u32*)(xq + i);
						const float d = xd[i / qb];
						f.x = cr_fmul((float)(signed char)(v & 0xffu), d);
						f.y = cr_fmul((float)(signed char)(v >> 8 & 0xffu), d);
						f.z = cr_fmul((float)(signed char)(v >> 16 & 0xffu), d);
						f.w = cr_fmul((float)(signed char)(v >> 24), d);
					}
				} else if (t0 + t < ntok) {
					const float* p = x + (i64)(t0 + t) * cols + col;
					if (xvec) {
						if (col < cols) {
							cr_f4 g = cr_ldg_f4(p);
							f.x = g.x, f.y = g.y, f.z = g.z, f.w = g.w;
						}
					} else {
						f.x = col < cols ? cr_ldg_f(p) : 0.0f;
						f.y = col + 1 < cols ? cr_ldg_f(p + 1) : 0.0f;
						f.z = col + 2 < cols ? cr_ldg_f(p + 2) : 0.0f;
						f.w = col + 3 < cols ? cr_ldg_f(p + 3) : 0.0f;
					}
				}
				mmq_st(&xs[t][4 * (q % (MMQ_K / 4))], f);
			}
			__syncthreads();

			// The step's 32 products of each output, in column order, from 0.
			float part[4][4];
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++)
					part[i][j] = 0.0f;
#pragma unroll
			for (int q = 0; q < MMQ_K / 4; q++) {
				mmq_f4 a[4], b[4];
#pragma unroll
				for (int i = 0; i < 4; i++) {
					a[i] = mmq_ld(&ws[tr + 16 * i][4 * q]);
					b[i] = mmq_ld(&xs[tt + 16 * i][4 * q]);
				}
#pragma unroll
				for (int i = 0; i < 4; i++)
#pragma unroll
					for (int j = 0; j < 4; j++) {
						float s = part[i][j];
						s = cr_fma(a[i].x, b[j].x, s);
						s = cr_fma(a[i].y, b[j].y, s);
						s = cr_fma(a[i].z, b[j].z, s);
						part[i][j] = cr_fma(a[i].w, b[j].w, s);
					}
			}
			if (apart) // the minimum times the activation's s, as the CPU's dot adds it
#pragma unroll
				for (int i = 0; i < 4; i++)
#pragma unroll
					for (int j = 0; j < 4; j++)
						part[i][j] = cr_fma(ms[tr + 16 * i], ss[tt + 16 * j], part[i][j]);
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 4; j++)
					acc[i][j] = cr_fadd(acc[i][j], part[i][j]);
			__syncthreads(); // before the next step overwrites the tiles
		}

#pragma unroll
		for (int j = 0; j < 4; j++) {
			const int t = t0 + tt + 16 * j;
			if (t >= ntok)
				continue;
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const int r = r0 + tr + 16 * i;
				if (r < rows)
					y[(i64)t * rows + r] = acc[i][j];
			}
		}
	}
}

// The kernels. Each computes y[t*rows + r] = sum over c of W[r][c] * x[t*cols + c] for r < rows,
// t < ntok, with the ABI at the top of this file:
//   (const unsigned char* w, const float* x, float* y, int rows, int cols, int ntok,
//    const signed char* xq, const float* xd, const float* xs, int qb)
//   block (256, 1, 1); grid (ceil(rows/64), ceil(ntok/64), 1) (any grid.y >= 1 is correct);
//   18944 bytes of static shared memory, no dynamic shared memory.
#define MMQ_KERNEL(name, T)                                                                                  \
	extern "C" __global__ void name(const u8* w, const float* x, float* y, int rows, int cols, int ntok,   \
	                                const signed char* xq, const float* xd, const float* xs, int qb) {      \
		mmq_entry<T>(w, x, y, rows, cols, ntok, xq, xd, xs, qb);                                           \
	}

// mmq_f32: w is F32, any cols.
MMQ_KERNEL(mmq_f32, mmq_f32_t)
// mmq_f16: w is F16 (IEEE half), any cols.
MMQ_KERNEL(mmq_f16, mmq_half_t<0>)
// mmq_bf16: w is BF16, any cols.
MMQ_KERNEL(mmq_bf16, mmq_half_t<1>)
// mmq_q4_0: w is Q4_0 (32 values in 18 bytes); cols % 32 == 0.
MMQ_KERNEL(mmq_q4_0, mmq_q4_0_t)
// mmq_q4_1: w is Q4_1 (32 values in 20 bytes); cols % 32 == 0.
MMQ_KERNEL(mmq_q4_1, mmq_q4_1_t)
// mmq_q5_0: w is Q5_0 (32 values in 22 bytes); cols % 32 == 0.
MMQ_KERNEL(mmq_q5_0, mmq_q5_0_t)
// mmq_q5_1: w is Q5_1 (32 values in 24 bytes); cols % 32 == 0.
MMQ_KERNEL(mmq_q5_1, mmq_q5_1_t)
// mmq_q8_0: w is Q8_0 (32 values in 34 bytes); cols % 32 == 0.
MMQ_KERNEL(mmq_q8_0, mmq_q8_0_t)
// mmq_iq4_nl: w is IQ4_NL (32 values in 18 bytes); cols % 32 == 0.
MMQ_KERNEL(mmq_iq4_nl, mmq_iq4_nl_t)
// mmq_mxfp4: w is MXFP4 (32 values in 17 bytes, any alignment); cols % 32 == 0.
MMQ_KERNEL(mmq_mxfp4, mmq_mxfp4_t)
// mmq_q2_K: w is Q2_K (256 values in 84 bytes); cols % 256 == 0.
MMQ_KERNEL(mmq_q2_K, mmq_q2_K_t)
// mmq_q3_K: w is Q3_K (256 values in 110 bytes); cols % 256 == 0.
MMQ_KERNEL(mmq_q3_K, mmq_q3_K_t)
// mmq_q4_K: w is Q4_K (256 values in 144 bytes); cols % 256 == 0.
MMQ_KERNEL(mmq_q4_K, mmq_q4_K_t)
// mmq_q5_K: w is Q5_K (256 values in 176 bytes); cols % 256 == 0.
MMQ_KERNEL(mmq_q5_K, mmq_q5_K_t)
// mmq_q6_K: w is Q6_K (256 values in 210 bytes); cols % 256 == 0.
MMQ_KERNEL(mmq_q6_K, mmq_q6_K_t)
