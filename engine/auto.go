package engine

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/trace"
)

// Automatic placement: where a model does not fit its GPU, which offload policy,
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
	why := ""
	for _, c := range p.Candidates {
		if c.Err == nil && c.Offload != p.Chosen.Offload {
			others = append(others, fmt.Sprintf("%s %.1f", c, c.TokensPerSecond))
			if c.TokensPerSecond > p.Chosen.TokensPerSecond && why == "" {
				why = fmt.Sprintf(" and %.0f ms to the first token of its sample, the quickest of those within %.0f%% of the fastest", p.Chosen.TTFT*1e3, (1-autoTie)*100)
			}
		}
	}
	return fmt.Sprintf("auto placement: %s, predicted %.1f tokens/s%s (others: %s; %s)",
		p.Chosen, p.Chosen.TokensPerSecond, why, strings.Join(others, ", "), p.Routing)
}

// The routing sample auto placement predicts with: a short prompt, and decode steps whose
// first half warms the caches and whose second half is timed.
const (
	autoPrompt = 32
	autoTokens = 96
)

// routedShape is what routing must fit: a model's MoE layers, experts and top-k.
type routedShape struct {
	name                  string
	layers, experts, used int
}

// autoOptions are what planPlacement needs beside the model.
type autoOptions struct {
	base     Options // the device (simulated: the card auto places for), threads, context
	budget   int64   // the device memory to fill
	eviction offload.Eviction
	// sample replays the routing sample (and a modelled predictor's predictions, if any) for
	// autoPrompt + autoTokens positions; label says where the routing came from.
	sample *TimingOnlyOptions
	label  string
	// prompt and tokens are the sample's prompt and decode steps (0: autoPrompt and
	// autoTokens), fewer where the context is short.
	prompt, tokens int
	// predictor is prefetch's and commit's; allowCommit lets auto choose commit, which
	// changes the output.
	predictor   string
	allowCommit bool
	commit      *CommitOptions
}

