package main

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var testJob = job{Model: "m.gguf", Threads: 2, Prompt: []int32{5, 6, 7}, Decode: 4, Batch: 256}

func TestCommitRunArgs(t *testing.T) {
	got := commitRun("bin/commit-run", 0).args(testJob)
	want := []string{"bin/commit-run", "generate", "-m", "m.gguf", "--threads", "2", "--ctx", "15",
		"--kv-type", "f16", "--tokens", "5,6,7", "-n", "5", "--greedy", "--ignore-eos", "--json"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("args\n got %q\nwant %q", got, want)
	}
}

func TestLlamaCppArgs(t *testing.T) {
	got := llamaCpp("node", "bench.mjs", 0).args(testJob)
	want := []string{"node", "bench.mjs", "m.gguf", "--threads", "2", "--prompt-ids", "5,6,7", "--tokens", "4",
		"--warmup", "0", "--batch", "256", "--ctx", "15", "--kv", "f16", "--flash", "off", "--no-mmap"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("args\n got %q\nwant %q", got, want)
	}
	j := testJob
	j.Mmap = true
	if got := llamaCpp("node", "bench.mjs", 0).args(j); slices.Contains(got, "--no-mmap") {
		t.Errorf("with mmap: %q", got)
	}
}

func TestParseCommitRun(t *testing.T) {
	for _, c := range []struct {
		name, out string
		want      sample
		err       string
	}{
		{name: "ok",
			out:  `{"tokens":[1,2,3,4,5],"text":"x","stop":"length","prompt_tokens":3,"prompt_seconds":0.5,"decode_seconds":2,"seed":1}`,
			want: sample{PromptTokens: 3, PromptSeconds: 0.5, DecodeTokens: 4, DecodeSeconds: 2, Tokens: []int32{1, 2, 3, 4, 5}}},
		{name: "noise before",
			out:  "loading...\n{\"tokens\":[1,2,3,4,5],\"prompt_tokens\":3,\"prompt_seconds\":0.5,\"decode_seconds\":2}\n",
			want: sample{PromptTokens: 3, PromptSeconds: 0.5, DecodeTokens: 4, DecodeSeconds: 2, Tokens: []int32{1, 2, 3, 4, 5}}},
		{name: "stopped early", out: `{"tokens":[1,2],"prompt_tokens":3,"prompt_seconds":0.5,"decode_seconds":2}`,
			err: "decoded 1 tokens after the prompt pass, asked for 4"},
		{name: "no tokens", out: `{"tokens":[],"prompt_tokens":3,"prompt_seconds":0.5,"decode_seconds":0}`,
			err: "decoded 0 tokens"},
		{name: "short prompt", out: `{"tokens":[1,2,3,4,5],"prompt_tokens":2,"prompt_seconds":0.5,"decode_seconds":2}`,
			err: "evaluated a 2-token prompt, asked for 3"},
		{name: "no timing", out: `{"tokens":[1,2,3,4,5],"prompt_tokens":3}`, err: "no prompt_seconds"},
		{name: "not JSON", out: "error: no such file", err: "no JSON object"},
		{name: "bad JSON", out: `{"tokens":"x"}`, err: "read its JSON"},
	} {
		got, err := parseCommitRun([]byte(c.out), testJob)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}

func TestParseLlamaCpp(t *testing.T) {
	const good = `{"engine":"llama.cpp","model":"/m.gguf","threads":2,"prompt_tokens":3,"decode_tokens":4,` +
		`"prompt_seconds":0.25,"decode_seconds":1,"prompt_tok_s":12,"decode_tok_s":4,"ms_per_token":250,` +
		`"tokens":[9,8,7,6,5],"batch_size":256,"context_size":256,"kv_type":"f16","flash_attention":false,"mmap":false,` +
		`"llama_cpp":"v0.5.0 de3ff815ea7d","node_llama_cpp":"3.22.1","cpu_variant":"haswell"}`
	wantGood := sample{PromptTokens: 3, PromptSeconds: 0.25, DecodeTokens: 4, DecodeSeconds: 1, Tokens: []int32{9, 8, 7, 6, 5},
		Build: "v0.5.0 de3ff815ea7d through node-llama-cpp 3.22.1, CPU backend haswell"}
	for _, c := range []struct {
		name, out string
		err       string
	}{
		{name: "ok", out: good},
		{name: "threads", out: strings.Replace(good, `"threads":2`, `"threads":1`, 1), err: "ran on 1 threads, asked for 2"},
		{name: "decode", out: strings.Replace(good, `"decode_tokens":4`, `"decode_tokens":3`, 1), err: "decoded 3 tokens, asked for 4"},
		{name: "prompt", out: strings.Replace(good, `"prompt_tokens":3`, `"prompt_tokens":4`, 1), err: "4-token prompt"},
		{name: "kv", out: strings.Replace(good, `"kv_type":"f16"`, `"kv_type":"f32"`, 1), err: "f32 KV cache"},
		{name: "flash", out: strings.Replace(good, `"flash_attention":false`, `"flash_attention":"auto"`, 1), err: "flash attention auto"},
		{name: "old bench.mjs", out: `{"engine":"llama.cpp","threads":2,"prompt_tokens":3,"decode_tok_s":4}`, err: "an older bench.mjs"},
		{name: "crash", out: "", err: "no JSON object"},
	} {
		got, err := parseLlamaCpp([]byte(c.out), testJob)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, wantGood) {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, wantGood)
		}
	}
}

func TestSampleRate(t *testing.T) {
	s := sample{PromptTokens: 512, PromptSeconds: 2, DecodeTokens: 64, DecodeSeconds: 4}
	if r := s.rate(test{Prefill: true, N: 512}); r != 256 {
		t.Errorf("prompt rate %g", r)
	}
	if r := s.rate(test{N: 64}); r != 16 {
		t.Errorf("decode rate %g", r)
	}
	if r := (sample{PromptTokens: 3}).rate(test{Prefill: true, N: 3}); r != 0 {
		t.Errorf("rate without a time %g", r)
	}
}

// TestEngineFailure runs a command that fails and one that hangs: the error names the engine
// and carries the child's stderr, or the timeout.
func TestEngineFailure(t *testing.T) {
	sh := func(script string, timeout time.Duration) engine {
		return engine{Name: "fake", timeout: timeout, parse: parseCommitRun,
			args: func(job) []string { return []string{"sh", "-c", script} }}
	}
	_, err := sh("echo 'bad model' >&2; exit 3", 0).run(context.Background(), testJob)
	if err == nil || !strings.Contains(err.Error(), "fake: exit status 3: bad model") {
		t.Errorf("failing command: %v", err)
	}
	_, err = sh("exec sleep 5", 100*time.Millisecond).run(context.Background(), testJob)
	if err == nil || !strings.Contains(err.Error(), "timed out after 100ms") {
		t.Errorf("hanging command: %v", err)
	}
	_, err = sh("echo '{}'", 0).run(context.Background(), testJob)
	if err == nil || !strings.Contains(err.Error(), "fake: its JSON has no prompt_seconds") {
		t.Errorf("unparsable output: %v", err)
	}
}
