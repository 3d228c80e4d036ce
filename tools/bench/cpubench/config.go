package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/synth"
)

// shape is a model shape the benchmark generates, a real model's with fewer layers.
type shape struct {
	Name  string // flag and file name
	Label string // the real model, for the table
	Arch  string // synth architecture
	// Opts fix every dimension that defines the shape, so that a change to synth's defaults
	// cannot silently change what is measured; Layers, Types and Seed are set per file.
	Opts synth.BenchOptions
	// Types are the recipes the shape is published in and measured in; nil: every type
	// but those only some shapes take (wtype.Only).
	Types []string
}

// takes reports whether shape sh is measured in type t.
func (sh shape) takes(t wtype) bool {
	if sh.Types != nil {
		return slices.Contains(sh.Types, t.Recipe)
	}
	return !t.Only
}

// shapes are the benchmark's shapes (DESIGN.md section 7). Qwen3-30B-A3B's head size of 128
// (32 query heads of 128 = 4096 wide from d_model 2048) comes from synth's real shape of
// qwen3moe; TestQwen3Attention checks it.
var shapes = []shape{
	{Name: "olmoe", Label: "OLMoE-1B-7B", Arch: synth.ArchOLMoE, Opts: synth.BenchOptions{
		Embd: 2048, Heads: 16, HeadsKV: 16, Experts: 64, ExpertsUsed: 8, ExpertFFN: 1024, Vocab: 50304}},
	{Name: "qwen3moe", Label: "Qwen3-30B-A3B", Arch: synth.ArchQwen3MoE, Opts: synth.BenchOptions{
		Embd: 2048, Heads: 32, HeadsKV: 4, Experts: 128, ExpertsUsed: 8, ExpertFFN: 768, Vocab: 151936}},
	// Qwen3.6-35B-A3B (qwen35moe) at Q4_K_M: two layers fit, a gated DeltaNet layer and a
	// full-attention one (the real model has one in four; llama.cpp cannot run a file without
	// any: its KV cache of no layers fails to allocate).
	{Name: "qwen36", Label: "Qwen3.6-35B-A3B", Arch: synth.ArchQwen35MoE, Opts: synth.BenchOptions{
		Embd: 2048, Heads: 16, HeadsKV: 2, Experts: 256, ExpertsUsed: 8, ExpertFFN: 512, Vocab: 248320,
		FullAttentionInterval: 2},
		Types: []string{"q4km"}},
	// gpt-oss-20b in its published MXFP4 mix: with its 201088-token vocabulary in Q8_0 twice
	// (embedding and head, 1.2 GB), one layer fits the file limit.
	{Name: "gptoss", Label: "gpt-oss-20b", Arch: synth.ArchGPTOSS, Opts: synth.BenchOptions{
		Embd: 2880, Heads: 64, HeadsKV: 8, Experts: 32, ExpertsUsed: 4, ExpertFFN: 2880, Vocab: 201088},
		Types: []string{"mxfp4"}},
}

// wtype is a weight type of the benchmark: a synth recipe and the name llama.cpp gives it.
type wtype struct {
	Recipe string // synth recipe
	Label  string // llama.cpp's file type name
	// Only: measured only for the shapes that list it (MXFP4 is gpt-oss's alone).
	Only bool
}

var wtypes = []wtype{
	{Recipe: "q4km", Label: "Q4_K_M"},
	{Recipe: "q8_0", Label: "Q8_0"},
	// llama.cpp's Q4_0 preset: Q4_0 throughout, Q6_K output.
	{Recipe: "q4_0-preset", Label: "Q4_0"},
	{Recipe: "mxfp4", Label: "MXFP4_MOE", Only: true},
}

// test is one llama-bench style measurement: ppN (a prompt of N tokens, tokens/s of the
// prompt pass) or tgN@dD (N tokens decoded one at a time after a D-token prompt).
type test struct {
	Prefill bool
	N       int
	Depth   int // tg only; 0 = after a minimal (1-token) prompt
}

func (t test) String() string {
	switch {
	case t.Prefill:
		return fmt.Sprintf("pp%d", t.N)
	case t.Depth > 0:
		return fmt.Sprintf("tg%d@d%d", t.N, t.Depth)
	}
	return fmt.Sprintf("tg%d", t.N)
}

