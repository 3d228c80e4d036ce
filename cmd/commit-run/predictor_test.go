package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	bundledQwen    = "../../models/testdata/tinymoe-qwen2moe.gguf"
	bundledMixtral = "../../models/testdata/tinymoe-mixtral.gguf"
	heldOut        = "../../models/testdata/war-and-peace-heldout.txt"
)

// collect, train and eval end to end on a few thousand tokens, writing the predictor to a
// file of its own; then commit with it in eval ppl.
func TestPredictorCollectTrainEval(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "x.trace")
	pred := filepath.Join(dir, "x.commit-router.gguf")
	mustRun(t, "", "-m", bundledQwen, "predictor", "collect", "--text", heldOut, "--max-tokens", "3000", "--window", "128", "--out", tr)
	out, errOut := mustRun(t, "", "-m", bundledQwen, "predictor", "train", "--trace", tr, "--out", pred, "--epochs", "2")
	if !strings.Contains(errOut, "epoch   2") || !strings.Contains(out, "wrote "+pred) {
		t.Errorf("train printed %q / %q", out, errOut)
	}
	out, _ = mustRun(t, "", "-m", bundledQwen, "--predictor-file", pred, "predictor", "eval", "--trace", tr)
	for _, want := range []string{"frequency baseline", "next token's first MoE layer", "0/4 KL", "4/4 share"} {
		if !strings.Contains(out, want) {
			t.Errorf("predictor eval lacks %q:\n%s", want, out)
		}
	}
	// The paper's data: the first generated tokens of prompts.
	gen := filepath.Join(dir, "gen.trace")
	prompts := filepath.Join(dir, "prompts.txt")
	os.WriteFile(prompts, []byte("The Emperor said\n\nPierre looked at\n"), 0o644)
	_, errOut = mustRun(t, "", "-m", bundledQwen, "predictor", "collect", "--prompts", prompts, "--tokens", "8", "--out", gen)
	if !strings.Contains(errOut, "recorded 16 generated tokens of 2 prompts") {
		t.Errorf("collect --prompts: %q", errOut)
	}
	info, _ := mustRun(t, "", "trace", "info", gen)
	if !strings.Contains(info, "16 tokens") {
		t.Errorf("trace info of the generated tokens:\n%s", info)
	}
	out, _ = mustRun(t, "", "-m", bundledQwen, "--policy", "commit", "--predictor-file", pred, "eval", "ppl", "--text", heldOut, "--max-tokens", "300", "--window", "128")
	for _, want := range []string{"perplexity", "one token per pass", "layer 1", "accuracy"} {
		if !strings.Contains(out, want) {
			t.Errorf("eval ppl under commit lacks %q:\n%s", want, out)
		}
	}
}

func TestPredictorBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.trace")
	mustRun(t, "", "-m", bundledQwen, "predictor", "collect", "--text", heldOut, "--max-tokens", "300", "--window", "128", "--out", filepath.Join(dir, "ok.trace"))
	corrupt := filepath.Join(dir, "corrupt.gguf")
	b, err := os.ReadFile("../../models/testdata/tinymoe-qwen2moe.commit-router.gguf")
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	os.WriteFile(corrupt, b[:len(b)-100], 0o644)
	os.WriteFile(empty, nil, 0o644)
	mixtralRouter := "../../models/testdata/tinymoe-mixtral.commit-router.gguf"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"predictor", "train"}, "--trace"},
		{[]string{"predictor", "collect", "--prompts", heldOut, "--text", heldOut, "--out", filepath.Join(dir, "c")}, "either --text or --prompts"},
		{[]string{"predictor", "collect", "--prompts", heldOut, "--tokens", "0", "--out", filepath.Join(dir, "c")}, "--tokens"},
		{[]string{"predictor", "train", "--trace", empty}, "empty.trace"},
		{[]string{"predictor", "train", "--trace", filepath.Join(dir, "ok.trace"), "--lr", "0"}, "--lr"},
		{[]string{"predictor", "train", "--trace", filepath.Join(dir, "ok.trace"), "--init", "zeros"}, "--init"},
		{[]string{"predictor", "collect", "--text", heldOut}, "--out"},
		{[]string{"predictor", "collect", "--text", heldOut, "--out", filepath.Join(dir, "b"), "--max-tokens", "-1"}, "--max-tokens"},
		{[]string{"--predictor-file", mixtralRouter, "predictor", "eval", "--trace", filepath.Join(dir, "ok.trace")}, "tinymoe-mixtral"},
		{[]string{"--predictor-file", corrupt, "predictor", "eval", "--trace", filepath.Join(dir, "ok.trace")}, "corrupt.gguf"},
		{[]string{"--policy", "commit", "--predictor-file", mixtralRouter, "generate", "--prompt", "a", "-n", "2"}, "tinymoe-mixtral"},
		{[]string{"--policy", "commit", "--owa", "a1=2,range=7", "generate", "--prompt", "a", "-n", "2"}, "range"},
		{[]string{"--owa", "neutral", "generate", "--prompt", "a", "-n", "2"}, "--owa"},
		{[]string{"--gpu-mem", "1GiB", "--policy", "ondemand", "--cross-token", "generate", "--prompt", "a", "-n", "2"}, "--cross-token"},
		{[]string{"predictor", "tune", "--text", heldOut, "--alphas", "1,x"}, "--alphas"},
	} {
		_, errOut, code := runCLI(t, "", append([]string{"-m", bundledQwen}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
	// A model without a Commit Router: commit says how to train one.
	_, errOut, code := runCLI(t, "", "-m", "../../models/testdata/tiny.gguf", "--policy", "commit", "generate", "--prompt", "a", "-n", "2")
	if code == 0 || !strings.Contains(errOut, "predictor train") {
		t.Errorf("commit without a Commit Router: exit %d, %q", code, errOut)
	}
}

func TestTokenDropFlags(t *testing.T) {
	out, _ := mustRun(t, "", "-m", bundledQwen, "--capacity-factor", "1.5", "--drop-metric", "random", "eval", "ppl", "--text", heldOut, "--max-tokens", "600", "--window", "256")
	if !strings.Contains(out, "dropped ") || !strings.Contains(out, "by random") {
		t.Errorf("eval ppl with token drop:\n%s", out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--capacity-factor", "-1"}, "--capacity-factor"},
		{[]string{"--capacity-factor", "1", "--drop-metric", "best"}, "--drop-metric"},
	} {
		args := append([]string{"-m", bundledQwen}, c.args...)
		_, errOut, code := runCLI(t, "", append(args, "eval", "ppl", "--text", heldOut)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %q", c.args, code, errOut)
		}
	}
}
