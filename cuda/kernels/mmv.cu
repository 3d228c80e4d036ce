// mmv.cu: matrix-vector and small-batch products with weights in their GGUF types.
//
// Every mmv_<type> kernel has the same ABI:
//
//   (const unsigned char* w, const float* x, float* y, int rows, int cols, int ntok)
//
//   w     the matrix: rows rows of cols values; row r starts at byte r*rowBytes with
//         rowBytes = cols/QK*BB (QK elements and BB bytes per block of the type: F32 1/4,
//         F16 and BF16 1/2, Q4_0 32/18, Q4_1 32/20, Q5_0 32/22, Q5_1 32/24, Q8_0 32/34,
//         IQ4_NL 32/18, MXFP4 32/17, Q2_K 256/84, Q3_K 256/110, Q4_K 256/144, Q5_K 256/176,
//         Q6_K 256/210). Aligned to 1 byte (MXFP4), 2 (Q4_0, Q5_0, Q8_0, IQ4_NL, Q3_K, Q6_K, F16,
//         BF16), 4 (Q4_1, Q2_K, F32), 8 (Q5_1) or 16 (Q4_K, Q5_K); any offset that is a whole number of rows, or of
//         matrices of a stacked expert tensor, from a cuMemAlloc base keeps that alignment.
//   x     ntok rows of cols floats (token t at x + t*cols), 16-byte aligned.
//   y     ntok rows of rows floats: y[t*rows + r] = sum over c of W[r][c] * x[t*cols + c].
//   rows  output rows, >= 1.
//   cols  a multiple of QK (any cols >= 1 for F32, F16 and BF16).
//   ntok  tokens, >= 1.
//
//   block (32, 4, 1): one warp per output row, 4 rows per block.
//   grid  (ceil(rows / 4), ceil(ntok / 8), 1): blockIdx.y takes tokens [8*y, 8*y+8) and then
//         [8*(y+gridDim.y), ...) and so on, so any grid.y >= 1 is correct (grid.y = 1 reads
//         the weights once per 8 tokens; blocks with no tokens left return at once).
//   no dynamic shared memory (mmv_iq4_nl and mmv_mxfp4 use 64 bytes of static shared memory).
//
// Each warp reads its row's GGUF blocks with consecutive lanes on consecutive bytes (16-byte
// loads where the layout's alignment allows, aligned 4-byte ones where it does not: for the
// 1- and 2-byte-aligned layouts these may read up to 3 bytes before or after the matrix, inside
// the aligned word holding its first or last byte), decodes them in registers, and takes up to 8
// tokens' dot products from one read of the weights; the next group of blocks is loaded before
// the current one is used.
// Accumulation is float32 with fused multiply-adds, then a butterfly reduction over the warp:
// results agree with the CPU reference to float32 rounding, not bit for bit.
#include "common.cuh"
#include "dequant.cuh"

#define MMV_ROWS 4  // rows (warps) per block: blockDim.y
#define MMV_TOKENS 8 // tokens per pass over the weights

// dot4 adds v[0..3] * x[0..3] (x 16-byte aligned) to acc.
CR_FN float mmv_dot4(const float* v, const float* x, float acc) {
	cr_f4 q = cr_ldg_f4(x);
	acc = cr_fma(v[0], q.x, acc);
	acc = cr_fma(v[1], q.y, acc);
	acc = cr_fma(v[2], q.z, acc);
	return cr_fma(v[3], q.w, acc);
}

// dot8 returns the dot product of v[0..7] with x[0..7] (x 16-byte aligned).
CR_FN float mmv_dot8(const float* v, const float* x) { return mmv_dot4(v + 4, x + 4, mmv_dot4(v, x, 0.0f)); }

// mmv_bytes4 writes the four bytes of w, each less off, as floats: v[k] = byte k of w - off.
CR_FN void mmv_bytes4(u32 w, float off, float* v) {
	v[0] = cr_byte_f(w, 0) - (CR_MAGIC + off);
	v[1] = cr_byte_f(w, 1) - (CR_MAGIC + off);
	v[2] = cr_byte_f(w, 2) - (CR_MAGIC + off);
	v[3] = cr_byte_f(w, 3) - (CR_MAGIC + off);
}

// Each type below is a traits struct:
//   QK, BB   elements and bytes per block;
//   LPB      lanes that share one block (32/LPB blocks per warp per step);
//   raw      what one lane loads from a block;
//   load     the lane's loads for block blk as lane s (0..LPB-1) of it;
//   dot<NT>  adds the lane's share of the block to acc[t] for tokens t < nt (nt <= NT), x being
//            the block's first column of token 0 and cols the token stride.

// F32 as blocks of 8 values: each lane reads 32 bytes.
struct mmv_f32_t {
	enum { QK = 8, BB = 32, LPB = 1 };
	struct raw {
		cr_f4 a, b;
	};
	CR_FN raw load(const u8* blk, int s) {
		(void)s;
		raw r;
		r.a = cr_ldg_f4((const float*)blk);
		r.b = cr_ldg_f4((const float*)blk + 4);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		(void)s;
		float v[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.b.x, r.b.y, r.b.z, r.b.w};
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt)
				acc[t] += mmv_dot8(v, x + (i64)t * cols);
	}
	CR_FN float scalar(const u8* row, int c) { return ((const float*)row)[c]; }
};