// defaultTests are what the issue asks for, in llama-bench's order.
const defaultTests = "pp128,pp512,pp2048,tg64,tg64@d2048"

// parseTests reads a comma-separated list such as "pp512,tg64,tg64@d2048".
func parseTests(s string) ([]test, error) {
	var out []test
	seen := map[test]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		t, err := parseTest(f)
		if err != nil {
			return nil, err
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no tests in %q", s)
	}
	return out, nil
}

func parseTest(f string) (test, error) {
	bad := func() (test, error) {
		return test{}, fmt.Errorf("test %q: want ppN, tgN or tgN@dD (e.g. pp512, tg64, tg64@d2048)", f)
	}
	const maxTokens = 1 << 20
	count := func(s string, min int) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && n >= min && n <= maxTokens
	}
	switch {
	case strings.HasPrefix(f, "pp"):
		n, ok := count(f[2:], 1)
		if !ok {
			return bad()
		}
		return test{Prefill: true, N: n}, nil
	case strings.HasPrefix(f, "tg"):
		body, depth, hasDepth := strings.Cut(f[2:], "@d")
		n, ok := count(body, 1)
		if !ok {
			return bad()
		}
		d := 0
		if hasDepth {
			if d, ok = count(depth, 0); !ok {
				return bad()
			}
		}
		return test{N: n, Depth: d}, nil
	}
	return bad()
}

// runSpec is one invocation of an engine: a prompt of Prompt tokens, then Decode tokens decoded
// one at a time (0: the prompt alone). It yields the tests in Yields.
type runSpec struct {
	Prompt, Decode int
	Yields         []test
}

// plan turns tests into runs. A decode test at depth D also yields ppD when that is asked
// for: the prompt and the decode steps are timed apart, so one run measures both.
func plan(tests []test) []runSpec {
	want := map[test]bool{}
	for _, t := range tests {
		want[t] = true
	}
	claimed := map[test]bool{}
	var runs []runSpec
	for _, t := range tests {
		if t.Prefill {
			continue
		}
		r := runSpec{Prompt: max(t.Depth, 1), Decode: t.N, Yields: []test{t}}
		if pp := (test{Prefill: true, N: t.Depth}); t.Depth > 0 && want[pp] && !claimed[pp] {
			claimed[pp] = true
			r.Yields = append(r.Yields, pp)
		}
		runs = append(runs, r)
	}
	// Prompt-only runs first, in the order asked: the shorter, the sooner a result shows.
	var out []runSpec
	for _, t := range tests {
		if t.Prefill && !claimed[t] {
			out = append(out, runSpec{Prompt: t.N, Yields: []test{t}})
		}
	}
	return append(out, runs...)
}

// pick selects entries of all by any of their names, from a comma-separated list ("" or
// "all": every one), in the order listed.
func pick[T any](list string, all []T, names func(T) []string, what string) ([]T, error) {
	if list == "" || list == "all" {
		return all, nil
	}
	var out []T
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		i := slices.IndexFunc(all, func(x T) bool {
			return slices.ContainsFunc(names(x), func(n string) bool { return strings.EqualFold(n, f) })
		})
		if i < 0 {
			var known []string
			for _, x := range all {
				known = append(known, names(x)[0])
			}
			return nil, fmt.Errorf("unknown %s %q (have %s)", what, f, strings.Join(known, ", "))
		}
		out = append(out, all[i])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s in %q", what, list)
	}
	return out, nil
}

func parseShapes(list string) ([]shape, error) {
	return pick(list, shapes, func(s shape) []string { return []string{s.Name, s.Label} }, "shape")
}

func parseTypes(list string) ([]wtype, error) {
	return pick(list, wtypes, func(t wtype) []string { return []string{t.Recipe, t.Label} }, "type")
}

// parseThreads reads "2" or "1,2,4"; 0 means every core (cores).
func parseThreads(list string, cores int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n > 4096 {
			return nil, fmt.Errorf("threads %q: want a count of threads (0 = every core)", f)
		}
		if n == 0 {
			n = cores
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no thread counts in %q", list)
	}
	return out, nil
}
