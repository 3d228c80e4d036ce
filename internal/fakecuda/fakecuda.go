// Package fakecuda builds a fake CUDA driver library for tests on machines without a GPU:
// testdata/fakecuda.c exports the driver calls package cuda binds, keeps "device memory" in
// host memory and runs kernels as C functions (the F32 and F16 matrix-vector products among
// them), so that the binding and the engine's GPU path are tested everywhere.
package fakecuda

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

//go:embed testdata/fakecuda.c
var source []byte

// ErrNoCompiler reports that no C compiler was found to build the library; tests skip then.
var ErrNoCompiler = errors.New("no C compiler to build the fake CUDA driver")

var built struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the fake driver once per process (with $CC, or gcc) and returns the path of
// its libcuda.so.1. The directory is left for the operating system's temporary files.
func Build() (string, error) {
	built.once.Do(func() {
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "gcc"
		}
		if _, err := exec.LookPath(cc); err != nil {
			built.err = fmt.Errorf("%w: %v", ErrNoCompiler, err)
			return
		}
		dir, err := os.MkdirTemp("", "fakecuda")
		if err != nil {
			built.err = err
			return
		}
		src := filepath.Join(dir, "fakecuda.c")
		if err := os.WriteFile(src, source, 0o644); err != nil {
			built.err = err
			return
		}
		lib := filepath.Join(dir, "libcuda.so.1")
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", lib, src).CombinedOutput(); err != nil {
			built.err = fmt.Errorf("building the fake CUDA driver: %v\n%s", err, out)
			return
		}
		built.path = lib
	})
	return built.path, built.err
}