// F16 and BF16 as blocks of 16 values: each lane reads 32 bytes.
template <int BF> struct mmv_half_t {
	enum { QK = 16, BB = 32, LPB = 1 };
	struct raw {
		cr_u4 a, b;
	};
	CR_FN raw load(const u8* blk, int s) {
		(void)s;
		raw r;
		r.a = cr_ldg_u4(blk);
		r.b = cr_ldg_u4(blk + 16);
		return r;
	}
	CR_FN float cvt(u32 h) { return BF ? cr_bf2f((u16)h) : cr_h2f((u16)h); }
	CR_FN void two(u32 w, float* v) {
		v[0] = cvt(w & 0xffffu);
		v[1] = cvt(w >> 16);
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		(void)s;
		float v[16];
		two(r.a.x, v + 0);
		two(r.a.y, v + 2);
		two(r.a.z, v + 4);
		two(r.a.w, v + 6);
		two(r.b.x, v + 8);
		two(r.b.y, v + 10);
		two(r.b.z, v + 12);
		two(r.b.w, v + 14);
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const float* xt = x + (i64)t * cols;
				acc[t] += mmv_dot8(v, xt) + mmv_dot8(v + 8, xt + 8);
			}
	}
	CR_FN float scalar(const u8* row, int c) { return cvt(cr_rd_u16(row + 2 * c)); }
};

// mmv_d_dot and mmv_dm_dot are the common ends of the 32-quant blocks whose lane s holds 16
// quants v, elements 8s..8s+7 and 16+8s..16+8s+7: Q4_0's, IQ4_NL's and Q5_0's scale the dot
// products by the half d (ggml's d * sum; MXFP4's by a float d, mmv_f_dot), Q4_1's and Q5_1's make d*q + m of each quant
// first (the halves d and m in one word dm).
template <int NT> CR_FN void mmv_f_dot(const float* v, float d, int s, const float* x, int cols, int nt, float* acc) {
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt) {
			const float* xt = x + (i64)t * cols + 8 * s;
			acc[t] = cr_fma(d, mmv_dot8(v, xt) + mmv_dot8(v + 8, xt + 16), acc[t]);
		}
}

template <int NT> CR_FN void mmv_d_dot(const float* v, u32 dh, int s, const float* x, int cols, int nt, float* acc) {
	mmv_f_dot<NT>(v, cr_h2f((u16)dh), s, x, cols, nt, acc);
}

template <int NT> CR_FN void mmv_dm_dot(float* v, u32 dm, int s, const float* x, int cols, int nt, float* acc) {
	float d = cr_h2f((u16)(dm & 0xffffu)), m = cr_h2f((u16)(dm >> 16));
#pragma unroll
	for (int i = 0; i < 16; i++)
		v[i] = cr_fma(v[i], d, m);
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt) {
			const float* xt = x + (i64)t * cols + 8 * s;
			acc[t] += mmv_dot8(v, xt) + mmv_dot8(v + 8, xt + 16);
		}
}

// Q4_0: two lanes per block, lane s takes qs[8s..8s+7]: elements 8s..8s+7 (low nibbles) and
// 16+8s..16+8s+7 (high nibbles).
struct mmv_q4_0_t {
	enum { QK = 32, BB = 18, LPB = 2 };
	struct raw {
		u32 d, q0, q1;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		u32 q[2];
		cr_ldg_words<2>(blk + 2 + 8 * s, q);
		r.d = cr_ldg_u16(blk);
		r.q0 = q[0];
		r.q1 = q[1];
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		float v[16];
		mmv_bytes4(r.q0 & 0x0f0f0f0fu, 8.0f, v);
		mmv_bytes4(r.q1 & 0x0f0f0f0fu, 8.0f, v + 4);
		mmv_bytes4((r.q0 >> 4) & 0x0f0f0f0fu, 8.0f, v + 8);
		mmv_bytes4((r.q1 >> 4) & 0x0f0f0f0fu, 8.0f, v + 12);
		mmv_d_dot<NT>(v, r.d, s, x, cols, nt, acc);
	}
};

// mmv_cb_values writes the codebook values tab[q] of lane s's 16 nibbles (Q4_0's order) to v.
CR_FN void mmv_cb_values(u32 q0, u32 q1, const float* tab, float* v) {
#pragma unroll
	for (int i = 0; i < 4; i++) {
		v[i] = tab[(q0 >> (8 * i)) & 0xf];
		v[4 + i] = tab[(q1 >> (8 * i)) & 0xf];
		v[8 + i] = tab[(q0 >> (8 * i + 4)) & 0xf];
		v[12 + i] = tab[(q1 >> (8 * i + 4)) & 0xf];
	}
}

// IQ4_NL: Q4_0's layout through the codebook (kept in shared memory, see mmv_codebook).
struct mmv_iq4_nl_t {
	enum { QK = 32, BB = 18, LPB = 2 };
	typedef mmv_q4_0_t::raw raw;
	CR_FN raw load(const u8* blk, int s) { return mmv_q4_0_t::load(blk, s); }
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc, const float* tab) {
		float v[16];
		mmv_cb_values(r.q0, r.q1, tab, v);
		mmv_d_dot<NT>(v, r.d, s, x, cols, nt, acc);
	}
};

