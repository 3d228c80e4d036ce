package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/synth"
)

// modelFile is one generated file of the benchmark.
type modelFile struct {
	Shape    shape
	Type     wtype
	Layers   int
	Estimate int64 // bytes, at least the file's size (estimateBytes)
	Spec     synth.Spec
	Path     string
}

// layout decides every file's layer count and path.
func layout(o options) ([]modelFile, error) {
	var files []modelFile
	for _, sh := range o.shapes {
		for _, t := range o.types {
			if !sh.takes(t) {
				continue
			}
			layers := o.layers
			var est int64
			var err error
			if layers == 0 {
				if layers, est, err = chooseLayers(sh, t, o.maxFile, o.seed); err != nil {
					return nil, err
				}
			}
			spec, err := benchSpec(sh, t, layers, o.seed)
			if err != nil {
				return nil, err
			}
			if est == 0 {
				if est, err = estimateBytes(spec); err != nil {
					return nil, err
				}
			}
			path, err := modelPath(o.work, sh, t, layers, o.seed, spec)
			if err != nil {
				return nil, err
			}
			files = append(files, modelFile{Shape: sh, Type: t, Layers: layers, Estimate: est, Spec: spec, Path: path})
		}
	}
	return files, nil
}

func printPlan(w io.Writer, o options, files []modelFile) error {
	var b strings.Builder
	fmt.Fprintf(&b, "files (under %.2f GB each unless -layers says otherwise):\n", float64(o.maxFile)/1e9)
	for _, f := range files {
		fmt.Fprintf(&b, "  %-14s %-7s %3d layers  ~%.3f GB  %s\n", f.Shape.Label, f.Type.Label, f.Layers, float64(f.Estimate)/1e9, f.Path)
	}
	fmt.Fprintf(&b, "runs per file, thread count and engine (x%d repetitions):\n", o.reps)
	for _, r := range plan(o.tests) {
		var ys []string
		for _, t := range r.Yields {
			ys = append(ys, t.String())
		}
		fmt.Fprintf(&b, "  prompt %5d, decode %4d  -> %s\n", r.Prompt, r.Decode, strings.Join(ys, ", "))
	}
	fmt.Fprintf(&b, "threads: %v\n", o.threads)
	_, err := io.WriteString(w, b.String())
	return err
}

// bench runs the benchmark file by file into rep.
type bench struct {
	o            options
	rep          *report
	logf         func(string, ...any)
	ours, theirs engine
}

// file benchmarks one model file at every thread count. Nothing here stops the benchmark: a
// file that cannot be made or read, or an engine that fails, becomes errors in its rows.
func (b *bench) file(ctx context.Context, f modelFile) {
	o := b.o
	name := fmt.Sprintf("%s %s (%d layers)", f.Shape.Name, f.Type.Label, f.Layers)
	fail := func(err error) {
		b.logf("%s: %v", name, err)
		for _, th := range o.threads {
			for _, r := range b.rows(f, 0, th, nil, nil) {
				r.CommitRun.add(0, 0, err)
				r.LlamaCpp.add(0, 0, err)
				r.finish()
				b.rep.Results = append(b.rep.Results, *r)
			}
		}
	}
	if err := ensureModel(f.Path, f.Spec, o.regen, b.logf); err != nil {
		fail(err)
		return
	}
	st, err := os.Stat(f.Path)
	if err != nil {
		fail(fmt.Errorf("model file: %w", err))
		return
	}
	if st.Size() >= o.maxFile {
		b.logf("warning: %s is %.2f GB, over the %.2f GB asked for", f.Path, float64(st.Size())/1e9, float64(o.maxFile)/1e9)
	}
	tr, ids, err := b.readModel(f.Path)
	if err != nil {
		fail(err)
		return
	}
	for _, th := range o.threads {
		if ctx.Err() != nil {
			return
		}
		b.threads(ctx, f, st.Size(), th, tr, ids)
	}
}

