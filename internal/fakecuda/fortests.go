package fakecuda

import (
	"errors"
	"testing"
)

// ForTests is Build for a test: the library's path, the test skipped where no compiler can
// build it and failed where the build fails otherwise.
func ForTests(tb testing.TB) string {
	tb.Helper()
	lib, err := Build()
	if errors.Is(err, ErrNoCompiler) {
		tb.Skip(err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	return lib
}