// MXFP4: an E8M0 scale byte, then IQ4_NL's quants through MXFP4's codebook; 17-byte blocks, so
// any alignment. Each lane loads its 8 quant bytes with byte-aligned word loads.
struct mmv_mxfp4_t {
	enum { QK = 32, BB = 17, LPB = 2 };
	struct raw {
		u32 e, q0, q1;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		u32 q[2];
		cr_ldg_words<2>(blk + 1 + 8 * s, q);
		r.e = cr_ldg_u8(blk);
		r.q0 = q[0];
		r.q1 = q[1];
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc, const float* tab) {
		float v[16];
		mmv_cb_values(r.q0, r.q1, tab, v);
		mmv_f_dot<NT>(v, cr_e8m0_half(r.e), s, x, cols, nt, acc);
	}
};

// mmv_cb says whether a type's quants index a codebook, and gives its values.
template <class T> struct mmv_cb {
	enum { ok = 0 };
	CR_FN int value(u32 n) { return (int)n; }
};
template <> struct mmv_cb<mmv_iq4_nl_t> {
	enum { ok = 1 };
	CR_FN int value(u32 n) { return cr_iq4nl(n); }
};
template <> struct mmv_cb<mmv_mxfp4_t> {
	enum { ok = 1 };
	CR_FN int value(u32 n) { return cr_mxfp4(n); }
};

// mmv_codebook fills a codebook type's 16 values in shared memory s (16 floats) for the block
// and returns it; the other types have none (NULL). Every thread must call it before any
// returns, as it waits for the block.
template <class T, int CB = mmv_cb<T>::ok> struct mmv_codebook {
	CR_FN const float* load(float* s) { return (void)s, (const float*)0; }
};
template <class T> struct mmv_codebook<T, 1> {
	CR_FN const float* load(float* s) {
		const int tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
		if (tid < 16)
			s[tid] = (float)mmv_cb<T>::value((u32)tid);
		__syncthreads();
		return s;
	}
};

// Q4_1: as Q4_0 with d*q + m (d and m read as one word).
struct mmv_q4_1_t {
	enum { QK = 32, BB = 20, LPB = 2 };
	struct raw {
		u32 dm, q0, q1;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		r.dm = cr_ldg_u32(blk);
		r.q0 = cr_ldg_u32(blk + 4 + 8 * s);
		r.q1 = cr_ldg_u32(blk + 8 + 8 * s);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		float v[16];
		mmv_bytes4(r.q0 & 0x0f0f0f0fu, 0.0f, v);
		mmv_bytes4(r.q1 & 0x0f0f0f0fu, 0.0f, v + 4);
		mmv_bytes4((r.q0 >> 4) & 0x0f0f0f0fu, 0.0f, v + 8);
		mmv_bytes4((r.q1 >> 4) & 0x0f0f0f0fu, 0.0f, v + 12);
		mmv_dm_dot<NT>(v, r.dm, s, x, cols, nt, acc);
	}
};

