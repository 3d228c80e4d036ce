package engine

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
)

// BenchOptions configure Bench: a real model decoding real prompts, the numbers computed.
type BenchOptions struct {
	// Options open the model (device, threads, context, KV type); Offload is set by Bench.
	Options Options
	// Policies are run one after the other, each on a freshly opened model; nil runs the
	// model with every weight resident on the device.
	Policies []offload.Policy
	GPUMem   int64
	Eviction offload.Eviction
	// HostLayers is static's N: the MoE layers whose experts the host computes.
	HostLayers int
	// Predictor is prefetch's and commit's: router (the Commit Router, commit's default),
	// prev-token (prefetch's default) or frequency.
	Predictor string
	// Commit configures the Commit Router of commit runs that use it (nil: defaults).
	Commit  *CommitOptions
	Prompts []string
	// PromptIDs, when set, are the prompts as token ids, and Prompts is not used: a model
	// shape's, whose tokens stand for nothing.
	PromptIDs [][]int32
	Tokens    int // decoded per prompt (0 = 32)
	// Routing says where a timing-only run's routing comes from, for the timelines' titles
	// ("" for the model's own).
	Routing string
	// Timeline, on a simulated device, receives an SVG of the last TimelineTokens tokens
	// of each run (policy "resident" when nothing is offloaded).
	Timeline       func(policy string) (io.WriteCloser, error)
	TimelineTokens int
	// Warmup is the decode steps of each prompt left out of the figures, so that they show
	// a policy's steady state once its cache has filled (0: none).
	Warmup int
	// AllowCommit lets policy auto choose commit, which computes with predicted experts and
	// changes the output.
	AllowCommit bool
	// moe is the model's routed shape, which policy auto needs for its routing sample.
	moe routedShape
}

// BenchReport is the outcome of Bench; times in seconds.
type BenchReport struct {
	Model  string
	Device string
	// Simulated says the times are the simulated GPU's virtual time (numbers computed on the
	// CPU), not this machine's wall clock.
	Simulated  bool
	Calibrated bool // a simulated device's profile was checked against a real GPU
	GPUMem     int64
	SlotBytes  int64
	Resident   int64 // non-expert weights and one session's KV cache
	Prompts    int
	Tokens     int // decoded per prompt
	Predictor  string
	// HostRates are what cpu-miss weighed a copy against, on a device that weighs (nil on
	// the CPU, which computes every miss on the host, and without cpu-miss).
	HostRates *HostRates `json:",omitempty"`
	Rows      []PolicyReport
}

// Bench decodes Tokens tokens greedily after each prompt, at batch size 1, once per policy,
// and reports per-token latency, time to first token and the offloader's figures. On a
// simulated device every figure comes from its timeline, and the physical limit (DESIGN.md
// §6) is max(compute, bytes not resident at the token's start / effective PCIe rate, expert
// bytes the host read / its memory's rate, HostRates.Memory). On a CUDA GPU the latency is
// still the wall clock, what the user waits, but the stall and the compute come from the
// device's events (deviceTimer) and the limit divides the bytes by the copy stream's
// bandwidth measured so far in the run.
func Bench(ctx context.Context, path string, o BenchOptions) (*BenchReport, error) {
	if slices.Contains(o.Policies, offload.Auto) {
		info, err := Inspect(path)
		if err != nil {
			return nil, err
		}
		o.moe = routedShape{name: info.Name, layers: len(info.MoELayers), experts: info.Experts, used: info.ExpertsUsed}
	}
	return bench(ctx, path, func(opts Options) (*Model, error) { return Open(path, opts) }, o)
}

// bench is Bench of the model open opens with the options of each run.
func bench(ctx context.Context, name string, open func(Options) (*Model, error), o BenchOptions) (*BenchReport, error) {
	n := cmp.Or(o.Tokens, 32)
	to := TimeOptions{Prompts: o.Prompts, PromptIDs: o.PromptIDs, Tokens: n, Warmup: o.Warmup}
	if err := to.Validate(); err != nil {
		return nil, err
	}
	rep := &BenchReport{Model: name, GPUMem: o.GPUMem, Prompts: to.prompts(), Tokens: n}
	runs := []*offload.Policy{nil}
	if len(o.Policies) > 0 {
		runs = nil
		for _, p := range o.Policies {
			if p == offload.Commit && o.Predictor == "oracle" {
				return nil, fmt.Errorf("bench: a running model cannot know its routing ahead, so commit with the oracle would be timed as ondemand; time it from the model's recorded routing with --timing-only")
			}
			runs = append(runs, &p)
		}
		if o.GPUMem <= 0 {
			return nil, fmt.Errorf("bench: offloading needs a device memory budget (--gpu-mem)")
		}
	}
	for _, p := range runs {
		var off *OffloadOptions
		var plan *AutoPlan
		name := "resident"
		if p != nil {
			name = p.String()
			off = &OffloadOptions{Policy: *p, GPUMem: o.GPUMem, Eviction: o.Eviction}
			if *p == offload.Prefetch || *p == offload.Commit {
				off.Predictor = o.Predictor // the others predict nothing
			}
			if p.Split() {
				off.HostLayers = o.HostLayers
			}
		}
		if p != nil && *p == offload.Auto {
			var err error
			if plan, err = benchAuto(ctx, open, o); err != nil {
				return nil, err
			}
			off = &plan.Chosen.Offload
		}
		row, err := benchRun(ctx, open, o, off, name, n, rep)
		if err != nil {
			return nil, err
		}
		row.Auto = plan
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

// benchRun opens the model with offloading off (nil: none), names the run name, and times the
// prompts.
func benchRun(ctx context.Context, open func(Options) (*Model, error), o BenchOptions, off *OffloadOptions, name string, n int, rep *BenchReport) (PolicyReport, error) {
	opts := o.Options
	opts.Offload, opts.Commit = off, nil
	if off != nil && off.Policy == offload.Commit && (off.Predictor == "" || off.Predictor == "router") {
		opts.Commit = o.Commit
	}
	m, err := open(opts)
	if err != nil {
		return PolicyReport{}, err
	}
	defer m.Close()
	rep.Device = m.Device()
	t, err := m.Time(ctx, TimeOptions{Name: name, Prompts: o.Prompts, PromptIDs: o.PromptIDs, Tokens: n, Warmup: o.Warmup, TimelineTokens: o.TimelineTokens})
	if err != nil {
		return PolicyReport{}, err
	}
	rep.Simulated, rep.Calibrated = t.Simulated, t.Calibrated
	if t.HostRates != nil {
		rep.HostRates = t.HostRates
	}
	if st, ok := m.Offload(); ok {
		rep.SlotBytes, rep.Resident, rep.Predictor = st.SlotBytes, st.Resident, t.Predictor
	}
	if o.Timeline != nil && t.Simulated {
		spans, _ := m.Timeline()
		title := fmt.Sprintf("%s on %s, %.2f GiB, policy %s, %s: the last decode tokens", m.Info().Path, rep.Device, float64(o.GPUMem)/(1<<30), name, cmp.Or(o.Routing, "the model's own routing"))
		if err := drawTimeline(o.Timeline, name, spans, t.From, t.To, title); err != nil {
			return t.Row, err
		}
	}
	return t.Row, nil
}

// drawTimeline draws spans from..to into the writer timeline opens for run name.
func drawTimeline(timeline func(string) (io.WriteCloser, error), name string, spans []sim.Span, from, to float64, title string) error {
	w, err := timeline(name)
	if err != nil {
		return err
	}
	if err := sim.WriteSVG(w, spans, from, to, title); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}
