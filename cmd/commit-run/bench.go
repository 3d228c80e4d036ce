package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/bench"
	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/runstats"
	"github.com/commit-run/commit-run/shapes"
	"github.com/commit-run/commit-run/trace"
)

// benchPrompts are the built-in prompts of the real-model benchmark.
var benchPrompts = []string{
	"Prince Andrew looked at Pierre and said",
	"The old count came into the drawing room, where",
	"It was a clear, frosty morning. The troops",
	"Natasha ran into the hall and",
}

type benchFlags struct {
	shape, traceFile, timeline, prompts string
	tokens, ctxFill, timelineTokens     int
	promptLen                           int
	skew, crossLayer, temporal          float64
	seed                                uint64
	asJSON, timingOnly, kernelProfile   bool
	warmupPrompt                        bool
	ep                                  epFlags
}

func (a *app) benchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Per-token decode latency of a model, on this machine or a simulated GPU, with its experts offloaded",
		Long: "bench decodes --tokens tokens greedily after each prompt (built-in or --prompts FILE, one per line) with -m on\n" +
			"--device and reports per-token latency (mean, p50, p90), time to first token and tokens/s. With --gpu-mem the\n" +
			"routed experts live in host memory and each --policy (default all four) runs side by side with\n" +
			"the expert cache's hit rate, bytes moved and prediction accuracy. On --device sim:<profile> the numbers are\n" +
			"computed and every time is the simulated GPU's: stalls waiting for copies and the physical limit are reported too;\n" +
			"on cuda:N they come from the GPU's own events, with its device time per token. The last prompt runs once, untimed,\n" +
			"before the timed ones (as llama-bench warms up; --warmup-prompt=false: not).\n\n" +
			"With --shape (e.g. mixtral-8x7b@q4_k) on sim:<profile> it times decode of a model shape with no weights loaded:\n" +
			"routing comes from --trace or a synthetic router (labelled as such), and the prediction of prefetch/commit from\n" +
			"--predictor (oracle, prev-token, frequency, or accuracy=P[,first=Q] with Q for each token's first MoE layer; default\n" +
			"accuracy=0.8,first=0.45, the Commit Router's measured first-layer accuracy). --timing-only does the same for\n" +
			"-m, with the routing the model chooses. Shapes: " + strings.Join(shapes.Names(), ", ") + ".\n\n" +
			"With --ep N it measures expert parallelism instead, each --ep-policy side by side: per-layer maximum device\n" +
			"load, balancedness, dropped tokens, straggler and batch latency. With -m and --text FILE it runs the model on\n" +
			"N devices of --device (cpu or sim:<profile>, the all-to-alls on a modelled link), each device evaluating its own\n" +
			"window of --batch/N tokens of the text per batch, and reports the perplexity each planner leaves too. With\n" +
			"--shape (or -m without --text) it simulates N devices of --device sim:<profile> with a cost model, batches of\n" +
			"--batch tokens routed by --trace or HarMoEny's synthetic skew (--alpha). The capacity-aware policies use\n" +
			"--capacity-factor (default 1.5) and --drop-metric.",
		Example: "  commit-run bench --tokens 32\n" +
			"  commit-run bench --device sim:rtx2080ti --gpu-mem 24MiB --timeline tiny.svg\n" +
			"  commit-run bench --shape mixtral-8x7b@q4_k --device sim:rtx4090 --gpu-mem 16GiB --predictor accuracy=0.85 --timeline mixtral.svg\n" +
			"  commit-run bench --ep 8 --shape qwen1.5-moe-a2.7b@q4_k --device sim:h100-pcie --alpha 0.9\n" +
			"  commit-run bench --ep 4 --device sim:rtx4090 --text models/testdata/war-and-peace-heldout.txt --batch 1024 --batches 4",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("tokens") && f.tokens == 0 {
				// 0 is the flag's "default", not a count anyone asks for.
				return fmt.Errorf("--tokens 0: want 2 or more (default 32, or 64 with --shape)")
			}
			if f.kernelProfile && (cmd.Flags().Changed("ep") || f.shape != "" || f.timingOnly || !strings.HasPrefix(a.device, "cuda:")) {
				return fmt.Errorf("--kernel-profile times a CUDA GPU's kernels: run -m with --device cuda:N, without --ep")
			}
			if cmd.Flags().Changed("ep") {
				return a.epBench(cmd, f)
			}
			for _, name := range epBenchFlagNames {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s applies to expert-parallel runs (--ep N)", name)
				}
			}
			if f.shape != "" || f.timingOnly {
				if cmd.Flags().Changed("warmup-prompt") {
					return fmt.Errorf("--warmup-prompt applies to runs of -m that compute (not --shape or --timing-only)")
				}
				return a.simBench(f)
			}
			for _, name := range []string{"trace", "skew", "cross-layer", "temporal", "ctx-fill"} {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s applies to timing-only runs (--shape or --timing-only)", name)
				}
			}
			return a.modelBench(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.shape, "shape", "", "model `SHAPE[@TYPE]` to time on a simulated GPU (timing only, no weights)")
	fl.BoolVar(&f.timingOnly, "timing-only", false, "time -m on a simulated GPU from the routing it chooses, without computing offloaded runs")
	fl.IntVar(&f.tokens, "tokens", 0, "decode tokens per prompt (default 32) or timed (default 64 with --shape)")
	fl.IntVar(&f.ctxFill, "ctx-fill", 512, "KV cache positions: a --shape run's context (at least its prompt and tokens), and what the --ep cost model's attention reads")
	fl.IntVar(&f.promptLen, "prompt-len", 128, "prompt tokens prefilled before a --shape decode, for the time to first token; with -m, prompts of this many token ids instead of text, as llama-bench's -p (prefill tokens/s = this / TTFT)")
	fl.StringVar(&f.traceFile, "trace", "", "replay the routing of a trace `FILE` (commit-run trace record)")
	fl.Float64Var(&f.skew, "skew", 0.8, "synthetic routing: Zipf exponent of expert popularity")
	fl.Float64Var(&f.crossLayer, "cross-layer", 0.5, "synthetic routing: probability a choice follows the previous layer's")
	fl.Float64Var(&f.temporal, "temporal", 0.2, "synthetic routing: probability a choice repeats the previous token's")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the synthetic router and predictor")
	fl.StringVar(&f.timeline, "timeline", "", "on a simulated GPU, write the streams of the last tokens as `FILE.svg` (one per policy)")
	fl.IntVar(&f.timelineTokens, "timeline-tokens", 2, "tokens drawn by --timeline")
	fl.StringVar(&f.prompts, "prompts", "", "prompts `FILE`, one per line")
	fl.BoolVar(&f.asJSON, "json", false, "print one JSON object")
	fl.BoolVar(&f.warmupPrompt, "warmup-prompt", true, "with -m, run the last prompt once untimed before the timed ones, as llama-bench warms up, so that one-time costs (a GPU's first launches, buffers growing) stay out of the time to first token")
	fl.BoolVar(&f.kernelProfile, "kernel-profile", false, "on cuda:N, time every kernel between events of its own and print where a prompt's pass and a decoded token spend the device's time (kernels launched one by one, no CUDA graph; the events add time of their own)")
	f.ep.register(cmd)
	return cmd
}