// Q5_0: d, qh, qs; the 5th bit of element j is bit j of qh.
struct mmv_q5_0_t {
	enum { QK = 32, BB = 22, LPB = 2 };
	struct raw {
		u32 d, qh, q0, q1;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		u32 q[2];
		cr_ldg_words<1>(blk + 2, &r.qh);
		cr_ldg_words<2>(blk + 6 + 8 * s, q);
		r.d = cr_ldg_u16(blk);
		r.q0 = q[0];
		r.q1 = q[1];
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		u32 hl = r.qh >> (8 * s), hh = r.qh >> (16 + 8 * s);
		float v[16];
		mmv_bytes4((r.q0 & 0x0f0f0f0fu) | cr_spread4(hl), 16.0f, v);
		mmv_bytes4((r.q1 & 0x0f0f0f0fu) | cr_spread4(hl >> 4), 16.0f, v + 4);
		mmv_bytes4(((r.q0 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh), 16.0f, v + 8);
		mmv_bytes4(((r.q1 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh >> 4), 16.0f, v + 12);
		mmv_d_dot<NT>(v, r.d, s, x, cols, nt, acc);
	}
};

// Q5_1: d, m, qh, qs; as Q5_0 without the -16, then d*q + m.
struct mmv_q5_1_t {
	enum { QK = 32, BB = 24, LPB = 2 };
	struct raw {
		u32 dm, qh, q0, q1;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		r.dm = cr_ldg_u32(blk);
		r.qh = cr_ldg_u32(blk + 4);
		r.q0 = cr_ldg_u32(blk + 8 + 8 * s);
		r.q1 = cr_ldg_u32(blk + 12 + 8 * s);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		u32 hl = r.qh >> (8 * s), hh = r.qh >> (16 + 8 * s);
		float v[16];
		mmv_bytes4((r.q0 & 0x0f0f0f0fu) | cr_spread4(hl), 0.0f, v);
		mmv_bytes4((r.q1 & 0x0f0f0f0fu) | cr_spread4(hl >> 4), 0.0f, v + 4);
		mmv_bytes4(((r.q0 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh), 0.0f, v + 8);
		mmv_bytes4(((r.q1 >> 4) & 0x0f0f0f0fu) | cr_spread4(hh >> 4), 0.0f, v + 12);
		mmv_dm_dot<NT>(v, r.dm, s, x, cols, nt, acc);
	}
};

// Q8_0: two lanes per block, lane s takes qs[16s..16s+15].
struct mmv_q8_0_t {
	enum { QK = 32, BB = 34, LPB = 2 };
	struct raw {
		u32 d, q[4];
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		cr_ldg_words<4>(blk + 2 + 16 * s, r.q);
		r.d = cr_ldg_u16(blk);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		float v[16];
#pragma unroll
		for (int i = 0; i < 4; i++)
			mmv_bytes4(r.q[i] ^ 0x80808080u, 128.0f, v + 4 * i); // int8 + 128 as a byte
		float d = cr_h2f((u16)r.d);
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const float* xt = x + (i64)t * cols + 16 * s;
				acc[t] = cr_fma(d, mmv_dot8(v, xt) + mmv_dot8(v + 8, xt + 8), acc[t]);
			}
	}
};

// Q2_K: eight lanes per block; lane k takes half h = k/4, part = (k/2)&1 and the 8 bytes
// qs[32h + 16part + l0 ..], l0 = 8(k&1), whose 2-bit fields j = 0..3 are elements
// 128h + 32j + 16part + l0 + i with scale byte scales[8h + 2j + part].
struct mmv_q2_K_t {
	enum { QK = 256, BB = 84, LPB = 8 };
	struct raw {
		u32 q0, q1, s0, s1, dm;
	};
	CR_FN raw load(const u8* blk, int k) {
		int h = k >> 2, part = (k >> 1) & 1, l0 = 8 * (k & 1);
		raw r;
		r.q0 = cr_ldg_u32(blk + 16 + 32 * h + 16 * part + l0);
		r.q1 = cr_ldg_u32(blk + 20 + 32 * h + 16 * part + l0);
		r.s0 = cr_ldg_u32(blk + 8 * h);
		r.s1 = cr_ldg_u32(blk + 8 * h + 4);
		r.dm = cr_ldg_u32(blk + 80);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int k, const float* x, int cols, int nt, float* acc) {
		int h = k >> 2, part = (k >> 1) & 1, l0 = 8 * (k & 1);
		float d = cr_h2f((u16)(r.dm & 0xffffu)), dmin = cr_h2f((u16)(r.dm >> 16));
		float v[32];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			u32 sw = j < 2 ? r.s0 : r.s1;
			u32 sc = (sw >> (8 * (2 * (j & 1) + part))) & 0xffu;
			float dl = d * (float)(sc & 0xf), ml = dmin * (float)(sc >> 4);
			mmv_bytes4((r.q0 >> (2 * j)) & 0x03030303u, 0.0f, v + 8 * j);
			mmv_bytes4((r.q1 >> (2 * j)) & 0x03030303u, 0.0f, v + 8 * j + 4);
#pragma unroll
			for (int i = 0; i < 8; i++)
				v[8 * j + i] = cr_fma(dl, v[8 * j + i], -ml);
		}
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const float* xt = x + (i64)t * cols + 128 * h + 16 * part + l0;
				acc[t] += (mmv_dot8(v, xt) + mmv_dot8(v + 8, xt + 32)) + (mmv_dot8(v + 16, xt + 64) + mmv_dot8(v + 24, xt + 96));
			}
	}
};

// Q3_K: Q2_K's lane mapping; the high bit of element 128h + 32j + 16part + l is bit 4h + j of
// hmask[16part + l], and the scales are 6-bit values less 32 packed in 12 bytes.
struct mmv_q3_K_t {
	enum { QK = 256, BB = 110, LPB = 8 };
	struct raw {
		u32 q0, q1, m0, m1, s[3], d;
	};
	CR_FN raw load(const u8* blk, int k) {
		int h = k >> 2, part = (k >> 1) & 1, l0 = 8 * (k & 1);
		raw r;
		u32 q[2], m[2];
		cr_ldg_words<2>(blk + 32 + 32 * h + 16 * part + l0, q);
		cr_ldg_words<2>(blk + 16 * part + l0, m);
		cr_ldg_words<3>(blk + 96, r.s);
		r.d = cr_ldg_u16(blk + 108);
		r.q0 = q[0];
		r.q1 = q[1];
		r.m0 = m[0];
		r.m1 = m[1];
		return r;
	}
	CR_FN u32 byte12(const raw& r, int i) {
		u32 w = i < 4 ? r.s[0] : (i < 8 ? r.s[1] : r.s[2]);
		return (w >> (8 * (i & 3))) & 0xffu;
	}
	template <int NT> CR_FN void dot(const raw& r, int k, const float* x, int cols, int nt, float* acc) {
		int h = k >> 2, part = (k >> 1) & 1, l0 = 8 * (k & 1);
		float d = cr_h2f((u16)r.d);
		float v[32], ds[4];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			int idx = 8 * h + 2 * j + part;
			u32 low = h == 0 ? byte12(r, idx) & 0xf : byte12(r, idx - 8) >> 4;
			u32 top = (byte12(r, 8 + (idx & 3)) >> (2 * (idx >> 2))) & 3;
			ds[j] = d * (float)((int)(low | top << 4) - 32);
			u32 hb = 4 * h + j;
			mmv_bytes4(((r.q0 >> (2 * j)) & 0x03030303u) | ((r.m0 >> hb) & 0x01010101u) << 2, 4.0f, v + 8 * j);
			mmv_bytes4(((r.q1 >> (2 * j)) & 0x03030303u) | ((r.m1 >> hb) & 0x01010101u) << 2, 4.0f, v + 8 * j + 4);
		}
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const float* xt = x + (i64)t * cols + 128 * h + 16 * part + l0;
				float a = acc[t];
				a = cr_fma(ds[0], mmv_dot8(v, xt), a);
				a = cr_fma(ds[1], mmv_dot8(v + 8, xt + 32), a);
				a = cr_fma(ds[2], mmv_dot8(v + 16, xt + 64), a);
				acc[t] = cr_fma(ds[3], mmv_dot8(v + 24, xt + 96), a);
			}
	}
};

