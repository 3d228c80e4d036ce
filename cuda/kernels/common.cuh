// common.cuh: what every kernel file shares. The kernels are plain CUDA C that compiles three
// ways, and this header hides the differences:
//
//   - nvcc (nvcc -ptx -arch=compute_75; compute_80 for sm80.cu): the toolkit's implicit
//     declarations (__shfl_xor_sync, __byte_perm, __fmul_rn, ...) are used; no toolkit header
//     is included.
//   - clang without the CUDA toolkit (clang -x cuda --cuda-device-only -nocudainc -nocudalib):
//     the CUDA keywords and intrinsics are defined here from clang's builtins.
//   - a host C++ compiler (neither of the above): only for testing the sources on a machine
//     without a GPU. The test harness then provides threadIdx, blockIdx, blockDim, gridDim,
//     cr_host_syncthreads and cr_host_shfl_xor, and runs each CUDA thread as a host thread.
//
// Nothing here calls the CUDA runtime or needs libdevice: the few transcendental functions the
// kernels use are written out below (ports of the routines the CPU reference reproduces).
#ifndef CR_COMMON_CUH
#define CR_COMMON_CUH

#if defined(__NVCC__)
#define CR_DEVICE 1
#define CR_NVCC 1
#elif defined(__clang__) && defined(__CUDA__)
#define CR_DEVICE 1
#define CR_CLANG 1
#include <__clang_cuda_builtin_vars.h>
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#else
#define CR_HOST 1
#include <math.h>
#include <string.h>
struct cr_dim3 {
	unsigned x, y, z;
};
extern thread_local cr_dim3 threadIdx, blockIdx, blockDim, gridDim;
void cr_host_syncthreads(void);
unsigned cr_host_shfl_xor(unsigned v, int lane_mask);
// cr_host_warp_gather: every lane of the warp calls it with the same n; it returns the warp's
// values, lane s's v[i] at [s*n + i], valid until the lane's next warp collective. The
// emulator's warp-wide helpers (sums, tensor-core products) exchange their values in one step
// where shuffles would take one step per value.
const unsigned* cr_host_warp_gather(const unsigned* v, int n);
// cr_host_fault ends the launch with CUDA_ERROR_LAUNCH_FAILED and the message what: where a
// GPU would fault (a misaligned load).
void cr_host_fault(const char* what);
// The emulator's cp.async (CR_EMU_SM80): a copy of 16 bytes, or 16 zero bytes where valid is
// 0, that lands at any moment up to the wait that covers its group; a group closed by commit;
// a wait until no more than n groups are in flight.
void cr_host_cp_async16(void* dst, const void* src, int valid);
void cr_host_cp_commit(void);
void cr_host_cp_wait(int n);
#define __global__
#define __device__
#define __host__
// Every block's shared variables in one section, which the emulator fills with 0xff bytes
// (NaN floats) before each block, as a GPU leaves them undefined (GCC leaves a function
// template's static locals out of the section).
#define __shared__ static __attribute__((section("cr_shared")))
#define __constant__ static const
#define __forceinline__ inline
#define __syncthreads() cr_host_syncthreads()
#endif

// CR_SM80: compiling for compute capability 8.0 or newer (sm80.cu's module), where helpers
// such as cr_mma_s8_k32 take sm_80's instructions. The sm_75 module and the emulator leave it
// undefined.
#if defined(CR_DEVICE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CR_SM80 1
#endif

// CR_CP_ASYNC: copies from global to shared memory are asynchronous (cp.async, sm_80's), so a
// kernel gains from copying its next tile while it computes on this one; without them a copy
// is a load and a store, done on return, and a second buffer only takes shared memory that
// more blocks on an SM would use better. The sm_80 module defines it, and so does the
// emulator's build of that module (CR_EMU_SM80, internal/fakecuda), whose copies land as its
// schedule says, as late or as early as a GPU may land them.
#if defined(CR_SM80) || (defined(CR_HOST) && defined(CR_EMU_SM80))
#define CR_CP_ASYNC 1
#endif

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// CR_FN marks the helpers: device functions, inlined.
#define CR_FN static __device__ __forceinline__

#define CR_WARP 32
#define CR_FULL_MASK 0xffffffffu

// ---- bit casts ----

CR_FN float cr_as_f(u32 u) {
#if defined(CR_NVCC)
	return __uint_as_float(u);
#else
	union {
		u32 u;
		float f;
	} c;
	c.u = u;
	return c.f;
#endif
}

CR_FN u32 cr_f_bits(float f) {
#if defined(CR_NVCC)
	return __float_as_uint(f);
#else
	union {
		u32 u;
		float f;
	} c;
	c.f = f;
	return c.u;
#endif
}

