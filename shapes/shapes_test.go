package shapes_test

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/shapes"
)

// TestOpenShapeBadInput: a shape that is not known, a type that is not, a shape asked to
// compute, one on the CPU and one that does not fit its card are each a clear error.
func TestOpenShapeBadInput(t *testing.T) {
	to := &engine.TimingOnlyOptions{Routing: func(pos, j int) []int { return nil }}
	for _, c := range []struct {
		name, shape string
		opts        engine.Options
		want        string
	}{
		{"unknown", "gpt-5", engine.Options{Device: "sim:rtx4090", TimingOnly: to}, "unknown model shape"},
		{"type", "mixtral-8x7b@q9_z", engine.Options{Device: "sim:rtx4090", TimingOnly: to}, "unknown type recipe"},
		{"computing", "mixtral-8x7b", engine.Options{Device: "sim:rtx4090"}, "runs timing only"},
		{"cpu", "mixtral-8x7b", engine.Options{TimingOnly: to}, "simulated GPU"},
		{"too small", "mixtral-8x7b", engine.Options{Device: "sim:rtx4090", TimingOnly: to}, "do not fit"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := shapes.Open(c.shape, c.opts)
			if err == nil {
				m.Close()
				t.Fatalf("no error, want one about %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to mention %q", err, c.want)
			}
		})
	}
}