// mmv_k_dot is Q4_K's and Q5_K's common end: lane s's 32 quants v, 16 of sub-block 2c and 16
// of 2c+1 (c = s/2), take their scales and mins from the block's header h, and their products
// with each token's x[64c + l0 ..] and x[64c + 32 + l0 ..] (l0 = 16(s&1)) join acc.
template <int NT> CR_FN void mmv_k_dot(float* v, const cr_u4& h, int s, const float* x, int cols, int nt, float* acc) {
	int c = s >> 1, l0 = 16 * (s & 1);
	float d = cr_h2f((u16)(h.x & 0xffffu)), dmin = cr_h2f((u16)(h.x >> 16));
	u32 sc1, m1, sc2, m2;
	cr_kscale_w(h.y, h.z, h.w, 2 * c, &sc1, &m1);
	cr_kscale_w(h.y, h.z, h.w, 2 * c + 1, &sc2, &m2);
	float d1 = d * (float)sc1, dm1 = dmin * (float)m1, d2 = d * (float)sc2, dm2 = dmin * (float)m2;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		v[i] = cr_fma(d1, v[i], -dm1);
		v[16 + i] = cr_fma(d2, v[16 + i], -dm2);
	}
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt) {
			const float* xt = x + (i64)t * cols + 64 * c + l0;
			acc[t] += (mmv_dot8(v, xt) + mmv_dot8(v + 8, xt + 8)) + (mmv_dot8(v + 16, xt + 32) + mmv_dot8(v + 24, xt + 40));
		}
}

// Q4_K: eight lanes per block; lane s reads the 16-byte header (d, dmin, scales) and
// qs[16s..16s+15], which is chunk c = s/2, bytes l0 = 16(s&1) ..: low nibbles are elements
// 64c + l0 + i of sub-block 2c, high nibbles elements 64c + 32 + l0 + i of sub-block 2c+1.
struct mmv_q4_K_t {
	enum { QK = 256, BB = 144, LPB = 8 };
	struct raw {
		cr_u4 h, q;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		r.h = cr_ldg_u4(blk);
		r.q = cr_ldg_u4(blk + 16 + 16 * s);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		u32 q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
		float v[32];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			mmv_bytes4(q[i] & 0x0f0f0f0fu, 0.0f, v + 4 * i);
			mmv_bytes4((q[i] >> 4) & 0x0f0f0f0fu, 0.0f, v + 16 + 4 * i);
		}
		mmv_k_dot<NT>(v, r.h, s, x, cols, nt, acc);
	}
};

