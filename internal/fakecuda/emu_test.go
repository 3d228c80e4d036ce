package fakecuda

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/commit-run/commit-run/internal/cbuild"
	"github.com/commit-run/commit-run/quant"
)

// emu is the emulator built around testdata/emutest's kernels.
type emu struct {
	find, launch uintptr
}

var emuKernelRE = regexp.MustCompile(`(?m)^__global__ void (\w+)\(`)

// buildEmu compiles emu.cc with the test's kernels in place of the project's (all.cu's as the
// base module, sm80.cu's as the sm_80 module) and loads it.
func buildEmu(t *testing.T) emu {
	t.Helper()
	cxx, err := cbuild.Compiler("CXX", "g++")
	if err != nil {
		t.Skip(err)
	}
	cudaDir, err := kernelDir()
	if err != nil {
		t.Fatal(err)
	}
	testDir, err := filepath.Abs(filepath.Join("testdata", "emutest"))
	if err != nil {
		t.Fatal(err)
	}
	var mods [2][]string
	for i, name := range []string{"all.cu", "sm80.cu"} {
		src, err := os.ReadFile(filepath.Join(testDir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range emuKernelRE.FindAllSubmatch(src, -1) {
			mods[i] = append(mods[i], string(m[1]))
		}
	}
	dir := t.TempDir()
	for name, b := range emuFiles(mods[0], mods[1]) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The test's directory comes first on the include path, so emu_kernels.cc's "all.cu" and
	// "sm80.cu" are its own.
	steps, post, objs := emuSteps(cxx, objcopyArgs(), "-O1", []string{testDir, filepath.Join(cudaDir, "kernels")}, true)
	if err := runSteps(dir, steps); err != nil {
		t.Fatalf("building the emulator's test library: %v", err)
	}
	if err := runSteps(dir, post); err != nil {
		t.Fatalf("building the emulator's test library: %v", err)
	}
	link := append(append(slices.Clone(cxx), "-shared", "-o", "libemutest.so"), objs...)
	if err := runSteps(dir, [][]string{link}); err != nil {
		t.Fatalf("linking the emulator's test library: %v", err)
	}
	h, err := purego.Dlopen(filepath.Join(dir, "libemutest.so"), purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	var e emu
	for _, s := range []struct {
		name string
		p    *uintptr
	}{{"emu_find", &e.find}, {"emu_launch", &e.launch}} {
		if *s.p, err = purego.Dlsym(h, s.name); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// run launches kernel name on one block of threads threads with the given buffers as its
// parameters and returns emu_launch's result: 0, or 719 for a failed launch. It finds name
// as a module of sm_80 does: in sm80.cu's kernels, else in all.cu's.
func (e emu) run(t *testing.T, name string, threads int, bufs ...unsafe.Pointer) uintptr {
	t.Helper()
	var pin runtime.Pinner
	defer pin.Unpin()
	cname := append([]byte(name), 0)
	pin.Pin(&cname[0])
	k, _, _ := purego.SyscallN(e.find, uintptr(unsafe.Pointer(&cname[0])), 80)
	if k == 0 {
		t.Fatalf("no kernel %s", name)
	}
	ptrs := make([]uintptr, len(bufs)) // the parameters' values: the buffers' addresses
	params := make([]uintptr, len(bufs)+1)
	for i, b := range bufs {
		pin.Pin(b)
		ptrs[i] = uintptr(b)
	}
	pin.Pin(&ptrs[0])
	for i := range bufs {
		params[i] = uintptr(unsafe.Pointer(&ptrs[i]))
	}
	pin.Pin(&params[0])
	r, _, _ := purego.SyscallN(e.launch, k, 1, 1, 1, uintptr(threads), 1, 1, uintptr(unsafe.Pointer(&params[0])))
	return r
}

// TestEmulatorCollectives: the warp collectives every lane reaches give each lane what a GPU
// gives it, and a launch fails where a GPU would hang or leave the result undefined.
func TestEmulatorCollectives(t *testing.T) {
	e := buildEmu(t)
	out := make([]float32, 64)
	p := unsafe.Pointer(&out[0])
	want := func(name string, f func(i int) float32) {
		t.Helper()
		clear(out)
		if r := e.run(t, name, 64, p); r != 0 {
			t.Fatalf("%s: launch failed (%d)", name, r)
		}
		for i, v := range out {
			if v != f(i) {
				t.Errorf("%s: thread %d has %g, want %g", name, i, v, f(i))
			}
		}
	}
	warpSum := func(i int) float32 { w := i / 32 * 32; return float32(32*w + 31*32/2) }
	want("warp_sum", warpSum)
	want("warp_sum_d", warpSum)
	want("warp_max", func(int) float32 { return 31 })
	want("shfl_xor", func(i int) float32 { return float32(i ^ 5) })

	for _, c := range []struct {
		name    string
		threads int
	}{
		{"warp_sum_half", 32},
		{"shfl_half", 32},
		{"sum_or_shfl", 64},
		{"warp_sum", 16}, // a warp sum in a block of less than a warp
		{"sync_half", 64},
	} {
		if r := e.run(t, c.name, c.threads, p); r != 719 {
			t.Errorf("%s on %d threads: emu_launch returned %d, want 719 (CUDA_ERROR_LAUNCH_FAILED)", c.name, c.threads, r)
		}
	}
	// A failed launch leaves the emulator ready for the next.
	want("warp_sum", warpSum)
}

// TestEmulatorTensorCores: common.cuh's tensor-core products, on fragments loaded as the PTX
// ISA lays them out, equal the products of the matrices: exactly in int32, and in float32 added
// in k's order (halves' products are exact in float32).
func TestEmulatorTensorCores(t *testing.T) {
	e := buildEmu(t)
	rng := rand.New(rand.NewPCG(1, 2))
	s8 := func() int8 { return int8(rng.IntN(256) - 128) }
	dotS8 := func(a, b int8) int32 { return int32(a) * int32(b) }
	f16 := func() uint16 { return quant.FP32ToFP16(float32(rng.NormFloat64())) }
	dotF16 := func(a, b uint16) float32 { return float32(quant.FP16ToFP32(a) * quant.FP16ToFP32(b)) }
	checkProduct(t, e, "mma_s8", 8, 16, s8, dotS8)
	checkProduct(t, e, "mma_s8_k16", 16, 16, s8, dotS8)
	checkProduct(t, e, "mma_s8_k32", 16, 32, s8, dotS8)
	checkProduct(t, e, "mma_f16_k8", 16, 8, f16, dotF16)
	checkProduct(t, e, "mma_f16_k16", 16, 16, f16, dotF16)
}

// checkProduct runs kernel (one warp) on an m x k A and a k x 8 B (column-major) of elements
// from gen and compares its m x 8 product with the products dot summed in k's order.
func checkProduct[E int8 | uint16, T int32 | float32](t *testing.T, e emu, kernel string, m, k int, gen func() E, dot func(a, b E) T) {
	t.Helper()
	const n = 8
	a, b := make([]E, m*k), make([]E, n*k)
	for _, x := range [][]E{a, b} {
		for i := range x {
			x[i] = gen()
		}
	}
	got := make([]T, m*n)
	if r := e.run(t, kernel, 32, unsafe.Pointer(&a[0]), unsafe.Pointer(&b[0]), unsafe.Pointer(&got[0])); r != 0 {
		t.Fatalf("%s: launch failed (%d)", kernel, r)
	}
	for i := range m {
		for j := range n {
			var w T
			for kk := range k {
				w += dot(a[k*i+kk], b[k*j+kk])
			}
			if got[n*i+j] != w {
				t.Errorf("%s: C[%d][%d] = %v, want %v", kernel, i, j, got[n*i+j], w)
			}
		}
	}
}

// TestEmulatorAsyncCopies: the sm_80 module's cp.async copies land between their issue and
// the wait that covers them, late or early as the schedule says, so a double-buffered pipeline
// gives the same values under every schedule while one that reads a tile before its wait, or
// copies into a buffer another thread may still read, gives wrong ones under some schedule;
// and a thread may not end with copies in flight.
func TestEmulatorAsyncCopies(t *testing.T) {
	e := buildEmu(t)
	const tiles, threads = 4, 64
	src := make([]float32, tiles*threads*4)
	for i := range src {
		src[i] = float32(i)
	}
	// Thread j writes thread j+1's row of each tile.
	want := make([]float32, len(src))
	for i := range tiles {
		for j := range threads {
			copy(want[256*i+4*j:256*i+4*j+4], src[256*i+4*((j+1)%threads):])
		}
	}
	out := make([]float32, len(src))
	run := func(kernel, schedule string) (diffs int) {
		t.Helper()
		t.Setenv("FAKECUDA_SCHEDULE", schedule)
		clear(out)
		if r := e.run(t, kernel, threads, unsafe.Pointer(&src[0]), unsafe.Pointer(&out[0])); r != 0 {
			t.Fatalf("%s under %s: launch failed (%d)", kernel, schedule, r)
		}
		for i := range out {
			if out[i] != want[i] {
				diffs++
			}
		}
		return diffs
	}
	for _, s := range []string{"forward", "reverse", "shuffle:1", "shuffle:2", "shuffle:3"} {
		if d := run("cp_pipeline", s); d != 0 {
			t.Errorf("cp_pipeline under %s: %d values differ from the source's", s, d)
		}
	}
	// Copies land late under forward: a tile read before its wait is not there yet.
	if d := run("cp_no_wait", "forward"); d == 0 {
		t.Error("cp_no_wait under forward read every tile right: its copies landed before the wait")
	}
	// Copies land early under reverse: the first thread to finish a tile overwrites the buffer
	// the others have still to read.
	if d := run("cp_no_end_sync", "reverse"); d == 0 {
		t.Error("cp_no_end_sync under reverse read every tile right: its copies did not land when issued")
	}
	t.Setenv("FAKECUDA_SCHEDULE", "forward")
	clear(out)
	if r := e.run(t, "cp_zeros", threads, unsafe.Pointer(&src[0]), unsafe.Pointer(&out[0])); r != 0 {
		t.Fatalf("cp_zeros: launch failed (%d)", r)
	}
	for i, v := range out[:4*threads] {
		if v != 0 {
			t.Fatalf("cp_zeros: out[%d] = %v, want 0", i, v)
		}
	}
	if r := e.run(t, "cp_in_flight", threads, unsafe.Pointer(&src[0]), unsafe.Pointer(&out[0])); r != 719 {
		t.Errorf("cp_in_flight: emu_launch returned %d, want 719 (CUDA_ERROR_LAUNCH_FAILED)", r)
	}
	if d := run("cp_pipeline", "forward"); d != 0 {
		t.Errorf("cp_pipeline after a failed launch: %d values differ", d)
	}
}

// TestEmulatorWarpsRunAhead: under the reverse schedule a warp runs as far as it can before the
// next, so a kernel whose warps keep step through their collectives, and which leaves out the
// barrier between one warp's last read of a buffer and the other's next write, gets wrong
// values there (forward, taking the threads in turns, keeps them in step and would not see it).
func TestEmulatorWarpsRunAhead(t *testing.T) {
	e := buildEmu(t)
	out := make([]float32, 4*64)
	// Round r: warp w sums the other warp's row, 100r + 32(1-w) + lane over its 32 lanes.
	want := func(i int) float32 {
		r, w := i/64, i%64/32
		return float32(32*(100*r+32*(1-w)) + 31*32/2)
	}
	diffs := func(kernel, schedule string) (n int) {
		t.Helper()
		t.Setenv("FAKECUDA_SCHEDULE", schedule)
		clear(out)
		if r := e.run(t, kernel, 64, unsafe.Pointer(&out[0])); r != 0 {
			t.Fatalf("%s under %s: launch failed (%d)", kernel, schedule, r)
		}
		for i, v := range out {
			if v != want(i) {
				n++
			}
		}
		return n
	}
	for _, s := range []string{"forward", "reverse", "shuffle:1", "shuffle:2"} {
		if d := diffs("skew_sync", s); d != 0 {
			t.Errorf("skew_sync under %s: %d sums wrong", s, d)
		}
	}
	if d := diffs("skew_no_sync", "reverse"); d == 0 {
		t.Error("skew_no_sync under reverse: every sum right, so no warp ran ahead of the other")
	}
}

// TestEmulatorTemplateShared: a function template's __shared__ variable, which GCC does not
// gather with the others, is undefined (NaN) at a launch's start too, not what the last launch
// left there.
func TestEmulatorTemplateShared(t *testing.T) {
	if objcopyArgs() == nil {
		t.Skip("no objcopy: a template's shared variables keep what the last launch left")
	}
	e := buildEmu(t)
	out := make([]float32, 64)
	for _, k := range []string{"tshared_w", "tshared_r"} {
		if r := e.run(t, k, 64, unsafe.Pointer(&out[0])); r != 0 {
			t.Fatalf("%s: launch failed (%d)", k, r)
		}
	}
	for i, v := range out {
		if v == v {
			t.Fatalf("thread %d read %v from shared memory the launch never wrote, want NaN", i, v)
		}
	}
}