CR_FN double cr_as_d(u64 u) {
#if defined(CR_NVCC)
	return __longlong_as_double((long long)u);
#else
	union {
		u64 u;
		double d;
	} c;
	c.u = u;
	return c.d;
#endif
}

CR_FN u64 cr_d_bits(double d) {
#if defined(CR_NVCC)
	return (u64)__double_as_longlong(d);
#else
	union {
		u64 u;
		double d;
	} c;
	c.d = d;
	return c.u;
#endif
}

// ---- warp shuffles (all 32 lanes of the warp must take part) ----

CR_FN u32 cr_shfl_xor_u32(u32 v, int m) {
#if defined(CR_NVCC)
	return __shfl_xor_sync(CR_FULL_MASK, v, m);
#elif defined(CR_CLANG)
	return (u32)__nvvm_shfl_sync_bfly_i32(CR_FULL_MASK, (int)v, m, 0x1f);
#else
	return cr_host_shfl_xor(v, m);
#endif
}

CR_FN float cr_shfl_xor(float v, int m) { return cr_as_f(cr_shfl_xor_u32(cr_f_bits(v), m)); }

CR_FN double cr_shfl_xor_d(double v, int m) {
	u64 b = cr_d_bits(v);
	u32 lo = cr_shfl_xor_u32((u32)b, m), hi = cr_shfl_xor_u32((u32)(b >> 32), m);
	return cr_as_d((u64)hi << 32 | lo);
}

#if defined(CR_HOST)
// The emulator's warp reductions gather the warp's values once and run, for this lane, the
// butterfly of the device's shuffles: v[j] holds lane (l ^ j)'s value, and at each step a
// lane's value becomes op(its own, lane (l ^ j ^ m)'s), as on the GPU.
template <typename T, typename Op> CR_FN T cr_host_butterfly(T* v, Op op) {
	for (int m = 16; m > 0; m >>= 1)
		for (int j = 0; j < m; j++)
			v[j] = op(v[j], v[j + m]);
	return v[0];
}
// cr_host_warp_reduce reduces a 4-byte value (a float, an int) over the warp.
template <typename T, typename Op> CR_FN T cr_host_warp_reduce(T x, Op op) {
	static_assert(sizeof(T) == sizeof(u32), "a warp exchange moves 4-byte registers");
	u32 b;
	memcpy(&b, &x, sizeof b);
	const u32* all = cr_host_warp_gather(&b, 1);
	const int l = threadIdx.x % CR_WARP;
	T v[CR_WARP];
	for (int j = 0; j < CR_WARP; j++)
		memcpy(&v[j], &all[l ^ j], sizeof b);
	return cr_host_butterfly(v, op);
}
#endif

// cr_warp_sum returns the sum of v over the warp to every lane (butterfly order).
CR_FN float cr_warp_sum(float v) {
#if defined(CR_HOST)
	return cr_host_warp_reduce(v, [](float a, float o) { return a + o; });
#else
	for (int m = 16; m > 0; m >>= 1)
		v += cr_shfl_xor(v, m);
	return v;
#endif
}

CR_FN double cr_warp_sum_d(double v) {
#if defined(CR_HOST)
	const u64 b = cr_d_bits(v);
	const u32 lh[2] = {(u32)b, (u32)(b >> 32)};
	const u32* all = cr_host_warp_gather(lh, 2);
	const int l = threadIdx.x % CR_WARP;
	double x[CR_WARP];
	for (int j = 0; j < CR_WARP; j++)
		x[j] = cr_as_d((u64)all[2 * (l ^ j) + 1] << 32 | all[2 * (l ^ j)]);
	return cr_host_butterfly(x, [](double a, double o) { return a + o; });
#else
	for (int m = 16; m > 0; m >>= 1)
		v += cr_shfl_xor_d(v, m);
	return v;
#endif
}

CR_FN float cr_warp_max(float v) {
#if defined(CR_HOST)
	return cr_host_warp_reduce(v, [](float a, float o) { return o > a ? o : a; });
#else
	for (int m = 16; m > 0; m >>= 1) {
		float o = cr_shfl_xor(v, m);
		v = o > v ? o : v;
	}
	return v;
#endif
}

// cr_ballot returns the warp's predicates p as bits, lane l's at bit l, to every lane (all 32
// lanes take part; a one-dimensional block, so that a lane is threadIdx.x % 32).
CR_FN u32 cr_ballot(int p) {
	u32 b = p ? 1u << (threadIdx.x % CR_WARP) : 0u;
#if defined(CR_HOST)
	return cr_host_warp_reduce(b, [](u32 a, u32 o) { return a | o; });
#else
	for (int m = 16; m > 0; m >>= 1)
		b |= cr_shfl_xor_u32(b, m);
	return b;
#endif
}

