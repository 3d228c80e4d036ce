// Package fakecuda builds a fake CUDA driver library for tests on machines without a GPU.
// testdata/fakecuda.c exports the driver calls package cuda binds and keeps "device memory"
// in host memory; testdata/emu.cc runs the project's own kernels (cuda/kernels, both PTX
// modules' builds of them: testdata/emu_kernels.cc) with every CUDA thread emulated. So the
// binding, the kernels and the engine's GPU path are tested everywhere, against the same
// sources the GPU runs.
package fakecuda

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/commit-run/commit-run/internal/cbuild"
)

var (
	//go:embed testdata/fakecuda.c
	driverSource []byte
	//go:embed testdata/emu.cc
	emuSource []byte
	//go:embed testdata/emu.h
	emuHeader []byte
	//go:embed testdata/emu_kernels.cc
	emuKernelsSource []byte
)

// ErrNoCompiler reports that no C or C++ compiler was found to build the library; tests skip
// then.
var ErrNoCompiler = errors.New("no C and C++ compiler to build the fake CUDA driver")

var built struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the fake driver (with $CC or gcc, and $CXX or g++) and returns the path of its
// libcuda.so.1. The library is kept in the temporary directory under a name derived from
// everything it is built from, so the test binaries of several packages build it once.
func Build() (string, error) {
	built.once.Do(func() { built.path, built.err = build() })
	return built.path, built.err
}

// kernelDir returns the directory of the kernels' CUDA sources in this source tree.
func kernelDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", fmt.Errorf("fakecuda: cannot locate the kernel sources (built with -trimpath?)")
	}
	return filepath.Join(filepath.Dir(file), "..", "..", "cuda"), nil
}

var entryRE = regexp.MustCompile(`(?m)^\.visible \.entry (\w+)\(`)

// entries returns the names of a PTX module's kernels.
func entries(ptx []byte) []string {
	var names []string
	for _, m := range entryRE.FindAllSubmatch(ptx, -1) {
		names = append(names, string(m[1]))
	}
	return names
}

// emuFiles returns the emulator's sources with the tables emu_kernels.cc includes: the base
// module's kernels, base, and the sm_80 module's, sm80, with their renames.
func emuFiles(base, sm80 []string) map[string][]byte {
	var table, table80, rename strings.Builder
	for _, n := range base {
		fmt.Fprintf(&table, "EMU_KERNEL(%s)\n", n)
	}
	for _, n := range sm80 {
		fmt.Fprintf(&table80, "EMU_KERNEL(%s)\n", n)
		fmt.Fprintf(&rename, "#define %s emu_sm80_%s\n", n, n)
	}
	return map[string][]byte{"emu.cc": emuSource, "emu.h": emuHeader, "emu_kernels.cc": emuKernelsSource,
		"emu_table.inc": []byte(table.String()), "emu_table_sm80.inc": []byte(table80.String()),
		"emu_rename_sm80.inc": []byte(rename.String())}
}

// emuSteps returns the commands that compile the emulator in a directory holding emuFiles'
// files, with the include directories includes (before that directory), into objects, the
// commands to run on them after (post), and the objects: emu.cc's, the base module's
// table's, and where sm80 the sm_80 module's.
//
// GCC ignores the section attribute that gathers the kernels' __shared__ variables
// (common.cuh) for the static locals of function templates, which are most of them (the
// tiles of mmqi, mmq, the attention and the flash attention: about 1 MB in all), and puts
// them in .bss. The tables' objects hold nothing else there, so objcopy (post) renames their
// .bss cr_tshared, which the emulator fills before each launch. Without objcopy on the PATH
// (binutils, beside the compilers) those variables keep what the last launch left.
func emuSteps(cxx, objcopy []string, opt string, includes []string, sm80 bool) (steps, post [][]string, objs []string) {
	flags := []string{"-std=c++17", "-fPIC", opt, "-ftls-model=initial-exec"}
	for _, d := range includes {
		flags = append(flags, "-I", d)
	}
	flags = append(flags, "-I", ".")
	// compile adds the step that compiles src into obj; kernels: a table of kernels, whose
	// .bss objcopy renames.
	compile := func(obj, src string, kernels bool, extra ...string) {
		steps = append(steps, append(append(append(slices.Clone(cxx), flags...), extra...), "-c", "-o", obj, src))
		objs = append(objs, obj)
		if kernels && objcopy != nil {
			post = append(post, append(slices.Clone(objcopy), "--rename-section", ".bss=cr_tshared", obj))
		}
	}
	compile("emu.o", "emu.cc", false)
	compile("emu_base.o", "emu_kernels.cc", true)
	if sm80 {
		compile("emu_sm80.o", "emu_kernels.cc", true, "-DCR_EMU_SM80")
	}
	return steps, post, objs
}

