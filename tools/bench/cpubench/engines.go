package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// sample is one engine run's outcome.
type sample struct {
	PromptTokens  int
	PromptSeconds float64
	DecodeTokens  int // single-token decode steps timed
	DecodeSeconds float64
	PeakRSS       int64 // bytes, the child process's maximum resident set (0: unknown)
	// Tokens are the generated ids, the prompt pass's first included: with the same prompt
	// and greedy sampling the engines should mostly agree, a check that both ran the same job.
	Tokens []int32
	Build  string // the engine's build, where its output says
}

func (s sample) promptRate() float64 { return tokensPerSecond(s.PromptTokens, s.PromptSeconds) }
func (s sample) decodeRate() float64 { return tokensPerSecond(s.DecodeTokens, s.DecodeSeconds) }

// rate is the tokens/s of test t from this run: the prompt pass's or the decode steps'.
func (s sample) rate(t test) float64 {
	if t.Prefill {
		return s.promptRate()
	}
	return s.decodeRate()
}

func tokensPerSecond(n int, seconds float64) float64 {
	if n <= 0 || seconds <= 0 {
		return 0
	}
	return float64(n) / seconds
}

// job is what both engines are asked to do in one run.
type job struct {
	Model   string
	Threads int
	Prompt  []int32 // token ids
	Decode  int     // single-token decode steps after the prompt pass
	Batch   int     // llama.cpp's n_batch = n_ubatch (commit-run's is fixed, prefillBatch)
	Mmap    bool    // llama.cpp memory-maps the weights instead of reading them at load
}

// ctxLen is the context both engines allocate: the prompt, the decode steps and a margin.
func (j job) ctxLen() int { return len(j.Prompt) + j.Decode + 8 }

// engine runs jobs.
type engine struct {
	Name string
	args func(job) []string // command line, program first
	// parse reads the command's stdout; j says what was asked, to check it was done.
	parse   func(stdout []byte, j job) (sample, error)
	timeout time.Duration
}

// commitRun drives `commit-run generate`. prompt_seconds times the prompt pass, which also
// yields the first generated token; decode_seconds times the rest, one single-token forward
// pass per further token (engine/session.go Generate). So -n Decode+1 gives Decode timed steps,
// and a prompt-only run asks for one token (-n 0 would mean "until the context is full").
func commitRun(bin string, timeout time.Duration) engine {
	return engine{Name: "commit-run", timeout: timeout, parse: parseCommitRun, args: func(j job) []string {
		return []string{bin, "generate", "-m", j.Model, "--threads", strconv.Itoa(j.Threads),
			"--ctx", strconv.Itoa(j.ctxLen()), "--kv-type", "f16",
			"--tokens", joinIDs(j.Prompt), "-n", strconv.Itoa(j.Decode + 1),
			"--greedy", "--ignore-eos", "--json"}
	}}
}

// llamaCpp drives tools/golden/ref/bench.mjs: the prompt evaluated in batches of j.Batch, the
// last token's logits sampled (the first generated token), then j.Decode timed steps with no
// untimed warm-up steps, as commit-run has none.
func llamaCpp(node, script string, timeout time.Duration) engine {
	return engine{Name: "llama.cpp", timeout: timeout, parse: parseLlamaCpp, args: func(j job) []string {
		a := []string{node, script, j.Model, "--threads", strconv.Itoa(j.Threads),
			"--prompt-ids", joinIDs(j.Prompt), "--tokens", strconv.Itoa(j.Decode), "--warmup", "0",
			"--batch", strconv.Itoa(j.Batch), "--ctx", strconv.Itoa(j.ctxLen()),
			"--kv", "f16", "--flash", "off"}
		if !j.Mmap {
			a = append(a, "--no-mmap")
		}
		return a
	}}
}

func joinIDs(ids []int32) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(id)))
	}
	return b.String()
}

// run executes one job and parses its outcome.
func (e engine) run(ctx context.Context, j job) (sample, error) {
	out, rss, err := e.exec(ctx, j)
	if err != nil {
		return sample{PeakRSS: rss}, err
	}
	s, err := e.parse(out, j)
	if err != nil {
		return sample{PeakRSS: rss}, fmt.Errorf("%s: %w", e.Name, err)
	}
	s.PeakRSS = rss
	return s, nil
}

// exec runs the engine's command for j and returns its stdout and peak resident memory. A
// failure names the engine and carries the tail of the child's stderr, which is where both
// engines explain themselves.
func (e engine) exec(ctx context.Context, j job) ([]byte, int64, error) {
	if e.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.timeout)
		defer cancel()
	}
	argv := e.args(j)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A killed child's own children could hold its output open; stop waiting for them.
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	rss := peakRSS(cmd.ProcessState)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v", e.timeout)
		}
		return nil, rss, fmt.Errorf("%s: %w%s", e.Name, err, tail(stderr.String()))
	}
	return stdout.Bytes(), rss, nil
}

