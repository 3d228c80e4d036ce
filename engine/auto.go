package engine

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/autoplace"
	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/trace"
)

// Automatic placement: where a model does not fit its GPU, which offload policy, how many
// host layers and how large a cache run it fastest is not something a user should have to
// find by hand. Package autoplace lists the candidates and chooses; each candidate's decode
// latency is predicted here with the engine's own scheduler, timing only, on a short routing
// sample (the candidates' runs are the same code path bench times and the card would run).

// AutoCandidate is one placement auto placement weighed, with its predicted figures.
type AutoCandidate = autoplace.Candidate

// AutoPlan is auto placement's decision: the fastest candidate that fits, and all it weighed.
type AutoPlan = autoplace.Plan

// autoOptions are what planPlacement needs beside the model.
type autoOptions struct {
	base  Options // the device (simulated: the card auto places for), threads, context
	place autoplace.Options
	// sample replays the routing sample (and a modelled predictor's predictions, if any) for
	// prompt + tokens positions (0: autoplace.Prompt and autoplace.Tokens), fewer where the
	// context is short.
	sample         *TimingOnlyOptions
	prompt, tokens int
	commit         *CommitOptions // commit's Commit Router
}

// planPlacement chooses the placement of the model open opens (autoplace.Choose), timing
// every candidate on the sample's routing with Model.Time.
func planPlacement(ctx context.Context, open func(Options) (*Model, error), experts, layers int, o autoOptions) (*AutoPlan, error) {
	prompt, tokens := cmp.Or(o.prompt, autoplace.Prompt), cmp.Or(o.tokens, autoplace.Tokens)
	to := TimeOptions{Name: "auto", PromptIDs: [][]int32{make([]int32, prompt)}, Tokens: tokens, Warmup: tokens / 2}
	run := func(oo OffloadOptions) (autoplace.Run, error) {
		opts := o.base
		opts.TimingOnly, opts.Offload, opts.Commit = o.sample, &oo, nil
		if oo.Policy == offload.Commit && (oo.Predictor == "" || oo.Predictor == "router") {
			opts.Commit = o.commit
		}
		m, err := open(opts)
		if err != nil {
			return autoplace.Run{}, err
		}
		t, err := m.Time(ctx, to)
		st, _ := m.Offload()
		m.Close()
		return autoplace.Run{TokensPerSecond: t.Row.TokensPerSecond, TTFT: t.Row.TTFT, Resident: st.Resident, SlotBytes: st.SlotBytes}, err
	}
	o.place.Device = o.base.Device
	return autoplace.Choose(o.place, experts, layers, run)
}

// DefaultSynthetic is the synthetic router's default skew and correlations (bench's flags):
// auto placement's routing sample where it has none of the model's own.
var DefaultSynthetic = trace.SynthOptions{Skew: 0.8, CrossLayer: 0.5, Temporal: 0.2, Seed: 1}

// PlanOptions configure PlanPlacement.
type PlanOptions struct {
	// Options are what the candidates open the model with: the device (a simulated GPU, or
	// a real card, whose candidates run on its description), threads, context, host rates.
	// Options.TimingOnly, when set, is the routing the candidates replay; else a sample of
	// the synthetic router at DefaultSynthetic's skew.
	Options Options
	// GPUMem is the device memory budget to place the model in.
	GPUMem   int64
	Eviction offload.Eviction
	// Predictor is prefetch's and commit's; AllowCommit lets the plan choose commit, which
	// changes the output; Commit configures its Commit Router (nil: defaults).
	Predictor   string
	AllowCommit bool
	Commit      *CommitOptions
	// MoELayers, Experts and Used are the model's routed shape (its Info's).
	MoELayers, Experts, Used int
}

// AutoSample is how many tokens of routing PlanPlacement's candidates replay: its prompt,
// the decode steps, and the one the last predicts for.
const AutoSample = autoplace.Sample

// PlanPlacement makes automatic placement's decision for the model open opens, without
// running it: on o.Options.TimingOnly's routing (its first AutoSample tokens), else (a
// model whose routing is not known ahead) on a sample of the synthetic router at its
// default skew; on a real card, on its description (as Open places a model that does not
// fit). bench's auto rows are its decisions.
func PlanPlacement(ctx context.Context, open func(Options) (*Model, error), o PlanOptions) (*AutoPlan, error) {
	if o.MoELayers == 0 {
		return nil, fmt.Errorf("auto placement: the model's MoE layers are unknown")
	}
	ao := autoOptions{base: o.Options, commit: o.Commit, place: autoplace.Options{Budget: o.GPUMem, Eviction: o.Eviction,
		Predictor: o.Predictor, AllowCommit: o.AllowCommit}}
	if to := o.Options.TimingOnly; to != nil {
		ao.sample, ao.place.Routing = to, "the first tokens of the benchmark's routing"
	} else {
		var err error
		if ao.prompt, ao.tokens, err = autoplace.SampleSize(o.Options.ContextLength); err != nil {
			return nil, err
		}
		shape := autoplace.Shape{Layers: o.MoELayers, Experts: o.Experts, Used: o.Used}
		sample, label, err := autoplace.SyntheticSample(DefaultSynthetic, shape, ao.prompt+ao.tokens+1)
		if err != nil {
			return nil, fmt.Errorf("auto placement: %w", err)
		}
		ao.sample, ao.place.Routing = replaySample(sample), label
	}
	if !strings.HasPrefix(strings.TrimSpace(o.Options.Device), "sim:") {
		// The candidates run timing only, which a real card cannot: they run on its
		// description, as Open's automatic placement does.
		probe := o.Options
		probe.Offload = &OffloadOptions{Policy: offload.OnDemand, GPUMem: o.GPUMem, Eviction: o.Eviction}
		m, err := open(probe)
		if err != nil {
			return nil, fmt.Errorf("auto placement: %w", err)
		}
		prof, err := m.cardProfile()
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("auto placement: %w", err)
		}
		ao.base.Device, ao.base.profile = "sim:"+prof.Name, prof
	}
	return planPlacement(ctx, open, o.Experts, o.MoELayers, ao)
}