// objcopyArgs returns the command line of $OBJCOPY or objcopy, or nil where there is none.
func objcopyArgs() []string {
	args, err := cbuild.Compiler("OBJCOPY", "objcopy")
	if err != nil {
		return nil
	}
	return args
}

// runSteps runs the commands in dir at once (the emulator's kernel tables take most of the
// build, each its own compiler) and returns their failures.
func runSteps(dir string, steps [][]string) error {
	errs := make([]error, len(steps))
	var wg sync.WaitGroup
	for i, s := range steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(s[0], s[1:]...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("%s: %v\n%s", strings.Join(s, " "), err, out)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func build() (string, error) {
	ccArgs, err := cbuild.Compiler("CC", "gcc")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoCompiler, err)
	}
	cxxArgs, err := cbuild.Compiler("CXX", "g++")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoCompiler, err)
	}
	cc, cxx := strings.Join(ccArgs, " "), strings.Join(cxxArgs, " ")
	cudaDir, err := kernelDir()
	if err != nil {
		return "", err
	}
	// The kernel tables list the PTX modules' entries: the kernels the driver can be asked for.
	var mods [2][]string
	for i, name := range []string{"kernels.ptx", "kernels_sm80.ptx"} {
		ptx, err := os.ReadFile(filepath.Join(cudaDir, "ptx", name))
		if err != nil {
			return "", fmt.Errorf("fakecuda: %w", err)
		}
		mods[i] = entries(ptx)
	}
	files := emuFiles(mods[0], mods[1])
	files["fakecuda.c"] = driverSource
	kernels, err := filepath.Glob(filepath.Join(cudaDir, "kernels", "*"))
	if err != nil {
		return "", err
	}
	sort.Strings(kernels)

	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(files)) {
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write(files[name])
		h.Write([]byte{0})
	}
	objcopy := objcopyArgs()
	for _, b := range []string{cc, cxx, strings.Join(objcopy, " ")} {
		h.Write([]byte(b))
		h.Write([]byte{0})
	}
	for _, k := range kernels {
		b, err := os.ReadFile(k)
		if err != nil {
			return "", fmt.Errorf("fakecuda: %w", err)
		}
		h.Write([]byte(filepath.Base(k)))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	return cbuild.Cached("commit-run-fakecuda", key, "libcuda.so.1", func(dir string) error {
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				return err
			}
		}
		steps, post, objs := emuSteps(cxxArgs, objcopy, "-O2", []string{filepath.Join(cudaDir, "kernels")}, len(mods[1]) > 0)
		steps = append(steps, append(slices.Clone(ccArgs), "-c", "-fPIC", "-O1", "-o", "fakecuda.o", "fakecuda.c"))
		if err := runSteps(dir, steps); err != nil {
			return fmt.Errorf("building the fake CUDA driver: %w", err)
		}
		if err := runSteps(dir, post); err != nil {
			return fmt.Errorf("building the fake CUDA driver: %w", err)
		}
		link := append(append(slices.Clone(cxxArgs), "-shared", "-o", "libcuda.so.1"), append(objs, "fakecuda.o")...)
		if err := runSteps(dir, [][]string{link}); err != nil {
			return fmt.Errorf("linking the fake CUDA driver: %w", err)
		}
		return nil
	})
}
