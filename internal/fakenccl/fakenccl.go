// Package fakenccl builds a fake NCCL library for tests on machines without GPUs.
//
// testdata/fakenccl.c exports the NCCL calls package nccl binds (version 2.23.4) and moves
// data between the ranks of ONE process: it takes "device pointers" for host addresses, as the
// fake CUDA driver (internal/fakecuda) keeps device memory in host memory, and ignores
// streams, so a send or receive is complete when the group that posted it ends. Communicators
// of several goroutines (ncclCommInitRankScalable) or of one (ncclCommInitAll) exchange data
// with ncclSend/ncclRecv in groups; a mismatch, a timeout or ncclCommAbort fails every rank of
// the clique instead of hanging it. The comment at the top of the C file lists what is
// modelled and the environment variables that steer it (FAKENCCL_INIT_ERROR and timeouts).
package fakenccl

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/commit-run/commit-run/internal/cbuild"
)

//go:embed testdata/fakenccl.c
var source []byte

// ErrNoCompiler reports that no C compiler was found to build the library; tests skip then.
var ErrNoCompiler = errors.New("no C compiler to build the fake NCCL library")

// The library's file name: the soname package nccl tries first.
const libName = "libnccl.so.2"

var built struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the fake library (with $CC or gcc) and returns the path of its libnccl.so.2.
// The library is kept in the temporary directory under a name derived from its source and
// compiler, so the test binaries of several packages build it once.
func Build() (string, error) {
	built.once.Do(func() { built.path, built.err = build() })
	return built.path, built.err
}

func build() (string, error) {
	ccArgs, err := cbuild.Compiler("CC", "gcc")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoCompiler, err)
	}
	cc := strings.Join(ccArgs, " ")
	flags := []string{"-shared", "-fPIC", "-O1", "-pthread", "-o", libName, "fakenccl.c"}

	h := sha256.New()
	for _, b := range [][]byte{source, []byte(cc), []byte(strings.Join(flags, " "))} {
		h.Write(b)
		h.Write([]byte{0})
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	return cbuild.Cached("commit-run-fakenccl", key, libName, func(dir string) error {
		if err := os.WriteFile(filepath.Join(dir, "fakenccl.c"), source, 0o644); err != nil {
			return err
		}
		cmd := exec.Command(ccArgs[0], append(ccArgs[1:], flags...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building the fake NCCL library: %s: %v\n%s", cc, err, out)
		}
		return nil
	})
}
