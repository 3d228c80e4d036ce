// rope.cu: rotary position embeddings as models/rope.go computes them (ggml's rope with YaRN):
// the angle of pair i at position pos is theta = pos * theta_scale^i advanced by repeated
// float32 multiplication (ggml_rope_cache_init), divided by the pair's frequency factor, mixed
// by YaRN's ramp, and its sine and cosine are glibc's sincosf (ported below, in double as
// glibc computes it), so the cache of cos/sin values matches the CPU bit for bit.
#include "common.cuh"

// __sincosf_table (x86-64 variant): sign[4], hpi_inv, hpi, c0, c1, {s1, c2}, {s2, c3}, {s3, c4};
// the second table has the signs of the odd quadrants.
__constant__ u64 rope_sincos_tab[2][14] = {
    {0x3ff0000000000000ull, 0xbff0000000000000ull, 0xbff0000000000000ull, 0x3ff0000000000000ull, 0x41645f306dc9c883ull,
     0x3ff921fb54442d18ull, 0x3ff0000000000000ull, 0xbfdffffffd0c621cull, 0xbfc555545995a603ull, 0x3fa55553e1068f19ull,
     0x3f81107605230bc4ull, 0xbf56c087e89a359dull, 0xbf2994eb3774cf24ull, 0x3ef99343027bf8c3ull},
    {0x3ff0000000000000ull, 0xbff0000000000000ull, 0xbff0000000000000ull, 0x3ff0000000000000ull, 0x41645f306dc9c883ull,
     0x3ff921fb54442d18ull, 0xbff0000000000000ull, 0x3fdffffffd0c621cull, 0xbfc555545995a603ull, 0xbfa55553e1068f19ull,
     0x3f81107605230bc4ull, 0x3f56c087e89a359dull, 0xbf2994eb3774cf24ull, 0xbef99343027bf8c3ull},
};

// 4/pi in 192 bits for reduce_large.
__constant__ u32 rope_inv_pio4[24] = {
    0xa2u,       0xa2f9u,     0xa2f983u,   0xa2f9836eu, 0xf9836e4eu, 0x836e4e44u, 0x6e4e4415u, 0x4e441529u,
    0x441529fcu, 0x1529fc27u, 0x29fc2757u, 0xfc2757d1u, 0x2757d1f5u, 0x57d1f534u, 0xd1f534ddu, 0xf534ddc0u,
    0x34ddc0dbu, 0xddc0db62u, 0xc0db6295u, 0xdb629599u, 0x6295993cu, 0x95993c43u, 0x993c4390u, 0x3c439041u,
};

enum { SC_HPI_INV = 4, SC_HPI, SC_C0, SC_C1, SC_S1, SC_C2, SC_S2, SC_C3, SC_S3, SC_C4 };

CR_FN double rope_tab(int which, int i) { return cr_as_d(rope_sincos_tab[which][i]); }

// rope_sincosf_poly is sincosf_poly of the FMA build.
CR_FN void rope_sincosf_poly(double xs, double x2, int which, int n, float* sinp, float* cosp) {
	double x3 = cr_dmul(x2, xs), x4 = cr_dmul(x2, x2);
	double vs1 = cr_dfma(x2, rope_tab(which, SC_S3), rope_tab(which, SC_S2));
	double vc2 = cr_dfma(x2, rope_tab(which, SC_C4), rope_tab(which, SC_C3));
	double x5 = cr_dmul(x2, x3), x6 = cr_dmul(x2, x4);
	double c1 = cr_dfma(x2, rope_tab(which, SC_C1), rope_tab(which, SC_C0));
	double s = cr_dfma(x3, rope_tab(which, SC_S1), xs);
	double c = cr_dfma(x4, rope_tab(which, SC_C2), c1);
	s = cr_dfma(vs1, x5, s);
	c = cr_dfma(vc2, x6, c);
	if (n & 1) {
		*sinp = (float)c;
		*cosp = (float)s;
	} else {
		*sinp = (float)s;
		*cosp = (float)c;
	}
}

// rope_reduce_large is reduce_large: x modulo pi/2 for |x| >= 120, and the quadrant.
CR_FN double rope_reduce_large(u32 xi, int* np) {
	const u32* arr = rope_inv_pio4 + ((xi >> 26) & 15);
	u32 shift = (xi >> 23) & 7;
	xi = ((xi & 0xffffffu) | 0x800000u) << shift;
	u64 res0 = (u64)(u32)(xi * arr[0]);
	u64 res1 = (u64)xi * (u64)arr[4];
	u64 res2 = (u64)xi * (u64)arr[8];
	res0 = (res2 >> 32) | (res0 << 32);
	res0 += res1;
	u64 n = (res0 + (1ull << 61)) >> 62;
	res0 -= n << 62;
	*np = (int)n;
	return cr_dmul((double)(i64)res0, cr_as_d(0x3c1921fb54442d18ull)); // 0x1.921FB54442D18p-62
}

