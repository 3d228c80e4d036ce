// dequant.cuh: the GGUF block layouts, decoded exactly as quant.DequantizeRow decodes them
// (quant/dequant.go: the same operations, each rounded to float32, no fused multiply-add).
//
// cr_deq_<type>(blk, p, y) writes the 32 values [32p, 32p+32) of the block at blk to y[0..31];
// p is 0 for the 32-element types and 0..7 for the 256-element K-quants. Reads are byte-wise
// (any alignment): these serve get_rows, not the bandwidth-bound products in mmv.cu, which
// decode the same layouts from wide loads in registers.
#ifndef CR_DEQUANT_CUH
#define CR_DEQUANT_CUH

#include "common.cuh"

// Elements and bytes per block of each type (quant/type.go).
#define CR_QK_Q4_0 32
#define CR_BB_Q4_0 18
#define CR_QK_Q4_1 32
#define CR_BB_Q4_1 20
#define CR_QK_Q5_0 32
#define CR_BB_Q5_0 22
#define CR_QK_Q5_1 32
#define CR_BB_Q5_1 24
#define CR_QK_Q8_0 32
#define CR_BB_Q8_0 34
#define CR_QK_IQ4_NL 32
#define CR_BB_IQ4_NL 18
#define CR_QK_MXFP4 32
#define CR_BB_MXFP4 17
#define CR_QK_Q2_K 256
#define CR_BB_Q2_K 84
#define CR_QK_Q3_K 256
#define CR_BB_Q3_K 110
#define CR_QK_Q4_K 256
#define CR_BB_Q4_K 144
#define CR_QK_Q5_K 256
#define CR_BB_Q5_K 176
#define CR_QK_Q6_K 256
#define CR_BB_Q6_K 210

// cr_iq4nl returns IQ4_NL's codebook value for a 4-bit index (kvalues_iq4nl:
// -127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113), from four packed words instead of
// an indexed array, which would live in local memory.
CR_FN int cr_iq4nl(u32 n) {
	const u32 w0 = 0xBFAD9881u, w1 = 0xF6EADDCFu, w2 = 0x26190D01u, w3 = 0x71594535u;
	u32 w = n < 8 ? (n < 4 ? w0 : w1) : (n < 12 ? w2 : w3);
	return (int)(signed char)(u8)(w >> (8 * (n & 3)));
}

// cr_mxfp4 returns MXFP4's codebook value for a 4-bit index (kvalues_mxfp4, the E2M1 values
// doubled: 0,1,2,3,4,6,8,12 and their negatives), packed as cr_iq4nl's.
CR_FN int cr_mxfp4(u32 n) {
	const u32 w0 = 0x03020100u, w1 = 0x0C080604u, w2 = 0xFDFEFF00u, w3 = 0xF4F8FAFCu;
	u32 w = n < 8 ? (n < 4 ? w0 : w1) : (n < 12 ? w2 : w3);
	return (int)(signed char)(u8)(w >> (8 * (n & 3)));
}

// cr_e8m0_half is GGML_E8M0_TO_FP32_HALF: 2^(e-128), exact in float32 for every byte (the two
// smallest as subnormals), which scales MXFP4's doubled codebook values.
CR_FN float cr_e8m0_half(u32 e) { return e < 2 ? cr_as_f(0x00200000u << e) : cr_as_f((e - 1) << 23); }

// Q4_0: d, qs[16]; element j<16 = (qs[j]&15)-8, element j+16 = (qs[j]>>4)-8, times d.
CR_FN void cr_deq_q4_0(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_rd_h(b);
	const u8* qs = b + 2;
	for (int j = 0; j < 16; j++) {
		y[j] = cr_fmul((float)((int)(qs[j] & 0xf) - 8), d);
		y[j + 16] = cr_fmul((float)((int)(qs[j] >> 4) - 8), d);
	}
}

// Q4_1: d, m, qs[16]; d*q + m with Q4_0's nibble order.
CR_FN void cr_deq_q4_1(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_rd_h(b), m = cr_rd_h(b + 2);
	const u8* qs = b + 4;
	for (int j = 0; j < 16; j++) {
		y[j] = cr_fadd(cr_fmul((float)(qs[j] & 0xf), d), m);
		y[j + 16] = cr_fadd(cr_fmul((float)(qs[j] >> 4), d), m);
	}
}

