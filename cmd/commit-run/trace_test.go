package main

import (
	"path/filepath"
	"strings"
	"testing"
)

const sampleText = "Well, Prince, so Genoa and Lucca are now just family estates of the Buonapartes.\n" +
	"But I warn you, if you don't tell me that this means war, if you still try to defend the infamies.\n"

func TestTraceRecordAndInfo(t *testing.T) {
	model := needModel(t)
	out := filepath.Join(t.TempDir(), "x.trace")
	_, errOut := mustRun(t, sampleText, "-m", model, "trace", "record", "--text", "-", "--out", out, "--logits", "--inputs", "f16", "--window", "16")
	if !strings.Contains(errOut, "recorded") {
		t.Errorf("no summary on stderr: %q", errOut)
	}
	info, _ := mustRun(t, "", "trace", "info", out)
	for _, want := range []string{"recorded", "inputs f16", "logits true", "max/mean"} {
		if !strings.Contains(info, want) {
			t.Errorf("trace info lacks %q:\n%s", want, info)
		}
	}
}

func TestTraceBadInput(t *testing.T) {
	model := needModel(t)
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"trace", "record", "--text", "-"}, "--out"},
		{[]string{"trace", "record", "--text", "-", "--out", filepath.Join(dir, "a"), "--inputs", "f8"}, `--inputs "f8"`},
		{[]string{"trace", "record", "--text", "-", "--out", filepath.Join(dir, "a"), "--window", "1"}, "--window 1"},
		{[]string{"trace", "info", model}, "not a routing trace"},
		{[]string{"trace", "info", filepath.Join(dir, "missing")}, "no such file"},
	}
	for _, c := range cases {
		_, errOut, code := runCLI(t, sampleText, append([]string{"-m", model}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
}

func TestInspectRouting(t *testing.T) {
	model := needModel(t)
	out, _ := mustRun(t, sampleText, "-m", model, "inspect", "--routing", "--text", "-")
	for _, want := range []string{"routing over", "max/mean", "KL mean"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect --routing lacks %q:\n%s", want, out)
		}
	}
	if _, errOut, code := runCLI(t, "", "-m", model, "inspect", "--routing"); code == 0 || !strings.Contains(errOut, "--text") {
		t.Errorf("--routing without --text: exit %d, %q", code, errOut)
	}
}