// Q5_K: Q4_K's mapping; lane s also reads qh[l0 .. l0+15], whose bit 2c (low nibbles) or 2c+1
// (high nibbles) adds 16.
struct mmv_q5_K_t {
	enum { QK = 256, BB = 176, LPB = 8 };
	struct raw {
		cr_u4 h, qh, q;
	};
	CR_FN raw load(const u8* blk, int s) {
		raw r;
		r.h = cr_ldg_u4(blk);
		r.qh = cr_ldg_u4(blk + 16 + 16 * (s & 1));
		r.q = cr_ldg_u4(blk + 48 + 16 * s);
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		int c = s >> 1;
		u32 q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
		u32 qh[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
		float v[32];
#pragma unroll
		for (int i = 0; i < 4; i++) {
			mmv_bytes4((q[i] & 0x0f0f0f0fu) | ((qh[i] >> (2 * c)) & 0x01010101u) << 4, 0.0f, v + 4 * i);
			mmv_bytes4(((q[i] >> 4) & 0x0f0f0f0fu) | ((qh[i] >> (2 * c + 1)) & 0x01010101u) << 4, 0.0f, v + 16 + 4 * i);
		}
		mmv_k_dot<NT>(v, r.h, s, x, cols, nt, acc);
	}
};

// Q6_K: eight lanes per block; lane s takes half h = s/4 and l0 = 8(s&3): ql[64h + l0 ..+7]
// (a), ql[64h + 32 + l0 ..+7] (b), qh[32h + l0 ..+7] (c); group g = 0..3 is elements
// 128h + 32g + l0 + i, from a low, b low, a high, b high with bits 2g, 2g+1 of c, scale
// scales[8h + l0/16 + 2g].
struct mmv_q6_K_t {
	enum { QK = 256, BB = 210, LPB = 8 };
	struct raw {
		u32 a0, a1, b0, b1, c0, c1, s0, s1, d;
	};
	CR_FN raw load(const u8* blk, int s) {
		int h = s >> 2, l0 = 8 * (s & 3);
		raw r;
		u32 a[2], b[2], c[2], sc[2];
		cr_ldg_words<2>(blk + 64 * h + l0, a);
		cr_ldg_words<2>(blk + 64 * h + 32 + l0, b);
		cr_ldg_words<2>(blk + 128 + 32 * h + l0, c);
		cr_ldg_words<2>(blk + 192 + 8 * h, sc);
		r.d = cr_ldg_u16(blk + 208);
		r.a0 = a[0], r.a1 = a[1], r.b0 = b[0], r.b1 = b[1], r.c0 = c[0], r.c1 = c[1], r.s0 = sc[0], r.s1 = sc[1];
		return r;
	}
	template <int NT> CR_FN void dot(const raw& r, int s, const float* x, int cols, int nt, float* acc) {
		int h = s >> 2, l0 = 8 * (s & 3), is = (s & 3) >> 1;
		float d = cr_h2f((u16)r.d);
		float ds[4];
#pragma unroll
		for (int g = 0; g < 4; g++) {
			u32 w = g < 2 ? r.s0 : r.s1;
			ds[g] = d * (float)(signed char)(u8)(w >> (8 * (2 * (g & 1) + is)));
		}
		float v[32];
		u32 a[2] = {r.a0, r.a1}, b[2] = {r.b0, r.b1}, c[2] = {r.c0, r.c1};
#pragma unroll
		for (int i = 0; i < 2; i++) {
			mmv_bytes4((a[i] & 0x0f0f0f0fu) | (c[i] & 0x03030303u) << 4, 32.0f, v + 4 * i);
			mmv_bytes4((b[i] & 0x0f0f0f0fu) | (c[i] & 0x0c0c0c0cu) << 2, 32.0f, v + 8 + 4 * i);
			mmv_bytes4(((a[i] >> 4) & 0x0f0f0f0fu) | (c[i] & 0x30303030u), 32.0f, v + 16 + 4 * i);
			mmv_bytes4(((b[i] >> 4) & 0x0f0f0f0fu) | (c[i] & 0xc0c0c0c0u) >> 2, 32.0f, v + 24 + 4 * i);
		}
#pragma unroll
		for (int t = 0; t < NT; t++)
			if (t < nt) {
				const float* xt = x + (i64)t * cols + 128 * h + l0;
				float a2 = acc[t];
				a2 = cr_fma(ds[0], mmv_dot8(v, xt), a2);
				a2 = cr_fma(ds[1], mmv_dot8(v + 8, xt + 32), a2);
				a2 = cr_fma(ds[2], mmv_dot8(v + 16, xt + 64), a2);
				acc[t] = cr_fma(ds[3], mmv_dot8(v + 24, xt + 96), a2);
			}
	}
};

// mmv_call passes the codebook to the types that take one.
template <class T, int NT, int CB = mmv_cb<T>::ok> struct mmv_call {
	CR_FN void dot(const typename T::raw& r, int s, const float* x, int cols, int nt, float* acc, const float* tab) {
		(void)tab;
		T::template dot<NT>(r, s, x, cols, nt, acc);
	}
};
template <class T, int NT> struct mmv_call<T, NT, 1> {
	CR_FN void dot(const typename T::raw& r, int s, const float* x, int cols, int nt, float* acc, const float* tab) {
		T::template dot<NT>(r, s, x, cols, nt, acc, tab);
	}
};

template <class T> struct mmv_is_float {
	enum { value = 0 };
};
template <> struct mmv_is_float<mmv_f32_t> {
	enum { value = 1 };
};
template <> struct mmv_is_float<mmv_half_t<0> > {
	enum { value = 1 };
};
template <> struct mmv_is_float<mmv_half_t<1> > {
	enum { value = 1 };
};

// mmv_walk calls dot(r, b) for the blocks b, b + step, ... below nb of row wr, in that order,
// r being block b's raw words as lane s of it loads them, with the loads of the next block
// (Ahead 1) or of the next two (Ahead 2) in flight while a block is used. Two help a warp
// alone on a short row of one token, which otherwise waits for memory at every step (on the
// H200 every one-token product took 31-37 us whatever its bytes, and the router's float
// product 7.5 us to llama.cpp's 3.1); with several tokens, the sums take the registers a
// second block would. Either way the blocks come in the same order: the same sums.
template <class T, int Ahead, class F> CR_FN void mmv_walk(const u8* wr, int b, int nb, int step, int s, F dot) {
	if (b >= nb)
		return;
	typename T::raw r = T::load(wr + (i64)b * T::BB, s), rn = r;
	if (Ahead == 2 && b + step < nb)
		rn = T::load(wr + (i64)(b + step) * T::BB, s);
	for (;;) {
		const int ba = b + Ahead * step; // the block whose loads start now
		typename T::raw ra = Ahead == 2 ? rn : r;
		if (ba < nb)
			ra = T::load(wr + (i64)ba * T::BB, s);
		dot(r, b);
		if (b + step >= nb)
			break;
		if (Ahead == 2) {
			r = rn;
			rn = ra;
		} else {
			r = ra;
		}
		b += step;
	}
}

// mmv_sums computes the dot products of one row with nt <= NT tokens with the whole warp: token
// t's activations at x + t*x_tok; every lane gets the warp's sums in acc[0..nt). A float
// matrix's one token reads two blocks ahead (mmv_walk); the block types' raw words are more
// registers than their kernels have to spare.
template <class T, int NT>
CR_FN void mmv_sums(const u8* wr, const float* x, int cols, int x_tok, int nt, float* acc, const float* tab) {
	const int lane = threadIdx.x, s = lane % T::LPB, step = CR_WARP / T::LPB;
	const int nb = cols / T::QK;
#pragma unroll
	for (int t = 0; t < NT; t++)
		acc[t] = 0.0f;
	mmv_walk<T, NT == 1 && mmv_is_float<T>::value ? 2 : 1>(wr, lane / T::LPB, nb, step, s, [&](const typename T::raw& r, int b) {
		mmv_call<T, NT>::dot(r, s, x + (i64)b * T::QK, x_tok, nt, acc, tab);
	});
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt)
			acc[t] = cr_warp_sum(acc[t]);
}

