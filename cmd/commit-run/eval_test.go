package main

import (
	"os"
	"strings"
	"testing"
)

// TestEndlessText: an endless --text is refused at a cap, not read until memory runs out.
func TestEndlessText(t *testing.T) {
	model := needModel(t)
	if _, err := os.Stat("/dev/zero"); err != nil {
		t.Skip("no /dev/zero on this system")
	}
	_, errOut, code := runCLI(t, "", "eval", "ppl", "-m", model, "--text", "/dev/zero")
	if code == 0 || !strings.Contains(errOut, "--text /dev/zero: more than 256 MiB") {
		t.Errorf("eval ppl --text /dev/zero: exit %d, %q", code, errOut)
	}
}
