package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// report is everything a benchmark run found; --json prints it as is.
type report struct {
	Notes     []string    `json:"notes"` // how the numbers were taken, as above the table
	Host      host        `json:"host"`
	Settings  settings    `json:"settings"`
	Bandwidth []bandwidth `json:"bandwidth"`
	Results   []result    `json:"results"`
}

type host struct {
	CPU     string `json:"cpu"`
	Cores   int    `json:"cores"`
	L3Bytes int64  `json:"l3_bytes"`
}

type settings struct {
	Reps      int    `json:"reps"`
	Seed      uint64 `json:"seed"`
	Batch     int    `json:"llama_cpp_batch"` // n_batch = n_ubatch
	LlamaMmap bool   `json:"llama_cpp_mmap"`
	CommitRun string `json:"commit_run"` // binary and source revision
	LlamaCpp  string `json:"llama_cpp"`  // release, node-llama-cpp version, CPU backend
}

// result is one test on one file at one thread count.
type result struct {
	Shape     string       `json:"shape"`
	Model     string       `json:"model"` // the real model the shape is
	Type      string       `json:"type"`  // llama.cpp's name
	Recipe    string       `json:"recipe"`
	File      string       `json:"file"`
	FileBytes int64        `json:"file_bytes"`
	Layers    int          `json:"layers"`
	Threads   int          `json:"threads"`
	Test      string       `json:"test"`
	Prompt    int          `json:"prompt_tokens"`
	Decode    int          `json:"decode_tokens"`
	CommitRun engineResult `json:"commit_run"`
	LlamaCpp  engineResult `json:"llama_cpp"`
	Ratio     *float64     `json:"ratio"` // commit-run / llama.cpp tokens/s
	Limit     *limit       `json:"limit,omitempty"`
}

// engineResult is one engine's runs of a test.
type engineResult struct {
	TokS    float64   `json:"tok_s"` // median of Samples; 0 when no run succeeded
	SD      float64   `json:"sd"`
	Samples []float64 `json:"samples"`
	PeakRSS int64     `json:"peak_rss_bytes"` // the largest over the runs
	Errors  []string  `json:"errors,omitempty"`
}

func (e *engineResult) add(tokS float64, rss int64, err error) {
	e.PeakRSS = max(e.PeakRSS, rss)
	if err != nil {
		e.Errors = append(e.Errors, err.Error())
		return
	}
	e.Samples = append(e.Samples, tokS)
	e.TokS, e.SD = median(e.Samples), stddev(e.Samples)
}

// limit is a decode test's physical limit: the bytes a token reads over the memory's read
// bandwidth at the test's thread count.
type limit struct {
	Traffic       traffic  `json:"traffic"`
	KVPositions   float64  `json:"kv_positions"` // mean cache length over the decode steps
	BytesPerToken float64  `json:"bytes_per_token"`
	GBps          float64  `json:"bandwidth_gb_per_s"`
	TokS          float64  `json:"tok_s"`
	CommitRun     *float64 `json:"commit_run_fraction"` // measured / limit
	LlamaCpp      *float64 `json:"llama_cpp_fraction"`
}

// newLimit is decode's limit for a file's traffic after a prompt of prompt tokens.
func newLimit(t traffic, prompt, steps int, gbps float64) *limit {
	l := &limit{Traffic: t, KVPositions: meanPositions(prompt, steps), GBps: gbps}
	l.BytesPerToken = t.perToken(l.KVPositions)
	if l.BytesPerToken > 0 {
		l.TokS = gbps * 1e9 / l.BytesPerToken
	}
	return l
}

// finish fills the fields computed from the engines' medians.
func (r *result) finish() {
	r.Ratio = ratio(r.CommitRun.TokS, r.LlamaCpp.TokS)
	if r.Limit != nil {
		r.Limit.CommitRun = ratio(r.CommitRun.TokS, r.Limit.TokS)
		r.Limit.LlamaCpp = ratio(r.LlamaCpp.TokS, r.Limit.TokS)
	}
}