// Q5_0: d, qh (u32), qs[16]; the 5th bit of element j is bit j of qh, of element j+16 bit j+16.
CR_FN void cr_deq_q5_0(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_rd_h(b);
	u32 qh = cr_rd_u32(b + 2);
	const u8* qs = b + 6;
	for (int j = 0; j < 16; j++) {
		int lo = (int)((qs[j] & 0xf) | ((qh >> j) & 1) << 4);
		int hi = (int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
		y[j] = cr_fmul((float)(lo - 16), d);
		y[j + 16] = cr_fmul((float)(hi - 16), d);
	}
}

// Q5_1: d, m, qh, qs[16]; as Q5_0 without the -16, then d*q + m.
CR_FN void cr_deq_q5_1(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_rd_h(b), m = cr_rd_h(b + 2);
	u32 qh = cr_rd_u32(b + 4);
	const u8* qs = b + 8;
	for (int j = 0; j < 16; j++) {
		int lo = (int)((qs[j] & 0xf) | ((qh >> j) & 1) << 4);
		int hi = (int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
		y[j] = cr_fadd(cr_fmul((float)lo, d), m);
		y[j + 16] = cr_fadd(cr_fmul((float)hi, d), m);
	}
}

// Q8_0: d, int8 qs[32]; d*q.
CR_FN void cr_deq_q8_0(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_rd_h(b);
	for (int j = 0; j < 32; j++)
		y[j] = cr_fmul((float)(signed char)b[2 + j], d);
}

// IQ4_NL: d, qs[16]; Q4_0's nibble order through the codebook, d*K[q].
CR_FN void cr_deq_iq4_nl(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_rd_h(b);
	const u8* qs = b + 2;
	for (int j = 0; j < 16; j++) {
		y[j] = cr_fmul(d, (float)cr_iq4nl(qs[j] & 0xf));
		y[j + 16] = cr_fmul(d, (float)cr_iq4nl(qs[j] >> 4));
	}
}

// MXFP4: E8M0 scale e, qs[16]; IQ4_NL's nibble order through MXFP4's codebook, K[q] * e's
// half.
CR_FN void cr_deq_mxfp4(const u8* b, int p, float* y) {
	(void)p;
	float d = cr_e8m0_half(b[0]);
	const u8* qs = b + 1;
	for (int j = 0; j < 16; j++) {
		y[j] = cr_fmul((float)cr_mxfp4(qs[j] & 0xf), d);
		y[j + 16] = cr_fmul((float)cr_mxfp4(qs[j] >> 4), d);
	}
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin. Piece p = 4*half + j
// holds out[128*half + 32*j + 16*part + l] = d*(sc&15)*((qs[32*half+16*part+l] >> 2j)&3) -
// dmin*(sc>>4), sc = scales[8*half + 2*j + part].
CR_FN void cr_deq_q2_K(const u8* b, int p, float* y) {
	float d = cr_rd_h(b + 80), dmin = cr_rd_h(b + 82);
	int hf = p >> 2, j = p & 3, shift = 2 * j;
	for (int part = 0; part < 2; part++) {
		u32 s = b[8 * hf + 2 * j + part];
		float dl = cr_fmul(d, (float)(s & 0xf)), ml = cr_fmul(dmin, (float)(s >> 4));
		const u8* q = b + 16 + 32 * hf + 16 * part;
		for (int l = 0; l < 16; l++)
			y[16 * part + l] = cr_fadd(cr_fmul(dl, (float)((q[l] >> shift) & 3)), -ml);
	}
}

// cr_q3k_scale returns Q3_K's scale j (0..15) from the 12 packed bytes s, less its bias 32:
// the low 4 bits are the low nibble of s[j] (j < 8) or the high nibble of s[j-8], the top 2
// bits are bits 2*(j/4).. of s[8 + j%4].
CR_FN int cr_q3k_scale(const u8* s, int j) {
	u32 low = j < 8 ? (u32)(s[j] & 0xf) : (u32)(s[j - 8] >> 4);
	u32 top = (u32)(s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
	return (int)(low | top << 4) - 32;
}

// Q3_K: hmask[32], qs[64], scales[12], d. Piece p = 4*half + j holds
// out[128*half + 32*j + 16*part + l] = d*scale[8*half+2*j+part] * (q2 - (hmask bit clear ? 4 : 0)),
// q2 = (qs[32*half+16*part+l] >> 2j)&3, the hmask bit being bit 4*half+j of hmask[16*part+l].
CR_FN void cr_deq_q3_K(const u8* b, int p, float* y) {
	float d = cr_rd_h(b + 108);
	int hf = p >> 2, j = p & 3, shift = 2 * j;
	u32 mask = 1u << (4 * hf + j);
	for (int part = 0; part < 2; part++) {
		float dl = cr_fmul(d, (float)cr_q3k_scale(b + 96, 8 * hf + 2 * j + part));
		const u8* q = b + 32 + 32 * hf + 16 * part;
		const u8* hm = b + 16 * part;
		for (int l = 0; l < 16; l++) {
			int v = (int)((q[l] >> shift) & 3);
			if ((hm[l] & mask) == 0)
				v -= 4;
			y[16 * part + l] = cr_fmul(dl, (float)v);
		}
	}
}

// cr_kscale returns the 6-bit scale (m = 0) or min (m = 1) of sub-block j (0..7) of a Q4_K or
// Q5_K block from its 12 packed bytes (ggml's get_scale_min_k4).
CR_FN u32 cr_kscale(const u8* s, int j, int m) {
	if (j < 4)
		return (u32)s[j + 4 * m] & 63;
	return m ? (u32)(s[j + 4] >> 4) | (u32)(s[j] >> 6) << 4 : (u32)(s[j + 4] & 0xf) | (u32)(s[j - 4] >> 6) << 4;
}

// Q4_K: d, dmin, scales[12], qs[128]. Piece p (sub-block p) is the low nibbles (p even) or
// high nibbles (p odd) of qs[32*(p/2) .. +31], times d*sc - dmin*m of sub-block p.
CR_FN void cr_deq_q4_K(const u8* b, int p, float* y) {
	float d = cr_rd_h(b), dmin = cr_rd_h(b + 2);
	float dl = cr_fmul(d, (float)cr_kscale(b + 4, p, 0)), ml = cr_fmul(dmin, (float)cr_kscale(b + 4, p, 1));
	const u8* q = b + 16 + 32 * (p >> 1);
	int sh = 4 * (p & 1);
	for (int l = 0; l < 32; l++)
		y[l] = cr_fadd(cr_fmul(dl, (float)((q[l] >> sh) & 0xf)), -ml);
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128]; as Q4_K, plus 16 when bit p of qh[l] is set.
CR_FN void cr_deq_q5_K(const u8* b, int p, float* y) {
	float d = cr_rd_h(b), dmin = cr_rd_h(b + 2);
	float dl = cr_fmul(d, (float)cr_kscale(b + 4, p, 0)), ml = cr_fmul(dmin, (float)cr_kscale(b + 4, p, 1));
	const u8* qh = b + 16;
	const u8* q = b + 48 + 32 * (p >> 1);
	int sh = 4 * (p & 1);
	for (int l = 0; l < 32; l++) {
		u32 v = (u32)((q[l] >> sh) & 0xf) | (u32)((qh[l] >> p) & 1) << 4;
		y[l] = cr_fadd(cr_fmul(dl, (float)v), -ml);
	}
}

// Q6_K: ql[128], qh[64], int8 scales[16], d. Piece p = 4*half + g holds out[128*half + 32*g + l]
// for l < 32: the low (g = 0, 1) or high (g = 2, 3) nibble of ql[64*half + l + 32*(g&1)] with bits
// 2g, 2g+1 of qh[32*half + l] on top, less 32, times d*scales[8*half + l/16 + 2g].
CR_FN void cr_deq_q6_K(const u8* b, int p, float* y) {
	float d = cr_rd_h(b + 208);
	int hf = p >> 2, g = p & 3;
	const u8* ql = b + 64 * hf + 32 * (g & 1);
	const u8* qh = b + 128 + 32 * hf;
	const u8* sc = b + 192 + 8 * hf;
	int sh = 4 * (g >> 1);
	for (int l = 0; l < 32; l++) {
		int q = (int)(((ql[l] >> sh) & 0xf) | ((qh[l] >> (2 * g)) & 3) << 4) - 32;
		y[l] = cr_fmul(cr_fmul(d, (float)(signed char)sc[(l >> 4) + 2 * g]), (float)q);
	}
}

// ---- packed decoders of the integer kernels (mmv.cu, mmvq.cu, mmqi.cu) ----

// cr_spread4 moves bits 0..3 of b to bit 4 of bytes 0..3.
CR_FN u32 cr_spread4(u32 b) { return (((b & 0xfu) * 0x00204081u) & 0x01010101u) << 4; }

// cr_kscale_w is cr_kscale from the header words (bytes 4..15 of a Q4_K/Q5_K block as s1, s2, s3).
CR_FN u32 cr_kbyte(u32 s1, u32 s2, u32 s3, int i) {
	u32 w = i < 4 ? s1 : (i < 8 ? s2 : s3);
	return (w >> (8 * (i & 3))) & 0xffu;
}
CR_FN void cr_kscale_w(u32 s1, u32 s2, u32 s3, int j, u32* sc, u32* m) {
	if (j < 4) {
		*sc = cr_kbyte(s1, s2, s3, j) & 63;
		*m = cr_kbyte(s1, s2, s3, j + 4) & 63;
	} else {
		*sc = (cr_kbyte(s1, s2, s3, j + 4) & 0xf) | (cr_kbyte(s1, s2, s3, j - 4) >> 6) << 4;
		*m = (cr_kbyte(s1, s2, s3, j + 4) >> 4) | (cr_kbyte(s1, s2, s3, j) >> 6) << 4;
	}
}

// cr_lut4 maps four nibbles (one per byte) to their codebook bytes, two byte permutes over
// the codebook's 16 bytes in words w0..w3 (cr_iq4nl's and cr_mxfp4's packing).
CR_FN int cr_lut4(int n, u32 w0, u32 w1, u32 w2, u32 w3) {
	const u32 t = (u32)n & 0x07070707u;
	const u32 sel = (t & 7u) | (t >> 4 & 0x70u) | (t >> 8 & 0x700u) | (t >> 12 & 0x7000u);
	const u32 lo = cr_prmt(w0, w1, sel), hi = cr_prmt(w2, w3, sel);
	const u32 m = ((u32)n >> 3 & 0x01010101u) * 0xffu;
	return (int)((lo & ~m) | (hi & m));
}

#endif // CR_DEQUANT_CUH
