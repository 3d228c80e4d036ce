package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/multigpu"
)

// epFlags are bench's expert-parallel flags.
type epFlags struct {
	devices, batch, batches, hot int
	harmoenyQ                    int
	policies, linkBW             string
	alpha, visual                float64
	perLayer                     bool
}

func (f *epFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.devices, "ep", 0, "expert parallelism: simulate `N` devices of --device sim:<profile> and plan each MoE layer's batches with each --ep-policy")
	fl.StringVar(&f.policies, "ep-policy", "", "expert-parallel planners, comma-separated (default all): "+strings.Join(engine.EPPolicies(), ", "))
	fl.IntVar(&f.batch, "batch", 1024, "--ep: tokens per batch, spread evenly over the devices")
	fl.IntVar(&f.batches, "batches", 8, "--ep: batches simulated")
	fl.Float64Var(&f.alpha, "alpha", 0, "--ep synthetic routing: share of tokens sent to the hottest expert(s) of each layer (HarMoEny's skew, 0 to 1)")
	fl.IntVar(&f.hot, "hot", 1, "--ep synthetic routing: hot experts per layer")
	fl.Float64Var(&f.visual, "visual", 0, "--ep synthetic routing: share of image tokens (MACS)")
	fl.StringVar(&f.linkBW, "link-bw", "", "--ep: each device's all-to-all bandwidth, e.g. 50GB (default: the profile's PCIe rate)")
	fl.BoolVar(&f.perLayer, "per-layer", false, "--ep: print every layer's figures")
	fl.IntVar(&f.harmoenyQ, "harmoeny-q", 0, "--ep: HarMoEny's token threshold q, the fewest tokens worth moving to a device that must fetch the expert (0: eq. 4 from the profile's FLOPS and PCIe rate)")
}

// epBenchFlagNames are the flags that apply only with --ep.
var epBenchFlagNames = []string{"ep-policy", "batch", "batches", "alpha", "hot", "visual", "link-bw", "per-layer", "harmoeny-q"}

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
	o := engine.EPBenchOptions{Shape: f.shape, Device: a.device, Devices: e.devices, Tokens: e.batch, Steps: e.batches,
		Context: f.ctxFill, Trace: f.traceFile, Skew: e.alpha, Hot: e.hot, Visual: e.visual, Seed: f.seed, Gamma: a.capacityFactor, HarMoEnyThreshold: e.harmoenyQ}
	if e.policies != "" {
		o.Policies = strings.Split(e.policies, ",")
	}
	var err error
	if o.Metric, err = multigpu.ParseDropMetric(a.dropMetric); err != nil {
		return fmt.Errorf("--drop-metric: %w", err)
	}
	if e.linkBW != "" {
		if o.LinkBandwidth, err = parseBytes(e.linkBW); err != nil {
			return fmt.Errorf("--link-bw: %w", err)
		}
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
	rep, err := engine.EPBench(o)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(a.stdout, rep)
	}
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
	if err := tw.Flush(); err != nil {
		return err
	}
	if !e.perLayer {
		return nil
	}
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
