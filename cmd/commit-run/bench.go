package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
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
	shape, gpuMem, policies, eviction, traceFile, predictor, timeline, prompts string
	tokens, ctxFill, timelineTokens                                            int
	skew, crossLayer, temporal                                                 float64
	hostBW                                                                     string
	seed                                                                       uint64
	asJSON                                                                     bool
}

func (a *app) benchCmd() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Per-token decode latency: of the model on this machine, or of a model shape on a simulated GPU",
		Long: "Without --shape, bench decodes --tokens tokens after each prompt (built-in or --prompts FILE, one per\n" +
			"line) with -m on --device and reports per-token latency (mean, p50, p90), time to first token and tokens/s.\n\n" +
			"With --shape (e.g. mixtral-8x7b@q4_k) and --device sim:<profile>, it times decode of that model shape on the\n" +
			"simulated GPU with the experts offloaded to host memory, for each --policy side by side: no weights are\n" +
			"loaded, routing comes from --trace or a synthetic router (labelled as such), and the prediction of\n" +
			"prefetch/commit from --predictor. Shapes: " + strings.Join(offload.PublicShapes(), ", ") + ".",
		Example: "  commit-run bench --tokens 32\n" +
			"  commit-run bench --shape mixtral-8x7b@q4_k --device sim:rtx4090 --gpu-mem 16GiB --predictor accuracy=0.85 --timeline mixtral.svg",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.shape != "" || strings.HasPrefix(a.device, "sim:") {
				return a.simBench(f)
			}
			for _, name := range []string{"gpu-mem", "policy", "eviction", "trace", "predictor", "timeline", "skew", "cross-layer", "temporal", "host-bw"} {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s applies to the offloading benchmark: pass --device sim:<profile> (a simulated GPU; the CPU device keeps every expert in memory)", name)
				}
			}
			return a.modelBench(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.shape, "shape", "", "model `SHAPE[@TYPE]` to time on a simulated GPU (timing only, no weights)")
	fl.StringVar(&f.gpuMem, "gpu-mem", "", "device memory budget, e.g. 12GiB (default: the profile's memory)")
	fl.StringVar(&f.policies, "policy", "ondemand,prefetch,commit,cpu-miss", "expert policies to compare")
	fl.StringVar(&f.eviction, "eviction", "lru", "expert cache eviction: lru or lfu")
	fl.IntVar(&f.tokens, "tokens", 0, "decode tokens per prompt (default 32) or timed (default 64 with --shape)")
	fl.IntVar(&f.ctxFill, "ctx-fill", 512, "KV cache positions the simulated attention reads")
	fl.StringVar(&f.traceFile, "trace", "", "replay the routing of a trace `FILE` (commit-run trace record)")
	fl.Float64Var(&f.skew, "skew", 0.8, "synthetic routing: Zipf exponent of expert popularity")
	fl.Float64Var(&f.crossLayer, "cross-layer", 0.5, "synthetic routing: probability a choice follows the previous layer's")
	fl.Float64Var(&f.temporal, "temporal", 0.2, "synthetic routing: probability a choice repeats the previous token's")
	fl.StringVar(&f.predictor, "predictor", "accuracy=0.8", "next-layer prediction for prefetch and commit: oracle, prev-token, frequency or accuracy=P")
	fl.StringVar(&f.hostBW, "host-bw", "", "host rate for computing a missed expert, e.g. 20GB (default: measured on this machine)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the synthetic router and predictor")
	fl.StringVar(&f.timeline, "timeline", "", "write the compute, copy and host streams of the last tokens as `FILE.svg` (one per policy)")
	fl.IntVar(&f.timelineTokens, "timeline-tokens", 2, "tokens drawn by --timeline")
	fl.StringVar(&f.prompts, "prompts", "", "prompts `FILE`, one per line (real-model benchmark)")
	fl.BoolVar(&f.asJSON, "json", false, "print one JSON object")
	return cmd
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

