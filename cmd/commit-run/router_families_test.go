package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// TestCommitRouterNewFamilies: the Commit Router is collected, trained and run on a
// synthetic model of each family of issue 37 (GLM-4.5, gpt-oss, Qwen3.5/3.6-MoE), and
// offloading with it computes what committed routing without offloading computes, on the
// CPU and on a simulated GPU.
func TestCommitRouterNewFamilies(t *testing.T) {
	tokens := regexp.MustCompile(`"tokens":\[[0-9,]*\]`)
	budget := regexp.MustCompile(`expert slots of (\d+) bytes.* at least (\d+) bytes`)
	for _, name := range []string{"glm4moe-q4km", "gpt-oss-mxfp4", "qwen35moe-q4km"} {
		t.Run(name, func(t *testing.T) {
			model := goldenFile(t, name)
			dir := t.TempDir()
			tr, pred := filepath.Join(dir, "m.trace"), filepath.Join(dir, "m.commit-router.gguf")
			mustRun(t, "", "-m", model, "predictor", "collect", "--text", heldOut, "--max-tokens", "600", "--window", "128", "--out", tr)
			mustRun(t, "", "-m", model, "predictor", "train", "--trace", tr, "--out", pred, "--epochs", "2")
			gen := func(extra ...string) string {
				t.Helper()
				args := append([]string{"-m", model, "--ctx", "128", "--policy", "commit", "--predictor-file", pred}, extra...)
				out, _ := mustRun(t, "", append(args, "generate", "--tokens", "1,20,30,40,50,60", "-n", "12", "--greedy", "--json")...)
				return tokens.FindString(out)
			}
			want := gen()
			if want == "" {
				t.Fatal("no tokens in generate --json")
			}
			// The smallest budget, as the refusal of a smaller one tells it, and room for
			// eight more experts: the cache then swaps experts at every layer.
			_, refusal, _ := runCLI(t, "", "-m", model, "--ctx", "128", "--policy", "commit", "--predictor-file", pred, "--device", "sim:rtx2080ti", "--gpu-mem", "1MiB",
				"generate", "--tokens", "1", "-n", "1")
			m := budget.FindStringSubmatch(refusal)
			if m == nil {
				t.Fatalf("a 1 MiB budget: %s", refusal)
			}
			least, _ := strconv.ParseInt(m[2], 10, 64)
			slot, _ := strconv.ParseInt(m[1], 10, 64)
			mem := strconv.FormatInt(least+8*slot, 10)
			for _, dev := range []string{"cpu", "sim:rtx2080ti"} {
				if got := gen("--device", dev, "--gpu-mem", mem); got != want {
					t.Errorf("%s: offloaded commit %s, committed routing %s", dev, got, want)
				}
			}
		})
	}
}
