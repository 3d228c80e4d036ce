package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/bench"
	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/multigpu"
)

// epFlags are bench's expert-parallel flags (--ep, --ep-policy, --link-bw and --harmoeny-q are
// global: eval and chat run with expert parallelism too).
type epFlags struct {
	batch, batches, hot int
	alpha, visual       float64
	perLayer            bool
	text                string
}

func (f *epFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.batch, "batch", 1024, "--ep: tokens per batch, spread evenly over the devices")
	fl.IntVar(&f.batches, "batches", 8, "--ep: batches run or simulated")
	fl.StringVar(&f.text, "text", "", "--ep with -m: run the model on the devices over this text `FILE`, each device evaluating its own window of --batch/N tokens per batch")
	fl.Float64Var(&f.alpha, "alpha", 0, "--ep synthetic routing: share of tokens sent to the hottest expert(s) of each layer (HarMoEny's skew, 0 to 1)")
	fl.IntVar(&f.hot, "hot", 1, "--ep synthetic routing: hot experts per layer")
	fl.Float64Var(&f.visual, "visual", 0, "--ep synthetic routing: share of image tokens (MACS)")
	fl.BoolVar(&f.perLayer, "per-layer", false, "--ep: print every layer's figures")
}

// epBenchFlagNames are the flags that apply only with --ep.
var epBenchFlagNames = []string{"batch", "batches", "text", "alpha", "hot", "visual", "per-layer"}

// epBench measures expert parallelism with each --ep-policy: on -m's devices over --text, or
// with a cost model of a --shape's (or -m's) on simulated devices.
func (a *app) epBench(cmd *cobra.Command, f benchFlags) error {
	for _, name := range []string{"timing-only", "timeline", "prompts", "tokens", "prompt-len", "skew", "cross-layer", "temporal"} {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s does not apply to --ep (see --alpha, --batch, --batches)", name)
		}
	}
	if a.gpuMem != "" || a.policy != "" {
		return fmt.Errorf("--gpu-mem and --policy offload experts to host memory; --ep spreads them over devices (see --ep-policy)")
	}
	e := f.ep
	if e.batch < 1 || e.batches < 1 {
		return fmt.Errorf("--batch %d, --batches %d: want at least one batch of one token", e.batch, e.batches)
	}
	if e.text != "" {
		return a.epRun(cmd, f)
	}
	if a.macsEta != 0 || a.macsCalibration != "" {
		return fmt.Errorf("--macs-eta and --macs-calibration need the model's hidden states: run it with --text (synthetic and recorded routing have none)")
	}
	o, err := a.epSimOptions(f)
	if err != nil {
		return err
	}
	if f.shape == "" {
		opts := a.plainOptions()
		opts.Device = "cpu" // only the model's tensors are read, for the costs
		m, err := a.openModelWith(opts)
		if err != nil {
			return err
		}
		defer m.Close()
		o.Model = m
	}
	rep, err := bench.EP(o)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(a.stdout, rep)
	}
	if err := a.printEPSim(rep); err != nil {
		return err
	}
	if !e.perLayer {
		return nil
	}
	return a.printEPSimLayers(rep)
}

// epSimOptions are the options of a simulated expert-parallel run: the batches, the routing
// and the planners, with how they drop tokens and how fast the devices' link is.
func (a *app) epSimOptions(f benchFlags) (bench.EPOptions, error) {
	e := f.ep
	o := bench.EPOptions{Shape: f.shape, Device: a.device, Devices: a.epDevices, Tokens: e.batch, Steps: e.batches,
		Context: f.ctxFill, Trace: f.traceFile, Skew: e.alpha, Hot: e.hot, Visual: e.visual, Seed: f.seed, Gamma: a.capacityFactor, HarMoEnyThreshold: a.harmoenyQ}
	if a.epPolicy != "" {
		o.Policies = strings.Split(a.epPolicy, ",")
	}
	var err error
	if o.Metric, err = multigpu.ParseDropMetric(a.dropMetric); err != nil {
		return o, fmt.Errorf("--drop-metric: %w", err)
	}
	if a.linkBW != "" {
		if o.LinkBandwidth, err = parseBytes(a.linkBW); err != nil {
			return o, fmt.Errorf("--link-bw: %w", err)
		}
	}
	return o, nil
}

