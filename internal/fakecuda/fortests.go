package fakecuda

import (
	"testing"

	"github.com/commit-run/commit-run/internal/cbuild"
)

// ForTests is Build for a test: the library's path, the test skipped where no compiler can
// build it and failed where the build fails otherwise.
func ForTests(tb testing.TB) string {
	tb.Helper()
	return cbuild.ForTests(tb, Build, ErrNoCompiler)
}