// cr_popc is the number of bits set in v.
CR_FN int cr_popc(u32 v) {
#if defined(CR_NVCC)
	return __popc(v);
#else
	return __builtin_popcount(v);
#endif
}

// ---- byte permute: result byte i = byte (s >> 4i) & 7 of the 8 bytes {y:x} (x = bytes 0-3).
// Callers keep bit 3 of every selector nibble clear (no sign replication).

CR_FN u32 cr_prmt(u32 x, u32 y, u32 s) {
#if defined(CR_NVCC)
	return __byte_perm(x, y, s);
#elif defined(CR_CLANG)
	return (u32)__nvvm_prmt((int)x, (int)y, (int)s);
#else
	u64 v = (u64)y << 32 | x;
	u32 r = 0;
	for (int i = 0; i < 4; i++)
		r |= (u32)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
	return r;
#endif
}

// cr_byte_f returns 2^23 + byte k of w, exactly, as a float (0x4B0000bb): subtracting
// 8388608.0f (or 8388608.0f + an offset) gives the byte as an exact integer-valued float
// without an integer-to-float conversion, which has a quarter of the FMA throughput.
#define CR_MAGIC 8388608.0f
CR_FN float cr_byte_f(u32 w, int k) { return cr_as_f(cr_prmt(w, 0x4B000000u, 0x7650u | (u32)k)); }

// ---- float arithmetic with one rounding and no contraction (where the reference rounds each
// step, as the CPU device does) ----
// With clang the product and the sum are inline PTX: LLVM turns __nvvm_mul_rn_f and
// __nvvm_add_rn_f into plain fmul and fadd and then contracts them into fma.rn, which rounds
// once where the CPU rounds twice (an H200 found scale_add_f32 and the combines 1 ulp off).
// ptxas never fuses a mul or add that names its rounding.

CR_FN float cr_fmul(float a, float b) {
#if defined(CR_NVCC)
	return __fmul_rn(a, b);
#elif defined(CR_CLANG)
	float r;
	asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
	return r;
#else
	return a * b;
#endif
}

CR_FN float cr_fadd(float a, float b) {
#if defined(CR_NVCC)
	return __fadd_rn(a, b);
#elif defined(CR_CLANG)
	float r;
	asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
	return r;
#else
	return a + b;
#endif
}

CR_FN float cr_fdiv(float a, float b) {
#if defined(CR_NVCC)
	return __fdiv_rn(a, b);
#elif defined(CR_CLANG)
	return __nvvm_div_rn_f(a, b);
#else
	return a / b;
#endif
}

CR_FN float cr_fsqrt(float a) {
#if defined(CR_NVCC)
	return __fsqrt_rn(a);
#elif defined(CR_CLANG)
	return __nvvm_sqrt_rn_f(a);
#else
	return sqrtf(a);
#endif
}

CR_FN float cr_fma(float a, float b, float c) {
#if defined(CR_NVCC)
	return __fmaf_rn(a, b, c);
#elif defined(CR_CLANG)
	return __nvvm_fma_rn_f(a, b, c);
#else
	return fmaf(a, b, c);
#endif
}

CR_FN double cr_dfma(double a, double b, double c) {
#if defined(CR_NVCC)
	return __fma_rn(a, b, c);
#elif defined(CR_CLANG)
	return __nvvm_fma_rn_d(a, b, c);
#else
	return fma(a, b, c);
#endif
}