func writeJSON(w io.Writer, r *report) error {
	withNotes := *r
	withNotes.Notes = notes(r)
	b, err := json.MarshalIndent(&withNotes, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the report: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// notes say how the numbers were taken, above the table.
func notes(r *report) []string {
	s := r.Settings
	var bw []string
	for _, b := range r.Bandwidth {
		var others []string
		for _, x := range b.Rates {
			others = append(others, fmt.Sprintf("%s %.1f", x.Reader, x.GBps))
		}
		bw = append(bw, fmt.Sprintf("%d threads %.1f GB/s (%s)", b.Threads, b.GBps, strings.Join(others, ", ")))
	}
	mmap := "--no-mmap: reads the weights into memory at load"
	if s.LlamaMmap {
		mmap = "memory-mapped, first touches inside the timing"
	}
	l3 := "unknown"
	if r.Host.L3Bytes > 0 {
		l3 = fmt.Sprintf("%d MiB", r.Host.L3Bytes>>20)
	}
	return []string{
		fmt.Sprintf("host: %s, %d cores, largest cache %s", r.Host.CPU, r.Host.Cores, l3),
		"commit-run: " + s.CommitRun + ", generate --json",
		"llama.cpp: " + s.LlamaCpp + ", tools/golden/ref/bench.mjs (one llama_decode per batch, native greedy sampling)",
		fmt.Sprintf("runs: median of %d, alternating commit-run and llama.cpp, same file, threads and prompt token ids (random ordinary tokens, seed %d)", s.Reps, s.Seed),
		"both: F16 KV cache, flash attention off, greedy, end-of-generation ignored; each file read once and each engine run once untimed before timing",
		fmt.Sprintf("weights: commit-run maps every page of its memory map at load (engine prefault, MADV_POPULATE_READ); llama.cpp %s", mmap),
		fmt.Sprintf("ppN: N-token prompt, logits of its last token only; commit-run in passes of 256 tokens (engine prefillBatch), llama.cpp n_batch = n_ubatch = %d", s.Batch),
		"tgN: N single-token decode steps after a 1-token prompt; tgN@dD: after a D-token prompt, whose prompt pass gives ppD in the same runs (timed apart)",
		"limit: bytes a decoded token reads / read bandwidth; the bytes: every weight outside the routed experts and the embedding table (output head included), one embedding row, top-k experts' gate+up+down per MoE layer, F16 K and V over the mean cache length",
		"bandwidth: " + strings.Join(bw, "; "),
	}
}

// writeTable prints the notes, a llama-bench style table and the runs that failed.
func writeTable(w io.Writer, r *report) error {
	var b strings.Builder
	for _, n := range notes(r) {
		b.WriteString(n + "\n")
	}
	b.WriteString("\n")
	head := []string{"model", "type", "size", "layers", "threads", "test", "commit-run t/s", "llama.cpp t/s",
		"ratio", "limit t/s", "cr/limit", "lc/limit", "cr RSS", "lc RSS"}
	right := []bool{false, false, true, true, true, false, true, true, true, true, true, true, true, true}
	rows := [][]string{head}
	for _, x := range r.Results {
		row := []string{x.Model, x.Type, gib(x.FileBytes), fmt.Sprint(x.Layers), fmt.Sprint(x.Threads), x.Test,
			tokS(x.CommitRun), tokS(x.LlamaCpp), frac(x.Ratio, "%.2f"), "-", "-", "-", gib(x.CommitRun.PeakRSS), gib(x.LlamaCpp.PeakRSS)}
		if l := x.Limit; l != nil {
			row[9], row[10], row[11] = fmt.Sprintf("%.2f", l.TokS), frac(l.CommitRun, "%.2f"), frac(l.LlamaCpp, "%.2f")
		}
		rows = append(rows, row)
	}
	writeRows(&b, rows, right)
	var errs []string
	for _, x := range r.Results {
		for _, e := range []struct {
			name string
			res  engineResult
		}{{"commit-run", x.CommitRun}, {"llama.cpp", x.LlamaCpp}} {
			for _, msg := range e.res.Errors {
				msg = strings.TrimPrefix(msg, e.name+": ")
				errs = append(errs, fmt.Sprintf("%s %s, %d threads, %s, %s: %s", x.Model, x.Type, x.Threads, x.Test, e.name, msg))
			}
		}
	}
	if len(errs) > 0 {
		b.WriteString("\nfailed runs:\n")
		for _, e := range errs {
			b.WriteString("  " + e + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRows prints a markdown table, numbers aligned right.
func writeRows(b *strings.Builder, rows [][]string, right []bool) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	line := func(r []string) {
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if right[i] {
				c = pad + c
			} else {
				c += pad
			}
			b.WriteString("| " + c + " ")
		}
		b.WriteString("|\n")
	}
	line(rows[0])
	for i, w := range width {
		dash := strings.Repeat("-", w)
		if right[i] {
			dash = dash[:w-1] + ":"
		}
		b.WriteString("| " + dash + " ")
	}
	b.WriteString("|\n")
	for _, r := range rows[1:] {
		line(r)
	}
}

// tokS is a median ± standard deviation, "error" when every run failed.
func tokS(e engineResult) string {
	switch {
	case len(e.Samples) == 0 && len(e.Errors) > 0:
		return "error"
	case len(e.Samples) == 0:
		return "-"
	case len(e.Samples) == 1:
		return fmt.Sprintf("%.2f", e.TokS)
	}
	return fmt.Sprintf("%.2f ± %.2f", e.TokS, e.SD)
}

func frac(x *float64, format string) string {
	if x == nil {
		return "-"
	}
	return fmt.Sprintf(format, *x)
}

func gib(n int64) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}
