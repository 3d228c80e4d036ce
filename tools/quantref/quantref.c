// quantref writes golden fixtures for package quant using llama.cpp's own ggml C code.
//
// It is linked against ggml sources compiled straight from the ollama module cache (see the
// Makefile): ggml-quants.c (reference dequantizers and quantizers), ggml-cpu/quants.c (the
// portable "generic" vec_dot kernels), ggml-cpu/arch/x86/quants.c built with AVX2/FMA/F16C
// (the activation quantizers and vec_dot kernels an x86 llama.cpp build runs) and
// ggml-cpu/vec.cpp twice (scalar, and AVX2 with its symbols renamed to avx2_*).
//
// Output (stdout) is a little-endian record stream; quant/golden_test.go documents and reads it.
// Everything is driven by a fixed seed so the output is reproducible.

#define GGML_COMMON_DECL_C
#include "ggml-common.h"
#include "ggml-quants.h"
#include "ggml-impl.h"
#include "ggml-cpu-impl.h"
#include "simd-mappings.h"
#include "quants.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the few ggml symbols the compiled sources reference but never call here ----

float ggml_table_f32_f16[1 << 16];

void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ggml_abort %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
size_t ggml_type_size(enum ggml_type t) { (void) t; abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void) t; (void) n; abort(); }

// vec.cpp, scalar build and AVX2 build (renamed).
void ggml_vec_dot_f32(int n, float * s, size_t bs, const float * x, size_t bx, const float * y, size_t by, int nrc);
void ggml_vec_dot_f16(int n, float * s, size_t bs, ggml_fp16_t * x, size_t bx, ggml_fp16_t * y, size_t by, int nrc);
void ggml_vec_dot_bf16(int n, float * s, size_t bs, ggml_bf16_t * x, size_t bx, ggml_bf16_t * y, size_t by, int nrc);
void avx2_ggml_vec_dot_f32(int n, float * s, size_t bs, const float * x, size_t bx, const float * y, size_t by, int nrc);
void avx2_ggml_vec_dot_f16(int n, float * s, size_t bs, ggml_fp16_t * x, size_t bx, ggml_fp16_t * y, size_t by, int nrc);
void avx2_ggml_vec_dot_bf16(int n, float * s, size_t bs, ggml_bf16_t * x, size_t bx, ggml_bf16_t * y, size_t by, int nrc);

// ---- type table (ggml ids) ----

enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q8_1 = 9,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15, T_IQ4_NL = 20,
    T_BF16 = 30, T_MXFP4 = 39,
};

typedef void (*dequant_fn)(const void * x, float * y, int64_t k);
typedef void (*quant_fn)(const float * x, void * y, int64_t k);
typedef void (*dot_fn)(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc);

static void deq_f32(const void * x, float * y, int64_t k) { memcpy(y, x, 4*k); }
static void deq_f16(const void * x, float * y, int64_t k) {
    const ggml_fp16_t * h = x;
    for (int64_t i = 0; i < k; i++) y[i] = GGML_FP16_TO_FP32(h[i]);
}
static void deq_bf16(const void * x, float * y, int64_t k) {
    const ggml_bf16_t * h = x;
    for (int64_t i = 0; i < k; i++) y[i] = GGML_BF16_TO_FP32(h[i]);
}

