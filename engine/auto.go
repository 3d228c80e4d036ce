package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/trace"
)

// Automatic placement (issue 25): where a model does not fit its GPU, which offload policy,
// how many host layers and how large a cache run it fastest is not something a user should
// have to find by hand. planPlacement predicts each candidate's decode latency with the
// engine's own scheduler, timing only, on a short routing sample (the candidates' runs are
// the same code path bench times and the card would run), and picks the fastest that fits.

// AutoCandidate is one placement auto placement weighed, with its predicted figures.
type AutoCandidate struct {
	Offload         OffloadOptions
	TokensPerSecond float64 // predicted decode rate; 0 when it does not fit
	TTFT            float64 // predicted time to first token of the sample's prompt, seconds
	Err             error   `json:"-"` // why it could not run (the budget too small), nil if it ran
}

// String names the candidate's placement as the bench and the decision line print it.
func (c AutoCandidate) String() string {
	o := c.Offload
	s := o.Policy.String()
	if o.Policy.Split() {
		s += fmt.Sprintf(" %d", o.HostLayers)
	}
	if o.Predictor != "" {
		s += "/" + o.Predictor
	}
	return s
}

// AutoPlan is auto placement's decision: the fastest candidate that fits, and all it weighed.
type AutoPlan struct {
	Chosen     AutoCandidate
	Candidates []AutoCandidate
	// Routing says what routing the prediction assumed.
	Routing string
}

// Summary is the decision in one line, as Open reports it (Model.DeviceNote).
func (p *AutoPlan) Summary() string {
	var others []string
	for _, c := range p.Candidates {
		if c.Err == nil && c.Offload != p.Chosen.Offload {
			others = append(others, fmt.Sprintf("%s %.1f", c, c.TokensPerSecond))
		}
	}
	return fmt.Sprintf("auto placement: %s, predicted %.1f tokens/s (others: %s; %s)",
		p.Chosen, p.Chosen.TokensPerSecond, strings.Join(others, ", "), p.Routing)
}

// The routing sample auto placement predicts with: a short prompt, and decode steps whose
// first half warms the caches and whose second half is timed.
const (
	autoPrompt = 8
	autoTokens = 64
)

// autoOptions are what planPlacement needs beside the model.
type autoOptions struct {
	base     Options // the device (simulated: the card auto places for), threads, context
	budget   int64   // the device memory to fill
	eviction offload.Eviction
	// sample replays the routing sample (and a modelled predictor's predictions, if any) for
	// autoPrompt + autoTokens positions; label says where the routing came from.
	sample *TimingOnlyOptions
	label  string
	// predictor is prefetch's and commit's; allowCommit lets auto choose commit, which
	// changes the output.
	predictor   string
	allowCommit bool
	commit      *CommitOptions
}

// syntheticSample draws n tokens of routing for layers MoE layers of top-used of experts from
// the synthetic router at so's skew and correlations.
func syntheticSample(so trace.SynthOptions, layers, experts, used, n int) ([][][]int, string, error) {
	so.Layers, so.Experts, so.Used = layers, experts, used
	sr, err := trace.NewSynthRouter(so)
	if err != nil {
		return nil, "", err
	}
	out := make([][][]int, n)
	for i := range out {
		t := sr.Next()
		out[i] = make([][]int, len(t.Layers))
		for j, l := range t.Layers {
			out[i][j] = l.Experts
		}
	}
	return out, sr.Header("auto").Source, nil
}