func (a *app) simBench(f benchFlags) error {
	o := engine.SimBenchOptions{Shape: f.shape, Device: a.device, Context: f.ctxFill, Tokens: f.tokens, Trace: f.traceFile,
		Predictor: f.predictor, Seed: f.seed, TimelineTokens: f.timelineTokens,
		Synthetic: trace.SynthOptions{Skew: f.skew, CrossLayer: f.crossLayer, Temporal: f.temporal}}
	if !strings.HasPrefix(a.device, "sim:") {
		return fmt.Errorf("--shape times a model shape on a simulated GPU: pass --device sim:<profile> (e.g. sim:rtx4090)")
	}
	if f.shape == "" {
		if f.traceFile != "" {
			return fmt.Errorf("--trace replays routing for --shape; with -m the routing is the model's own")
		}
		prompts, err := benchPromptList(f.prompts)
		if err != nil {
			return err
		}
		// Numbers on the CPU, time on the simulated GPU.
		m, err := a.openModelOn("cpu")
		if err != nil {
			return err
		}
		defer m.Close()
		o.Model, o.Prompts = m, prompts
		if o.Tokens == 0 {
			o.Tokens = 32
		}
	}
	if f.ctxFill < 1 || f.ctxFill > 1<<20 {
		return fmt.Errorf("--ctx-fill %d: want 1 to %d", f.ctxFill, 1<<20)
	}
	if f.timelineTokens < 1 || f.timelineTokens > 64 {
		return fmt.Errorf("--timeline-tokens %d: want 1 to 64", f.timelineTokens)
	}
	var err error
	if f.gpuMem != "" {
		if o.GPUMem, err = parseBytes(f.gpuMem); err != nil {
			return fmt.Errorf("--gpu-mem: %w", err)
		}
	}
	if f.hostBW != "" {
		if o.HostBandwidth, err = parseBytes(f.hostBW); err != nil {
			return fmt.Errorf("--host-bw: %w", err)
		}
	}
	if o.Policies, err = offload.ParsePolicies(f.policies); err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	if o.Eviction, err = offload.ParseEviction(f.eviction); err != nil {
		return fmt.Errorf("--eviction: %w", err)
	}
	if f.timeline != "" {
		ext := filepath.Ext(f.timeline)
		base := strings.TrimSuffix(f.timeline, ext)
		if ext == "" {
			ext = ".svg"
		}
		o.Timeline = func(p offload.Policy) (io.WriteCloser, error) {
			return os.Create(base + "-" + p.String() + ext)
		}
	}
	rep, err := engine.SimBench(o)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(a.stdout, rep)
	}
	routing := "recorded routing"
	if rep.Synthetic {
		routing = "SYNTHETIC routing"
	}
	fmt.Fprintf(a.stdout, "%s on %s (profile calibrated: %v), %.2f GiB budget: %.1f MiB per expert, %.2f GiB resident\n",
		rep.Shape, rep.Device, rep.Calibrated, rep.GPUMem/(1<<30), rep.ExpertBytes/(1<<20), rep.Resident/(1<<30))
	fmt.Fprintf(a.stdout, "%d decode tokens, %s: %s; predictor %s; host computes experts at %.1f GB/s\n",
		rep.Tokens, routing, rep.Routing, rep.Predictor, rep.HostBandwidth/1e9)
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tslots\tmean ms\tp50 ms\tp90 ms\ttok/s\thit rate\tMB moved/tok\tstall ms/tok\taccuracy\ton CPU/tok\tlimit ms\tmeasured/limit\t")
	for _, p := range rep.Policies {
		acc := "-"
		if !math.IsNaN(p.Accuracy) {
			acc = fmt.Sprintf("%.3f", p.Accuracy)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.1f\t%.3f\t%.2f\t%.2f\t%s\t%.1f\t%.2f\t%.2f\t\n", p.Policy, p.Slots,
			p.Mean*1e3, p.P50*1e3, p.P90*1e3, p.TokensPerSecond, p.HitRate, p.MovedPerToken/1e6, p.StallPerToken*1e3, acc,
			p.OnCPUPerToken, p.LimitPerToken*1e3, p.OverLimit)
	}
	return tw.Flush()
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

// modelBench decodes tokens after each prompt with the real model and reports latencies.
func (a *app) modelBench(cmd *cobra.Command, f benchFlags) error {
	n := f.tokens
	if n == 0 {
		n = 32
	}
	if n < 1 || n > maxCtx {
		return fmt.Errorf("--tokens %d: want 1 to %d", n, maxCtx)
	}
	prompts, err := benchPromptList(f.prompts)
	if err != nil {
		return err
	}
	m, s, closeAll, err := a.session()
	if err != nil {
		return err
	}
	defer closeAll()
	var lat, ttft []float64
	for _, p := range prompts {
		ids, err := m.Tokenize(p, true)
		if err != nil {
			return err
		}
		s.Reset()
		start := time.Now()
		last := start
		first := true
		_, err = s.Generate(cmd.Context(), ids, engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true,
			Sampler: engine.SamplerOptions{Greedy: true},
			OnToken: func(engine.Token) error {
				now := time.Now()
				if first {
					ttft = append(ttft, now.Sub(start).Seconds())
					first = false
				} else {
					lat = append(lat, now.Sub(last).Seconds())
				}
				last = now
				return nil
			}})
		if err != nil {
			return err
		}
	}
	if len(lat) == 0 {
		return fmt.Errorf("bench: no decode steps were timed (use --tokens 2 or more)")
	}
	mean := func(v []float64) float64 {
		t := 0.0
		for _, x := range v {
			t += x
		}
		return t / float64(len(v))
	}
	slices.Sort(lat)
	pct := func(q float64) float64 { return lat[int(q*float64(len(lat)-1)+0.5)] }
	info := m.Info()
	res := struct {
		Model        string  `json:"model"`
		Device       string  `json:"device"`
		Prompts      int     `json:"prompts"`
		Tokens       int     `json:"tokens_per_prompt"`
		MeanMS       float64 `json:"mean_ms"`
		P50MS        float64 `json:"p50_ms"`
		P90MS        float64 `json:"p90_ms"`
		TTFTMS       float64 `json:"ttft_ms"`
		TokensPerSec float64 `json:"tokens_per_second"`
	}{info.Path, a.device, len(prompts), n, mean(lat) * 1e3, pct(0.5) * 1e3, pct(0.9) * 1e3, mean(ttft) * 1e3, 1 / mean(lat)}
	if f.asJSON {
		return writeJSON(a.stdout, res)
	}
	fmt.Fprintf(a.stdout, "%s on %s: %d prompts x %d tokens\nper-token latency  mean %.2f ms  p50 %.2f ms  p90 %.2f ms\ntime to first token %.2f ms\ndecode %.1f tokens/s\n",
		res.Model, res.Device, res.Prompts, res.Tokens, res.MeanMS, res.P50MS, res.P90MS, res.TTFTMS, res.TokensPerSec)
	return nil
}
