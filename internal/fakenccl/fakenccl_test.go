package fakenccl

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestBuild checks that the library is built once and then found in the cache.
func TestBuild(t *testing.T) {
	path, err := Build()
	if errors.Is(err, ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(path) != libName {
		t.Errorf("Build = %s, want a %s", path, libName)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("the library %s: %v", path, err)
	}
	// A second build (another test binary) finds the published library.
	again, err := build()
	if err != nil || again != path {
		t.Errorf("build again = %s, %v; want %s", again, err, path)
	}
}