// routingLabel says where a timing-only run's routing came from; synthetic routing is
// labelled so that no figure made from it passes for a model's.
func routingLabel(synthetic bool) string {
	if synthetic {
		return "SYNTHETIC routing"
	}
	return "recorded routing"
}

// timelineFiles names the --timeline picture of each policy: FILE-policy.svg.
func timelineFiles(file string) func(string) (io.WriteCloser, error) {
	if file == "" {
		return nil
	}
	ext := filepath.Ext(file)
	base := strings.TrimSuffix(file, ext)
	if ext == "" {
		ext = ".svg"
	}
	return func(p string) (io.WriteCloser, error) { return os.Create(base + "-" + p + ext) }
}

// parseBytes reads a size such as 12GiB, 1.5G, 800MB or 1073741824.
func parseBytes(s string) (float64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mul    float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
		{"T", 1e12}, {"G", 1e9}, {"M", 1e6}, {"K", 1e3}, {"B", 1}}
	mul := 1.0
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(t), strings.ToUpper(u.suffix)) {
			t, mul = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mul
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v > 0) || math.IsInf(v, 0) || v*mul > 1<<50 {
		return 0, fmt.Errorf("size %q: want a positive size such as 12GiB or 800MB", s)
	}
	return v * mul, nil
}

// measureHostRates fills the rates r lacks with this machine's (cpu.MeasureHostRates, about a
// quarter of a second: it reads a matrix from memory as experts are read).
func measureHostRates(r engine.HostRates) engine.HostRates {
	if r.Bandwidth == 0 || r.FLOPS == 0 {
		m := cpu.MeasureHostRates()
		r.Bandwidth, r.FLOPS = cmp.Or(r.Bandwidth, m.Bandwidth), cmp.Or(r.FLOPS, m.FLOPS)
	}
	return r
}