// readModel computes a file's traffic and draws the prompt token ids, and reads the file
// through once so that no engine's first run waits on the disk.
func (b *bench) readModel(path string) (traffic, []int32, error) {
	mf, err := models.Open(path)
	if err != nil {
		return traffic{}, nil, err
	}
	defer mf.Close()
	tr, err := trafficOf(mf)
	if err != nil {
		return traffic{}, nil, fmt.Errorf("%s: %w", path, err)
	}
	pool, err := ordinaryTokens(mf)
	if err != nil {
		return traffic{}, nil, err
	}
	longest := warmupPrompt
	for _, r := range plan(b.o.tests) {
		longest = max(longest, r.Prompt)
	}
	fh, err := os.Open(path)
	if err != nil {
		return traffic{}, nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer fh.Close()
	if _, err := io.Copy(io.Discard, fh); err != nil {
		return traffic{}, nil, fmt.Errorf("read %s: %w", path, err)
	}
	return tr, promptIDs(pool, longest, b.o.seed), nil
}

// warmupPrompt and warmupDecode size the untimed run of each engine before the timed ones.
const (
	warmupPrompt = 8
	warmupDecode = 2
)

// threads runs every test of one file at one thread count.
func (b *bench) threads(ctx context.Context, f modelFile, size int64, th int, tr traffic, ids []int32) {
	o := b.o
	name := fmt.Sprintf("%s %s %dL %dt", f.Shape.Name, f.Type.Label, f.Layers, th)
	var gbps float64
	for _, bw := range b.rep.Bandwidth {
		if bw.Threads == th {
			gbps = bw.GBps
		}
	}
	rows := b.rows(f, size, th, &tr, func(t test) float64 {
		if t.Prefill {
			return 0
		}
		return gbps
	})
	byTest := map[test]*result{}
	for i, t := range o.tests {
		byTest[t] = rows[i]
	}
	mkJob := func(prompt, decode int) job {
		return job{Model: f.Path, Threads: th, Prompt: ids[:prompt], Decode: decode, Batch: o.batch, Mmap: o.mmap}
	}
	broken := b.warmUp(ctx, name, mkJob(warmupPrompt, warmupDecode))
	runs := plan(o.tests)
	for i, r := range runs {
		j := mkJob(r.Prompt, r.Decode)
		for rep := range o.reps {
			for _, e := range []engine{b.ours, b.theirs} {
				s, err := sample{}, broken[e.Name]
				if err == nil {
					s, err = e.run(ctx, j)
				}
				if ctx.Err() != nil {
					// Interrupted: the run was killed, not failed.
					b.collect(rows)
					return
				}
				var parts []string
				for _, t := range r.Yields {
					res := &byTest[t].CommitRun
					if e.Name == b.theirs.Name {
						res = &byTest[t].LlamaCpp
					}
					res.add(s.rate(t), s.PeakRSS, err)
					parts = append(parts, fmt.Sprintf("%s %.2f t/s", t, s.rate(t)))
				}
				msg := strings.Join(parts, ", ")
				if err != nil {
					msg = "error: " + err.Error()
				}
				b.logf("%s: run %d/%d rep %d/%d %s: %s", name, i+1, len(runs), rep+1, o.reps, e.Name, msg)
			}
		}
	}
	b.collect(rows)
}

// warmUp runs each engine once, untimed: it checks each works on this file before time is
// spent on it, and that both generate the same tokens from the same prompt. It returns the
// engines that failed, by name.
func (b *bench) warmUp(ctx context.Context, name string, j job) map[string]error {
	broken := map[string]error{}
	var warm [2]sample
	for i, e := range []engine{b.ours, b.theirs} {
		b.logf("%s: warm-up run of %s", name, e.Name)
		s, err := e.run(ctx, j)
		if err != nil {
			b.logf("%s: %v; its timed runs are skipped", name, err)
			broken[e.Name] = fmt.Errorf("warm-up run failed: %w", err)
			continue
		}
		warm[i] = s
		if s.Build != "" {
			b.rep.Settings.LlamaCpp = s.Build
		}
	}
	if len(broken) == 0 && !slices.Equal(warm[0].Tokens, warm[1].Tokens) {
		b.logf("%s: note: greedy tokens differ (commit-run %v, llama.cpp %v): rounding can do that on a random model, a different prompt would too",
			name, warm[0].Tokens, warm[1].Tokens)
	}
	return broken
}

func (b *bench) collect(rows []*result) {
	for _, r := range rows {
		r.finish()
		b.rep.Results = append(b.rep.Results, *r)
	}
}

// rows makes a file's empty result rows at one thread count, one per test in the order asked;
// decode tests get a limit when tr is known and bw gives a bandwidth.
func (b *bench) rows(f modelFile, size int64, th int, tr *traffic, bw func(test) float64) []*result {
	var out []*result
	for _, t := range b.o.tests {
		r := &result{Shape: f.Shape.Name, Model: f.Shape.Label, Type: f.Type.Label, Recipe: f.Type.Recipe,
			File: f.Path, FileBytes: size, Layers: f.Layers, Threads: th, Test: t.String()}
		r.Prompt, r.Decode = t.N, 0
		if !t.Prefill {
			r.Prompt, r.Decode = max(t.Depth, 1), t.N
			if tr != nil && bw != nil && bw(t) > 0 {
				r.Limit = newLimit(*tr, r.Prompt, r.Decode, bw(t))
			}
		}
		out = append(out, r)
	}
	return out
}
