// The kernels of the emulator's own test (emu_test.go), built with emu.cc in place of the
// project's kernels: warp collectives that every lane reaches, the ones a GPU would hang on or
// leave undefined, and common.cuh's tensor-core products with their fragments loaded as the
// PTX ISA lays them out (g = lane/4, t = lane%4).
#include "common.cuh"

__global__ void warp_sum(float* out) { out[threadIdx.x] = cr_warp_sum((float)threadIdx.x); }
__global__ void warp_sum_d(float* out) { out[threadIdx.x] = (float)cr_warp_sum_d((double)threadIdx.x); }
__global__ void warp_max(float* out) { out[threadIdx.x] = cr_warp_max((float)((threadIdx.x * 7) % 32)); }
__global__ void shfl_xor(float* out) { out[threadIdx.x] = cr_shfl_xor((float)threadIdx.x, 5); }

// The failures: half a warp at a collective, a warp at two different ones, a warp sum in a
// block of less than a warp, a barrier half the block reaches.
__global__ void warp_sum_half(float* out) {
	if (threadIdx.x % CR_WARP < 16)
		out[threadIdx.x] = cr_warp_sum(1.0f);
}
__global__ void shfl_half(float* out) {
	if (threadIdx.x % CR_WARP < 16)
		out[threadIdx.x] = cr_shfl_xor(1.0f, 1);
}
__global__ void sum_or_shfl(float* out) {
	out[threadIdx.x] = threadIdx.x % CR_WARP < 16 ? cr_warp_sum(1.0f) : cr_shfl_xor(1.0f, 1);
}
__global__ void sync_half(float* out) {
	if (threadIdx.x < 32)
		__syncthreads();
	out[threadIdx.x] = 1.0f;
}

// ld4 reads four consecutive bytes as a register, the first lowest.
static u32 ld4(const u8* p) { return (u32)p[0] | (u32)p[1] << 8 | (u32)p[2] << 16 | (u32)p[3] << 24; }
static u32 ld2h(const u16* p) { return (u32)p[0] | (u32)p[1] << 16; }

// The products: a is A (M x K, row-major), b is B column-major (N x K), c the M x N product
// (row-major), N = 8.
__global__ void mma_s8(const u8* a, const u8* b, int* c) { // m8n8k16
	const int g = threadIdx.x / 4, t = threadIdx.x % 4;
	int r[2] = {0, 0};
	cr_mma_s8(ld4(a + 16 * g + 4 * t), ld4(b + 16 * g + 4 * t), r);
	c[8 * g + 2 * t] = r[0];
	c[8 * g + 2 * t + 1] = r[1];
}
__global__ void mma_s8_k16(const u8* a, const u8* b, int* c) { // m16n8k16
	const int g = threadIdx.x / 4, t = threadIdx.x % 4;
	const u32 af[2] = {ld4(a + 16 * g + 4 * t), ld4(a + 16 * (g + 8) + 4 * t)};
	int r[4] = {0, 0, 0, 0};
	cr_mma_s8_k16(af, ld4(b + 16 * g + 4 * t), r);
	for (int i = 0; i < 4; i++)
		c[8 * (g + 8 * (i / 2)) + 2 * t + i % 2] = r[i];
}
__global__ void mma_s8_k32(const u8* a, const u8* b, int* c) { // m16n8k32
	const int g = threadIdx.x / 4, t = threadIdx.x % 4;
	const u32 af[4] = {ld4(a + 32 * g + 4 * t), ld4(a + 32 * (g + 8) + 4 * t), ld4(a + 32 * g + 16 + 4 * t),
	                   ld4(a + 32 * (g + 8) + 16 + 4 * t)};
	const u32 bf[2] = {ld4(b + 32 * g + 4 * t), ld4(b + 32 * g + 16 + 4 * t)};
	int r[4] = {0, 0, 0, 0};
	cr_mma_s8_k32(af, bf, r);
	for (int i = 0; i < 4; i++)
		c[8 * (g + 8 * (i / 2)) + 2 * t + i % 2] = r[i];
}
__global__ void mma_f16_k8(const u16* a, const u16* b, float* c) { // m16n8k8
	const int g = threadIdx.x / 4, t = threadIdx.x % 4;
	const u32 af[2] = {ld2h(a + 8 * g + 2 * t), ld2h(a + 8 * (g + 8) + 2 * t)};
	float r[4] = {0, 0, 0, 0};
	cr_mma_f16_k8(af, ld2h(b + 8 * g + 2 * t), r);
	for (int i = 0; i < 4; i++)
		c[8 * (g + 8 * (i / 2)) + 2 * t + i % 2] = r[i];
}
__global__ void mma_f16_k16(const u16* a, const u16* b, float* c) { // m16n8k16
	const int g = threadIdx.x / 4, t = threadIdx.x % 4;
	const u32 af[4] = {ld2h(a + 16 * g + 2 * t), ld2h(a + 16 * (g + 8) + 2 * t), ld2h(a + 16 * g + 8 + 2 * t),
	                   ld2h(a + 16 * (g + 8) + 8 + 2 * t)};
	const u32 bf[2] = {ld2h(b + 16 * g + 2 * t), ld2h(b + 16 * g + 8 + 2 * t)};
	float r[4] = {0, 0, 0, 0};
	cr_mma_f16_k16(af, bf, r);
	for (int i = 0; i < 4; i++)
		c[8 * (g + 8 * (i / 2)) + 2 * t + i % 2] = r[i];
}

// skew: two warps take turns with a shared row each. Every round each warp writes its row, a
// barrier, reads the other warp's row and sums it over the warp (a collective after the read),
// and, with end_sync, a barrier before the next round's write. Without it the warps still keep
// step through their collectives when they run in turns, so only a warp that runs ahead of the
// other writes its next row before the other has read it.
CR_FN void skew(float* out, bool end_sync) {
	__shared__ float row[2][CR_WARP];
	const int w = threadIdx.x / CR_WARP, l = threadIdx.x % CR_WARP;
	for (int r = 0; r < 4; r++) {
		row[w][l] = (float)(100 * r + threadIdx.x);
		__syncthreads();
		const float v = row[1 - w][l];
		out[64 * r + threadIdx.x] = cr_warp_sum(v);
		if (end_sync)
			__syncthreads();
	}
}
__global__ void skew_sync(float* out) { skew(out, true); }
__global__ void skew_no_sync(float* out) { skew(out, false); }

// tshared: a function template's __shared__ variable (which GCC leaves out of the section
// cr_shared): tshared_w writes it, tshared_r reads it without writing.
template <int N> CR_FN void tshared(float* out, bool write) {
	__shared__ float x[N];
	if (write)
		x[threadIdx.x] = 1.0f;
	else
		out[threadIdx.x] = x[threadIdx.x];
}
__global__ void tshared_w(float* out) { tshared<64>(out, true); }
__global__ void tshared_r(float* out) { tshared<64>(out, false); }
