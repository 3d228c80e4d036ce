// mla.cu: the per-head products of DeepSeek's multi-head latent attention (models.MLAttention:
// q_nope through k_b, the latent attention output through v_b). Each head has its own small
// matrix, all of one type and shape, applied to that head's slice of rows that hold every
// head: one launch covers all heads, reading the inputs and writing the outputs in place.
//
// Every mmv_heads_<type> kernel has the same ABI:
//
//   (const unsigned char* w, const float* x, float* y, int rows, int cols, int ntok,
//    long long w_head, int x_tok, int x_head, int y_tok, int y_head)
//
//   w       head h's matrix starts at byte w + h*w_head: rows rows of cols values in the
//           type's GGUF blocks, laid out and aligned as the matrices of mmv.cu (w_head is a
//           whole number of rows: consecutive heads of one tensor, as attn_k_b's).
//   x       the input of head h for token t: cols floats at x + t*x_tok + h*x_head.
//   y       its output: y[t*y_tok + h*y_head + r] = sum over c of W_h[r][c] * x_h,t[c], for
//           r < rows (the floats between heads and tokens are not touched).
//   rows    output rows per head, >= 1.
//   cols    a multiple of the type's block size (any cols >= 1 for F32, F16 and BF16).
//   ntok    tokens, >= 1.
//   block (32, 4, 1): one warp per output row of a head, 4 rows per block.
//   grid  (ceil(rows / 4), G, heads) with any G >= 1: blockIdx.z is the head, and blockIdx.y
//         takes tokens [8*y, 8*y+8), then [8*(y+G), ...) as in mmv.cu.
//   No dynamic shared memory (mmv_heads_iq4_nl and mmv_heads_mxfp4: 64 bytes of static shared
//   memory).
//
// Where every input row is 16-byte aligned (x, x_tok and x_head multiples of 16 bytes; for
// F32, F16 and BF16 also w, w_head and cols as mmv's vector path wants) the arithmetic is
// mmv.cu's, the same code: a head's product equals mmv_<type> on that head's packed rows to the
// bit. Otherwise a slower path takes any layout: lanes over 32-value pieces decoded by
// dequant.cuh (byte-wise reads), or value by value for the float types. Either way results
// agree with the CPU reference to float32 rounding, not bit for bit.
#include "common.cuh"
#include "dequant.cuh"

// mh_deq decodes the 32-value piece p of the block at b for the slow path: dequant.cuh's
// decoders for the block types (the float types have none and go value by value instead).
template <class T> struct mh_deq {
	enum { ok = 0 };
	CR_FN void run(const u8* b, int p, float* y) { (void)b, (void)p, (void)y; }
};
#define MH_DEQ(T, fn)                                                                         \
	template <> struct mh_deq<T> {                                                            \
		enum { ok = 1 };                                                                      \
		CR_FN void run(const u8* b, int p, float* y) { fn(b, p, y); }                         \
	};
MH_DEQ(mmv_q4_0_t, cr_deq_q4_0)
MH_DEQ(mmv_q4_1_t, cr_deq_q4_1)
MH_DEQ(mmv_q5_0_t, cr_deq_q5_0)
MH_DEQ(mmv_q5_1_t, cr_deq_q5_1)
MH_DEQ(mmv_q8_0_t, cr_deq_q8_0)
MH_DEQ(mmv_iq4_nl_t, cr_deq_iq4_nl)
MH_DEQ(mmv_mxfp4_t, cr_deq_mxfp4)
MH_DEQ(mmv_q2_K_t, cr_deq_q2_K)
MH_DEQ(mmv_q3_K_t, cr_deq_q3_K)
MH_DEQ(mmv_q4_K_t, cr_deq_q4_K)
MH_DEQ(mmv_q5_K_t, cr_deq_q5_K)
MH_DEQ(mmv_q6_K_t, cr_deq_q6_K)

// mh_scalar reads value c of a float type's row for the slow path (block types never ask).
template <class T, int F = mmv_is_float<T>::value> struct mh_scalar {
	CR_FN float get(const u8* row, int c) { return (void)row, (void)c, 0.0f; }
};
template <class T> struct mh_scalar<T, 1> {
	CR_FN float get(const u8* row, int c) { return T::scalar(row, c); }
};

// mh_row_slow computes tokens [t0, t0+nt) of one row (nt <= MMV_TOKENS) for any alignment:
// lanes over 32-value pieces for the block types, over single values for the float types.
template <class T>
CR_FN void mh_row_slow(const u8* wr, const float* x, float* y, int cols, int x_tok, int y_tok, int row, int t0, int nt) {
	const int lane = threadIdx.x;
	float acc[MMV_TOKENS];
#pragma unroll
	for (int t = 0; t < MMV_TOKENS; t++)
		acc[t] = 0.0f;
	const float* xb = x + (i64)t0 * x_tok;
	if (mh_deq<T>::ok) {
		const int per = T::QK / 32;
		for (int p = lane; p < cols / 32; p += CR_WARP) {
			float v[32];
			mh_deq<T>::run(wr + (i64)(p / per) * T::BB, p % per, v);
			for (int t = 0; t < nt; t++) {
				const float* xt = xb + (i64)t * x_tok + 32 * p;
				float a = acc[t];
				for (int i = 0; i < 32; i++)
					a = cr_fma(v[i], xt[i], a);
				acc[t] = a;
			}
		}
	} else {
		for (int c = lane; c < cols; c += CR_WARP) {
			float v = mh_scalar<T>::get(wr, c);
			for (int t = 0; t < nt; t++)
				acc[t] = cr_fma(v, xb[(i64)t * x_tok + c], acc[t]);
		}
	}
	for (int t = 0; t < nt; t++) {
		float v = cr_warp_sum(acc[t]);
		if (lane == 0)
			y[(i64)(t0 + t) * y_tok + row] = v;
	}
}

