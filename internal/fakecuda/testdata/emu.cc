// The CUDA emulator of the fake driver: the project's real kernels (cuda/kernels), compiled
// for the host (emu_kernels.cc: the base module's, and the sm_80 module's for a module whose
// .target is sm_80 or newer), with every CUDA thread of a block run as a fiber on the calling
// thread. So a kernel launched through the fake driver runs the same source the GPU runs, and
// the engine's GPU path is tested, kernels included, on machines without a GPU.
//
// A block's fibers run until each finishes or waits: at __syncthreads the whole block must
// arrive (every thread that has not exited, and none may have exited), at a warp shuffle every
// lane of the warp, and at a warp-wide exchange (cr_host_warp_gather: common.cuh's warp sums
// and tensor-core products on the host, one switch a lane where shuffles took one a value)
// every lane of a whole warp. Blocks run one after another, so __shared__ variables (static
// locals here, see common.cuh) belong to the running block. Before each block they are
// filled with 0xff bytes (NaN floats), since a GPU leaves a block's shared memory undefined,
// so that a kernel reading it before a barrier orders the write fails here too. (GCC ignores
// the section attribute that gathers them for the static locals of function templates: most
// of the tiles, about 1 MB. fakecuda.Build moves those to section cr_tshared, filled before
// each launch instead, since a megabyte a block would slow the tests down.) A launch that
// deadlocks, shuffles with an exited lane or passes a barrier only part of the block reaches
// fails with CUDA_ERROR_LAUNCH_FAILED and a message on stderr, where a GPU would hang or be
// undefined.
//
// Launches are serialized: the kernels' static shared memory is one per process.
//
// $FAKECUDA_SCHEDULE chooses the order threads and blocks run in: "forward" (the default: in
// index order), "reverse" (the reverse, and each warp, the last first, running as far as it
// can before the next: see run_block), or "shuffle:SEED" (a new random order at every round
// of a block, and a random order of the blocks). A GPU promises no order, so a kernel whose
// results change with it reads what another thread writes without a barrier between them, or
// relies on one block running before another; the tests run every kernel under all three.
//
// The sm_80 module's asynchronous copies (cp.async: common.cuh's cr_cp_async16, under
// CR_EMU_SM80) land as late as a GPU may land them, at the wait that covers their group, under
// "forward"; as early, when issued, under "reverse"; and each at one or the other under
// "shuffle". So a kernel that reads a tile before waiting for it, or copies into a buffer
// another warp may still be reading, gets wrong values under one of them. A thread that ends
// with copies not waited for faults.
//
// Fibers switch with a few instructions of assembly on x86-64 (callee-saved registers and the
// stack pointer), and with swapcontext elsewhere, which is correct but makes two system calls
// per switch. They live on between blocks and launches, each parked where its kernel
// returned, and are made anew only after a failed launch.
//
// Built by fakecuda.Build with the kernels' directory on the include path, into one library
// with emu_kernels.cc's tables.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <mutex>
#include <utility>
#include <vector>

#include "common.cuh"
#include "emu.h"

thread_local cr_dim3 threadIdx, blockIdx, blockDim, gridDim;

// The kernels' __shared__ variables, which common.cuh places in section cr_shared: the linker
// marks its bounds.
extern "C" char __start_cr_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_cr_shared[] __attribute__((weak, visibility("hidden")));
// The __shared__ variables of function templates, built with GCC (see the opening comment).
extern "C" char __start_cr_tshared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_cr_tshared[] __attribute__((weak, visibility("hidden")));

namespace {

constexpr size_t kStack = 128 << 10; // kernels keep small arrays in registers, ~ a few KiB here
constexpr int kMaxThreads = 1024;
constexpr int kMaxGather = 16; // values a lane gives a warp-wide exchange
constexpr int kMaxCopies = 32; // a thread's cp.async copies in flight

enum State { RUNNABLE, AT_SYNC, AT_SHFL, AT_GATHER, DONE, FAULTED };

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
	// At a gather (cr_host_warp_gather): the lane's gn values.
	const u32* gv;
	int gn;
	// Its cp.async copies not yet landed, each with its group (group: the open one; those
	// before it are committed).
	struct Copy {
		void* dst;
		const void* src; // null: zeros
		int group;
	} copies[kMaxCopies];
	int ncopies, group;
};