// mmv_row computes tokens [t0, t0+nt) of one row, nt <= NT, with the whole warp: token t's
// activations at x + t*x_tok, its output at y[t*y_tok + row] (mmv's own products have
// x_tok = cols and y_tok = rows; mla.cu's per-head products other strides).
template <class T, int NT>
CR_FN void mmv_row(const u8* wr, const float* x, float* y, int cols, int x_tok, int y_tok, int row, int t0, int nt,
                   const float* tab) {
	float acc[NT];
	mmv_sums<T, NT>(wr, x + (i64)t0 * x_tok, cols, x_tok, nt, acc, tab);
#pragma unroll
	for (int t = 0; t < NT; t++)
		if (t < nt && threadIdx.x == 0)
			y[(i64)(t0 + t) * y_tok + row] = acc[t];
}

// mmv_dot_scalar is the dot product of a float matrix's row with one token's activations,
// one element per lane per step: the fallback for rows or activations that are not 16-byte
// aligned. Every lane gets the sum.
template <class T> CR_FN float mmv_dot_scalar(const u8* wr, const float* xt, int cols) {
	float acc = 0.0f;
	for (int c = threadIdx.x; c < cols; c += CR_WARP)
		acc = cr_fma(T::scalar(wr, c), xt[c], acc);
	return cr_warp_sum(acc);
}

// mmv_row_scalar is mmv_dot_scalar for every token of a row.
template <class T>
CR_FN void mmv_row_scalar(const u8* wr, const float* x, float* y, int rows, int cols, int row, int t0, int nt) {
	for (int t = 0; t < nt; t++) {
		float acc = mmv_dot_scalar<T>(wr, x + (i64)(t0 + t) * cols, cols);
		if (threadIdx.x == 0)
			y[(i64)(t0 + t) * rows + row] = acc;
	}
}

// mmv_scalar runs mmv_row_scalar for the float types; the block types never take it.
template <class T, int F = mmv_is_float<T>::value> struct mmv_scalar {
	CR_FN void run(const u8* wr, const float* x, float* y, int rows, int cols, int row, int t0, int nt) {
		(void)wr, (void)x, (void)y, (void)rows, (void)cols, (void)row, (void)t0, (void)nt;
	}
	CR_FN float dot(const u8* wr, const float* xt, int cols) { return (void)wr, (void)xt, (void)cols, 0.0f; }
};
template <class T> struct mmv_scalar<T, 1> {
	CR_FN void run(const u8* wr, const float* x, float* y, int rows, int cols, int row, int t0, int nt) {
		mmv_row_scalar<T>(wr, x, y, rows, cols, row, t0, nt);
	}
	CR_FN float dot(const u8* wr, const float* xt, int cols) { return mmv_dot_scalar<T>(wr, xt, cols); }
};

// mmv_vec says whether mmv takes the vector path for matrix w and activations x: always for
// the block types, and for the float types when cols is a multiple of their block and both
// are 16-byte aligned.
template <class T> CR_FN bool mmv_vec(const u8* w, const float* x, int cols) {
	if (!mmv_is_float<T>::value)
		return true;
	return cols % T::QK == 0 && (((u64)w | (u64)x) & 15) == 0;
}

// mmv_row_bytes is the bytes of a row of cols values.
template <class T> CR_FN i64 mmv_row_bytes(int cols) {
	return mmv_is_float<T>::value ? (i64)cols * (T::BB / T::QK) : (i64)(cols / T::QK) * T::BB;
}

// mmv_dot is one token's dot product with row wr of a matrix whose path (mmv_vec) is vec, as
// mmv computes it: the fused kernels (fused.cu) take it so that their products are mmv's to
// the bit. Every lane gets the sum.
template <class T> CR_FN float mmv_dot(const u8* wr, const float* xt, int cols, bool vec, const float* tab) {
	if (!vec)
		return mmv_scalar<T>::dot(wr, xt, cols);
	float acc[1];
	mmv_sums<T, 1>(wr, xt, cols, cols, 1, acc, tab);
	return acc[0];
}

// mmv_rows is mmv_row for nt <= MMV_TOKENS tokens, with the fewest accumulators that hold them.
template <class T>
CR_FN void mmv_rows(const u8* wr, const float* x, float* y, int cols, int x_tok, int y_tok, int row, int t0, int nt,
                    const float* tab) {
	if (nt == 1)
		mmv_row<T, 1>(wr, x, y, cols, x_tok, y_tok, row, t0, 1, tab);
	else if (nt == 2)
		mmv_row<T, 2>(wr, x, y, cols, x_tok, y_tok, row, t0, 2, tab);
	else if (nt <= 4)
		mmv_row<T, 4>(wr, x, y, cols, x_tok, y_tok, row, t0, nt, tab);
	else
		mmv_row<T, 8>(wr, x, y, cols, x_tok, y_tok, row, t0, nt, tab);
}

