package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/sim"
)

// TestAutoPlacementFlags: on a simulated card too small for the bundled model, generate places
// the experts itself and says so; --auto-trace records where its routing sample came from, and
// a trace that cannot be read is a clear error.
func TestAutoPlacementFlags(t *testing.T) {
	model := needModel(t)
	p, err := sim.LoadProfile("rtx4090")
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.MemoryBytes = "small", 10<<20
	data, _ := json.Marshal(p)
	card := filepath.Join(t.TempDir(), "small.json")
	if err := os.WriteFile(card, data, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"generate", "-m", model, "--prompt", "Hello", "-n", "2", "--ctx", "64", "--device", "sim:" + card}
	if _, errOut := mustRun(t, "", args...); !strings.Contains(errOut, "auto placement: ") || !strings.Contains(errOut, "synthetic router") {
		t.Errorf("no automatic placement on a 10 MiB card: %q", errOut)
	}
	missing := filepath.Join(t.TempDir(), "gone.trace")
	if _, errOut, code := runCLI(t, "", append(args, "--auto-trace", missing)...); code == 0 || !strings.Contains(errOut, "gone.trace") {
		t.Errorf("--auto-trace of a missing file: exit %d, %q", code, errOut)
	}
}