// parseFLOPS reads an arithmetic rate such as 150G, 1.5T or 150GFLOPS.
func parseFLOPS(s string) (float64, error) {
	t := strings.TrimSpace(s)
	for _, suffix := range []string{"FLOP/S", "FLOPS"} {
		if strings.HasSuffix(strings.ToUpper(t), suffix) {
			t = t[:len(t)-len(suffix)]
			break
		}
	}
	mul := 1.0
	if n := len(t); n > 0 {
		if m, ok := map[byte]float64{'K': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12}[t[n-1]&^0x20]; ok {
			t, mul = t[:n-1], m
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || !(v > 0) || math.IsInf(v*mul, 0) {
		return 0, fmt.Errorf("rate %q: want a positive rate such as 150G or 1.5TFLOPS", s)
	}
	return v * mul, nil
}

// benchPolicies are the policies bench runs when --policy names none: the four, and
// llama.cpp's split, plain and with its cache, when --cpu-moe-layers says how.
func (a *app) benchPolicies() string {
	if a.cpuMoELayers != 0 {
		return "ondemand,prefetch,commit,cpu-miss,static,static-cache"
	}
	return "ondemand,prefetch,commit,cpu-miss"
}

// simBench times decode on a simulated GPU without computing the offloaded runs: of a
// --shape with no weights, or of -m with the routing it chooses.
func (a *app) simBench(f benchFlags) error {
	o := bench.SimOptions{Shape: f.shape, Device: a.device, Context: f.ctxFill, Tokens: f.tokens, Trace: f.traceFile,
		Predictor: cmp.Or(a.predictor, "accuracy=0.8,first=0.45"), CrossToken: a.crossToken, Seed: f.seed, TimelineTokens: f.timelineTokens, PromptLen: f.promptLen,
		Synthetic: trace.SynthOptions{Skew: f.skew, CrossLayer: f.crossLayer, Temporal: f.temporal}}
	if !strings.HasPrefix(a.device, "sim:") {
		return fmt.Errorf("--shape and --timing-only time on a simulated GPU: pass --device sim:<profile> (e.g. sim:rtx4090)")
	}
	if f.shape != "" && f.timingOnly {
		return fmt.Errorf("--timing-only times -m; --shape is timing-only already")
	}
	if f.shape == "" {
		if f.traceFile != "" {
			return fmt.Errorf("--trace replays routing for --shape; with -m the routing is the model's own")
		}
		prompts, m, err := a.openRoutingModel(f)
		if err != nil {
			return err
		}
		defer m.Close()
		o.Model, o.Prompts = m, prompts
		if o.Tokens == 0 {
			o.Tokens = 32
		}
	}
	if err := a.simPolicyOptions(&o, f); err != nil {
		return err
	}
	rep, err := bench.Sim(o)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(a.stdout, rep)
	}
	return a.printSimBench(rep)
}

// openRoutingModel opens -m for a timing-only run: its numbers are computed on the CPU with
// every expert in memory, for the routing alone; the time is the simulated GPU's.
func (a *app) openRoutingModel(f benchFlags) ([]string, *engine.Model, error) {
	prompts, opts, err := a.benchModelOptions(f, "cpu")
	if err != nil {
		return nil, nil, err
	}
	opts.Offload = nil // the routing is computed with every expert in memory
	m, err := engine.Open(a.modelPath, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", a.modelPath, err)
	}
	return prompts, m, nil
}

// simPolicyOptions checks the rest of a timing-only run's flags and fills in o what the
// policies are timed with: the device budget, the host's rates, the policies themselves and
// where their timelines go.
func (a *app) simPolicyOptions(o *bench.SimOptions, f benchFlags) error {
	if f.ctxFill < 1 || f.ctxFill > 1<<20 {
		return fmt.Errorf("--ctx-fill %d: want 1 to %d", f.ctxFill, 1<<20)
	}
	if f.timelineTokens < 1 || f.timelineTokens > 64 {
		return fmt.Errorf("--timeline-tokens %d: want 1 to 64", f.timelineTokens)
	}
	var err error
	if a.gpuMem != "" {
		if o.GPUMem, err = parseBytes(a.gpuMem); err != nil {
			return fmt.Errorf("--gpu-mem: %w", err)
		}
	}
	if o.HostRates, o.Host, err = a.hostRates(); err != nil {
		return err
	}
	if o.Policies, err = offload.ParsePolicies(cmp.Or(a.policy, a.benchPolicies())); err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	o.HostLayers = a.cpuMoELayers
	if o.Eviction, err = offload.ParseEviction(a.eviction); err != nil {
		return fmt.Errorf("--eviction: %w", err)
	}
	if files := timelineFiles(f.timeline); files != nil {
		o.Timeline = func(p offload.Policy) (io.WriteCloser, error) { return files(p.String()) }
	}
	return nil
}

// printSimBench reports a timing-only run: what was timed and how, then the policies side
// by side.
func (a *app) printSimBench(rep *bench.SimReport) error {
	routing := routingLabel(rep.Synthetic)
	fmt.Fprintf(a.stdout, "%s on %s (profile calibrated: %v), %.2f GiB budget: %.1f MiB per expert, %.2f GiB resident\n",
		rep.Shape, rep.Device, rep.Calibrated, rep.GPUMem/(1<<30), rep.ExpertBytes/(1<<20), rep.Resident/(1<<30))
	prompt := "no prompt prefilled"
	if rep.PromptLen > 0 {
		prompt = fmt.Sprintf("after a %d-token prompt", rep.PromptLen)
	}
	host := ""
	if r := rep.HostRates; r != nil { // cpu-miss or static ran
		host = fmt.Sprintf("; host (%s) computes experts at %.1f GB/s, memory %.1f GB/s", rep.Host, r.Bandwidth/1e9, r.Memory/1e9)
	}
	fmt.Fprintf(a.stdout, "%d decode tokens %s, %s: %s; predictor %s%s\n",
		rep.Tokens, prompt, routing, rep.Routing, rep.Predictor, host)
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tslots\tTTFT ms\tTTFT/limit\tmean ms\tp50 ms\tp90 ms\ttok/s\thit rate\tMB moved/tok\tstall ms/tok\taccuracy\ton CPU/tok\tlimit ms\tmeasured/limit\t")
	for _, p := range rep.Policies {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.1f\t%.3f\t%.2f\t%.2f\t%s\t%.1f\t%.2f\t%.2f\t\n", a.policyLabel(p), p.Slots,
			orDash(p.TTFT*1e3, "%.1f", rep.PromptLen > 0), orDash(p.TTFT/p.TTFTLimit, "%.2f", rep.PromptLen > 0 && p.TTFTLimit > 0), p.Mean*1e3, p.P50*1e3, p.P90*1e3, p.TokensPerSecond, p.HitRate, p.MovedPerToken/1e6,
			p.StallPerToken*1e3, orDash(p.Accuracy, "%.3f", true), p.OnCPUPerToken, p.LimitPerToken*1e3, p.OverLimit)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	a.policyNotes(rep.Policies)
	return nil
}

// policyLabel names a row's policy: llama.cpp's split with its host layers, and auto with
// what it chose.
func (a *app) policyLabel(p engine.PolicyReport) string {
	if p.Auto != nil {
		return "auto: " + p.Auto.Chosen.String()
	}
	if q, err := offload.ParsePolicy(p.Policy); err == nil && q.Split() {
		return fmt.Sprintf("%s %d", p.Policy, a.cpuMoELayers)
	}
	return p.Policy
}

// policyNotes says under a table which rows are llama.cpp's strategy, and what auto weighed.
func (a *app) policyNotes(rows []engine.PolicyReport) {
	for _, p := range rows {
		switch p.Policy {
		case "static":
			fmt.Fprintf(a.stdout, "static %d: llama.cpp's strategy, -ngl 99 --n-cpu-moe %d (the experts of %d MoE layers on the host)\n", a.cpuMoELayers, a.cpuMoELayers, a.cpuMoELayers)
		case "static-cache":
			fmt.Fprintf(a.stdout, "static-cache %d: llama.cpp's strategy with its device cache of the host layers' experts\n", a.cpuMoELayers)
		}
		if p.Auto != nil {
			fmt.Fprintln(a.stdout, p.Auto.Summary())
		}
	}
}

// tokenPrompts are n prompts of length token ids each, spread over the upper three quarters
// of a vocabulary of vocab (clear of the special tokens at its start), the same on every run:
// what llama-bench prefills, a prompt's rate without a tokenizer's say in its length.
func tokenPrompts(n, length, vocab int) [][]int32 {
	out := make([][]int32, n)
	lo := vocab / 4
	for p := range out {
		ids := make([]int32, length)
		for i := range ids {
			ids[i] = int32(lo + (p*104729+i*7919)%(vocab-lo))
		}
		out[p] = ids
	}
	return out
}

// benchPromptList returns the built-in prompts, or those of file, one per non-empty line.
func benchPromptList(file string) ([]string, error) {
	if file == "" {
		return benchPrompts, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--prompts: %w", err)
	}
	var prompts []string
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			prompts = append(prompts, l)
		}
	}
	if len(prompts) == 0 {
		return nil, fmt.Errorf("--prompts %s has no prompts", file)
	}
	return prompts, nil
}