// replaySample replays routing token by MoE layer, timing only.
func replaySample(sample [][][]int) *TimingOnlyOptions {
	return &TimingOnlyOptions{Routing: func(pos, j int) []int {
		if pos >= len(sample) || j >= len(sample[pos]) {
			return nil
		}
		return sample[pos][j]
	}}
}

// autoPlaces says whether Open places the experts itself: on a GPU, real or simulated, with
// no placement asked for, when the weights, a session's KV cache and a pass's activations do
// not fit the card.
func (m *Model) autoPlaces() bool {
	o := m.opts
	if o.NoAuto || o.Offload != nil || o.EP != nil || o.TimingOnly != nil || m.info.Experts == 0 {
		return false
	}
	if !hasCardMemory(m.dev) {
		return false
	}
	need := m.info.NonExpertBytes + m.info.ExpertBytes + kvCacheBytes(m)*int64(max(o.Parallel, 1)) + m.act.bytes()
	return need > m.dev.Memory().Budget()
}

// placeAuto makes automatic placement's decision for the model on its card and sets the
// offload options Open goes on with: every candidate is timed on the card's profile (a real
// card's described from what the driver says and a measured copy) on the first tokens of
// the model's routing recorded in Options.AutoTrace, or else, since the model's own routing
// is not known before it runs, on a sample of the synthetic router at its default skew.
func (m *Model) placeAuto() error {
	if err := m.checkFeatures(); err != nil {
		return err // before timing candidates on a device that cannot run it
	}
	prof, err := m.cardProfile()
	if err != nil {
		return fmt.Errorf("auto placement: %w", err)
	}
	rates := m.opts.HostRates
	if _, gpu := m.dev.(*cuda.GPU); gpu && rates.Bandwidth == 0 {
		m := cpu.MeasureHostRates()
		rates.Bandwidth, rates.FLOPS = m.Bandwidth, cmp.Or(rates.FLOPS, m.FLOPS)
	}
	layers := len(m.info.MoELayers)
	prompt, tokens, err := autoplace.SampleSize(m.nctx)
	if err != nil {
		return err
	}
	shape := autoplace.Shape{Name: m.info.Name, Layers: layers, Experts: m.info.Experts, Used: m.info.ExpertsUsed}
	sample, label, err := autoplace.SyntheticSample(DefaultSynthetic, shape, prompt+tokens+1)
	if m.opts.AutoTrace != "" {
		sample, label, err = autoplace.TraceSample(m.opts.AutoTrace, shape, prompt+tokens+1)
	}
	if err != nil {
		return fmt.Errorf("auto placement: %w", err)
	}
	base := Options{Device: "sim:" + prof.Name, profile: prof, Threads: m.opts.Threads, ContextLength: m.nctx,
		KVType: map[bool]string{true: "f16", false: "f32"}[m.kvF16], HostRates: rates}
	ao := autoOptions{base: base, sample: replaySample(sample), prompt: prompt, tokens: tokens,
		place: autoplace.Options{Budget: m.dev.Memory().Budget(), Routing: label, AllowCommit: m.opts.AutoCommit}}
	path := m.info.Path
	plan, err := planPlacement(context.Background(), func(o Options) (*Model, error) { return Open(path, o) }, m.info.Experts, layers, ao)
	if err != nil {
		return err
	}
	chosen := plan.Chosen.Offload
	m.opts.Offload, m.plan = &chosen, plan
	m.devNote = strings.TrimPrefix(m.devNote+"; "+plan.Summary(), "; ")
	return nil
}

// AutoPlan returns automatic placement's decision, and false when Open made none (a policy
// was given, the model fits, or the device is the CPU).
func (m *Model) AutoPlan() (*AutoPlan, bool) { return m.plan, m.plan != nil }

// cardProfile describes the model's GPU for automatic placement: a simulated card's own
// profile, or for a real card the embedded profile of its kind (or one from the driver's
// figures) with its memory and a copy stream rate measured now (autoplace.DescribeGPU).
func (m *Model) cardProfile() (*sim.Profile, error) {
	switch d := m.dev.(type) {
	case *sim.Device:
		p := *d.Profile()
		p.MemoryBytes = d.Memory().Budget()
		return &p, nil
	case *cuda.GPU:
		return autoplace.DescribeGPU(d)
	}
	return nil, fmt.Errorf("device %s is not a GPU", m.dev.Name())
}
