// Package cbuild builds the C libraries the tests load in place of NVIDIA's (internal/fakecuda,
// internal/fakenccl) once per version of their sources, in the temporary directory, so that the
// test binaries of several packages share one build.
package cbuild

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Cached returns the path of file in the directory prefix-key of os.TempDir(), where key names
// everything the library is built from. When it is not there yet, build makes it: it is given
// a fresh work directory and leaves file in it. The library is then published whole, by
// renaming a directory, so that a test binary building the same one at once finds either
// nothing or a complete file.
func Cached(prefix, key, file string, build func(dir string) error) (string, error) {
	final := filepath.Join(os.TempDir(), prefix+"-"+key)
	lib := filepath.Join(final, file)
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	dir, err := os.MkdirTemp("", prefix+"-build")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := build(dir); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(os.TempDir(), prefix+"-lib")
	if err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(dir, file), filepath.Join(tmp, file)); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		// Another builder won the race; its library is as good as ours.
		if _, serr := os.Stat(lib); serr != nil {
			return "", fmt.Errorf("%s: %w", prefix, err)
		}
	}
	return lib, nil
}

// ErrNoCompiler reports that the compiler an environment variable names, or its default, is
// not on the path; the fakes' tests skip then.
var ErrNoCompiler = errors.New("no compiler")

// Compiler returns the command line of the compiler $env names (def when unset), split into
// words, since make allows flags there ("gcc -m64"); the first word must be on the path.
func Compiler(env, def string) ([]string, error) {
	args := strings.Fields(cmp.Or(os.Getenv(env), def))
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: $%s is blank", ErrNoCompiler, env)
	}
	if _, err := exec.LookPath(args[0]); err != nil {
		return nil, fmt.Errorf("%w: $%s: %v", ErrNoCompiler, env, err)
	}
	return args, nil
}

// ForTests is a library's Build for a test: the library's path, the test skipped where build
// reports no compiler (an error wrapping noCompiler) and failed where the build fails
// otherwise.
func ForTests(tb testing.TB, build func() (string, error), noCompiler error) string {
	tb.Helper()
	lib, err := build()
	if errors.Is(err, noCompiler) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return lib
}