// autoSampleSize fits the routing sample to a context of nctx positions (0: the model's own,
// taken to be long enough): a quarter of it at most for the prompt, the rest decoded.
func autoSampleSize(nctx int) (prompt, tokens int, err error) {
	if nctx == 0 {
		return autoPrompt, autoTokens, nil
	}
	prompt = min(autoPrompt, nctx/4)
	tokens = min(autoTokens, nctx-prompt-1)
	if prompt < 1 || tokens < 4 {
		return 0, 0, fmt.Errorf("auto placement: a %d-position context leaves no room for a routing sample", nctx)
	}
	return prompt, tokens, nil
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

// autoTie is how close to the fastest predicted decode rate a candidate with a quicker first
// token is chosen instead.
const autoTie = 0.97

// planPlacement times every candidate placement of the model open opens (timing only, with
// the sample's routing) and returns the fastest that fits (within autoTie of it, the one
// with the quickest first token); commit, which changes the output,
// only when allowed. The candidates are the policies that move experts (ondemand, prefetch,
// cpu-miss, hot) with every slot the budget holds, and llama.cpp's split, plain at the fewest
// host layers whose device layers fit and with its cache at that count and a few more. A
// model whose experts all fit stays resident (static at 0 host layers).
func planPlacement(ctx context.Context, open func(Options) (*Model, error), experts, layers int, o autoOptions) (*AutoPlan, error) {
	plan := &AutoPlan{Routing: "predicted on " + o.label}
	prompt, tokens := cmp.Or(o.prompt, autoPrompt), cmp.Or(o.tokens, autoTokens)
	to := TimeOptions{Name: "auto", PromptIDs: [][]int32{make([]int32, prompt)}, Tokens: tokens, Warmup: tokens / 2}
	try := func(oo OffloadOptions) (AutoCandidate, OffloadStats) {
		c := AutoCandidate{Offload: oo}
		opts := o.base
		opts.TimingOnly, opts.Offload, opts.Commit = o.sample, &oo, nil
		if oo.Policy == offload.Commit && (oo.Predictor == "" || oo.Predictor == "router") {
			opts.Commit = o.commit
		}
		var st OffloadStats
		err := offload.CheckTimed(oo.Policy, oo.Predictor)
		var m *Model
		if err == nil {
			m, err = open(opts)
		}
		if err == nil {
			var t Timing
			t, err = m.Time(ctx, to)
			st, _ = m.Offload()
			m.Close()
			c.TokensPerSecond, c.TTFT = t.Row.TokensPerSecond, t.Row.TTFT
		}
		c.Err = err
		plan.Candidates = append(plan.Candidates, c)
		return c, st
	}
	base := OffloadOptions{GPUMem: o.budget, Eviction: o.eviction}
	first := base
	first.Policy = offload.OnDemand
	c, st := try(first)
	if c.Err != nil {
		// The policy with the fewest slots does not fit: nothing will.
		return nil, fmt.Errorf("auto placement: the %s of %s cannot run the model even with its experts in host memory (a shorter context needs less; --gpu-mem and --policy place them by hand): %w",
			sizeString(o.budget), o.base.Device, c.Err)
	}
	pf := base
	pf.Policy, pf.Predictor = offload.Prefetch, cmp.Or(o.predictor, "prev-token")
	cands := []OffloadOptions{pf, {Policy: offload.CPUMiss, GPUMem: o.budget, Eviction: o.eviction}, {Policy: offload.Hot, GPUMem: o.budget, Eviction: offload.LFU}}
	if o.allowCommit {
		cm := pf
		cm.Policy = offload.Commit
		cands = append(cands, cm)
	}
	// The fewest host layers whose device layers' experts fit beside what stays resident.
	fit := (o.budget - st.Resident) / max(st.SlotBytes, 1) / int64(max(experts, 1))
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
	if err := plan.choose(); err != nil {
		return nil, err
	}
	return plan, nil
}

// choose sets Chosen to the fastest candidate that ran or, within autoTie of it, the one with
// the quickest first token; a model whose experts all fit stays resident.
func (plan *AutoPlan) choose() error {
	best, resident := -1, false
	for i, c := range plan.Candidates {
		if c.Err == nil && (best < 0 || c.TokensPerSecond > plan.Candidates[best].TokensPerSecond) {
			best = i
		}
		// Every expert fits beside the rest: nothing need move, and no prediction on a
		// sample should talk the model out of the card.
		if c.Err == nil && c.Offload.Policy == offload.Static && c.Offload.HostLayers == 0 {
			best, resident = i, true
			break
		}
	}
	if best < 0 || math.IsNaN(plan.Candidates[best].TokensPerSecond) {
		return fmt.Errorf("auto placement: no candidate ran")
	}
	if !resident {
		// A short sample does not rank decode rates within a few percent (Mixtral-8x7B on
		// sim:rtx4090 under uniform routing: static-cache 14 predicted at 59.6 tokens/s and hot
		// at 58.3 decoded 57.4 and 57.7), while their prompts can differ twofold (403 and
		// 177 ms): among those that close, the quickest to the first token.
		top := plan.Candidates[best].TokensPerSecond
		for i, c := range plan.Candidates {
			if c.Err == nil && c.TokensPerSecond >= autoTie*top && c.TTFT < plan.Candidates[best].TTFT {
				best = i
			}
		}
	}
	plan.Chosen = plan.Candidates[best]
	return nil
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
const AutoSample = autoPrompt + autoTokens + 1

// PlanPlacement makes automatic placement's decision for the model open opens, without
// running it: on o.Options.TimingOnly's routing (its first AutoSample tokens), else (a
// model whose routing is not known ahead) on a sample of the synthetic router at its
// default skew; on a real card, on its description (as Open places a model that does not
// fit). bench's auto rows are its decisions.
func PlanPlacement(ctx context.Context, open func(Options) (*Model, error), o PlanOptions) (*AutoPlan, error) {
	if o.MoELayers == 0 {
		return nil, fmt.Errorf("auto placement: the model's MoE layers are unknown")
	}
	ao := autoOptions{base: o.Options, budget: o.GPUMem, eviction: o.Eviction, predictor: o.Predictor,
		allowCommit: o.AllowCommit, commit: o.Commit}
	if to := o.Options.TimingOnly; to != nil {
		ao.sample, ao.label = to, "the first tokens of the benchmark's routing"
	} else {
		var err error
		if ao.prompt, ao.tokens, err = autoSampleSize(o.Options.ContextLength); err != nil {
			return nil, err
		}
		sample, label, err := syntheticSample(DefaultSynthetic, o.MoELayers, o.Experts, o.Used, ao.prompt+ao.tokens+1)
		if err != nil {
			return nil, fmt.Errorf("auto placement: %w", err)
		}
		ao.sample, ao.label = replaySample(sample), label
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

// traceSample reads the routing of the first n tokens recorded in the trace at path, which
// must route shape's MoE layers.
func traceSample(path string, shape routedShape, n int) ([][][]int, string, error) {
	r, err := trace.OpenFor(path, shape.name, shape.layers, shape.experts, shape.used)
	if err != nil {
		return nil, "", err
	}
	defer r.Close()
	out := make([][][]int, 0, n)
	for len(out) < n {
		t, err := r.Next()
		if err == io.EOF {
			return nil, "", fmt.Errorf("trace %s holds %d tokens; the routing sample needs %d", path, len(out), n)
		}
		if err != nil {
			return nil, "", err
		}
		tok := make([][]int, len(t.Layers))
		for j, l := range t.Layers {
			tok[j] = slices.Clone(l.Experts)
		}
		out = append(out, tok)
	}
	return out, "the first tokens of the routing recorded in " + path, nil
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
	switch m.dev.(type) {
	case *sim.Device, *cuda.GPU:
	default:
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
	if err := m.checkHostOnly(); err != nil {
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
	prompt, tokens, err := autoSampleSize(m.nctx)
	if err != nil {
		return err
	}
	shape := routedShape{name: m.info.Name, layers: layers, experts: m.info.Experts, used: m.info.ExpertsUsed}
	sample, label, err := syntheticSample(DefaultSynthetic, layers, m.info.Experts, m.info.ExpertsUsed, prompt+tokens+1)
	if m.opts.AutoTrace != "" {
		sample, label, err = traceSample(m.opts.AutoTrace, shape, prompt+tokens+1)
	}
	if err != nil {
		return fmt.Errorf("auto placement: %w", err)
	}
	base := Options{Device: "sim:" + prof.Name, profile: prof, Threads: m.opts.Threads, ContextLength: m.nctx,
		KVType: map[bool]string{true: "f16", false: "f32"}[m.kvF16], HostRates: rates}
	ao := autoOptions{base: base, budget: m.dev.Memory().Budget(), sample: replaySample(sample), label: label,
		prompt: prompt, tokens: tokens, allowCommit: m.opts.AutoCommit}
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
// figures) with its memory and a copy stream rate measured now.
func (m *Model) cardProfile() (*sim.Profile, error) {
	switch d := m.dev.(type) {
	case *sim.Device:
		p := *d.Profile()
		p.MemoryBytes = d.Memory().Budget()
		return &p, nil
	case *cuda.GPU:
		return gpuProfile(d)
	}
	return nil, fmt.Errorf("device %s is not a GPU", m.dev.Name())
}

// gpuProfile describes a real card: its kind's embedded profile when there is one, else its
// figures from the driver (the dense FP16 rate with FP32 accumulate taken as 512 flops a clock
// a multiprocessor, as on Turing, Ampere and Ada GeForce cards), with its free memory and the
// copy stream's rate measured on 16 MiB copies.
func gpuProfile(g *cuda.GPU) (*sim.Profile, error) {
	in := g.Info()
	p := profileOfKind(in.Name)
	if p == nil {
		p = &sim.Profile{Name: "cuda", Description: in.Name, MemoryBandwidth: in.MemoryBandwidth,
			PeakFLOPS: float64(in.SMs) * float64(in.ClockKHz) * 1e3 * 512, CopyLatency: 10e-6, LaunchOverhead: 5e-6}
	}
	p.MemoryBytes = g.Memory().Budget()
	bw, err := measureCopies(g, 16<<20, 4)
	if err != nil {
		return nil, err
	}
	p.PCIeEffective = bw
	p.PCIeBandwidth = max(p.PCIeBandwidth, bw)
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", in.Name, err)
	}
	return p, nil
}

// profileOfKind returns the embedded profile of a card the driver names ("NVIDIA GeForce RTX
// 4090" is rtx4090), or nil.
func profileOfKind(name string) *sim.Profile {
	n := strings.ToLower(name)
	for _, drop := range []string{"nvidia", "geforce", " ", "-"} {
		n = strings.ReplaceAll(n, drop, "")
	}
	for _, k := range sim.Profiles() {
		if strings.ReplaceAll(k, "-", "") == n {
			p, err := sim.LoadProfile(k)
			if err == nil {
				return p
			}
		}
	}
	return nil
}

// measureCopies times n copies of size bytes from pinned host memory to the card and returns
// the best rate.
func measureCopies(g *cuda.GPU, size int64, n int) (float64, error) {
	src, err := g.HostAlloc(size)
	if err != nil {
		return 0, fmt.Errorf("measure the copy stream: %w", err)
	}
	dst, err := g.Buffer(size, "copy stream measurement")
	if err != nil {
		return 0, fmt.Errorf("measure the copy stream: %w", err)
	}
	defer g.Release(dst)
	best := math.Inf(1)
	for range n {
		start := time.Now()
		g.CopyIn(dst, src)
		g.Sync(g.Copy().Record())
		best = min(best, time.Since(start).Seconds())
	}
	if err := g.Err(); err != nil {
		return 0, fmt.Errorf("measure the copy stream: %w", err)
	}
	return float64(size) / max(best, 1e-9), nil
}

// sizeString writes n bytes in GiB, or MiB below one GiB.
func sizeString(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}
