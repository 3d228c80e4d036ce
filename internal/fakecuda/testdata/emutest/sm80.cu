// The kernels of the emulator's own test (emu_test.go) built as the sm_80 module is
// (CR_EMU_SM80), where common.cuh's cp.async copies are asynchronous: a double-buffered
// pipeline as flash.cu's, and the same with its wait or its closing barrier left out, which
// the emulator must make fail under some schedule.
#include "common.cuh"

#define CP_TILES 4

// cp_tiles copies CP_TILES tiles of 64 x 4 floats (src: tile i at 256i) through the two
// buffers t, the next while this one is read, and writes each thread's neighbour's row of a
// tile (another thread's copy) to out at 256i + 4 * thread. wait and end_sync keep the wait
// before the barrier and the barrier after the reads.
CR_FN void cp_tiles(float (*t)[64][4], const float* src, float* out, bool wait, bool end_sync) {
	const int tid = threadIdx.x, n = (tid + 1) % 64;
	cr_cp_async16(t[0][tid], src + 4 * tid, 1);
	cr_cp_async_commit();
	for (int i = 0; i < CP_TILES; i++) {
		if (i + 1 < CP_TILES)
			cr_cp_async16(t[(i + 1) % 2][tid], src + 256 * (i + 1) + 4 * tid, 1);
		cr_cp_async_commit();
		if (wait)
			cr_cp_async_wait<1>();
		__syncthreads();
		for (int j = 0; j < 4; j++)
			out[256 * i + 4 * tid + j] = t[i % 2][n][j];
		if (end_sync)
			__syncthreads();
	}
	cr_cp_async_wait<0>();
}

__global__ void cp_pipeline(const float* src, float* out) {
	__shared__ __attribute__((aligned(16))) float t[2][64][4];
	cp_tiles(t, src, out, true, true);
}
__global__ void cp_no_wait(const float* src, float* out) {
	__shared__ __attribute__((aligned(16))) float t[2][64][4];
	cp_tiles(t, src, out, false, true);
}
__global__ void cp_no_end_sync(const float* src, float* out) {
	__shared__ __attribute__((aligned(16))) float t[2][64][4];
	cp_tiles(t, src, out, true, false);
}

// cp_zeros copies nothing (valid 0): each thread's row of out is 4 zeros.
__global__ void cp_zeros(const float* src, float* out) {
	__shared__ __attribute__((aligned(16))) float t[64][4];
	cr_cp_async16(t[threadIdx.x], src, 0);
	cr_cp_async_commit();
	cr_cp_async_wait<0>();
	__syncthreads();
	for (int j = 0; j < 4; j++)
		out[4 * threadIdx.x + j] = t[(threadIdx.x + 1) % 64][j];
}

// cp_in_flight ends with its copy not waited for.
__global__ void cp_in_flight(const float* src, float* out) {
	__shared__ __attribute__((aligned(16))) float t[64][4];
	cr_cp_async16(t[threadIdx.x], src + 4 * threadIdx.x, 1);
	cr_cp_async_commit();
	out[threadIdx.x] = 0;
}
