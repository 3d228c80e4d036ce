package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/synth"
)

// runCLI runs the command tree in-process with stdin as input and returns stdout, stderr and
// the exit status.
func runCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errOut, nil)
	return out.String(), errOut.String(), code
}

// tinyModel is the bundled test model, relative to the repository root (tests run in
// cmd/commit-run).
var tinyModel = filepath.Join("..", "..", defaultModel)

// needModel returns the bundled model, which every checkout has.
func needModel(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(tinyModel); err != nil {
		t.Fatalf("end-to-end tests need the bundled model %s: %v", defaultModel, err)
	}
	return tinyModel
}

// mustRun runs the CLI and fails the test unless it exits 0.
func mustRun(t *testing.T, stdin string, args ...string) (string, string) {
	t.Helper()
	out, errOut, code := runCLI(t, stdin, args...)
	if code != 0 {
		t.Fatalf("commit-run %s: exit %d\nstderr: %s", strings.Join(args, " "), code, errOut)
	}
	return out, errOut
}

// tinyInfo reads the model's shape through inspect --json, which is itself under test here.
func tinyInfo(t *testing.T, model string) inspectJSON {
	t.Helper()
	out, _ := mustRun(t, "", "inspect", "--json", model)
	var info inspectJSON
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, out)
	}
	if info.Vocab < 4 || info.Layers <= 0 || info.Architecture == "" {
		t.Fatalf("inspect --json: implausible shape %+v", info)
	}
	return info
}