CR_FN double cr_dmul(double a, double b) {
#if defined(CR_NVCC)
	return __dmul_rn(a, b);
#elif defined(CR_CLANG)
	double r;
	asm("mul.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b));
	return r;
#else
	return a * b;
#endif
}

CR_FN double cr_dadd(double a, double b) {
#if defined(CR_NVCC)
	return __dadd_rn(a, b);
#elif defined(CR_CLANG)
	double r;
	asm("add.rn.f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b));
	return r;
#else
	return a + b;
#endif
}

CR_FN float cr_fabs(float a) { return cr_as_f(cr_f_bits(a) & 0x7fffffffu); }
CR_FN float cr_inf(void) { return cr_as_f(0x7f800000u); }

#if defined(CR_HOST)
// cr_host_mma_s8 is cr_mma_s8 on a warp's gathered registers (all: n a lane): A's in register
// ia, B's in ib.
CR_FN void cr_host_mma_s8(const u32* all, int n, int ia, int ib, int* c) {
	const int l = threadIdx.x % CR_WARP, r = 4 * (l / 4), n0 = 4 * (2 * (l % 4));
	for (int k = 0; k < 16; k++) {
		const int sh = 8 * (k % 4);
		const int av = (signed char)(all[n * (r + k / 4) + ia] >> sh);
		c[0] += av * (signed char)(all[n * (n0 + k / 4) + ib] >> sh);
		c[1] += av * (signed char)(all[n * (n0 + 4 + k / 4) + ib] >> sh);
	}
}
#endif

// cr_mma_s8 adds to c the 8 x 8 product of an 8 x 16 matrix A by a 16 x 8 matrix B of signed
// bytes, in int32 (mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32: the tensor cores, sm_75 and
// newer, PTX ISA 6.5). Every lane of the warp takes part: lane l holds in a row l/4 of A,
// columns 4(l%4) .. 4(l%4)+3 (a byte each, the first lowest), in b column l/4 of B, rows
// 4(l%4) .. 4(l%4)+3, and in c[0], c[1] row l/4 of the product, columns 2(l%4) and 2(l%4)+1.
// The emulator gathers the warp's A and B registers in one step. (Plain asm, not
// volatile: the product has no side effect, so the compiler may schedule loads around it.)
CR_FN void cr_mma_s8(u32 a, u32 b, int* c) {
#if defined(CR_DEVICE)
	asm("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0, %1}, {%2}, {%3}, {%0, %1};"
	    : "+r"(c[0]), "+r"(c[1])
	    : "r"(a), "r"(b));
#else
	const u32 v[2] = {a, b};
	const u32* all = cr_host_warp_gather(v, 2);
	cr_host_mma_s8(all, 2, 0, 1, c);
#endif
}

// cr_mma_s8_k32 adds to c the 16 x 8 product of a 16 x 32 matrix A by a 32 x 8 matrix B of
// signed bytes (mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32). Its fragments are four of
// cr_mma_s8's: lane l holds in a[0] and a[1] rows l/4 and l/4+8 of A at columns 4(l%4) ..
// 4(l%4)+3, in a[2] and a[3] the same rows at columns 16+4(l%4) ..; in b[0] and b[1] column l/4
// of B at rows 4(l%4) .. and 16+4(l%4) ..; in c[0], c[1] row l/4 of the product at columns
// 2(l%4), 2(l%4)+1, in c[2], c[3] row l/4+8. The instruction is sm_80's (PTX ISA 7.0): the
// module built for compute capability 8.0 (sm80.cu) runs it; before sm_80, and in the
// emulator, it is those four m8n8k16 products (integer sums: the same values either way).
CR_FN void cr_mma_s8_k32(const u32* a, const u32* b, int* c) {
#if defined(CR_SM80)
	asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
	    : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CR_DEVICE)
	cr_mma_s8(a[0], b[0], c);
	cr_mma_s8(a[1], b[0], c + 2);
	cr_mma_s8(a[2], b[1], c);
	cr_mma_s8(a[3], b[1], c + 2);
#else
	const u32 v[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
	const u32* all = cr_host_warp_gather(v, 6);
	cr_host_mma_s8(all, 6, 0, 4, c);
	cr_host_mma_s8(all, 6, 1, 4, c + 2);
	cr_host_mma_s8(all, 6, 2, 5, c);
	cr_host_mma_s8(all, 6, 3, 5, c + 2);
#endif
}

// cr_mma_s8_k16 is cr_mma_s8_k32's first half, a 16 x 16 A (a[0], a[1]) by a 16 x 8 B (b):
// mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 on sm_80, two m8n8k16 before.
CR_FN void cr_mma_s8_k16(const u32* a, u32 b, int* c) {
#if defined(CR_SM80)
	asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
	    : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(b));
#elif defined(CR_DEVICE)
	cr_mma_s8(a[0], b, c);
	cr_mma_s8(a[1], b, c + 2);
#else
	const u32 v[3] = {a[0], a[1], b};
	const u32* all = cr_host_warp_gather(v, 3);
	cr_host_mma_s8(all, 3, 0, 2, c);
	cr_host_mma_s8(all, 3, 1, 2, c + 2);
#endif
}

// cr_dp4a adds the four products of a's and b's signed bytes to c (dp4a, sm_61 and newer).
CR_FN int cr_dp4a(int a, int b, int c) {
#if defined(CR_NVCC)
	return __dp4a(a, b, c);
#elif defined(CR_CLANG)
	int r;
	asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
	return r;
#else
	for (int k = 0; k < 4; k++)
		c += (int)(signed char)(a >> (8 * k)) * (int)(signed char)(b >> (8 * k));
	return c;
#endif
}

// ---- half and bfloat16 ----

// cr_h2f widens an IEEE half (every half is exact in float32). On the device it is PTX's
// cvt.f32.f16; the host version is the same function in bits (Go: quant.FP16ToFP32).
CR_FN float cr_h2f(u16 h) {
#if defined(CR_DEVICE)
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
#else
	u32 sign = (u32)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	if (e == 0x1f)
		return cr_as_f(sign | 0x7f800000u | (m ? 0x400000u | m << 13 : 0));
	if (e != 0)
		return cr_as_f(sign | (e + 112) << 23 | m << 13);
	float v = (float)m * (1.0f / 16777216.0f);
	return sign ? -v : v;
#endif
}

// cr_f2h rounds a float to the nearest half, ties to even, overflowing to infinity (Go:
// quant.FP32ToFP16; NaN payloads may differ).
CR_FN u16 cr_f2h(float f) {
#if defined(CR_DEVICE)
	u16 h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
	return h;
#else
	u32 b = cr_f_bits(f), sign = (b >> 16) & 0x8000u, mant = b & 0x7fffffu;
	int exp = (int)((b >> 23) & 0xff);
	if (exp == 0xff)
		return (u16)(sign | 0x7c00u | (mant ? 0x200u | mant >> 13 : 0));
	int e = exp - 127;
	if (e > 15)
		return (u16)(sign | 0x7c00u);
	if (e >= -14) {
		u32 h = (u32)(e + 15) << 10 | mant >> 13, rest = mant & 0x1fffu;
		if (rest > 0x1000u || (rest == 0x1000u && (h & 1)))
			h++;
		return (u16)(sign | h);
	}
	if (exp == 0)
		return (u16)sign;
	u32 m = mant | 0x800000u, shift = (u32)(-e - 1);
	if (shift > 24)
		return (u16)sign;
	u32 h = m >> shift, rest = m & ((1u << shift) - 1), hw = 1u << (shift - 1);
	if (rest > hw || (rest == hw && (h & 1)))
		h++;
	return (u16)(sign | h);
#endif
}

// cr_round_h rounds a float to the nearest half and back.
CR_FN float cr_round_h(float f) { return cr_h2f(cr_f2h(f)); }

CR_FN float cr_bf2f(u16 h) { return cr_as_f((u32)h << 16); }

// cr_pack_h2 rounds two floats to halves, lo in the low 16 bits (an .f16x2 register).
CR_FN u32 cr_pack_h2(float lo, float hi) { return (u32)cr_f2h(lo) | (u32)cr_f2h(hi) << 16; }

#if defined(CR_HOST)
// cr_host_mma_f16 is cr_mma_f16_k8 on a warp's gathered registers (all: n a lane): A's rows g
// and g+8 in registers ia0 and ia1, B's in ib.
CR_FN void cr_host_mma_f16(const u32* all, int n, int ia0, int ia1, int ib, float* c) {
	const int l = threadIdx.x % CR_WARP, r = 4 * (l / 4), n0 = 4 * (2 * (l % 4));
	for (int k = 0; k < 8; k++) {
		const int j = k / 2, sh = 16 * (k % 2);
		const float x0 = cr_h2f((u16)(all[n * (r + j) + ia0] >> sh)), x1 = cr_h2f((u16)(all[n * (r + j) + ia1] >> sh));
		const float y0 = cr_h2f((u16)(all[n * (n0 + j) + ib] >> sh)), y1 = cr_h2f((u16)(all[n * (n0 + 4 + j) + ib] >> sh));
		c[0] += x0 * y0;
		c[1] += x0 * y1;
		c[2] += x1 * y0;
		c[3] += x1 * y1;
	}
}
#endif

// cr_mma_f16_k8 adds to c the 16 x 8 product of a 16 x 8 matrix A by an 8 x 8 matrix B of
// halves, in float32 (mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32: the tensor cores, sm_75
// and newer, PTX ISA 6.5). Lane l, with g = l/4 and t = l%4, holds in a[0] row g of A at
// columns 2t and 2t+1 (the first in the low half), in a[1] row g+8 at the same columns; in b
// column g of B at rows 2t and 2t+1; in c[0], c[1] row g of the product at columns 2t, 2t+1,
// in c[2], c[3] row g+8. The products of halves are exact in float32; the hardware's order and
// rounding of their sum is its own, so results agree with a float32 sum to rounding, not bit
// for bit. The emulator gathers the warp's registers in one step and adds the products in k's
// order.
CR_FN void cr_mma_f16_k8(const u32* a, u32 b, float* c) {
#if defined(CR_DEVICE)
	asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(b));
#else
	const u32 v[3] = {a[0], a[1], b};
	const u32* all = cr_host_warp_gather(v, 3);
	cr_host_mma_f16(all, 3, 0, 1, 2, c);
#endif
}