struct Launch {
	void (*run)(void**);
	void** params;
	Fiber* cur;
	const char* fault; // why a thread faulted (cr_host_fault), or nullptr
};

enum Order { FORWARD, REVERSE, SHUFFLE };

struct Schedule {
	Order order;
	uint64_t seed, rng; // SHUFFLE's seed and xorshift64* state (never 0)
	int perm[kMaxThreads];
	int first[kMaxThreads]; // the order the last block's threads first ran in
	int nfirst;

	uint64_t next() {
		rng ^= rng >> 12;
		rng ^= rng << 25;
		rng ^= rng >> 27;
		return rng * 2685821657736338717ull;
	}
	// arrange fills perm[0..n) with the order of the next round under forward or shuffle
	// (reverse runs a warp at a time: run_block).
	void arrange(int n) {
		for (int i = 0; i < n; i++)
			perm[i] = i;
		if (order == SHUFFLE)
			for (int i = n - 1; i > 0; i--)
				std::swap(perm[i], perm[next() % (uint64_t)(i + 1)]);
	}
};

Launch* current;           // the launch in progress
Fiber fibers[kMaxThreads]; // the running block's threads
// Each warp's values at its last gather: rewritten only when every lane is at the next one,
// so a lane reads them until its next collective.
u32 gathered[kMaxThreads / CR_WARP][CR_WARP * kMaxGather];
Schedule sched{FORWARD, 0, 1, {}, {}, 0};
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
		if (current->cur->ncopies > 0)
			cr_host_fault("a thread ended with cp.async copies it did not wait for");
		yield(DONE);
	}
}

// run_thread runs thread t, if it can run, until it waits or ends; it returns why it faulted,
// or nullptr. first: the block's first round, whose order sched.first records.
const char* run_thread(int t, bool first) {
	if (fibers[t].state != RUNNABLE)
		return nullptr;
	if (first)
		sched.first[sched.nfirst++] = t;
	current->cur = &fibers[t];
	threadIdx = fibers[t].idx;
	to_fiber(&fibers[t]);
	return fibers[t].state == FAULTED ? current->fault : nullptr;
}

// release_warp completes the collective that every lane of the warp of threads w .. end-1
// waits at, if they all wait at one, and makes them runnable (*released); it returns an error
// for one that only part of the warp reached.
const char* release_warp(int w, int end, bool* released) {
	int shfl = 0, gather = 0;
	for (int t = w; t < end; t++) {
		shfl += fibers[t].state == AT_SHFL;
		gather += fibers[t].state == AT_GATHER;
	}
	if (gather > 0) {
		if (gather != CR_WARP)
			return "a warp-wide exchange (a warp sum, a tensor-core product) that not every lane of a "
			       "whole warp reached";
		for (int t = w; t < end; t++)
			if (fibers[t].gn != fibers[w].gn)
				return "a warp-wide exchange whose lanes give different numbers of values";
		const int gn = fibers[w].gn;
		if (gn < 1 || gn > kMaxGather)
			return "a warp-wide exchange of no values, or of more than the emulator holds";
		u32* warp = gathered[w / CR_WARP];
		for (int s = 0; s < CR_WARP; s++)
			memcpy(warp + s * gn, fibers[w + s].gv, sizeof(u32) * gn);
	} else if (shfl > 0) {
		if (shfl != end - w)
			return "a warp shuffle that not every lane of the warp reached";
		for (int t = w; t < end; t++) {
			int p = w + ((t - w) ^ fibers[t].mask);
			if (p >= end)
				return "a warp shuffle from a lane past the block's last thread";
			fibers[t].result = fibers[p].val;
		}
	} else {
		return nullptr;
	}
	for (int t = w; t < end; t++)
		fibers[t].state = RUNNABLE;
	*released = true;
	return nullptr;
}