func TestInspect(t *testing.T) {
	model := needModel(t)
	info := tinyInfo(t, model)
	out, _ := mustRun(t, "", "inspect", model)
	for _, want := range []string{"architecture", info.Architecture, "layers", "d_model", "vocab", "experts", "expert weights", "tensor types"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	// With no FILE, inspect reads -m.
	if out2, _ := mustRun(t, "", "inspect", "-m", model); out2 != out {
		t.Errorf("inspect -m differs from inspect FILE")
	}
}

// promptIDsArg holds ids that exist in any vocabulary of at least 4 tokens.
const promptIDsArg = "1,2,3"

func TestGenerateJSON(t *testing.T) {
	model := needModel(t)
	info := tinyInfo(t, model)
	for _, n := range []int{1, 5} {
		out, _ := mustRun(t, "", "generate", "-m", model, "--tokens", promptIDsArg,
			"-n", fmt.Sprint(n), "--greedy", "--ignore-eos", "--json")
		var res generateJSON
		if err := json.Unmarshal([]byte(out), &res); err != nil || strings.Count(out, "\n") != 1 {
			t.Fatalf("-n %d: want one JSON line, got %q (%v)", n, out, err)
		}
		if len(res.Tokens) != n || res.Stop != "length" || res.PromptTokens != 3 {
			t.Errorf("-n %d: tokens %v, stop %q, prompt_tokens %d; want %d tokens, stop length, 3 prompt tokens",
				n, res.Tokens, res.Stop, res.PromptTokens, n)
		}
		for _, id := range res.Tokens {
			if id < 0 || int(id) >= info.Vocab {
				t.Errorf("-n %d: token %d outside the vocabulary of %d", n, id, info.Vocab)
			}
		}
	}
}

// Greedy decoding is deterministic, and a seeded sampler replays.
func TestGenerateDeterministic(t *testing.T) {
	model := needModel(t)
	for _, mode := range [][]string{{"--greedy"}, {"--seed", "7", "--temp", "1"}} {
		args := append([]string{"generate", "-m", model, "--tokens", promptIDsArg, "-n", "6", "--ignore-eos", "--json"}, mode...)
		a, _ := mustRun(t, "", args...)
		b, _ := mustRun(t, "", args...)
		var ra, rb generateJSON
		json.Unmarshal([]byte(a), &ra)
		json.Unmarshal([]byte(b), &rb)
		if fmt.Sprint(ra.Tokens) != fmt.Sprint(rb.Tokens) {
			t.Errorf("%v: runs differ: %v vs %v", mode, ra.Tokens, rb.Tokens)
		}
	}
}

func TestGenerateStream(t *testing.T) {
	model := needModel(t)
	out, errOut := mustRun(t, "", "generate", "-m", model, "--prompt", "Hello", "-n", "4", "--greedy", "--ignore-eos")
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("stdout %q does not end the line", out)
	}
	for _, want := range []string{"prompt:", "decode:", "tokens/s", "stop: length"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

func TestGenerateTokenOutOfVocab(t *testing.T) {
	model := needModel(t)
	info := tinyInfo(t, model)
	_, errOut, code := runCLI(t, "", "generate", "-m", model, "--tokens", fmt.Sprintf("1,%d", info.Vocab), "-n", "1")
	if code != 1 || !strings.Contains(errOut, "out of range") {
		t.Errorf("code %d, stderr %q; want an out-of-range error", code, errOut)
	}
}

func TestLogits(t *testing.T) {
	model := needModel(t)
	info := tinyInfo(t, model)
	out, _ := mustRun(t, "", "logits", "-m", model, "--tokens", promptIDsArg)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %d", len(lines))
	}
	for i, line := range lines {
		var l struct {
			Pos   int       `json:"pos"`
			Token int32     `json:"token"`
			Probs []float64 `json:"probs"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		sum := 0.0
		for _, p := range l.Probs {
			sum += p
		}
		if l.Pos != i || l.Token != int32(i+1) || len(l.Probs) != info.Vocab || math.Abs(sum-1) > 1e-3 {
			t.Errorf("line %d: pos %d token %d, %d probs summing to %v; want pos %d token %d, %d probs summing to 1",
				i, l.Pos, l.Token, len(l.Probs), sum, i, i+1, info.Vocab)
		}
	}

	out, _ = mustRun(t, "", "logits", "-m", model, "--tokens", promptIDsArg, "--top", "3")
	for i, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var l struct {
			Top [][2]float64 `json:"top"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || len(l.Top) != min(3, info.Vocab) {
			t.Fatalf("--top line %d: %q (%v)", i, line, err)
		}
		if l.Top[0][1] < l.Top[1][1] {
			t.Errorf("--top line %d not sorted: %v", i, l.Top)
		}
	}
}

func TestEvalPPL(t *testing.T) {
	model := needModel(t)
	text := filepath.Join(t.TempDir(), "text.txt")
	os.WriteFile(text, []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 8)), 0o644)
	out, _ := mustRun(t, "", "eval", "ppl", "-m", model, "--text", text, "--window", "32", "--json")
	var r pplJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	if r.Tokens <= 0 || r.Perplexity < 1 || r.BitsPerByte <= 0 {
		t.Errorf("implausible result %+v", r)
	}
	out, _ = mustRun(t, "", "eval", "ppl", "-m", model, "--text", text, "--window", "32")
	if !strings.Contains(out, "perplexity") || !strings.Contains(out, "bits/byte") {
		t.Errorf("text output: %q", out)
	}
}

// Piped chat answers each line, /reset clears and /exit stops reading.
func TestChatPiped(t *testing.T) {
	model := needModel(t)
	in := "Hello\n\n/reset\nHi again\n/exit\nnever read\n"
	out, errOut := mustRun(t, in, "chat", "-m", model, "-n", "3", "--greedy", "--system", "Be brief.")
	// Each reply ends its line; a reply may hold newlines of its own.
	if got := strings.Count(out, "\n"); got < 2 {
		t.Errorf("want 2 replies, got %d lines: %q (stderr %q)", got, out, errOut)
	}
	if strings.Contains(out, "> ") {
		t.Errorf("piped chat printed a prompt: %q", out)
	}
}