// printEPSim reports a simulated expert-parallel run, a row for each planner with its
// figures averaged over the layers and its speedup over the first.
func (a *app) printEPSim(rep *bench.EPReport) error {
	fmt.Fprintf(a.stdout, "%s on %d x %s, all-to-all at %.1f GB/s per device; %d batches of %d tokens; %s: %s\n",
		rep.Shape, rep.Devices, rep.Device, rep.LinkBandwidth/1e9, rep.Steps, rep.Tokens, routingLabel(rep.Synthetic), rep.Routing)
	fmt.Fprintf(a.stdout, "capacity factor %v (by %s); HarMoEny threshold q = %d tokens\n", rep.Gamma, a.dropMetric, rep.HarMoEnyThreshold)
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tmax load\tbalancedness\tdropped\textra\tfetches\tstraggler ms/layer\tlayer ms\tbatch ms\ttok/s\tspeedup\t")
	base := 0.0
	for _, r := range rep.Rows {
		var maxLoad, bal, strag, total float64
		for _, l := range r.Layers {
			maxLoad += l.MaxLoad
			bal += l.Balancedness
			strag += l.Straggler
			total += l.Total
		}
		n := float64(len(r.Layers))
		if base == 0 {
			base = r.Latency
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.3f\t%.3f\t%.3f\t%.1f\t%.3f\t%.3f\t%.2f\t%.0f\t%.2fx\t\n", r.Policy, maxLoad/n, bal/n, r.Dropped, r.Extra,
			r.Fetches, strag/n*1e3, total/n*1e3, r.Latency*1e3, r.Throughput, base/r.Latency)
	}
	return tw.Flush()
}

// printEPSimLayers prints every layer's figures of each planner (--per-layer).
func (a *app) printEPSimLayers(rep *bench.EPReport) error {
	for _, r := range rep.Rows {
		fmt.Fprintf(a.stdout, "\n%s per layer\n", r.Policy)
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "layer\tmax load\tbalancedness\tstraggler ms\tlayer ms\t")
		for l, x := range r.Layers {
			fmt.Fprintf(tw, "%d\t%.1f\t%.3f\t%.3f\t%.3f\t\n", l, x.MaxLoad, x.Balancedness, x.Straggler*1e3, x.Total*1e3)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// epRunRow is one planner's run of the model over the devices.
type epRunRow struct {
	Policy     string
	Perplexity float64
	Stats      engine.EPStats
}

// epRun runs -m over --ep devices with every --ep-policy on windows of --text.
func (a *app) epRun(cmd *cobra.Command, f benchFlags) error {
	e := f.ep
	for _, name := range []string{"shape", "trace", "alpha", "hot", "visual", "ctx-fill", "seed"} {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s does not apply to a run of the model over --text", name)
		}
	}
	if a.epDevices < 2 || a.epDevices > 1024 {
		return fmt.Errorf("--ep %d: want 2 to 1024 devices", a.epDevices)
	}
	window := e.batch / a.epDevices
	if window < 2 {
		return fmt.Errorf("--batch %d over %d devices leaves %d tokens per device: want at least 2", e.batch, a.epDevices, window)
	}
	data, err := os.ReadFile(e.text)
	if err != nil {
		return fmt.Errorf("--text: %w", err)
	}
	policies := engine.EPPolicies()
	if a.epPolicy != "" {
		policies = strings.Split(a.epPolicy, ",")
	}
	if err := a.macsFlagsFit(policies); err != nil {
		return err
	}
	rows, err := a.runPlanners(cmd.Context(), string(data), policies, engine.PerplexityOptions{Window: window, MaxTokens: e.batch * e.batches})
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(a.stdout, rows)
	}
	a.printEPRunHeader(rows, window, e.text)
	if err := a.printEPRun(rows); err != nil {
		return err
	}
	if !e.perLayer {
		return nil
	}
	return a.printEPRunLayers(rows)
}

