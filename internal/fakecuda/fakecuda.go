// Package fakecuda builds a fake CUDA driver library for tests on machines without a GPU.
// testdata/fakecuda.c exports the driver calls package cuda binds and keeps "device memory"
// in host memory; testdata/emu.cc runs the project's own kernels (cuda/kernels) with every CUDA
// thread emulated. So the binding, the kernels and the engine's GPU path are tested
// everywhere, against the same sources the GPU runs.
package fakecuda

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
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
	// The kernel table lists the PTX module's entries: the kernels the driver can be asked for.
	ptx, err := os.ReadFile(filepath.Join(cudaDir, "ptx", "kernels.ptx"))
	if err != nil {
		return "", fmt.Errorf("fakecuda: %w", err)
	}
	var table bytes.Buffer
	for _, m := range entryRE.FindAllSubmatch(ptx, -1) {
		fmt.Fprintf(&table, "EMU_KERNEL(%s)\n", m[1])
	}
	kernels, err := filepath.Glob(filepath.Join(cudaDir, "kernels", "*"))
	if err != nil {
		return "", err
	}
	sort.Strings(kernels)

	h := sha256.New()
	for _, b := range [][]byte{driverSource, emuSource, table.Bytes(), []byte(cc), []byte(cxx)} {
		h.Write(b)
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
		files := map[string][]byte{"fakecuda.c": driverSource, "emu.cc": emuSource, "emu_table.inc": table.Bytes()}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				return err
			}
		}
		steps := [][]string{
			append(slices.Clone(ccArgs), "-c", "-fPIC", "-O1", "-o", "fakecuda.o", "fakecuda.c"),
			append(slices.Clone(cxxArgs), "-std=c++17", "-shared", "-fPIC", "-O2", "-ftls-model=initial-exec", "-I", filepath.Join(cudaDir, "kernels"), "-I", ".",
				"-o", "libcuda.so.1", "emu.cc", "fakecuda.o"),
		}
		for _, s := range steps {
			cmd := exec.Command(s[0], s[1:]...)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("building the fake CUDA driver: %s: %v\n%s", s[0], err, out)
			}
		}
		return nil
	})
}