// Offloading, on the CPU and on a simulated GPU, with every policy that keeps the numbers,
// generates exactly the tokens of the run with every weight in memory.
func TestGenerateOffloaded(t *testing.T) {
	model := needModel(t)
	base := []string{"generate", "-m", model, "--tokens", promptIDsArg, "-n", "6", "--ignore-eos", "--greedy", "--json"}
	want, _ := mustRun(t, "", base...)
	var rw generateJSON
	json.Unmarshal([]byte(want), &rw)
	for _, extra := range [][]string{
		{"--gpu-mem", "3.4MiB"},
		{"--gpu-mem", "3.4MiB", "--policy", "prefetch", "--predictor", "frequency", "--eviction", "lfu"},
		{"--device", "sim:rtx4090", "--gpu-mem", "8.5MiB", "--policy", "cpu-miss", "--host-bw", "30GB"},
		{"--device", "sim:h100-pcie"},
		// llama.cpp's split as its --n-cpu-moe runs, with no budget: the card's memory.
		{"--device", "sim:rtx2080ti", "--cpu-moe-layers", "2"},
		{"--device", "sim:rtx2080ti", "--policy", "static-cache", "--cpu-moe-layers", "3"},
	} {
		got, _ := mustRun(t, "", append(extra, base...)...)
		var rg generateJSON
		json.Unmarshal([]byte(got), &rg)
		if len(rw.Tokens) == 0 || fmt.Sprint(rg.Tokens) != fmt.Sprint(rw.Tokens) {
			t.Errorf("%v: tokens %v, want %v", extra, rg.Tokens, rw.Tokens)
		}
	}
}

func TestOffloadFlagsBadInput(t *testing.T) {
	model := needModel(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "prefetch"}, "--gpu-mem"},
		{[]string{"--policy", "bogus"}, "unknown expert policy \"bogus\""},
		{[]string{"--owa", "a1=abc"}, "--owa: owa \"a1=abc\": a1=abc: want a number"},
		{[]string{"--owa", "a1=abc", "--policy", "commit", "--gpu-mem", "64MiB"}, "a1=abc: want a number"},
		{[]string{"--ctx", "16777216"}, "--ctx 16777216: want 0 (the model's) to 4194304"},
		{[]string{"--gpu-mem", "-1GiB"}, "--gpu-mem"},
		{[]string{"--gpu-mem", "lots"}, "--gpu-mem"},
		{[]string{"--gpu-mem", "1MiB"}, "at least"},
		{[]string{"--gpu-mem", "8MiB", "--policy", "fastest"}, "unknown expert policy"},
		{[]string{"--gpu-mem", "8MiB", "--eviction", "random"}, "--eviction"},
		{[]string{"--gpu-mem", "8MiB", "--policy", "prefetch", "--predictor", "psychic"}, "predictor"},
		{[]string{"--gpu-mem", "8MiB", "--policy", "commit", "--predictor", "accuracy=0.9"}, "Commit Router"},
		{[]string{"--device", "sim:rtx4090", "--gpu-mem", "30GiB"}, "exceeds"},
		{[]string{"--device", "sim:", "--gpu-mem", "8MiB"}, "profile"},
		{[]string{"--device", "sim:/nonexistent/card.json"}, "no such file"},
		{[]string{"--device", "sim:rtx4090", "--host-bw", "0"}, "--host-bw"},
		{[]string{"--device", "sim:rtx4090", "--host-flops", "fast"}, "--host-flops"},
		{[]string{"--device", "sim:rtx4090", "--host-flops", "-3G"}, "--host-flops"},
		{[]string{"--device", "sim:rtx4090", "--host", "pentium-ii"}, "unknown host profile"},
		{[]string{"--device", "sim:rtx4090", "--host", "/nonexistent/host.json"}, "no such file"},
		{[]string{"--device", "cpu", "--cpu-moe-layers", "2"}, "offload on cpu: no card's memory to fill: give a device memory budget (--gpu-mem)"},
		{[]string{"--device", "sim:rtx4090", "--cpu-moe-layers", "9"}, "static with 9 host layers: the model has 4 MoE layers"},
		{[]string{"--device", "sim:rtx4090", "--cpu-moe-layers", "2", "--policy", "hot"}, "--gpu-mem"},
	}
	for _, c := range cases {
		args := append(c.args, "generate", "-m", model, "--prompt", "Hello", "-n", "1")
		_, errOut, code := runCLI(t, "", args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
}

// goldenFile writes synth's golden model of the given name into a temporary folder.
func goldenFile(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".gguf")
	if _, err := synth.WriteGolden(name, path); err != nil {
		t.Fatal(err)
	}
	return path
}