// rope_sincosf is glibc's sincosf (FMA variant; Go: models.sincosf).
CR_FN void rope_sincosf(float y, float* sinp, float* cosp) {
	double x = (double)y;
	u32 t = (cr_f_bits(y) >> 20) & 0x7ffu;
	if (t < 0x3f4u) { // |y| < pi/4
		if (t < 0x398u) { // |y| < 2^-12
			*sinp = y;
			*cosp = 1.0f;
			return;
		}
		rope_sincosf_poly(x, cr_dmul(x, x), 0, 0, sinp, cosp);
	} else if (t < 0x42fu) { // |y| < 120
		double r = cr_dmul(x, rope_tab(0, SC_HPI_INV));
		int n = ((int)r + 0x800000) >> 24;
		x = cr_dfma(-(double)n, rope_tab(0, SC_HPI), x);
		double s = rope_tab(0, n & 3);
		rope_sincosf_poly(cr_dmul(x, s), cr_dmul(x, x), (n & 2) ? 1 : 0, n, sinp, cosp);
	} else if (t < 0x7f8u) {
		u32 xi = cr_f_bits(y);
		int sign = (int)(xi >> 31), n;
		x = rope_reduce_large(xi, &n);
		double s = rope_tab(0, (n + sign) & 3);
		rope_sincosf_poly(cr_dmul(x, s), cr_dmul(x, x), ((n + sign) & 2) ? 1 : 0, n, sinp, cosp);
	} else {
		float qnan = y - y;
		*sinp = qnan;
		*cosp = qnan;
	}
}

// rope_cs returns in *cs and *sn the cosine and sine, times mscale, of pair i's angle at
// position p: rope_f32's arithmetic, which rope_kv_f32 (fused.cu) shares.
CR_FN void rope_cs(float p, int i, float theta_scale, float freq_scale, float ext_factor, float mscale, float corr_lo,
                   float corr_hi, const float* freq_factors, float* cs, float* sn) {
	float theta = p;
	for (int j = 0; j < i; j++)
		theta = cr_fmul(theta, theta_scale);
	float te = freq_factors ? cr_fdiv(theta, freq_factors[i]) : theta;
	float ti = cr_fmul(freq_scale, te), th = ti;
	if (ext_factor != 0.0f) {
		float den = cr_fadd(corr_hi, -corr_lo);
		den = den > 0.001f ? den : 0.001f;
		float y = cr_fdiv(cr_fadd((float)i, -corr_lo), den);
		y = y > 0.0f ? y : 0.0f;
		y = y < 1.0f ? y : 1.0f;
		float ramp = cr_fmul(cr_fadd(1.0f, -y), ext_factor);
		th = cr_fma(ti, cr_fadd(1.0f, -ramp), cr_fmul(te, ramp));
	}
	float s, c;
	rope_sincosf(th, &s, &c);
	*cs = cr_fmul(c, mscale);
	*sn = cr_fmul(s, mscale);
}

// rope_pair rotates the pair (x0, x1) of a head in place.
CR_FN void rope_pair(float* x0, float* x1, float cs, float sn) {
	float a = *x0, b = *x1;
	*x0 = cr_fma(a, cs, -cr_fmul(b, sn));
	*x1 = cr_fma(a, sn, cr_fmul(b, cs));
}

// rope_f32(float* x, const int* posp, int pos0, int ntok, int heads, int head_stride,
//          int tok_stride, int n_dims, int neox, float theta_scale, float freq_scale,
//          float ext_factor, float mscale, float corr_lo, float corr_hi, const float* freq_factors)
//   Rotates, in place, the first n_dims values of every head of every token: head h of token t
//   starts at x + t*tok_stride + h*head_stride (standard attention: head_stride = head_dim,
//   tok_stride = heads*head_dim; MLA's q_pe: x = q + nope, head_stride = nope + rope,
//   tok_stride = heads*(nope + rope), n_dims = rope; MLA's k_pe: x = kv + rank, heads = 1,
//   tok_stride = rank + rope). Token t is at position pos0 + t, plus *posp when posp is not
//   NULL (one int in device memory: the position of a decode step that a CUDA graph replays).
//   neox = 0 rotates the pairs (2i, 2i+1), neox != 0 the pairs (i, i + n_dims/2); n_dims even.
//   The host computes, as models.Rope does:
//     theta_scale = float32(pow(freq_base, -2/float32(n_dims)))  (in float64, then rounded)
//     freq_scale  = Rope.FreqScale;  ext_factor = Rope.ExtFactor
//     mscale      = Rope.AttnFactor, times fma32(logf(1/FreqScale), 0.1, 1) if ext_factor != 0
//     corr_lo, corr_hi = Rope.yarnCorrDims() (used only if ext_factor != 0)
//   freq_factors: n_dims/2 floats dividing each pair's angle (llama 3 rope_freqs), or NULL.
//   grid (ntok, 1, 1); block (n_dims/2 rounded up to a multiple of 32, at most 256: no kernel
//   declares launch bounds, so only blocks of up to 256 threads are sure to fit its registers
//   (cuda's maxBlockThreads); any block size works, threads loop over the pairs); no shared
//   memory.
extern "C" __global__ void rope_f32(float* x, const int* posp, int pos0, int ntok, int heads, int head_stride, int tok_stride,
                                    int n_dims, int neox, float theta_scale, float freq_scale, float ext_factor, float mscale,
                                    float corr_lo, float corr_hi, const float* freq_factors) {
	const int t = blockIdx.x;
	if (t >= ntok)
		return;
	const int npairs = n_dims / 2;
	float* xt = x + (i64)t * tok_stride;
	const float p = (float)(pos0 + t + (posp ? *posp : 0));
	for (int i = threadIdx.x; i < npairs; i += blockDim.x) {
		float cs, sn;
		rope_cs(p, i, theta_scale, freq_scale, ext_factor, mscale, corr_lo, corr_hi, freq_factors, &cs, &sn);
		const int i0 = neox ? i : 2 * i, i1 = neox ? i + npairs : 2 * i + 1;
		for (int h = 0; h < heads; h++) {
			float* xh = xt + (i64)h * head_stride;
			rope_pair(xh + i0, xh + i1, cs, sn);
		}
	}
}