// tail is the last lines of a child's stderr, for an error message.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > 4 {
		lines = lines[len(lines)-4:]
	}
	return ": " + strings.Join(lines, " | ")
}

// lastJSONLine is the last line of out that starts with '{': the engines print one JSON
// object, but a library may print something before it.
func lastJSONLine(out []byte) ([]byte, error) {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if l := bytes.TrimSpace(lines[i]); len(l) > 0 && l[0] == '{' {
			return l, nil
		}
	}
	return nil, fmt.Errorf("no JSON object in its output %q", clip(string(out), 200))
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// commitRunOutput is the part of `commit-run generate --json` read here.
type commitRunOutput struct {
	Tokens        []int32  `json:"tokens"`
	PromptTokens  int      `json:"prompt_tokens"`
	PromptSeconds *float64 `json:"prompt_seconds"`
	DecodeSeconds *float64 `json:"decode_seconds"`
}

func parseCommitRun(out []byte, j job) (sample, error) {
	line, err := lastJSONLine(out)
	if err != nil {
		return sample{}, err
	}
	var o commitRunOutput
	if err := json.Unmarshal(line, &o); err != nil {
		return sample{}, fmt.Errorf("read its JSON: %w", err)
	}
	if o.PromptSeconds == nil || o.DecodeSeconds == nil {
		return sample{}, fmt.Errorf("its JSON has no prompt_seconds or decode_seconds: %s", clip(string(line), 200))
	}
	if o.PromptTokens != len(j.Prompt) {
		return sample{}, fmt.Errorf("evaluated a %d-token prompt, asked for %d", o.PromptTokens, len(j.Prompt))
	}
	// The first token comes from the prompt pass; every further one is a timed step.
	if got := len(o.Tokens) - 1; got != j.Decode {
		return sample{}, fmt.Errorf("decoded %d tokens after the prompt pass, asked for %d", max(got, 0), j.Decode)
	}
	return sample{PromptTokens: o.PromptTokens, PromptSeconds: *o.PromptSeconds,
		DecodeTokens: j.Decode, DecodeSeconds: *o.DecodeSeconds, Tokens: o.Tokens}, nil
}

// llamaOutput is bench.mjs's JSON line, the part read here.
type llamaOutput struct {
	Threads       int      `json:"threads"`
	PromptTokens  int      `json:"prompt_tokens"`
	DecodeTokens  *int     `json:"decode_tokens"`
	PromptSeconds *float64 `json:"prompt_seconds"`
	DecodeSeconds *float64 `json:"decode_seconds"`
	Tokens        []int32  `json:"tokens"`
	BatchSize     int      `json:"batch_size"`
	KVType        string   `json:"kv_type"`
	FlashAttn     any      `json:"flash_attention"`
	LlamaCpp      string   `json:"llama_cpp"`
	NodeLlamaCpp  string   `json:"node_llama_cpp"`
	CPUVariant    string   `json:"cpu_variant"`
}

func parseLlamaCpp(out []byte, j job) (sample, error) {
	o, err := readLlamaOutput(out)
	if err != nil {
		return sample{}, err
	}
	switch {
	case o.PromptTokens != len(j.Prompt):
		return sample{}, fmt.Errorf("evaluated a %d-token prompt, asked for %d", o.PromptTokens, len(j.Prompt))
	case *o.DecodeTokens != j.Decode:
		return sample{}, fmt.Errorf("decoded %d tokens, asked for %d", *o.DecodeTokens, j.Decode)
	case o.Threads != j.Threads:
		return sample{}, fmt.Errorf("ran on %d threads, asked for %d", o.Threads, j.Threads)
	case o.KVType != "f16" || o.FlashAttn != false:
		return sample{}, fmt.Errorf("ran with a %s KV cache and flash attention %v, asked for f16 and off", o.KVType, o.FlashAttn)
	}
	return sample{PromptTokens: o.PromptTokens, PromptSeconds: *o.PromptSeconds,
		DecodeTokens: *o.DecodeTokens, DecodeSeconds: *o.DecodeSeconds, Tokens: o.Tokens,
		Build: fmt.Sprintf("%s through node-llama-cpp %s, CPU backend %s", o.LlamaCpp, o.NodeLlamaCpp, o.CPUVariant)}, nil
}

func readLlamaOutput(out []byte) (llamaOutput, error) {
	line, err := lastJSONLine(out)
	if err != nil {
		return llamaOutput{}, err
	}
	var o llamaOutput
	if err := json.Unmarshal(line, &o); err != nil {
		return llamaOutput{}, fmt.Errorf("read its JSON: %w", err)
	}
	if o.PromptSeconds == nil || o.DecodeSeconds == nil || o.DecodeTokens == nil {
		return llamaOutput{}, fmt.Errorf("its JSON has no prompt_seconds, decode_seconds or decode_tokens (an older bench.mjs?): %s", clip(string(line), 200))
	}
	return o, nil
}
