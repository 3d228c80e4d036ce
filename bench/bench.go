// Package bench times the engine: Run (a model file's decode under each offloading policy,
// on this machine, a GPU or a simulated one), Sim (public model shapes, or a model's own
// routing, on a simulated GPU, timing only) and EP (expert parallelism's planners on a
// simulated cluster), with their reports. Run's and Sim's figures come from
// engine.Model.Time, the passes a user's tokens take; EP's from multigpu's cluster model and
// the planners the engine runs. bench is never imported by engine.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
)

// Options configure Run: a real model decoding real prompts, the numbers computed.
type Options struct {
	// Options open the model (device, threads, context, KV type); Offload is set by Run.
	Options engine.Options
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
	Commit  *engine.CommitOptions
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
	// WarmupPrompt runs the last prompt once, untimed, before the timed ones
	// (engine.TimeOptions.WarmupPrompt).
	WarmupPrompt bool
	// AllowCommit lets policy auto choose commit, which computes with predicted experts and
	// changes the output.
	AllowCommit bool
	// moe is the model's routed shape, which policy auto needs for its routing sample.
	moe routedShape
}

// Report is the outcome of Run; times in seconds.
type Report struct {
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
	// WarmupPrompt: a prompt ran untimed before the timed ones (Options.WarmupPrompt).
	WarmupPrompt bool
	// GPURowWarps are the warps a row of a CUDA GPU's integer decode products, where not 1
	// (engine.Options.GPURowWarps).
	GPURowWarps int `json:",omitempty"`
	Predictor   string
	// HostRates are what cpu-miss weighed a copy against, on a device that weighs (nil on
	// the CPU, which computes every miss on the host, and without cpu-miss).
	HostRates *engine.HostRates `json:",omitempty"`
	Rows      []engine.PolicyReport
}

// Run decodes Tokens tokens greedily after each prompt, at batch size 1, once per policy,
// each on a freshly opened model, and reports per-token latency, time to first token and the
// offloader's figures (engine.Model.Time says how each is measured on each device). Policy
// auto's row is the placement engine.PlanPlacement chooses for the budget.
func Run(ctx context.Context, path string, o Options) (*Report, error) {
	if slices.Contains(o.Policies, offload.Auto) {
		info, err := engine.Inspect(path)
		if err != nil {
			return nil, err
		}
		o.moe = routedShape{name: info.Name, layers: len(info.MoELayers), experts: info.Experts, used: info.ExpertsUsed}
	}
	return run(ctx, path, func(opts engine.Options) (*engine.Model, error) { return engine.Open(path, opts) }, o)
}

// run is Run of the model open opens with the options of each run.
func run(ctx context.Context, name string, open func(engine.Options) (*engine.Model, error), o Options) (*Report, error) {
	n := cmp.Or(o.Tokens, 32)
	to := engine.TimeOptions{Prompts: o.Prompts, PromptIDs: o.PromptIDs, Tokens: n, Warmup: o.Warmup}
	if err := to.Validate(); err != nil {
		return nil, err
	}
	rep := &Report{Model: name, GPUMem: o.GPUMem, Prompts: len(o.Prompts), Tokens: n, WarmupPrompt: o.WarmupPrompt}
	if o.PromptIDs != nil {
		rep.Prompts = len(o.PromptIDs)
	}
	runs := []*offload.Policy{nil}
	if len(o.Policies) > 0 {
		runs = nil
		for _, p := range o.Policies {
			if err := offload.CheckTimed(p, o.Predictor); err != nil {
				return nil, err
			}
			runs = append(runs, &p)
		}
		if o.GPUMem <= 0 {
			return nil, fmt.Errorf("bench: offloading needs a device memory budget (--gpu-mem)")
		}
	}
	for _, p := range runs {
		var off *engine.OffloadOptions
		var plan *engine.AutoPlan
		name := "resident"
		if p != nil {
			name = p.String()
			off = &engine.OffloadOptions{Policy: *p, GPUMem: o.GPUMem, Eviction: o.Eviction}
			if *p == offload.Prefetch || *p == offload.Commit {
				off.Predictor = o.Predictor // the others predict nothing
			}
			if p.Split() {
				off.HostLayers = o.HostLayers
			}
		}
		if p != nil && *p == offload.Auto {
			var err error
			po := engine.PlanOptions{Options: o.Options, GPUMem: o.GPUMem, Eviction: o.Eviction, Predictor: o.Predictor, AllowCommit: o.AllowCommit,
				Commit: o.Commit, MoELayers: o.moe.layers, Experts: o.moe.experts, Used: o.moe.used}
			if plan, err = engine.PlanPlacement(ctx, open, po); err != nil {
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
func benchRun(ctx context.Context, open func(engine.Options) (*engine.Model, error), o Options, off *engine.OffloadOptions, name string, n int, rep *Report) (engine.PolicyReport, error) {
	opts := o.Options
	opts.Offload, opts.Commit = off, nil
	if off != nil && off.Policy == offload.Commit && (off.Predictor == "" || off.Predictor == "router") {
		opts.Commit = o.Commit
	}
	m, err := open(opts)
	if err != nil {
		return engine.PolicyReport{}, err
	}
	defer m.Close()
	rep.Device = m.Device()
	if _, gpu := m.GPUStats(); gpu && opts.GPURowWarps > 1 {
		rep.GPURowWarps = opts.GPURowWarps
	}
	t, err := m.Time(ctx, engine.TimeOptions{Name: name, Prompts: o.Prompts, PromptIDs: o.PromptIDs, Tokens: n, Warmup: o.Warmup, TimelineTokens: o.TimelineTokens,
		WarmupPrompt: o.WarmupPrompt})
	if err != nil {
		return engine.PolicyReport{}, err
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