// mh_entry is the body of every mmv_heads kernel: the block's head and the warp's row, then
// the tokens 8 at a time, as mmv_entry.
template <class T>
CR_FN void mh_entry(const u8* w, const float* x, float* y, int rows, int cols, int ntok, i64 w_head, int x_tok, int x_head,
                    int y_tok, int y_head, const float* tab) {
	const int row = blockIdx.x * blockDim.y + threadIdx.y;
	if (row >= rows)
		return; // the whole warp: rows are per warp
	const i64 h = blockIdx.z;
	const float* xh = x + h * x_head;
	float* yh = y + h * y_head + row;
	const i64 rb = mmv_is_float<T>::value ? (i64)cols * (T::BB / T::QK) : (i64)(cols / T::QK) * T::BB;
	const u8* wr = w + h * w_head + (i64)row * rb;
	bool vec = (((u64)xh | (u64)x_tok * 4) & 15) == 0;
	if (mmv_is_float<T>::value)
		vec = vec && cols % T::QK == 0 && ((u64)wr & 15) == 0;
	for (int t0 = blockIdx.y * MMV_TOKENS; t0 < ntok; t0 += gridDim.y * MMV_TOKENS) {
		int nt = ntok - t0 < MMV_TOKENS ? ntok - t0 : MMV_TOKENS;
		if (!vec)
			mh_row_slow<T>(wr, xh, yh, cols, x_tok, y_tok, 0, t0, nt);
		else
			mmv_rows<T>(wr, xh, yh, cols, x_tok, y_tok, 0, t0, nt, tab);
	}
}

// The kernels, with the ABI at the top of this file.
#define MH_KERNEL(name, T)                                                                                         \
	extern "C" __global__ void name(const u8* w, const float* x, float* y, int rows, int cols, int ntok, i64 w_head, \
	                                int x_tok, int x_head, int y_tok, int y_head) {                                  \
		mh_entry<T>(w, x, y, rows, cols, ntok, w_head, x_tok, x_head, y_tok, y_head, 0);                             \
	}
// mmv_heads_f32: w is F32; any cols (the vector path wants cols % 8 == 0 and w 16-byte aligned).
MH_KERNEL(mmv_heads_f32, mmv_f32_t)
// mmv_heads_f16: w is F16; any cols (the vector path wants cols % 16 == 0 and w 16-byte aligned).
MH_KERNEL(mmv_heads_f16, mmv_half_t<0>)
// mmv_heads_bf16: w is BF16; as mmv_heads_f16.
MH_KERNEL(mmv_heads_bf16, mmv_half_t<1>)
// mmv_heads_q4_0: w is Q4_0; cols % 32 == 0.
MH_KERNEL(mmv_heads_q4_0, mmv_q4_0_t)
// mmv_heads_q4_1: w is Q4_1; cols % 32 == 0.
MH_KERNEL(mmv_heads_q4_1, mmv_q4_1_t)
// mmv_heads_q5_0: w is Q5_0; cols % 32 == 0.
MH_KERNEL(mmv_heads_q5_0, mmv_q5_0_t)
// mmv_heads_q5_1: w is Q5_1; cols % 32 == 0.
MH_KERNEL(mmv_heads_q5_1, mmv_q5_1_t)
// mmv_heads_q8_0: w is Q8_0; cols % 32 == 0.
MH_KERNEL(mmv_heads_q8_0, mmv_q8_0_t)
// mmv_heads_q2_K: w is Q2_K; cols % 256 == 0.
MH_KERNEL(mmv_heads_q2_K, mmv_q2_K_t)
// mmv_heads_q3_K: w is Q3_K; cols % 256 == 0.
MH_KERNEL(mmv_heads_q3_K, mmv_q3_K_t)
// mmv_heads_q4_K: w is Q4_K; cols % 256 == 0.
MH_KERNEL(mmv_heads_q4_K, mmv_q4_K_t)
// mmv_heads_q5_K: w is Q5_K; cols % 256 == 0.
MH_KERNEL(mmv_heads_q5_K, mmv_q5_K_t)
// mmv_heads_q6_K: w is Q6_K; cols % 256 == 0.
MH_KERNEL(mmv_heads_q6_K, mmv_q6_K_t)

// The codebook types' kernels: 64 bytes of static shared memory (the codebook, as mmv's).
#define MH_CB_KERNEL(name, T)                                                                                      \
	extern "C" __global__ void name(const u8* w, const float* x, float* y, int rows, int cols, int ntok, i64 w_head, \
	                                int x_tok, int x_head, int y_tok, int y_head) {                                  \
		__shared__ float tab[16];                                                                                  \
		mh_entry<T>(w, x, y, rows, cols, ntok, w_head, x_tok, x_head, y_tok, y_head, mmv_codebook<T>::load(tab));  \
	}
// mmv_heads_iq4_nl: w is IQ4_NL; cols % 32 == 0.
MH_CB_KERNEL(mmv_heads_iq4_nl, mmv_iq4_nl_t)
// mmv_heads_mxfp4: w is MXFP4; cols % 32 == 0.
MH_CB_KERNEL(mmv_heads_mxfp4, mmv_mxfp4_t)