// planPlacement times every candidate placement of the model open opens (timing only, with
// the sample's routing) and returns the fastest that fits, exact policies first: commit only
// when allowed. The candidates are the policies that move experts (ondemand, prefetch,
// cpu-miss) with every slot the budget holds, and llama.cpp's split, plain with the fewest host
// layers whose device layers fit and with its cache at several host layer counts.
func planPlacement(ctx context.Context, open func(Options) (*Model, error), experts, layers int, o autoOptions) (*AutoPlan, error) {
	plan := &AutoPlan{Routing: "predicted on " + o.label}
	try := func(oo OffloadOptions) (AutoCandidate, *BenchReport) {
		c := AutoCandidate{Offload: oo}
		bo := BenchOptions{Options: o.base, PromptIDs: [][]int32{make([]int32, autoPrompt)}, Tokens: autoTokens, Warmup: autoTokens / 2,
			Policies: []offload.Policy{oo.Policy}, GPUMem: oo.GPUMem, Eviction: oo.Eviction, HostLayers: oo.HostLayers,
			Predictor: oo.Predictor, Commit: o.commit}
		bo.Options.TimingOnly = o.sample
		rep, err := bench(ctx, "auto", open, bo)
		if err == nil {
			r := rep.Rows[0]
			c.TokensPerSecond, c.TTFT = r.TokensPerSecond, r.TTFT
		}
		c.Err = err
		plan.Candidates = append(plan.Candidates, c)
		return c, rep
	}
	base := OffloadOptions{GPUMem: o.budget, Eviction: o.eviction}
	first := base
	first.Policy = offload.OnDemand
	c, rep := try(first)
	if c.Err != nil {
		// The smallest policy does not fit: nothing will.
		return nil, fmt.Errorf("auto placement: %w", c.Err)
	}
	pf := base
	pf.Policy, pf.Predictor = offload.Prefetch, cmp.Or(o.predictor, "prev-token")
	cands := []OffloadOptions{pf, {Policy: offload.CPUMiss, GPUMem: o.budget, Eviction: o.eviction}}
	if o.allowCommit {
		cm := pf
		cm.Policy = offload.Commit
		cands = append(cands, cm)
	}
	// The fewest host layers whose device layers' experts fit beside what stays resident.
	fit := (o.budget - rep.Resident) / max(rep.SlotBytes, 1) / int64(max(experts, 1))
	nMin := max(0, layers-int(fit))
	for _, n := range []int{nMin, nMin + layers/8, nMin + layers/4, nMin + layers/2} {
		if n > layers {
			continue
		}
		st := base
		st.Policy, st.HostLayers = offload.StaticCache, n
		if n == nMin {
			plain := st
			plain.Policy = offload.Static
			cands = append(cands, plain)
		}
		cands = append(cands, st)
	}
	for _, oo := range cands {
		if slices.ContainsFunc(plan.Candidates, func(c AutoCandidate) bool { return c.Offload == oo }) {
			continue
		}
		try(oo)
	}
	best := -1
	for i, c := range plan.Candidates {
		if c.Err == nil && (best < 0 || c.TokensPerSecond > plan.Candidates[best].TokensPerSecond) {
			best = i
		}
	}
	if best < 0 || math.IsNaN(plan.Candidates[best].TokensPerSecond) {
		return nil, fmt.Errorf("auto placement: no candidate ran")
	}
	plan.Chosen = plan.Candidates[best]
	return plan, nil
}

// DefaultSynthetic is the synthetic router's default skew and correlations (bench's flags):
// auto placement's routing sample where it has none of the model's own.
var DefaultSynthetic = trace.SynthOptions{Skew: 0.8, CrossLayer: 0.5, Temporal: 0.2, Seed: 1}

// benchAuto makes auto placement's decision for a bench row: on the first tokens of the
// benchmark's own routing in a timing-only run, else (a run that computes, whose routing is
// not known ahead) on a sample of the synthetic router at its default skew.
func benchAuto(ctx context.Context, open func(Options) (*Model, error), o BenchOptions) (*AutoPlan, error) {
	d := o.moe
	if d.layers == 0 {
		return nil, fmt.Errorf("auto placement: the model's MoE layers are unknown")
	}
	ao := autoOptions{base: o.Options, budget: o.GPUMem, eviction: o.Eviction, predictor: o.Predictor,
		allowCommit: o.AllowCommit, commit: o.Commit}
	if to := o.Options.TimingOnly; to != nil {
		ao.sample, ao.label = to, "the first tokens of the benchmark's routing"
	} else {
		sample, label, err := syntheticSample(DefaultSynthetic, d.layers, d.experts, d.used, autoPrompt+autoTokens+1)
		if err != nil {
			return nil, fmt.Errorf("auto placement: %w", err)
		}
		ao.sample, ao.label = replaySample(sample), label
	}
	return planPlacement(ctx, open, d.experts, d.layers, ao)
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
