// A table of the project's kernels compiled for the host, for the emulator (emu.cc), built
// twice into the fake driver by fakecuda.Build:
//   - as it is, from all.cu: the base module's kernels (kernels.ptx), emu_find_base;
//   - with CR_EMU_SM80, from sm80.cu: the sm_80 module's (kernels_sm80.ptx), emu_find_sm80.
//     common.cuh then takes sm_80's paths where they differ in more than an instruction (its
//     cp.async copies are asynchronous, CR_CP_ASYNC, and land late), so a device of compute
//     capability 8.0 or newer runs here what it runs on a card. emu_rename_sm80.inc renames
//     each of those kernels emu_sm80_NAME (#define NAME emu_sm80_NAME): both builds define
//     the same extern "C" names, and one library holds both. (Their helpers are static.)
// emu_table.inc or emu_table_sm80.inc has an EMU_KERNEL(name) line for each kernel of the
// module.
#include <stddef.h>
#include <string.h>

#include <utility>

#include "emu.h"

#if defined(CR_EMU_SM80)
#include "emu_rename_sm80.inc"
#include "sm80.cu"
#define EMU_TABLE "emu_table_sm80.inc"
#define EMU_FIND emu_find_sm80
#else
#include "all.cu"
#define EMU_TABLE "emu_table.inc"
#define EMU_FIND emu_find_base
#endif

namespace {

template <typename F> struct Invoker;
template <typename... A> struct Invoker<void (*)(A...)> {
	template <void (*K)(A...), size_t... I> static void call(void** p, std::index_sequence<I...>) { K(*(A*)p[I]...); }
	template <void (*K)(A...)> static void run(void** p) { call<K>(p, std::index_sequence_for<A...>{}); }
	// sizes writes the bytes of each parameter, which a captured launch copies.
	static int sizes(int* out, int max) {
		const int s[] = {(int)sizeof(A)..., 0};
		const int n = (int)sizeof...(A);
		for (int i = 0; i < n && i < max; i++)
			out[i] = s[i];
		return n;
	}
};

// #name is the kernel's name as the module spells it; &name may be renamed.
const EmuKernel table[] = {
#define EMU_KERNEL(name) {#name, &Invoker<decltype(&name)>::run<&name>, &Invoker<decltype(&name)>::sizes},
#include EMU_TABLE
#undef EMU_KERNEL
};

} // namespace

extern "C" const EmuKernel* EMU_FIND(const char* name) {
	for (const EmuKernel& e : table)
		if (!strcmp(e.name, name))
			return &e;
	return nullptr;
}