// modelBench decodes tokens after each prompt with the real model and reports latencies,
// for each policy when the experts are offloaded.
func (a *app) modelBench(cmd *cobra.Command, f benchFlags) error {
	o, err := a.modelBenchOptions(cmd, f)
	if err != nil {
		return err
	}
	rep, err := bench.Run(cmd.Context(), a.modelPath, o)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(a.stdout, rep)
	}
	if len(rep.Rows) == 1 && rep.GPUMem == 0 {
		a.printLatency(rep, cmd.Flags().Changed("prompt-len"), f.promptLen)
	} else if err := a.printPolicyBench(rep); err != nil {
		return err
	}
	return a.printKernels(rep.Rows)
}

// percent is part as a percentage of total, or "-" of nothing.
func percent(part, total float64) string {
	if total <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*part/total)
}

// kernelRows is how many of the longest kernels printKernels lists; the rest are summed.
const kernelRows = 24

// printKernels prints where a profiled GPU's time went, kernel by kernel, for each row that
// has a profile: per prompt pass and per decoded token.
func (a *app) printKernels(rows []engine.PolicyReport) error {
	for _, p := range rows {
		k := p.Kernels
		if k == nil {
			continue
		}
		for _, part := range []struct {
			what   string
			shares []runstats.KernelShare
		}{{"per prompt pass", k.Prefill}, {"per decoded token", k.Decode}} {
			var total float64
			for _, s := range part.shares {
				total += s.Seconds
			}
			fmt.Fprintf(a.stdout, "\n%s: device time by kernel %s, %.3f ms in all (each launch between two events)\n", p.Policy, part.what, total*1e3)
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "kernel\tcalls\tus\tus/call\tshare\t")
			var rest runstats.KernelShare
			for i, s := range part.shares {
				if i >= kernelRows {
					rest.Calls, rest.Seconds = rest.Calls+s.Calls, rest.Seconds+s.Seconds
					continue
				}
				fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%s\t\n", s.Name, s.Calls, s.Seconds*1e6, s.Seconds*1e6/s.Calls, percent(s.Seconds, total))
			}
			if rest.Calls > 0 {
				fmt.Fprintf(tw, "(%d others)\t%.1f\t%.1f\t%.2f\t%s\t\n", len(part.shares)-kernelRows, rest.Calls, rest.Seconds*1e6,
					rest.Seconds*1e6/rest.Calls, percent(rest.Seconds, total))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// modelBenchOptions checks the flags of a run of -m and builds it: the prompts as text or as
// --prompt-len token ids, and with --gpu-mem the list of policies to compare.
func (a *app) modelBenchOptions(cmd *cobra.Command, f benchFlags) (bench.Options, error) {
	if f.tokens != 0 && (f.tokens < 2 || f.tokens > maxCtx) {
		return bench.Options{}, fmt.Errorf("--tokens %d: want 2 to %d (the first token is the time to first token)", f.tokens, maxCtx)
	}
	if f.timelineTokens < 1 || f.timelineTokens > 64 {
		return bench.Options{}, fmt.Errorf("--timeline-tokens %d: want 1 to 64", f.timelineTokens)
	}
	if f.timeline != "" && !strings.HasPrefix(a.device, "sim:") {
		return bench.Options{}, fmt.Errorf("--timeline draws a simulated GPU's streams: pass --device sim:<profile>")
	}
	prompts, base, err := a.benchModelOptions(f, a.device)
	if err != nil {
		return bench.Options{}, err
	}
	base.ProfileKernels = f.kernelProfile
	o := bench.Options{Options: base, Prompts: prompts, Tokens: f.tokens, Timeline: timelineFiles(f.timeline), TimelineTokens: f.timelineTokens,
		Commit: a.commitOptions(), WarmupPrompt: f.warmupPrompt}
	if cmd.Flags().Changed("prompt-len") {
		if f.prompts != "" {
			return o, fmt.Errorf("--prompt-len and --prompts: give the prompts as text or as a number of tokens, not both")
		}
		if f.promptLen < 1 || f.promptLen > maxCtx {
			return o, fmt.Errorf("--prompt-len %d: want 1 to %d", f.promptLen, maxCtx)
		}
		info, err := engine.Inspect(a.modelPath)
		if err != nil {
			return o, err
		}
		o.PromptIDs = tokenPrompts(len(prompts), f.promptLen, info.Vocab)
	}
	o.Options.Offload, o.Options.Commit = nil, nil
	if off := base.Offload; off != nil {
		o.GPUMem, o.Eviction, o.Predictor = off.GPUMem, off.Eviction, off.Predictor
		if o.Policies, err = offload.ParsePolicies(cmp.Or(a.policy, a.benchPolicies())); err != nil {
			return o, fmt.Errorf("--policy: %w", err)
		}
		o.HostLayers = a.cpuMoELayers
		if slices.ContainsFunc(o.Policies, offload.Policy.UsesHost) && weighsHost(a.device) {
			o.Options.HostRates = measureHostRates(o.Options.HostRates)
		}
	}
	return o, nil
}

// printLatency reports a run with all its experts in memory: one row needs no table.
func (a *app) printLatency(rep *bench.Report, promptLenSet bool, promptLen int) {
	p := rep.Rows[0]
	fmt.Fprintf(a.stdout, "%s on %s: %d prompts x %d tokens%s\nper-token latency  mean %.3f ms  p50 %.3f ms  p90 %.3f ms\ntime to first token %.3f ms\ndecode %.1f tokens/s\n",
		rep.Model, rep.Device, rep.Prompts, rep.Tokens, warmedUp(rep), p.Mean*1e3, p.P50*1e3, p.P90*1e3, p.TTFT*1e3, p.TokensPerSecond)
	if promptLenSet {
		fmt.Fprintf(a.stdout, "prefill %.1f tokens/s (%d-token prompts)\n", float64(promptLen)/p.TTFT, promptLen)
	}
	if rep.Simulated {
		fmt.Fprintf(a.stdout, "simulated time (profile calibrated: %v), numbers computed on the CPU; physical limit %.3f ms per token, measured/limit %.2f\n",
			rep.Calibrated, p.LimitPerToken*1e3, p.OverLimit)
	}
	if p.GPU != nil {
		fmt.Fprintf(a.stdout, "device time %.3f ms per token (CUDA events); physical limit %.3f ms per token (the device's compute), measured/limit %.2f\n",
			p.DeviceTimePerToken*1e3, p.LimitPerToken*1e3, p.OverLimit)
		a.gpuPerToken(p)
	}
}

// warmedUp says, after a run's prompt count, that a prompt ran untimed before them, and how
// many warps a row the GPU's decode products took where not one.
func warmedUp(rep *bench.Report) string {
	s := ""
	if rep.WarmupPrompt {
		s = " (after an untimed warm-up prompt)"
	}
	if rep.GPURowWarps > 1 {
		s += fmt.Sprintf(" (%d warps a row of the integer decode products)", rep.GPURowWarps)
	}
	return s
}

// printPolicyBench reports the policies of an offloaded run side by side, under a header
// that says whose clock timed them.
func (a *app) printPolicyBench(rep *bench.Report) error {
	// On a GPU the device times its own streams: a column of its time per token, and the
	// limit is what it measured.
	gpu := slices.ContainsFunc(rep.Rows, func(p engine.PolicyReport) bool { return p.GPU != nil })
	clock := "wall clock of this machine"
	if rep.Simulated {
		clock = fmt.Sprintf("simulated time (profile calibrated: %v); numbers computed on the CPU", rep.Calibrated)
	}
	if gpu {
		clock += "; device time and stall from CUDA events, limit = max(device compute, bytes needed / the copy stream's measured bandwidth)"
	}
	fmt.Fprintf(a.stdout, "%s on %s: %d prompts x %d tokens%s, batch size 1, %s\n", rep.Model, rep.Device, rep.Prompts, rep.Tokens, warmedUp(rep), clock)
	if rep.GPUMem > 0 {
		fmt.Fprintf(a.stdout, "%.2f MiB device budget: %.2f MiB resident, %.3f MiB per expert slot\n",
			float64(rep.GPUMem)/(1<<20), float64(rep.Resident)/(1<<20), float64(rep.SlotBytes)/(1<<20))
	}
	if r := rep.HostRates; r != nil {
		fmt.Fprintf(a.stdout, "cpu-miss weighs each copy against the host: %.1f GB/s of weights for a token, %.0f GFLOP/s for each further token\n",
			r.Bandwidth/1e9, r.FLOPS/1e9)
	}
	if err := a.policyTable(rep.Rows, gpu); err != nil {
		return err
	}
	a.policyNotes(rep.Rows)
	for _, p := range rep.Rows {
		if g := p.GPU; g != nil {
			fmt.Fprintf(a.stdout, "%s on the GPU: %d kernel launches, %d products on the host, copy stream %.2f GB/s measured over %.1f MB\n",
				p.Policy, g.Launches, g.HostFallbacks, g.CopyBandwidth()/1e9, float64(g.CopyBytes)/1e6)
			a.gpuPerToken(p)
		}
	}
	return nil
}

// policyTable prints a row for each policy of a run of -m, with a column of device time when
// a GPU timed its streams.
func (a *app) policyTable(rows []engine.PolicyReport, gpu bool) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	devCol := ""
	if gpu {
		devCol = "device ms/tok\t"
	}
	fmt.Fprintln(tw, "policy\tpredictor\tslots\tTTFT ms\tmean ms\tp50 ms\tp90 ms\t"+devCol+"tok/s\thit rate\tKB moved/tok\tstall ms/tok\taccuracy\ton CPU/tok\tlimit ms\tmeasured/limit\t")
	for _, p := range rows {
		dev := ""
		if gpu {
			dev = orDash(p.DeviceTimePerToken*1e3, "%.3f", p.GPU != nil) + "\t"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%.3f\t%s%.1f\t%s\t%.1f\t%s\t%s\t%.2f\t%s\t%s\t\n", a.policyLabel(p), cmp.Or(p.Predictor, "-"), p.Slots,
			p.TTFT*1e3, p.Mean*1e3, p.P50*1e3, p.P90*1e3, dev, p.TokensPerSecond, orDash(p.HitRate, "%.3f", p.Slots > 0), p.MovedPerToken/1e3,
			orDash(p.StallPerToken*1e3, "%.3f", true), orDash(p.Accuracy, "%.3f", true), p.OnCPUPerToken,
			orDash(p.LimitPerToken*1e3, "%.3f", true), orDash(p.OverLimit, "%.2f", true))
	}
	return tw.Flush()
}

// gpuPerToken prints what a CUDA GPU did for a decoded token, and for a prompt up to its first
// token.
func (a *app) gpuPerToken(p engine.PolicyReport) {
	if t := p.GPUPerToken; t != nil {
		how := "kernels launched one by one"
		if t.Launches < t.Kernels {
			how = "a CUDA graph replayed"
		}
		fmt.Fprintf(a.stdout, "%s, per decoded token: %.1f host launches (%s), %.1f kernels, %.1f read-backs, %.1f writes, %.1f of them from pageable memory\n",
			p.Policy, t.Launches, how, t.Kernels, t.Reads, t.Writes, t.Pageable)
	}
	if t := p.GPUPerPrompt; t != nil {
		fmt.Fprintf(a.stdout, "%s, per prompt: %.1f host launches, %.1f read-backs, %.1f writes, %.1f of them from pageable memory\n",
			p.Policy, t.Launches, t.Reads, t.Writes, t.Pageable)
	}
}

// benchModelOptions reads the prompts and the options that open -m on device; the offload
// policy is left to the caller, which compares a list of them.
func (a *app) benchModelOptions(f benchFlags, device string) ([]string, engine.Options, error) {
	prompts, err := benchPromptList(f.prompts)
	if err != nil {
		return nil, engine.Options{}, err
	}
	if err := a.checkModelPath(a.modelPath); err != nil {
		return nil, engine.Options{}, err
	}
	opts, err := a.engineOptions(device, "")
	return prompts, opts, err
}

// orDash formats v, or "-" for a figure that does not apply (NaN, or ok false).
func orDash(v float64, format string, ok bool) string {
	if !ok || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