// Activation conversions exactly as ggml-cpu's from_float does on an F16C machine
// (ggml_cpu_fp32_to_fp16: VCVTPS2PH on groups of 8, then 4, then the scalar macro for the rest).
static void act_f32(const float * x, void * y, int64_t k) { memcpy(y, x, 4*k); }
static void act_f16(const float * x, void * y, int64_t k) {
    ggml_fp16_t * h = y;
    int64_t i = 0;
    for (; i + 7 < k; i += 8) {
        _mm_storeu_si128((__m128i *) (h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < k; i++) h[i] = GGML_CPU_FP32_TO_FP16(x[i]);
}
static void act_bf16(const float * x, void * y, int64_t k) {
    ggml_bf16_t * h = y;
    for (int64_t i = 0; i < k; i++) h[i] = GGML_FP32_TO_BF16(x[i]);
}

static void dot_f32_scalar(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc) {
    ggml_vec_dot_f32(n, s, bs, x, bx, y, by, nrc);
}
static void dot_f16_scalar(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc) {
    ggml_vec_dot_f16(n, s, bs, (ggml_fp16_t *) x, bx, (ggml_fp16_t *) y, by, nrc);
}
static void dot_bf16_scalar(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc) {
    ggml_vec_dot_bf16(n, s, bs, (ggml_bf16_t *) x, bx, (ggml_bf16_t *) y, by, nrc);
}
static void dot_f32_avx2(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc) {
    avx2_ggml_vec_dot_f32(n, s, bs, x, bx, y, by, nrc);
}
static void dot_f16_avx2(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc) {
    avx2_ggml_vec_dot_f16(n, s, bs, (ggml_fp16_t *) x, bx, (ggml_fp16_t *) y, by, nrc);
}
static void dot_bf16_avx2(int n, float * s, size_t bs, const void * x, size_t bx, const void * y, size_t by, int nrc) {
    avx2_ggml_vec_dot_bf16(n, s, bs, (ggml_bf16_t *) x, bx, (ggml_bf16_t *) y, by, nrc);
}

typedef struct {
    int id;
    const char * name;
    int block;       // elements per block
    int bytes;       // bytes per block
    int dot;         // vec_dot_type
    dequant_fn deq;  // reference dequantizer (ggml-quants.c)
    quant_fn ref_q;  // reference quantizer (ggml-quants.c), weights
    quant_fn act_q;  // x86 CPU backend from_float, activations
    dot_fn dot_generic;
    dot_fn dot_simd;
    int fp16_fields[3]; // byte offsets of fp16 scale fields inside a block, -1 terminated
    int f32_field;      // byte offset of an f32 scale field, or -1
    int e8m0_field;     // 1 if byte 0 of a block is an E8M0 scale (MXFP4); 0 (unset) otherwise
} type_info;

#define DQ(f) ((dequant_fn) (f))
#define QF(f) ((quant_fn) (f))
#define DF(f) ((dot_fn) (f))

static const type_info types[] = {
    { T_F32, "F32", 1, 4, T_F32, deq_f32, NULL, act_f32, dot_f32_scalar, dot_f32_avx2, {-1}, -1 },
    { T_F16, "F16", 1, 2, T_F16, deq_f16, NULL, act_f16, dot_f16_scalar, dot_f16_avx2, {-1}, -1 },
    { T_BF16, "BF16", 1, 2, T_BF16, deq_bf16, NULL, act_bf16, dot_bf16_scalar, dot_bf16_avx2, {-1}, -1 },
    { T_Q4_0, "Q4_0", QK4_0, sizeof(block_q4_0), T_Q8_0, DQ(dequantize_row_q4_0), QF(quantize_row_q4_0_ref), NULL,
      DF(ggml_vec_dot_q4_0_q8_0_generic), DF(ggml_vec_dot_q4_0_q8_0), {0, -1}, -1 },
    { T_Q4_1, "Q4_1", QK4_1, sizeof(block_q4_1), T_Q8_1, DQ(dequantize_row_q4_1), QF(quantize_row_q4_1_ref), NULL,
      DF(ggml_vec_dot_q4_1_q8_1_generic), DF(ggml_vec_dot_q4_1_q8_1), {0, 2, -1}, -1 },
    { T_Q5_0, "Q5_0", QK5_0, sizeof(block_q5_0), T_Q8_0, DQ(dequantize_row_q5_0), QF(quantize_row_q5_0_ref), NULL,
      DF(ggml_vec_dot_q5_0_q8_0_generic), DF(ggml_vec_dot_q5_0_q8_0), {0, -1}, -1 },
    { T_Q5_1, "Q5_1", QK5_1, sizeof(block_q5_1), T_Q8_1, DQ(dequantize_row_q5_1), QF(quantize_row_q5_1_ref), NULL,
      DF(ggml_vec_dot_q5_1_q8_1_generic), DF(ggml_vec_dot_q5_1_q8_1), {0, 2, -1}, -1 },
    { T_Q8_0, "Q8_0", QK8_0, sizeof(block_q8_0), T_Q8_0, DQ(dequantize_row_q8_0), QF(quantize_row_q8_0_ref), QF(quantize_row_q8_0),
      DF(ggml_vec_dot_q8_0_q8_0_generic), DF(ggml_vec_dot_q8_0_q8_0), {0, -1}, -1 },
    { T_Q8_1, "Q8_1", QK8_1, sizeof(block_q8_1), T_Q8_1, NULL, QF(quantize_row_q8_1_ref), QF(quantize_row_q8_1),
      NULL, NULL, {0, 2, -1}, -1 },
    { T_IQ4_NL, "IQ4_NL", QK4_NL, sizeof(block_iq4_nl), T_Q8_0, DQ(dequantize_row_iq4_nl), QF(quantize_row_iq4_nl_ref), NULL,
      DF(ggml_vec_dot_iq4_nl_q8_0_generic), DF(ggml_vec_dot_iq4_nl_q8_0), {0, -1}, -1 },
    { T_Q2_K, "Q2_K", QK_K, sizeof(block_q2_K), T_Q8_K, DQ(dequantize_row_q2_K), QF(quantize_row_q2_K_ref), NULL,
      DF(ggml_vec_dot_q2_K_q8_K_generic), DF(ggml_vec_dot_q2_K_q8_K), {80, 82, -1}, -1 },
    { T_Q3_K, "Q3_K", QK_K, sizeof(block_q3_K), T_Q8_K, DQ(dequantize_row_q3_K), QF(quantize_row_q3_K_ref), NULL,
      DF(ggml_vec_dot_q3_K_q8_K_generic), DF(ggml_vec_dot_q3_K_q8_K), {108, -1}, -1 },
    { T_Q4_K, "Q4_K", QK_K, sizeof(block_q4_K), T_Q8_K, DQ(dequantize_row_q4_K), QF(quantize_row_q4_K_ref), NULL,
      DF(ggml_vec_dot_q4_K_q8_K_generic), DF(ggml_vec_dot_q4_K_q8_K), {0, 2, -1}, -1 },
    { T_Q5_K, "Q5_K", QK_K, sizeof(block_q5_K), T_Q8_K, DQ(dequantize_row_q5_K), QF(quantize_row_q5_K_ref), NULL,
      DF(ggml_vec_dot_q5_K_q8_K_generic), DF(ggml_vec_dot_q5_K_q8_K), {0, 2, -1}, -1 },
    { T_Q6_K, "Q6_K", QK_K, sizeof(block_q6_K), T_Q8_K, DQ(dequantize_row_q6_K), QF(quantize_row_q6_K_ref), NULL,
      DF(ggml_vec_dot_q6_K_q8_K_generic), DF(ggml_vec_dot_q6_K_q8_K), {208, -1}, -1 },
    { T_Q8_K, "Q8_K", QK_K, sizeof(block_q8_K), T_Q8_K, DQ(dequantize_row_q8_K), QF(quantize_row_q8_K_ref), QF(quantize_row_q8_K),
      NULL, NULL, {-1}, 0 },
    { T_MXFP4, "MXFP4", QK_MXFP4, sizeof(block_mxfp4), T_Q8_0, DQ(dequantize_row_mxfp4), QF(quantize_row_mxfp4_ref), NULL,
      DF(ggml_vec_dot_mxfp4_q8_0_generic), DF(ggml_vec_dot_mxfp4_q8_0), {-1}, -1, 1 },
};
#define NTYPES ((int) (sizeof(types)/sizeof(types[0])))

static const type_info * info(int id) {
    for (int i = 0; i < NTYPES; i++) {
        if (types[i].id == id) return &types[i];
    }
    fprintf(stderr, "no type %d\n", id);
    abort();
}

static size_t row_bytes(const type_info * t, int n) {
    if (n % t->block) { fprintf(stderr, "%s: %d not a multiple of %d\n", t->name, n, t->block); abort(); }
    return (size_t) (n / t->block) * t->bytes;
}

// ---- deterministic randomness ----

static uint64_t rng_state = 0x5eed0f00d1234567ull;

static uint64_t splitmix64(uint64_t * s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t rnd(void) { return splitmix64(&rng_state); }
static float uniform(void) { return (float) ((rnd() >> 40) * (1.0 / 16777216.0)); } // [0,1)
static float gauss(void) {
    // Irwin-Hall: sum of 12 uniforms minus 6 - close enough to normal, no libm involved.
    float s = 0;
    for (int i = 0; i < 12; i++) s += uniform();
    return s - 6.0f;
}

// ---- output ----

static void put(const void * p, size_t n) {
    if (fwrite(p, 1, n, stdout) != n) { perror("write"); exit(1); }
}
static void put_u8(uint8_t v) { put(&v, 1); }
static void put_u32(uint32_t v) { put(&v, 4); }
static void put_u64(uint64_t v) { put(&v, 8); }
static void put_f32(float v) { put(&v, 4); }
static void put_blob(const void * p, size_t n) { put_u32((uint32_t) n); put(p, n); }

enum { REC_END = 0, REC_DEQUANT = 1, REC_ACTQ = 2, REC_VECDOT = 3, REC_REFQ = 4, REC_HASH = 5 };

static void rec_header(int kind, int type, int n) {
    put_u8((uint8_t) kind);
    put_u32((uint32_t) type);
    put_u32((uint32_t) n);
}

// ---- data generators ----

// random_blocks fills a row of type t with random bytes, then overwrites the scale fields with
// sane values so dequantized numbers stay finite and readable.
static void random_blocks(const type_info * t, uint8_t * dst, int n) {
    size_t nb = row_bytes(t, n);
    for (size_t i = 0; i < nb; i++) dst[i] = (uint8_t) rnd();
    if (t->block == 1) {
        // float types: random finite values of moderate size
        for (int i = 0; i < n; i++) {
            float v = gauss() * 0.5f;
            if (t->id == T_F32) memcpy(dst + 4*i, &v, 4);
            if (t->id == T_F16) { ggml_fp16_t h = GGML_FP32_TO_FP16(v); memcpy(dst + 2*i, &h, 2); }
            if (t->id == T_BF16) { ggml_bf16_t h = GGML_FP32_TO_BF16(v); memcpy(dst + 2*i, &h, 2); }
        }
        return;
    }
    for (int b = 0; b < n / t->block; b++) {
        uint8_t * blk = dst + (size_t) b * t->bytes;
        for (int f = 0; t->fp16_fields[f] >= 0; f++) {
            // magnitude in [2^-12, 2^-1), either sign (K-quant dmin included: the kernels must
            // not assume a sign).
            float mag = ldexpf(1.0f + uniform(), -2 - (int) (rnd() % 11));
            float v = (rnd() & 1) ? -mag : mag;
            ggml_fp16_t h = GGML_FP32_TO_FP16(v);
            memcpy(blk + t->fp16_fields[f], &h, 2);
        }
        if (t->f32_field >= 0) {
            float v = ldexpf(1.0f + uniform(), -8);
            memcpy(blk + t->f32_field, &v, 4);
        }
        if (t->e8m0_field) {
            // scale 2^(e-128) in [2^-12, 2^-1], the range of the fp16 scales above
            blk[0] = (uint8_t) (116 + rnd() % 12);
        }
    }
}

enum { DIST_GAUSS, DIST_OUTLIERS, DIST_ZEROS, DIST_TIES, DIST_WIDE, DIST_SPREAD, NDIST };

static void random_floats(float * x, int n, int dist) {
    for (int i = 0; i < n; i++) x[i] = gauss();
    switch (dist) {
    case DIST_GAUSS:
        break;
    case DIST_OUTLIERS:
        for (int i = 0; i < n; i += 37) x[i] *= 50.0f;
        break;
    case DIST_ZEROS:
        // first 256 values zero (an all-zero Q8_K block and eight zero Q8_0 blocks), then a block
        // with one non-zero value, then ordinary data
        for (int i = 0; i < 256 && i < n; i++) x[i] = 0;
        for (int i = 256; i < 288 && i < n; i++) x[i] = (i == 270) ? -3.0f : 0.0f;
        break;
    case DIST_TIES:
        // half-integers with the block's absmax at 127: the scaled values are exact .5 ties, so
        // the rounding rule (nearest-even vs away from zero) shows.
        for (int i = 0; i < n; i++) {
            int k = (int) (rnd() % 254) - 127;
            x[i] = (float) k + 0.5f;
        }
        for (int i = 0; i < n; i += 32) x[i] = (i / 32) % 2 ? 127.0f : -127.0f;
        break;
    case DIST_WIDE:
        // magnitudes 2^-20..2^19: F16 subnormals and overflow, Q8 blocks with tiny values
        for (int i = 0; i < n; i++) x[i] = ldexpf(gauss(), (int) (rnd() % 40) - 20);
        break;
    case DIST_SPREAD:
        // magnitudes 2^-12..2^3, finite in every type
        for (int i = 0; i < n; i++) x[i] = ldexpf(gauss(), (int) (rnd() % 16) - 12);
        break;
    }
}

// ---- conversion hashes ----

static uint64_t fnv_init(void) { return 0xcbf29ce484222325ull; }
static uint64_t fnv_add(uint64_t h, const void * p, size_t n) {
    const uint8_t * b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 0x100000001b3ull; }
    return h;
}

// conv_input returns the i'th fp32 bit pattern of the conversion sweep: every fp16 value's
// exact fp32 image, the exact midpoint above it and the patterns one ulp either side of that
// midpoint (4 x 65536), followed by 1<<20 pseudo-random patterns from splitmix64(seed 42).
#define CONV_STRUCTURED (4 * 65536)
#define CONV_RANDOM (1 << 20)
static uint32_t conv_input(uint32_t i, uint64_t * s) {
    if (i < CONV_STRUCTURED) {
        uint16_t h = (uint16_t) (i / 4);
        float f = GGML_COMPUTE_FP16_TO_FP32(h);
        uint32_t b; memcpy(&b, &f, 4);
        switch (i % 4) {
        case 0: return b;
        case 1: return b + 0x1000;
        case 2: return b + 0x0fff;
        default: return b + 0x1001;
        }
    }
    return (uint32_t) (splitmix64(s) >> 32);
}

static void write_hashes(void) {
    enum { H_F16_TO_F32_COMPUTE = 1, H_F16_TO_F32_F16C = 2, H_F32_TO_F16_F16C = 3, H_F32_TO_F16_COMPUTE = 4, H_F32_TO_BF16 = 5 };
    uint64_t a = fnv_init(), b = fnv_init();
    for (uint32_t i = 0; i < 65536; i++) {
        float x = GGML_COMPUTE_FP16_TO_FP32((ggml_fp16_t) i);
        float y = _cvtsh_ss((unsigned short) i);
        a = fnv_add(a, &x, 4);
        b = fnv_add(b, &y, 4);
    }
    rec_header(REC_HASH, H_F16_TO_F32_COMPUTE, 65536); put_u64(a);
    rec_header(REC_HASH, H_F16_TO_F32_F16C, 65536); put_u64(b);

    uint64_t hf16c = fnv_init(), hcomp = fnv_init(), hbf = fnv_init();
    uint64_t s = 42;
    const uint32_t total = CONV_STRUCTURED + CONV_RANDOM;
    for (uint32_t i = 0; i < total; i++) {
        uint32_t bits = conv_input(i, &s);
        float f; memcpy(&f, &bits, 4);
        // On x86 GGML_CPU_FP32_TO_FP16 is the portable GGML_COMPUTE_FP32_TO_FP16 (used for
        // scalars such as block scales); bulk conversions (ggml_cpu_fp32_to_fp16) use F16C.
        uint16_t h1 = _cvtss_sh(f, 0);
        uint16_t h2 = GGML_CPU_FP32_TO_FP16(f);
        ggml_bf16_t h3 = GGML_FP32_TO_BF16(f);
        hf16c = fnv_add(hf16c, &h1, 2);
        hcomp = fnv_add(hcomp, &h2, 2);
        hbf = fnv_add(hbf, &h3.bits, 2);
    }
    rec_header(REC_HASH, H_F32_TO_F16_F16C, (int) total); put_u64(hf16c);
    rec_header(REC_HASH, H_F32_TO_F16_COMPUTE, (int) total); put_u64(hcomp);
    rec_header(REC_HASH, H_F32_TO_BF16, (int) total); put_u64(hbf);
}

// ---- records ----

static void write_dequant(const type_info * t, int n) {
    size_t nb = row_bytes(t, n);
    uint8_t * src = calloc(nb, 1);
    float * dst = calloc(n, sizeof(float));
    random_blocks(t, src, n);
    t->deq(src, dst, n);
    rec_header(REC_DEQUANT, t->id, n);
    put_blob(src, nb);
    put_blob(dst, (size_t) n * 4);
    free(src);
    free(dst);
}

static void write_actq(const type_info * t, int n, int dist) {
    float * x = calloc(n, sizeof(float));
    size_t nb = row_bytes(t, n);
    uint8_t * dst = calloc(nb, 1); // zeroed: Q8_K leaves bsums of an all-zero block untouched
    random_floats(x, n, dist);
    t->act_q(x, dst, n);
    rec_header(REC_ACTQ, t->id, n);
    put_blob(x, (size_t) n * 4);
    put_blob(dst, nb);
    free(x);
    free(dst);
}

static void write_refq(const type_info * t, int n, int dist) {
    float * x = calloc(n, sizeof(float));
    size_t nb = row_bytes(t, n);
    uint8_t * dst = calloc(nb, 1);
    random_floats(x, n, dist);
    t->ref_q(x, dst, n);
    rec_header(REC_REFQ, t->id, n);
    put_blob(x, (size_t) n * 4);
    put_blob(dst, nb);
    free(x);
    free(dst);
}

static void write_vecdot(const type_info * t, int n, int dist) {
    const type_info * dt = info(t->dot);
    size_t wb = row_bytes(t, n), xb = row_bytes(dt, n);
    uint8_t * w = calloc(wb, 1);
    uint8_t * xq = calloc(xb, 1);
    float * x = calloc(n, sizeof(float));
    random_blocks(t, w, n);
    random_floats(x, n, dist);
    dt->act_q(x, xq, n);
    float generic = 0, simd = 0;
    t->dot_generic(n, &generic, 0, w, 0, xq, 0, 1);
    t->dot_simd(n, &simd, 0, w, 0, xq, 0, 1);
    rec_header(REC_VECDOT, t->id, n);
    put_blob(w, wb);
    put_blob(xq, xb);
    put_f32(generic);
    put_f32(simd);
    free(w);
    free(xq);
    free(x);
}

// ---- MXFP4 ----
//
// Written after every other record, so that adding them left the earlier records (and the
// random stream they draw from) unchanged.

// write_dequant_e8m0_sweep: one block per E8M0 byte 0..255 (subnormal, huge and infinite
// products included), random quants.
static void write_dequant_e8m0_sweep(const type_info * t) {
    const int n = 256 * t->block;
    size_t nb = row_bytes(t, n);
    uint8_t * src = calloc(nb, 1);
    float * dst = calloc(n, sizeof(float));
    random_blocks(t, src, n);
    for (int b = 0; b < 256; b++) src[(size_t) b * t->bytes] = (uint8_t) b;
    t->deq(src, dst, n);
    rec_header(REC_DEQUANT, t->id, n);
    put_blob(src, nb);
    put_blob(dst, (size_t) n * 4);
    free(src);
    free(dst);
}

// write_refq_mxfp4_ties: blocks whose largest magnitude is 6 (scale 0.5, codebook values
// 0, 0.5, 1, 1.5, 2, 3, 4, 6) and whose other values are multiples of 0.25, many of them
// exactly between two codebook values, where best_index_mxfp4 keeps the first.
static void write_refq_mxfp4_ties(const type_info * t, int n) {
    float * x = calloc(n, sizeof(float));
    size_t nb = row_bytes(t, n);
    uint8_t * dst = calloc(nb, 1);
    for (int i = 0; i < n; i++) x[i] = (float) ((int) (rnd() % 49) - 24) * 0.25f;
    for (int i = 0; i < n; i += 32) x[i] = (i / 32) % 2 ? 6.0f : -6.0f;
    t->ref_q(x, dst, n);
    rec_header(REC_REFQ, t->id, n);
    put_blob(x, (size_t) n * 4);
    put_blob(dst, nb);
    free(x);
    free(dst);
}

// The MXFP4 scale sweep: largest magnitudes whose E8M0 exponent depends on how log2f rounds,
// those within 256 patterns below a power of two (farther below, log2 is more than an ulp from
// the integer). For every normal binade the 256 patterns just below its top and its 16 lowest;
// for every power of two among the subnormals (2^-149 .. 2^-126) the 256 patterns below it and
// the power itself; then +Inf, 0, the largest finite value and 1<<16 splitmix64(seed 7)
// patterns of any sign (NaN included).

static uint64_t mxfp4_hash_block(const type_info * t, uint64_t h, uint32_t bits, uint32_t * count) {
    float x[QK_MXFP4];
    block_mxfp4 y;
    float v; memcpy(&v, &bits, 4);
    x[0] = v;
    for (int j = 1; j < QK_MXFP4; j++) x[j] = v * ((float) (j - 16) / 16.0f);
    t->ref_q(x, &y, QK_MXFP4);
    ++*count;
    return fnv_add(h, &y, sizeof(y));
}

// write_mxfp4_scale_hash hashes quantize_row_mxfp4_ref's block for each sweep value v placed
// in a block whose other values are v*(j-16)/16: the E8M0 exponent of v and the codebook
// indices of values at fixed ratios to it.
static void write_mxfp4_scale_hash(const type_info * t) {
    enum { H_MXFP4_REFQ_SWEEP = 6 };
    uint64_t h = fnv_init();
    uint32_t count = 0;
    for (uint32_t binade = 1; binade < 255; binade++) {
        for (uint32_t k = 0; k < 256; k++) h = mxfp4_hash_block(t, h, binade << 23 | (0x7fffffu - k), &count);
        for (uint32_t k = 0; k < 16; k++) h = mxfp4_hash_block(t, h, binade << 23 | k, &count);
    }
    for (uint32_t p = 0; p < 24; p++) {
        for (uint32_t k = 1; k <= 256 && k < (1u << p); k++) h = mxfp4_hash_block(t, h, (1u << p) - k, &count);
        h = mxfp4_hash_block(t, h, 1u << p, &count);
    }
    h = mxfp4_hash_block(t, h, 0x7f800000u, &count);
    h = mxfp4_hash_block(t, h, 0, &count);
    h = mxfp4_hash_block(t, h, 0x7f7fffffu, &count);
    uint64_t s = 7;
    for (int i = 0; i < (1 << 16); i++) h = mxfp4_hash_block(t, h, (uint32_t) (splitmix64(&s) >> 32), &count);
    rec_header(REC_HASH, H_MXFP4_REFQ_SWEEP, (int) count);
    put_u64(h);
}

// mxfp4_large_row fills a weight row w of n elements and its activation row xq: weights of
// the activations' signs, +-3 or +-12, against activations of near-constant magnitude, so that
// block sums reach 2^14 without being multiples of 4 and d*sum rounds. Random data (small sums
// of even codebook values) almost never tells a fused multiply-add from a product and a sum.
static void mxfp4_large_row(const type_info * t, int n, uint8_t * w, uint8_t * xq) {
    float * x = calloc(n, sizeof(float));
    random_blocks(t, w, n);
    for (int i = 0; i < n; i++) x[i] = (rnd() & 1 ? 1.0f : -1.0f) * (0.8f + 0.2f * uniform());
    for (int b = 0; b < n / t->block; b++) {
        for (int j = 0; j < 16; j++) {
            uint8_t lo = (x[32 * b + j] >= 0 ? 3 : 11) + 4 * (uint8_t) (rnd() & 1);
            uint8_t hi = (x[32 * b + j + 16] >= 0 ? 3 : 11) + 4 * (uint8_t) (rnd() & 1);
            w[(size_t) b * t->bytes + 1 + j] = lo | hi << 4;
        }
    }
    info(t->dot)->act_q(x, xq, n);
    free(x);
}

static void put_vecdot(const type_info * t, int n, const uint8_t * w, const uint8_t * xq) {
    float generic = 0, simd = 0;
    t->dot_generic(n, &generic, 0, w, 0, xq, 0, 1);
    t->dot_simd(n, &simd, 0, w, 0, xq, 0, 1);
    rec_header(REC_VECDOT, t->id, n);
    put_blob(w, row_bytes(t, n));
    put_blob(xq, row_bytes(info(t->dot), n));
    put_f32(generic);
    put_f32(simd);
}

// mxfp4_generic_fused is ggml_vec_dot_mxfp4_q8_0_generic with each block fused into the sum:
// what a compiler that contracts would make of it.
static float mxfp4_generic_fused(int n, const uint8_t * w, const uint8_t * xq) {
    // kvalues_mxfp4, which ggml-common.h only defines for its own translation units
    static const int8_t kv[16] = { 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12 };
    const block_mxfp4 * x = (const block_mxfp4 *) w;
    const block_q8_0 * y = (const block_q8_0 *) xq;
    float acc = 0;
    for (int ib = 0; ib < n / QK_MXFP4; ib++) {
        const float d = GGML_FP16_TO_FP32(y[ib].d) * GGML_E8M0_TO_FP32_HALF(x[ib].e);
        int s = 0;
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            s += y[ib].qs[j] * kv[x[ib].qs[j] & 0xf];
            s += y[ib].qs[j + QK_MXFP4 / 2] * kv[x[ib].qs[j] >> 4];
        }
        acc = fmaf(d, (float) s, acc);
    }
    return acc;
}

// write_vecdot_mxfp4_fused writes want records of n elements (from 8192 candidates at most) on
// which fusing matters: the generic kernel's products and sums differ from fused multiply-adds,
// and the AVX2 kernel's fused last block (n an odd number of blocks) differs from a product and
// a sum, that is from its result on the other blocks plus the generic result of the last.
static void write_vecdot_mxfp4_fused(const type_info * t, int n, int want) {
    const int nb = n / t->block;
    const size_t wb = row_bytes(t, n), xb = row_bytes(info(t->dot), n);
    uint8_t * w = calloc(wb, 1);
    uint8_t * xq = calloc(xb, 1);
    int found = 0;
    for (int i = 0; i < 8192 && found < want; i++) {
        mxfp4_large_row(t, n, w, xq);
        float generic = 0, simd = 0, head = 0, last = 0;
        t->dot_generic(n, &generic, 0, w, 0, xq, 0, 1);
        t->dot_simd(n, &simd, 0, w, 0, xq, 0, 1);
        t->dot_simd(n - t->block, &head, 0, w, 0, xq, 0, 1);
        t->dot_generic(t->block, &last, 0, w + wb - t->bytes, 0, xq + xb - info(t->dot)->bytes, 0, 1);
        const int tail = nb % 2 == 1 && simd != head + last;
        if (generic != mxfp4_generic_fused(n, w, xq) && (nb % 2 == 0 || tail)) {
            put_vecdot(t, n, w, xq);
            found++;
        }
    }
    if (found < want) { fprintf(stderr, "MXFP4: %d of %d records of %d elements where fusing matters\n", found, want, n); exit(1); }
    free(w);
    free(xq);
}

static void write_mxfp4(void) {
    const type_info * t = info(T_MXFP4);
    write_dequant(t, 768);
    write_dequant_e8m0_sweep(t);
    for (int d = 0; d < NDIST; d++) {
        write_refq(t, d == DIST_ZEROS ? 512 : 256, d);
    }
    write_refq(t, 512, DIST_OUTLIERS);
    write_refq_mxfp4_ties(t, 256);
    write_mxfp4_scale_hash(t);
    write_vecdot(t, 256, DIST_GAUSS);
    write_vecdot(t, 512, DIST_ZEROS);
    write_vecdot(t, 512, DIST_OUTLIERS);
    write_vecdot(t, 1024, DIST_GAUSS);
    // odd block counts: the AVX2 kernel's last block is a scalar tail
    write_vecdot(t, 32, DIST_GAUSS);
    write_vecdot(t, 96, DIST_SPREAD);
    write_vecdot(t, 288, DIST_OUTLIERS);
    // a pair of blocks, then the AVX2 kernel's scalar tail; and long rows
    write_vecdot_mxfp4_fused(t, 96, 4);
    write_vecdot_mxfp4_fused(t, 800, 2);
    write_vecdot_mxfp4_fused(t, 2880, 2);
}

int main(void) {
    for (int i = 0; i < (1 << 16); i++) {
        ggml_table_f32_f16[i] = GGML_COMPUTE_FP16_TO_FP32((ggml_fp16_t) i);
    }

    put("QREF", 4);
    put_u32(1);

    write_hashes();

    static const int weights[] = { T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_IQ4_NL,
                                   T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K };
    const int nweights = (int) (sizeof(weights)/sizeof(weights[0]));

    // Dequantization: random blocks of every weight type plus Q8_0 and Q8_K.
    for (int i = 0; i < nweights; i++) write_dequant(info(weights[i]), 768);
    write_dequant(info(T_Q8_K), 512);

    // Activation quantization as the x86 CPU backend does it.
    static const int acts[] = { T_Q8_0, T_Q8_1, T_Q8_K, T_F16, T_BF16, T_F32 };
    for (int i = 0; i < (int) (sizeof(acts)/sizeof(acts[0])); i++) {
        for (int d = 0; d < NDIST; d++) {
            // DIST_ZEROS needs more than 288 values for its non-zero tail
            write_actq(info(acts[i]), d == DIST_ZEROS ? 512 : 256, d);
        }
    }

    // ggml's reference weight quantizers, for comparing error and (where our algorithm is the
    // same) bits.
    static const int refs[] = { T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0, T_Q8_1, T_IQ4_NL,
                                T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K, T_Q8_K };
    for (int i = 0; i < (int) (sizeof(refs)/sizeof(refs[0])); i++) {
        write_refq(info(refs[i]), 256, DIST_GAUSS);
        write_refq(info(refs[i]), 512, DIST_OUTLIERS);
    }

    // Dot products: generic kernels (bit-exact target) and the AVX2 kernels (tolerance target).
    for (int i = 0; i < nweights; i++) {
        const type_info * t = info(weights[i]);
        if (t->block == 1) {
            // odd lengths exercise the SIMD kernels' scalar tails
            write_vecdot(t, 7, DIST_GAUSS);
            write_vecdot(t, 256, DIST_GAUSS);
            write_vecdot(t, 1000, DIST_OUTLIERS);
            write_vecdot(t, 520, DIST_SPREAD);
        } else {
            write_vecdot(t, 256, DIST_GAUSS);
            write_vecdot(t, 512, DIST_ZEROS);
            write_vecdot(t, 512, DIST_OUTLIERS);
            write_vecdot(t, 1024, DIST_GAUSS);
        }
    }

    write_mxfp4();

    put_u8(REC_END);
    return 0;
}
