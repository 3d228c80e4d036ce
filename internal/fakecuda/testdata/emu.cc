// The CUDA emulator of the fake driver: the project's real kernels (cuda/kernels/all.cu),
// compiled for the host, with every CUDA thread of a block run as a fiber on the calling
// thread. So a kernel launched through the fake driver runs the same source the GPU runs, and
// the engine's GPU path is tested, kernels included, on machines without a GPU.
//
// A block's fibers run until each finishes or waits: at __syncthreads the whole block must
// arrive (every thread that has not exited, and none may have exited), at a warp shuffle every
// lane of the warp. Blocks run one after another, so __shared__ variables (static locals
// here, see common.cuh) belong to the running block. A launch that deadlocks, shuffles with an
// exited lane or passes a barrier only part of the block reaches fails with
// CUDA_ERROR_LAUNCH_FAILED and a message on stderr, where a GPU would hang or be undefined.
//
// Launches are serialized: the kernels' static shared memory is one per process.
//
// Fibers switch with a few instructions of assembly on x86-64 (callee-saved registers and the
// stack pointer), and with swapcontext elsewhere, which is correct but makes two system calls
// per switch. They live on between blocks and launches, each parked where its kernel
// returned, and are made anew only after a failed launch.
//
// Built by fakecuda.Build with the kernels' directory on the include path and emu_table.inc,
// one EMU_KERNEL(name) line per kernel of the PTX module.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <mutex>
#include <utility>

#include "all.cu"

thread_local cr_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

enum State { RUNNABLE, AT_SYNC, AT_SHFL, DONE };

struct Fiber {
#if defined(__x86_64__)
	void* sp; // where it waits: its saved registers on its stack
#else
	ucontext_t ctx;
#endif
	bool started;
	State state;
	cr_dim3 idx;
	u32 val, result;
	int mask;
};

constexpr size_t kStack = 128 << 10; // kernels keep small arrays in registers, ~ a few KiB here
constexpr int kMaxThreads = 1024;

struct Launch {
	void (*run)(void**);
	void** params;
	Fiber* cur;
};

Launch* current;           // the launch in progress
Fiber fibers[kMaxThreads]; // the running block's threads
char* stacks;              // kMaxThreads stacks of kStack bytes, mapped once
std::mutex launch_mu;

void fiber_main();

#if defined(__x86_64__)
// emu_switch(save, sp) pushes the callee-saved registers, stores the stack pointer in *save,
// and resumes the context saved at sp.
extern "C" void emu_switch(void** save, void* sp);
asm(R"(
	.text
	.p2align 4
	.type emu_switch, @function
emu_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size emu_switch, .-emu_switch
)");

void* sched_sp;

void fiber_start(Fiber* f, char* stack) {
	// A frame emu_switch returns from into fiber_main, with the stack aligned as at a call.
	void** top = (void**)(stack + kStack);
	*--top = nullptr; // fiber_main's return address: it never returns
	*--top = (void*)fiber_main;
	for (int i = 0; i < 6; i++)
		*--top = nullptr;
	f->sp = top;
}
void to_fiber(Fiber* f) { emu_switch(&sched_sp, f->sp); }
void to_scheduler(Fiber* f) { emu_switch(&f->sp, sched_sp); }
#else
ucontext_t sched_ctx;

void fiber_start(Fiber* f, char* stack) {
	getcontext(&f->ctx);
	f->ctx.uc_stack.ss_sp = stack;
	f->ctx.uc_stack.ss_size = kStack;
	f->ctx.uc_link = nullptr; // fiber_main never returns
	makecontext(&f->ctx, fiber_main, 0);
}
void to_fiber(Fiber* f) { swapcontext(&sched_ctx, &f->ctx); }
void to_scheduler(Fiber* f) { swapcontext(&f->ctx, &sched_ctx); }
#endif

void yield(State s) {
	Fiber* f = current->cur;
	f->state = s;
	to_scheduler(f);
}

void fiber_main() {
	for (;;) {
		current->run(current->params);
		yield(DONE);
	}
}

