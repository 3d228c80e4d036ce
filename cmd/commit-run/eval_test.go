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

// TestClearMessages: errors a new user met in the reliability probe say what is wrong once.
func TestClearMessages(t *testing.T) {
	model := needModel(t)
	b, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	cut, bad := t.TempDir()+"/cut.gguf", t.TempDir()+"/bad.txt"
	os.WriteFile(cut, b[:1000], 0o644)
	os.WriteFile(bad, []byte("hello\xfe world"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"generate", "-m", cut, "--prompt", "x"}, "open " + cut + ": "},
		{[]string{"bench", "-m", model, "--tokens", "0"}, "--tokens 0: want 2 or more"},
		{[]string{"--ctx", "300", "generate", "-m", model, "--prompt", strings.Repeat("prince ", 400), "-n", "1"}, "the model was trained on 256"},
		{[]string{"generate", "-m", model, "--prompt", "ab\xffcd"}, "--prompt: not valid UTF-8 at byte 2"},
		{[]string{"logits", "-m", model, "--prompt", "\xc3"}, "--prompt: not valid UTF-8 at byte 0"},
		{[]string{"eval", "ppl", "-m", model, "--text", bad}, "--text " + bad + ": not valid UTF-8 at byte 5"},
	} {
		_, errOut, code := runCLI(t, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) || strings.Count(errOut, cut) > 1 || strings.Contains(errOut, "strconv") {
			t.Errorf("%v: exit %d, %q; want one error saying %q", c.args, code, errOut, c.want)
		}
	}
}