// cr_mma_f16_k16 adds to c the 16 x 8 product of a 16 x 16 A by a 16 x 8 B of halves
// (mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, sm_80's): a[0], a[1] as cr_mma_f16_k8's
// (columns 0..7), a[2], a[3] the same rows at columns 8..15; b[0] rows 2t, 2t+1 of column g,
// b[1] rows 8+2t, 9+2t. Before sm_80, and in the emulator, two m16n8k8.
CR_FN void cr_mma_f16_k16(const u32* a, const u32* b, float* c) {
#if defined(CR_SM80)
	asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(CR_DEVICE)
	cr_mma_f16_k8(a, b[0], c);
	cr_mma_f16_k8(a + 2, b[1], c);
#else
	const u32 v[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
	const u32* all = cr_host_warp_gather(v, 6);
	cr_host_mma_f16(all, 6, 0, 1, 4, c);
	cr_host_mma_f16(all, 6, 2, 3, 5, c);
#endif
}

// ---- KV caches ----

// cr_kv_row returns the cache row of position p: p % ring in a sliding window's ring
// (device.KVLayer.Ring), p where ring is 0. The division is in int, not i64: the attention
// kernels take it for every position they read.
CR_FN i64 cr_kv_row(int p, int ring) { return ring > 0 ? p % ring : p; }

// ---- loads ----
// cr_ldg_* read global memory through the read-only (non-coherent) path: only for data no
// thread writes during the kernel. The pointer must be aligned to the access size: a GPU
// faults on a misaligned one (CUDA_ERROR_MISALIGNED_ADDRESS), and so does the emulator.

#if defined(CR_HOST)
#define CR_ALIGNED(p, n)                                                                            \
	do {                                                                                            \
		if ((u64)(p) % (n) != 0)                                                                    \
			cr_host_fault("a " #n "-byte global load from an address not aligned to " #n " bytes"); \
	} while (0)
#endif

struct cr_u4 {
	u32 x, y, z, w;
};
struct cr_f4 {
	float x, y, z, w;
};
struct cr_u2 {
	u32 x, y;
};

CR_FN cr_u2 cr_ldg_u2(const void* p) {
	cr_u2 r;
#if defined(CR_DEVICE)
	asm("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
#else
	CR_ALIGNED(p, 8);
	memcpy(&r, p, 8);
#endif
	return r;
}

CR_FN cr_u4 cr_ldg_u4(const void* p) {
	cr_u4 r;
#if defined(CR_DEVICE)
	asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#else
	CR_ALIGNED(p, 16);
	memcpy(&r, p, 16);
#endif
	return r;
}

// cr_opaque_zero returns 0 where the compiler cannot see it. A loop that offsets its shared
// tiles by it computes its lanes' addresses in them each round: where a tile lies at a fixed
// address (one buffer, not two taken in turn), LLVM hoists every address a loop reads out of
// it, 64 bits each, and holds them in registers across the loop (flash.cu's single-buffered
// kernels took 31-55 more registers a thread, and an SM one block fewer).
CR_FN int cr_opaque_zero(void) {
	int z = 0;
#if defined(CR_DEVICE)
	asm volatile("" : "+r"(z));
#endif
	return z;
}

// cr_cp_async16 copies 16 bytes from global memory at src to shared memory at dst (both
// 16-byte aligned), or writes 16 zero bytes when valid is 0 (src is then not read). Where
// CR_CP_ASYNC is defined it is cp.async.cg: the copy goes through the L2 to shared memory
// without a register and lands by a later cr_cp_async_wait, so a block loads its next tile
// while it computes on this one (the emulator lands it at a moment of its schedule's choosing
// up to that wait). Otherwise it is a load and a store, done on return.
CR_FN void cr_cp_async16(void* dst, const void* src, int valid) {
#if defined(CR_SM80)
	asm volatile("{\n\t.reg .u64 s;\n\tcvta.to.shared.u64 s, %0;\n\tcp.async.cg.shared.global [s], [%1], 16, %2;\n\t}" ::"l"(dst), "l"(src),
	             "r"(valid ? 16 : 0)
	             : "memory");
#elif defined(CR_CP_ASYNC)
	if (valid)
		CR_ALIGNED(src, 16);
	cr_host_cp_async16(dst, src, valid);
#else
	cr_u4 w = {0, 0, 0, 0};
	if (valid)
		w = cr_ldg_u4(src);
	u32* d = (u32*)dst;
	d[0] = w.x, d[1] = w.y, d[2] = w.z, d[3] = w.w;
#endif
}

// cr_cp_async_commit closes the group of the thread's cr_cp_async16 copies issued since the
// last; cr_cp_async_wait<N> waits until no more than the latest N groups are still in flight.
// (No operation without CR_CP_ASYNC, where copies are done on return.) A block reads the
// copies of its other threads only after a __syncthreads that follows the wait.
CR_FN void cr_cp_async_commit(void) {
#if defined(CR_SM80)
	asm volatile("cp.async.commit_group;" ::: "memory");
#elif defined(CR_CP_ASYNC)
	cr_host_cp_commit();
#endif
}

template <int N> CR_FN void cr_cp_async_wait(void) {
#if defined(CR_SM80)
	asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#elif defined(CR_CP_ASYNC)
	cr_host_cp_wait(N);
#endif
}

CR_FN cr_f4 cr_ldg_f4(const float* p) {
	cr_f4 r;
#if defined(CR_DEVICE)
	asm("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p));
#else
	CR_ALIGNED(p, 16);
	memcpy(&r, p, 16);
#endif
	return r;
}

CR_FN float cr_ldg_f(const float* p) {
#if defined(CR_DEVICE)
	float r;
	asm("ld.global.nc.f32 %0, [%1];" : "=f"(r) : "l"(p));
	return r;
#else
	CR_ALIGNED(p, 4);
	return *p;
#endif
}

CR_FN u32 cr_ldg_u32(const void* p) {
	u32 r;
#if defined(CR_DEVICE)
	asm("ld.global.nc.u32 %0, [%1];" : "=r"(r) : "l"(p));
#else
	CR_ALIGNED(p, 4);
	memcpy(&r, p, 4);
#endif
	return r;
}

CR_FN u16 cr_ldg_u16(const void* p) {
	u16 r;
#if defined(CR_DEVICE)
	asm("ld.global.nc.u16 %0, [%1];" : "=h"(r) : "l"(p));
#else
	CR_ALIGNED(p, 2);
	memcpy(&r, p, 2);
#endif
	return r;
}

CR_FN u32 cr_ldg_u8(const void* p) {
#if defined(CR_DEVICE)
	u16 r;
	asm("ld.global.nc.u8 %0, [%1];" : "=h"(r) : "l"(p));
	return r;
#else
	return *(const u8*)p;
#endif
}

// ---- blocks that meet: the last of a group of blocks to finish does what needs all of theirs ----

// cr_fence_gpu orders the calling thread's writes to global memory before its later ones, as
// every thread of the device sees them (membar.gl).
CR_FN void cr_fence_gpu(void) {
#if defined(CR_DEVICE)
	asm volatile("membar.gl;" ::: "memory");
#else
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// cr_atomic_inc returns *p and adds 1 to it, atomically for the whole device.
CR_FN u32 cr_atomic_inc(u32* p) {
	u32 r;
#if defined(CR_DEVICE)
	asm volatile("atom.global.add.u32 %0, [%1], 1;" : "=r"(r) : "l"(p) : "memory");
#else
	CR_ALIGNED(p, 4);
	r = __atomic_fetch_add(p, 1u, __ATOMIC_SEQ_CST);
#endif
	return r;
}

// cr_ld_cg reads a float that another block of the same launch wrote (before a cr_fence_gpu
// and the counter that says it has): from the L2, past this SM's L1, which the device keeps
// coherent only between launches.
CR_FN float cr_ld_cg(const float* p) {
#if defined(CR_DEVICE)
	float r;
	asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(r) : "l"(p) : "memory");
	return r;
#else
	CR_ALIGNED(p, 4);
	return *(const volatile float*)p;
#endif
}

// cr_ldg_words reads N consecutive little-endian u32 words from p, of any alignment (the
// 2-byte-aligned layouts, MXFP4's 17-byte blocks), with aligned 4-byte loads (a quarter as many
// load instructions as byte loads), realigned with byte permutes. When p is not 4-byte
// aligned it reads up to 3 bytes before p and after p + 4N, which lie in the aligned words
// holding p's and the last byte, so in the same allocation.
template <int N> CR_FN void cr_ldg_words(const u8* p, u32* w) {
	const u8* a = (const u8*)((u64)p & ~(u64)3);
	const u32 r = (u32)((u64)p & 3), sel = 0x3210u + r * 0x1111u;
	u32 lo = cr_ldg_u32(a);
#pragma unroll
	for (int i = 0; i < N; i++) {
		u32 hi = (i + 1 < N || r) ? cr_ldg_u32(a + 4 * (i + 1)) : 0u;
		w[i] = cr_prmt(lo, hi, sel);
		lo = hi;
	}
}

// Plain little-endian reads of any alignment, for code that is not on a hot path.
CR_FN u32 cr_rd_u8(const u8* p) { return p[0]; }
CR_FN u32 cr_rd_u16(const u8* p) { return (u32)p[0] | (u32)p[1] << 8; }
CR_FN u32 cr_rd_u32(const u8* p) { return (u32)p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24; }
CR_FN float cr_rd_h(const u8* p) { return cr_h2f((u16)cr_rd_u16(p)); }

// ---- exponentials ----

// cr_exp_v is ggml_v_expf (llama.cpp's AVX-512 exp; Go: models.expAVX512) operation for
// operation: a range reduction to 2^n * e^b and a degree-5 polynomial, 0 or +Inf outside about
// [-104, 88]. The CPU reference uses it in softmax and SwiGLU.
CR_FN float cr_exp_v(float x) {
	const float r = 12582912.0f; // 0x1.8p23
	float z = cr_fma(x, 1.44269502f, r);
	float n = cr_fadd(z, -r);
	float b = cr_fma(-n, 1.42860677e-06f, cr_fma(-n, 0.693145752f, x));
	float u = cr_fmul(b, b);
	float j = cr_fma(cr_fma(cr_fma(0.00824739039f, b, 0.0418997668f), u, cr_fma(0.166683957f, b, 0.499991268f)), u,
	                 cr_fma(0.999999404f, b, 1.0f));
	if (cr_fabs(n) > 192.0f)
		return n <= 0.0f ? 0.0f : cr_inf();
	if (n != n)
		return n;
	int k = (int)n;
	if (k >= -125 && k <= 127)
		return cr_fmul(j, cr_as_f((u32)(k + 127) << 23)); // exact scaling, one rounding
	// scalef near the ends of the range: j * 2^k exact in double, rounded once.
	return (float)cr_dmul((double)j, cr_as_d((u64)(k + 1023) << 52));
}

// __exp2f_data.tab of glibc / Arm optimized-routines (2^(i/32) with the index folded in).
__constant__ u64 cr_exp2f_tab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

// cr_expf is glibc's expf (FMA variant; Go: models.expf), computed in double: the CPU
// reference's scalar exp (sigmoid gating, softmax tails).
CR_FN float cr_expf(float x) {
	u32 ax = (cr_f_bits(x) >> 20) & 0x7ffu;
	if (ax >= 0x42bu) { // |x| >= 88, Inf or NaN
		if (cr_f_bits(x) == 0xff800000u)
			return 0.0f;
		if (ax >= 0x7f8u)
			return x + x;
		if (x > 88.7228317f)
			return cr_inf();
		if (x < -103.972076f)
			return 0.0f;
		if (x < -103.278923f)
			return 1.40129846e-45f;
	}
	const double inv_ln2_n = cr_as_d(0x40471547652b82feull); // 0x1.71547652b82fep+5
	const double shift = cr_as_d(0x4338000000000000ull);     // 0x1.8p+52
	double xd = (double)x;
	double kd = cr_dfma(inv_ln2_n, xd, shift);
	u64 ki = cr_d_bits(kd);
	kd = cr_dadd(kd, -shift);
	double r = cr_dfma(inv_ln2_n, xd, -kd);
	u64 t = cr_exp2f_tab[ki % 32] + (ki << 47);
	double s = cr_as_d(t);
	double z = cr_dfma(r, cr_as_d(0x3ebc6af84b912394ull), cr_as_d(0x3f2ebfce50fac4f3ull));
	double r2 = cr_dmul(r, r);
	double y = cr_dfma(r, cr_as_d(0x3f962e42ff0c52d6ull), 1.0);
	y = cr_dfma(z, r2, y);
	return (float)cr_dmul(y, s);
}

// cr_hsum16 adds 16 values in the order of _mm512_reduce_add_ps (Go: quant.HSum16).
CR_FN float cr_hsum16(const float* a) {
	float t[8];
#pragma unroll
	for (int i = 0; i < 8; i++)
		t[i] = cr_fadd(a[i + 8], a[i]);
	float u0 = cr_fadd(t[4], t[0]), u1 = cr_fadd(t[5], t[1]), u2 = cr_fadd(t[6], t[2]), u3 = cr_fadd(t[7], t[3]);
	return cr_fadd(cr_fadd(u0, u2), cr_fadd(u1, u3));
}

// ---- block-wide reductions (blockDim.x a multiple of 32, at most 1024, blockDim.y == 1;
// every thread of the block must call them) ----

CR_FN double cr_block_sum_d(double v, double* sh /* 32 doubles of shared memory */) {
	int lane = threadIdx.x % CR_WARP, warp = threadIdx.x / CR_WARP, nw = blockDim.x / CR_WARP;
	v = cr_warp_sum_d(v);
	__syncthreads(); // sh may still be read from an earlier call
	if (lane == 0)
		sh[warp] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.0;
	return cr_warp_sum_d(v);
}

CR_FN float cr_block_max(float v, float* sh /* 32 floats of shared memory */) {
	int lane = threadIdx.x % CR_WARP, warp = threadIdx.x / CR_WARP, nw = blockDim.x / CR_WARP;
	v = cr_warp_max(v);
	__syncthreads();
	if (lane == 0)
		sh[warp] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : -cr_inf();
	return cr_warp_max(v);
}

#endif // CR_COMMON_CUH
