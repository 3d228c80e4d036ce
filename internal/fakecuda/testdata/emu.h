// What the emulator's runtime (emu.cc) and its tables of kernels (emu_kernels.cc) share.
#ifndef EMU_H
#define EMU_H

// EmuKernel is one kernel compiled for the host: run calls it with a launch's parameters;
// sizes writes the byte size of each parameter (at most max) and returns how many it takes.
struct EmuKernel {
	const char* name;
	void (*run)(void**);
	int (*sizes)(int* out, int max);
};

// The kernels of the base module (all.cu) and of the sm_80 module (sm80.cu, compiled with
// CR_EMU_SM80): the one called name, or null. A library built without the second table (the
// emulator's own test) has no emu_find_sm80.
extern "C" const EmuKernel* emu_find_base(const char* name);
extern "C" const EmuKernel* emu_find_sm80(const char* name) __attribute__((weak));

#endif