// mmv_entry is the body of every mmv kernel: the warp's row, then the tokens 8 at a time.
template <class T>
CR_FN void mmv_entry(const u8* w, const float* x, float* y, int rows, int cols, int ntok, const float* tab) {
	const int row = blockIdx.x * blockDim.y + threadIdx.y;
	if (row >= rows)
		return; // the whole warp: rows are per warp
	const u8* wr = w + (i64)row * mmv_row_bytes<T>(cols);
	const bool vec = mmv_vec<T>((const u8*)w, x, cols);
	for (int t0 = blockIdx.y * MMV_TOKENS; t0 < ntok; t0 += gridDim.y * MMV_TOKENS) {
		int nt = ntok - t0 < MMV_TOKENS ? ntok - t0 : MMV_TOKENS;
		if (!vec)
			mmv_scalar<T>::run(wr, x, y, rows, cols, row, t0, nt);
		else
			mmv_rows<T>(wr, x, y, cols, cols, rows, row, t0, nt, tab);
	}
}

// The kernels. Each computes y[t*rows + r] = sum over c of W[r][c] * x[t*cols + c] for r < rows,
// t < ntok, with the ABI at the top of this file:
//   (const unsigned char* w, const float* x, float* y, int rows, int cols, int ntok)
//   block (32, 4, 1); grid (ceil(rows/4), ceil(ntok/8), 1) (any grid.y >= 1 is correct);
//   no dynamic shared memory; x 16-byte aligned; w aligned as noted.
#define MMV_KERNEL(name, T)                                                                                  \
	extern "C" __global__ void name(const u8* w, const float* x, float* y, int rows, int cols, int ntok) { \
		mmv_entry<T>(w, x, y, rows, cols, ntok, 0);                                                        \
	}

// mmv_f32: w is F32 (4 bytes per value, 4-byte aligned), any cols; the 16-byte vector path
// needs cols % 8 == 0 and w, x 16-byte aligned, else a slower scalar path is taken.
MMV_KERNEL(mmv_f32, mmv_f32_t)
// mmv_f16: w is F16 (IEEE half, 2 bytes per value, 2-byte aligned), any cols; the vector path
// needs cols % 16 == 0 and w, x 16-byte aligned.
MMV_KERNEL(mmv_f16, mmv_half_t<0>)
// mmv_bf16: w is BF16 (2 bytes per value, 2-byte aligned), any cols; as mmv_f16.
MMV_KERNEL(mmv_bf16, mmv_half_t<1>)
// mmv_q4_0: w is Q4_0 (32 values in 18 bytes), 2-byte aligned; cols % 32 == 0.
MMV_KERNEL(mmv_q4_0, mmv_q4_0_t)
// mmv_q4_1: w is Q4_1 (32 values in 20 bytes), 4-byte aligned; cols % 32 == 0.
MMV_KERNEL(mmv_q4_1, mmv_q4_1_t)
// mmv_q5_0: w is Q5_0 (32 values in 22 bytes), 2-byte aligned; cols % 32 == 0.
MMV_KERNEL(mmv_q5_0, mmv_q5_0_t)
// mmv_q5_1: w is Q5_1 (32 values in 24 bytes), 8-byte aligned; cols % 32 == 0.
MMV_KERNEL(mmv_q5_1, mmv_q5_1_t)
// mmv_q8_0: w is Q8_0 (32 values in 34 bytes), 2-byte aligned; cols % 32 == 0.
MMV_KERNEL(mmv_q8_0, mmv_q8_0_t)
// mmv_q2_K: w is Q2_K (256 values in 84 bytes), 4-byte aligned; cols % 256 == 0.
MMV_KERNEL(mmv_q2_K, mmv_q2_K_t)
// mmv_q3_K: w is Q3_K (256 values in 110 bytes), 2-byte aligned; cols % 256 == 0.
MMV_KERNEL(mmv_q3_K, mmv_q3_K_t)
// mmv_q4_K: w is Q4_K (256 values in 144 bytes), 16-byte aligned; cols % 256 == 0.
MMV_KERNEL(mmv_q4_K, mmv_q4_K_t)
// mmv_q5_K: w is Q5_K (256 values in 176 bytes), 16-byte aligned; cols % 256 == 0.
MMV_KERNEL(mmv_q5_K, mmv_q5_K_t)
// mmv_q6_K: w is Q6_K (256 values in 210 bytes), 2-byte aligned; cols % 256 == 0.
MMV_KERNEL(mmv_q6_K, mmv_q6_K_t)

// The codebook types' kernels: the same ABI, block and grid, and 64 bytes of static shared
// memory (the codebook), no dynamic shared memory.
#define MMV_CB_KERNEL(name, T)                                                                               \
	extern "C" __global__ void name(const u8* w, const float* x, float* y, int rows, int cols, int ntok) { \
		__shared__ float tab[16];                                                                          \
		mmv_entry<T>(w, x, y, rows, cols, ntok, mmv_codebook<T>::load(tab));                               \
	}

// mmv_iq4_nl: w is IQ4_NL (32 values in 18 bytes), 2-byte aligned; cols % 32 == 0.
MMV_CB_KERNEL(mmv_iq4_nl, mmv_iq4_nl_t)
// mmv_mxfp4: w is MXFP4 (32 values in 17 bytes), any alignment; cols % 32 == 0.
MMV_CB_KERNEL(mmv_mxfp4, mmv_mxfp4_t)