// run_block runs one block to completion; it returns an error message or nullptr.
const char* run_block(int n) {
	sched.nfirst = 0;
	// A block finds its shared memory undefined on a GPU, often as the last block left it: a
	// kernel that reads it before writing it would pass here with the last block's values.
	if (__start_cr_shared)
		memset(__start_cr_shared, 0xff, (size_t)(__stop_cr_shared - __start_cr_shared));
	for (int t = 0; t < n; t++) {
		Fiber& f = fibers[t];
		f.idx.x = t % blockDim.x;
		f.idx.y = t / blockDim.x % blockDim.y;
		f.idx.z = t / (blockDim.x * blockDim.y);
		f.state = RUNNABLE;
		f.ncopies = f.group = 0;
		if (!f.started) {
			fiber_start(&f, stacks + (size_t)t * kStack);
			f.started = true;
		}
	}
	for (int round = 0;; round++) {
		if (sched.order == REVERSE) {
			// Each warp, the last first, runs as far as it can, through its shuffles and
			// exchanges, before the next starts: where the others keep step with it through
			// their collectives, a warp running ahead overwrites what another has still to read
			// if no barrier stands between them.
			for (int w = (n - 1) / CR_WARP * CR_WARP; w >= 0; w -= CR_WARP) {
				const int end = w + CR_WARP < n ? w + CR_WARP : n;
				for (bool released = true, first = round == 0; released; first = false) {
					for (int t = end - 1; t >= w; t--)
						if (const char* err = run_thread(t, first))
							return err;
					released = false;
					if (const char* err = release_warp(w, end, &released))
						return err;
				}
			}
		} else {
			sched.arrange(n);
			for (int i = 0; i < n; i++)
				if (const char* err = run_thread(sched.perm[i], round == 0))
					return err;
		}
		// Nothing runs now: release the warps whose lanes all wait at a collective, else the
		// block if all its threads wait at __syncthreads.
		bool released = false;
		int at_sync = 0, exited = 0;
		for (int w = 0; w < n; w += CR_WARP) {
			const int end = w + CR_WARP < n ? w + CR_WARP : n;
			for (int t = w; t < end; t++) {
				at_sync += fibers[t].state == AT_SYNC;
				exited += fibers[t].state == DONE;
			}
			if (const char* err = release_warp(w, end, &released))
				return err;
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

// set_schedule reads $FAKECUDA_SCHEDULE into sched; it returns an error message or nullptr.
const char* set_schedule() {
	const char* v = getenv("FAKECUDA_SCHEDULE");
	if (!v || !*v || !strcmp(v, "forward")) {
		sched.order = FORWARD;
	} else if (!strcmp(v, "reverse")) {
		sched.order = REVERSE;
	} else if (!strncmp(v, "shuffle:", 8)) {
		char* end;
		unsigned long long seed = strtoull(v + 8, &end, 10);
		if (end == v + 8 || *end)
			return "FAKECUDA_SCHEDULE: want shuffle:SEED with a decimal SEED";
		// The same seed goes on from the last launch's state, so launches differ.
		if (sched.order != SHUFFLE || sched.seed != seed)
			sched.rng = (seed + 1) * 0x9e3779b97f4a7c15ull | 1;
		sched.order = SHUFFLE;
		sched.seed = seed;
	} else {
		return "FAKECUDA_SCHEDULE: want forward, reverse or shuffle:SEED";
	}
	return nullptr;
}

} // namespace

void cr_host_syncthreads(void) { yield(AT_SYNC); }

// cr_host_fault parks the thread for good: the launch fails with what (emu_launch makes the
// block's fibers anew).
void cr_host_fault(const char* what) {
	current->fault = what;
	yield(FAULTED);
}

unsigned cr_host_shfl_xor(unsigned v, int lane_mask) {
	Fiber* f = current->cur;
	f->val = v;
	f->mask = lane_mask;
	yield(AT_SHFL);
	return f->result;
}

// cr_host_warp_gather parks the lane until every lane of its warp has called it, then returns
// the warp's values, lane s's v[i] at [s*n + i]. One switch where shuffles would take one a
// value.
const u32* cr_host_warp_gather(const u32* v, int n) {
	Fiber* f = current->cur;
	f->gv = v;
	f->gn = n;
	yield(AT_GATHER);
	return gathered[(f - fibers) / CR_WARP];
}

// emu_find returns the kernel called name of a module whose .target is sm_SM, or null: from
// the sm_80 module's table where sm >= 80 and it has one, else from the base module's.
extern "C" void* emu_find(const char* name, int sm) {
	if (sm >= 80 && emu_find_sm80)
		if (const EmuKernel* k = emu_find_sm80(name))
			return (void*)k;
	return (void*)emu_find_base(name);
}

// emu_param_sizes writes the byte size of each of kernel k's parameters to sizes (at most max)
// and returns how many it takes.
extern "C" int emu_param_sizes(void* k, int* sizes, int max) { return ((const EmuKernel*)k)->sizes(sizes, max); }

// fake_first_order writes the order in which the last launch's last block's threads first
// ran to out (up to 1024 thread indices) and returns how many there were.
extern "C" int fake_first_order(int* out) {
	std::lock_guard<std::mutex> lock(launch_mu);
	memcpy(out, sched.first, sizeof(int) * sched.nfirst);
	return sched.nfirst;
}

// emu_launch runs kernel k (from emu_find) on a grid of blocks; it returns 0, or 719
// (CUDA_ERROR_LAUNCH_FAILED) after printing why.
extern "C" int emu_launch(void* k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                          void** params) {
	const EmuKernel* e = (const EmuKernel*)k;
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
	if (const char* err = set_schedule()) {
		fprintf(stderr, "fakecuda: kernel %s: %s\n", e->name, err);
		return 1; // CUDA_ERROR_INVALID_VALUE
	}
	if (__start_cr_tshared)
		memset(__start_cr_tshared, 0xff, (size_t)(__stop_cr_tshared - __start_cr_tshared));
	Launch l{};
	l.run = e->run;
	l.params = params;
	current = &l;
	gridDim = cr_dim3{gx, gy, gz};
	blockDim = cr_dim3{bx, by, bz};
	// Blocks in linear order x, then y, then z; reversed, or shuffled up to a million blocks
	// (reversed beyond, to keep the permutation's memory small).
	uint64_t nb = (uint64_t)gx * gy * gz;
	std::vector<uint32_t> blocks;
	if (sched.order == SHUFFLE && nb <= (1u << 20)) {
		blocks.resize(nb);
		for (uint32_t i = 0; i < nb; i++)
			blocks[i] = i;
		for (uint64_t i = nb - 1; i > 0; i--)
			std::swap(blocks[i], blocks[sched.next() % (i + 1)]);
	}
	for (uint64_t i = 0; i < nb; i++) {
		uint64_t b = !blocks.empty() ? blocks[i] : sched.order == FORWARD ? i : nb - 1 - i;
		unsigned x = (unsigned)(b % gx), y = (unsigned)(b / gx % gy), z = (unsigned)(b / gx / gy);
		blockIdx = cr_dim3{x, y, z};
		if (const char* err = run_block(n)) {
			fprintf(stderr, "fakecuda: kernel %s, block (%u,%u,%u) of (%u,%u,%u), %d threads: %s\n", e->name, x, y, z, gx,
			        gy, gz, n, err);
			for (Fiber& f : fibers) // stuck inside the kernel: start afresh next time
				f.started = false;
			current = nullptr;
			return 719;
		}
	}
	current = nullptr;
	return 0;
}

namespace {

// land writes copy c to shared memory: the 16 bytes at its source, or zeros.
void land(const Fiber::Copy& c) {
	if (c.src)
		memcpy(c.dst, c.src, 16);
	else
		memset(c.dst, 0, 16);
}

} // namespace

// cr_host_cp_async16 issues a copy of the thread's open group: landed now, or kept until the
// wait that covers it, as the schedule says (the opening comment).
void cr_host_cp_async16(void* dst, const void* src, int valid) {
	Fiber* f = current->cur;
	Fiber::Copy c{dst, valid ? src : nullptr, f->group};
	if (sched.order == REVERSE || (sched.order == SHUFFLE && (sched.next() >> 32 & 1))) {
		land(c);
		return;
	}
	if (f->ncopies == kMaxCopies)
		cr_host_fault("more cp.async copies in flight in a thread than the emulator holds");
	f->copies[f->ncopies++] = c;
}

// cr_host_cp_commit closes the thread's open group.
void cr_host_cp_commit(void) { current->cur->group++; }

// cr_host_cp_wait lands the copies of every committed group but the latest n (cp.async's
// wait_group n), in the order they were issued.
void cr_host_cp_wait(int n) {
	Fiber* f = current->cur;
	int kept = 0;
	for (int i = 0; i < f->ncopies; i++) {
		if (f->copies[i].group < f->group - n)
			land(f->copies[i]);
		else
			f->copies[kept++] = f->copies[i];
	}
	f->ncopies = kept;
}
