// getrows.cu: embedding lookups, decoding rows exactly as quant.DequantizeRow does.
//
// Every get_rows_<type> kernel has the ABI
//
//   (const unsigned char* w, const int* ids, float* out, int cols, int n)
//
//   w     a matrix of cols values per row in the type's blocks (row r at byte r*rowBytes,
//         rowBytes = cols/QK*BB as in mmv.cu); any alignment.
//   ids   n row indices (device memory), each in [0, rows of w); not checked.
//   out   n rows of cols floats: out[i*cols + c] = value c of row ids[i].
//   cols  a multiple of the type's block size (32 or 256; any cols >= 1 for F32, F16, BF16).
//   n     rows to gather.
//
//   grid  (n, G, 1) with any G >= 1 (the blockIdx.y-th of G blocks takes a share of the row:
//         G = ceil(cols / (32 * 256)) gives one 32-value piece per thread); block (256, 1, 1)
//         (any blockDim.x >= 1 works); no shared memory.
#include "common.cuh"
#include "dequant.cuh"

// GR_KERNEL defines a block type's kernel: row ids[blockIdx.x] decoded piece by piece (32 values each).
#define GR_KERNEL(name, QK, BB, deq)                                                                      \
	extern "C" __global__ void name(const u8* w, const int* ids, float* out, int cols, int n) {          \
		const int i = blockIdx.x;                                                                         \
		if (i >= n)                                                                                       \
			return;                                                                                       \
		const u8* row = w + (i64)ids[i] * ((i64)(cols / (QK)) * (BB));                                    \
		float* o = out + (i64)i * cols;                                                                   \
		const int pieces = cols / 32, per = (QK) / 32;                                                    \
		for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < pieces; p += gridDim.y * blockDim.x)     \
			deq(row + (i64)(p / per) * (BB), p % per, o + (i64)p * 32);                                   \
	}

// get_rows_q4_0 (Q4_0, 32 values in 18 bytes): ABI above.
GR_KERNEL(get_rows_q4_0, CR_QK_Q4_0, CR_BB_Q4_0, cr_deq_q4_0)
// get_rows_q4_1 (Q4_1, 32 values in 20 bytes): ABI above.
GR_KERNEL(get_rows_q4_1, CR_QK_Q4_1, CR_BB_Q4_1, cr_deq_q4_1)
// get_rows_q5_0 (Q5_0, 32 values in 22 bytes): ABI above.
GR_KERNEL(get_rows_q5_0, CR_QK_Q5_0, CR_BB_Q5_0, cr_deq_q5_0)
// get_rows_q5_1 (Q5_1, 32 values in 24 bytes): ABI above.
GR_KERNEL(get_rows_q5_1, CR_QK_Q5_1, CR_BB_Q5_1, cr_deq_q5_1)
// get_rows_q8_0 (Q8_0, 32 values in 34 bytes): ABI above.
GR_KERNEL(get_rows_q8_0, CR_QK_Q8_0, CR_BB_Q8_0, cr_deq_q8_0)
// get_rows_iq4_nl (IQ4_NL, 32 values in 18 bytes): ABI above.
GR_KERNEL(get_rows_iq4_nl, CR_QK_IQ4_NL, CR_BB_IQ4_NL, cr_deq_iq4_nl)
// get_rows_mxfp4 (MXFP4, 32 values in 17 bytes): ABI above.
GR_KERNEL(get_rows_mxfp4, CR_QK_MXFP4, CR_BB_MXFP4, cr_deq_mxfp4)
// get_rows_q2_K (Q2_K, 256 values in 84 bytes): ABI above.
GR_KERNEL(get_rows_q2_K, CR_QK_Q2_K, CR_BB_Q2_K, cr_deq_q2_K)
// get_rows_q3_K (Q3_K, 256 values in 110 bytes): ABI above.
GR_KERNEL(get_rows_q3_K, CR_QK_Q3_K, CR_BB_Q3_K, cr_deq_q3_K)
// get_rows_q4_K (Q4_K, 256 values in 144 bytes): ABI above.
GR_KERNEL(get_rows_q4_K, CR_QK_Q4_K, CR_BB_Q4_K, cr_deq_q4_K)
// get_rows_q5_K (Q5_K, 256 values in 176 bytes): ABI above.
GR_KERNEL(get_rows_q5_K, CR_QK_Q5_K, CR_BB_Q5_K, cr_deq_q5_K)
// get_rows_q6_K (Q6_K, 256 values in 210 bytes): ABI above.
GR_KERNEL(get_rows_q6_K, CR_QK_Q6_K, CR_BB_Q6_K, cr_deq_q6_K)

// The float types go value by value (consecutive threads on consecutive values).
#define GR_FLOAT_KERNEL(name, BYTES, cvt)                                                                 \
	extern "C" __global__ void name(const u8* w, const int* ids, float* out, int cols, int n) {          \
		const int i = blockIdx.x;                                                                         \
		if (i >= n)                                                                                       \
			return;                                                                                       \
		const u8* row = w + (i64)ids[i] * ((i64)cols * (BYTES));                                          \
		float* o = out + (i64)i * cols;                                                                   \
		for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += gridDim.y * blockDim.x)       \
			o[c] = cvt(row + (i64)c * (BYTES));                                                           \
	}

CR_FN float gr_f32(const u8* p) { return cr_as_f(cr_rd_u32(p)); }
CR_FN float gr_f16(const u8* p) { return cr_h2f((u16)cr_rd_u16(p)); }
CR_FN float gr_bf16(const u8* p) { return cr_bf2f((u16)cr_rd_u16(p)); }

// get_rows_f32 (F32 rows of 4*cols bytes): ABI above; any cols; grid (n, ceil(cols/256)) for
// one value per thread.
GR_FLOAT_KERNEL(get_rows_f32, 4, gr_f32)
// get_rows_f16 (F16 rows of 2*cols bytes): ABI above; any cols.
GR_FLOAT_KERNEL(get_rows_f16, 2, gr_f16)
// get_rows_bf16 (BF16 rows of 2*cols bytes): ABI above; any cols.
GR_FLOAT_KERNEL(get_rows_bf16, 2, gr_bf16)
