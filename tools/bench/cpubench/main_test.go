package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"-shapes", "olmoe", "-types", "q8_0", "-tests", "pp16,tg8", "-threads", "1,2",
		"-reps", "5", "-max-file-gb", "1.5", "-bw-mib", "64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.shapes) != 1 || len(o.types) != 1 || len(o.tests) != 2 || len(o.threads) != 2 || o.reps != 5 ||
		o.maxFile != 1.5e9 || o.bwSize != 64<<20 || o.batch != 256 || o.mmap {
		t.Errorf("options %+v", o)
	}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"-reps", "0"}, "-reps 0"},
		{[]string{"-layers", "-1"}, "-layers -1"},
		{[]string{"-max-file-gb", "0"}, "-max-file-gb 0"},
		{[]string{"-batch", "0"}, "-batch 0"},
		{[]string{"-bw-mib", "0"}, "-bw-mib 0"},
		{[]string{"-shapes", "mixtral"}, "unknown shape"},
		{[]string{"-tests", "pp"}, "want ppN"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-nosuchflag"}, "not defined"},
	} {
		if _, err := parseFlags(c.args, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("parseFlags(%q) error %v, want %q", c.args, err, c.err)
		}
	}
}

func TestPlanOnly(t *testing.T) {
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"-plan", "-shapes", "olmoe", "-types", "q8_0", "-tests", "pp16,tg8@d16",
		"-threads", "2", "-work", "/w"}, &out, &errs)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"OLMoE-1B-7B    Q8_0      3 layers", "/w/olmoe-q8_0-3L-s1-",
		"prompt    16, decode    8  -> tg8@d16, pp16", "threads: [2]"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, out.String())
		}
	}
}