// run_block runs one block to completion; it returns an error message or nullptr.
const char* run_block(int n) {
	for (int t = 0; t < n; t++) {
		Fiber& f = fibers[t];
		f.idx.x = t % blockDim.x;
		f.idx.y = t / blockDim.x % blockDim.y;
		f.idx.z = t / (blockDim.x * blockDim.y);
		f.state = RUNNABLE;
		if (!f.started) {
			fiber_start(&f, stacks + (size_t)t * kStack);
			f.started = true;
		}
	}
	for (;;) {
		for (int t = 0; t < n; t++) {
			if (fibers[t].state != RUNNABLE)
				continue;
			current->cur = &fibers[t];
			threadIdx = fibers[t].idx;
			to_fiber(&fibers[t]);
		}
		// Nothing runs now: release the warps whose lanes all wait at a shuffle, else the block
		// if all its threads wait at __syncthreads.
		bool released = false;
		int at_sync = 0, exited = 0;
		for (int w = 0; w < n; w += CR_WARP) {
			int end = w + CR_WARP < n ? w + CR_WARP : n, shfl = 0;
			for (int t = w; t < end; t++) {
				shfl += fibers[t].state == AT_SHFL;
				at_sync += fibers[t].state == AT_SYNC;
				exited += fibers[t].state == DONE;
			}
			if (shfl == 0)
				continue;
			if (shfl != end - w)
				return "a warp shuffle that not every lane of the warp reached";
			for (int t = w; t < end; t++) {
				int p = w + ((t - w) ^ fibers[t].mask);
				if (p >= end)
					return "a warp shuffle from a lane past the block's last thread";
				fibers[t].result = fibers[p].val;
			}
			for (int t = w; t < end; t++)
				fibers[t].state = RUNNABLE;
			released = true;
		}
		if (released)
			continue;
		if (exited == n)
			return nullptr;
		if (at_sync > 0 && exited > 0)
			return "__syncthreads reached by part of the block (the rest exited)";
		if (at_sync == n) {
			for (int t = 0; t < n; t++)
				fibers[t].state = RUNNABLE;
			continue;
		}
		return "deadlock: threads wait at different barriers";
	}
}

} // namespace

void cr_host_syncthreads(void) { yield(AT_SYNC); }

unsigned cr_host_shfl_xor(unsigned v, int lane_mask) {
	Fiber* f = current->cur;
	f->val = v;
	f->mask = lane_mask;
	yield(AT_SHFL);
	return f->result;
}

namespace {

template <typename F> struct Invoker;
template <typename... A> struct Invoker<void (*)(A...)> {
	template <void (*K)(A...), size_t... I> static void call(void** p, std::index_sequence<I...>) { K(*(A*)p[I]...); }
	template <void (*K)(A...)> static void run(void** p) { call<K>(p, std::index_sequence_for<A...>{}); }
};

struct Entry {
	const char* name;
	void (*run)(void**);
};

const Entry table[] = {
#define EMU_KERNEL(name) {#name, &Invoker<decltype(&name)>::run<&name>},
#include "emu_table.inc"
#undef EMU_KERNEL
};

} // namespace

// emu_find returns the kernel called name, or null.
extern "C" void* emu_find(const char* name) {
	for (const Entry& e : table)
		if (!strcmp(e.name, name))
			return (void*)&e;
	return nullptr;
}

// emu_launch runs kernel k (from emu_find) on a grid of blocks; it returns 0, or 719
// (CUDA_ERROR_LAUNCH_FAILED) after printing why.
extern "C" int emu_launch(void* k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          void** params) {
	const Entry* e = (const Entry*)k;
	int n = (int)(bx * by * bz);
	if (n <= 0 || n > kMaxThreads)
		return 1; // CUDA_ERROR_INVALID_VALUE
	std::lock_guard<std::mutex> lock(launch_mu);
	if (!stacks) {
		void* p = mmap(nullptr, (size_t)kMaxThreads * kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			return 2; // CUDA_ERROR_OUT_OF_MEMORY
		stacks = (char*)p;
	}
	Launch l{};
	l.run = e->run;
	l.params = params;
	current = &l;
	gridDim = cr_dim3{gx, gy, gz};
	blockDim = cr_dim3{bx, by, bz};
	for (unsigned z = 0; z < gz; z++)
		for (unsigned y = 0; y < gy; y++)
			for (unsigned x = 0; x < gx; x++) {
				blockIdx = cr_dim3{x, y, z};
				if (const char* err = run_block(n)) {
					fprintf(stderr, "fakecuda: kernel %s, block (%u,%u,%u) of (%u,%u,%u), %d threads: %s\n", e->name, x, y, z,
					        gx, gy, gz, n, err);
					for (Fiber& f : fibers) // stuck inside the kernel: start afresh next time
						f.started = false;
					current = nullptr;
					return 719;
				}
			}
	current = nullptr;
	return 0;
}