// runPlanners scores text with the model opened for each planner in turn: the planner is an
// option of the open model, not of a run.
func (a *app) runPlanners(ctx context.Context, text string, policies []string, po engine.PerplexityOptions) ([]epRunRow, error) {
	var rows []epRunRow
	var err error
	for _, p := range policies {
		opts := a.baseOptions(a.device)
		if opts.EP, err = a.epOptions(strings.TrimSpace(p)); err != nil {
			return nil, err
		}
		m, err := a.openModelWith(opts)
		if err != nil {
			return nil, err
		}
		r, err := m.PerplexityWith(ctx, text, po)
		st, _ := m.EPStats()
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		rows = append(rows, epRunRow{Policy: st.Policy, Perplexity: r.Perplexity, Stats: st})
	}
	return rows, nil
}

// printEPRunHeader says what ran where, whose clock timed it and how the tokens moved.
func (a *app) printEPRunHeader(rows []epRunRow, window int, textFile string) {
	clock := "wall time, the devices sharing this machine's cores"
	if strings.HasPrefix(a.device, "sim:") {
		clock = "simulated time, numbers computed on the CPU"
	}
	fmt.Fprintf(a.stdout, "%s on %d x %s: batches of %d windows of %d tokens of %s, %s\n", a.modelPath, a.epDevices, a.device, a.epDevices, window, textFile, clock)
	if len(rows) > 0 {
		fmt.Fprintf(a.stdout, "tokens moved by: %s\n", rows[0].Stats.Transport)
	}
	for _, r := range rows {
		if n := r.Stats.CalibrationTokens; n > 0 {
			fmt.Fprintf(a.stdout, "MACS reroutes with eta %g, expert centroids from %d tokens of %s\n", a.macsEta, n, a.macsCalibration)
			break
		}
	}
}

// printEPRun prints a row for each planner's run of the model: its perplexity, and its
// figures averaged over the layers (each layer's over its passes) and batches.
func (a *app) printEPRun(rows []epRunRow) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tperplexity\tmax load\tbalancedness\tdropped\textra\tfetches\tMB moved/batch\tstraggler ms/layer\tlayer ms\tbatch ms\ttok/s\tspeedup\t")
	base := 0.0
	for _, r := range rows {
		st := r.Stats
		var maxLoad, bal, strag, total, tokens, choices, dropped, extra, fetches, moved float64
		for _, l := range st.Layers {
			n := float64(max(l.Passes, 1))
			maxLoad += l.MaxLoad / n
			bal += l.Balancedness / n
			strag += l.Straggler / n
			total += l.Time / n
			choices += float64(l.Choices)
			dropped += float64(l.Dropped)
			extra += float64(l.Extra)
			fetches += float64(l.Fetches)
			moved += float64(l.Bytes)
		}
		if len(st.Layers) > 0 {
			tokens = float64(st.Layers[0].Tokens)
		}
		nl, steps := float64(max(len(st.Layers), 1)), float64(max(st.Steps, 1))
		batch := st.Seconds / steps
		if base == 0 {
			base = batch
		}
		fmt.Fprintf(tw, "%s\t%.4f\t%.1f\t%.3f\t%.3f\t%.3f\t%.1f\t%.2f\t%.3f\t%.3f\t%.2f\t%.0f\t%.2fx\t\n", r.Policy, r.Perplexity, maxLoad/nl, bal/nl,
			dropped/max(choices, 1), extra/max(choices, 1), fetches/steps, moved/steps/1e6, strag/nl*1e3, total/nl*1e3, batch*1e3, tokens/max(st.Seconds, 1e-12), base/batch)
	}
	return tw.Flush()
}

// printEPRunLayers prints every layer's figures of each planner's run (--per-layer).
func (a *app) printEPRunLayers(rows []epRunRow) error {
	for _, r := range rows {
		fmt.Fprintf(a.stdout, "\n%s per layer\n", r.Policy)
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "layer\tmax load\tbalancedness\tdropped\tstraggler ms\tlayer ms\t")
		for _, l := range r.Stats.Layers {
			n := float64(max(l.Passes, 1))
			fmt.Fprintf(tw, "%d\t%.1f\t%.3f\t%.3f\t%.3f\t%.3f\t\n", l.Layer, l.MaxLoad/n, l.Balancedness/n, float64(l.Dropped)/float64(max(l.Choices, 1)), l.Straggler/n*1e3, l.Time/n*1e3)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
