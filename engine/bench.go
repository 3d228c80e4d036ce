package engine

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/commit-run/commit-run/cuda"
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
	if n < 2 || n > 1<<20 {
		return nil, fmt.Errorf("bench: %d tokens per prompt: want 2 to %d (the first is the time to first token)", n, 1<<20)
	}
	if o.Warmup < 0 || o.Warmup > n-2 {
		return nil, fmt.Errorf("bench: %d warm-up tokens of %d: want 0 to %d, so that one decode step is timed", o.Warmup, n, n-2)
	}
	prompts := len(o.Prompts)
	if o.PromptIDs != nil {
		prompts = len(o.PromptIDs)
	}
	if prompts == 0 {
		return nil, fmt.Errorf("bench: no prompts")
	}
	rep := &BenchReport{Model: name, GPUMem: o.GPUMem, Prompts: prompts, Tokens: n}
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
	s, err := m.NewSession()
	if err != nil {
		return PolicyReport{}, err
	}
	defer s.Close()
	r := newBenchRunner(m, s, o, name, n, rep)
	for i := range rep.Prompts {
		if err := r.prompt(ctx, i); err != nil {
			return PolicyReport{}, err
		}
	}
	if len(r.st) == 0 {
		return PolicyReport{}, fmt.Errorf("bench: no decode steps were timed")
	}
	row := r.row()
	if o.Timeline != nil && r.simulated {
		if err := r.timeline(); err != nil {
			return row, err
		}
	}
	return row, nil
}

// benchRunner times one run's prompts on an opened model and sums what its decode steps
// did.
type benchRunner struct {
	m         *Model
	s         *Session
	o         BenchOptions
	name      string
	n         int // tokens to generate per prompt
	rep       *BenchReport
	sd        *sim.Device // the simulated device, or nil
	simulated bool
	timer     deviceTimer // the device's own stream timer, or nil
	timed     bool
	pcie      float64 // the simulated link's rate
	hostMem   float64 // host memory's rate where the host computes experts

	st               []offload.TokenStats // the timed decode steps
	devTime          float64              // device seconds of the timed tokens, summed
	per              GPUTokenStats        // a GPU's counters of the timed tokens, summed
	ttft, ttftLimit  float64
	drawFrom, drawTo float64 // the timeline's window
}

func newBenchRunner(m *Model, s *Session, o BenchOptions, name string, n int, rep *BenchReport) *benchRunner {
	r := &benchRunner{m: m, s: s, o: o, name: name, n: n, rep: rep}
	r.sd, r.simulated = m.dev.(*sim.Device)
	rep.Device, rep.Simulated = m.dev.Name(), r.simulated
	if m.off != nil && m.off.planner != nil && m.off.opts.Policy.UsesHost() {
		hr, _ := m.opts.HostRates.WithDefaults() // Open checked them
		rep.HostRates, r.hostMem = &hr, hr.Memory
	}
	if r.simulated {
		rep.Calibrated = r.sd.Profile().Calibrated
		r.pcie = r.sd.Profile().PCIeEffective
	}
	r.timer, r.timed = m.dev.(deviceTimer)
	return r
}

// take is the clock and the counters now.
func (r *benchRunner) take() benchSnap {
	t, ok := r.m.Clock()
	if !ok {
		t = float64(time.Now().UnixNano()) / 1e9
	}
	sn := benchSnap{t: t}
	sn.off, _ = r.m.Offload()
	if r.simulated {
		sn.dv = r.sd.Stats()
	}
	if r.timed {
		sn.gpu, sn.timed = r.timer.Mark(), true
	}
	return sn
}

// prompt generates from prompt i and times its tokens: the first as the time to it, those
// after the warm-up as decode steps.
func (r *benchRunner) prompt(ctx context.Context, i int) error {
	var ids []int32
	var prompt string
	if r.o.PromptIDs != nil {
		ids, prompt = r.o.PromptIDs[i], fmt.Sprintf("%d of %d tokens", i, len(r.o.PromptIDs[i]))
	} else {
		prompt = r.o.Prompts[i]
		var err error
		if ids, err = r.m.Tokenize(prompt, true); err != nil {
			return err
		}
	}
	r.s.Reset()
	start := r.take()
	last := start
	tok := 0
	_, err := r.s.Generate(ctx, ids, GenerateOptions{MaxTokens: r.n, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true},
		OnToken: func(Token) error {
			now := r.take()
			switch {
			case tok == 0:
				r.ttft += now.t - start.t
				r.ttftLimit += tokenStats(start, now, r.pcie, r.hostMem).Limit
			case tok > r.o.Warmup:
				r.st = append(r.st, tokenStats(last, now, r.pcie, r.hostMem))
				r.devTime += now.gpu.DeviceSeconds - last.gpu.DeviceSeconds
				r.per.Launches += float64(now.gpu.Launches - last.gpu.Launches)
				r.per.Kernels += float64(now.gpu.Kernels - last.gpu.Kernels)
				r.per.Reads += float64(now.gpu.Reads - last.gpu.Reads)
			}
			tok++
			last = now
			return nil
		}})
	if err != nil {
		return fmt.Errorf("bench %s, prompt %q: %w", r.name, prompt, err)
	}
	r.drawTo = last.t
	// The prompt's last decode tokens, never reaching back into its prefill.
	if k := min(cmp.Or(r.o.TimelineTokens, 2), r.n-1, len(r.st)); k > 0 {
		r.drawFrom = r.drawTo
		for _, x := range r.st[len(r.st)-k:] {
			r.drawFrom -= x.Latency
		}
	}
	return nil
}

// row summarises the run.
func (r *benchRunner) row() PolicyReport {
	m, rep := r.m, r.rep
	var slots int
	if off, ok := m.Offload(); ok {
		slots = off.Slots
		rep.SlotBytes, rep.Resident = off.SlotBytes, off.Resident
		rep.Predictor = m.off.opts.Predictor
	}
	row := summarise(r.name, slots, r.st)
	if m.off != nil && m.off.opts.Policy != offload.OnDemand && m.off.opts.Policy != offload.CPUMiss {
		row.Predictor = m.off.opts.Predictor
	}
	row.TTFT = r.ttft / float64(rep.Prompts)
	row.TTFTLimit = r.ttftLimit / float64(rep.Prompts)
	if !r.simulated && !r.timed {
		row.TTFTLimit = math.NaN()
	}
	if g, ok := m.GPUStats(); ok {
		row.GPU = &g
	}
	n := float64(len(r.st))
	if r.timed {
		row.DeviceTimePerToken = r.devTime / n
		row.GPUPerToken = &GPUTokenStats{Launches: r.per.Launches / n, Kernels: r.per.Kernels / n, Reads: r.per.Reads / n}
	} else if !r.simulated {
		row.StallPerToken, row.LimitPerToken, row.OverLimit = math.NaN(), math.NaN(), math.NaN()
	}
	return row
}

// timeline draws the simulated device's last decode tokens.
func (r *benchRunner) timeline() error {
	w, err := r.o.Timeline(r.name)
	if err != nil {
		return err
	}
	title := fmt.Sprintf("%s on %s, %.2f GiB, policy %s, %s: the last decode tokens", r.m.info.Path, r.rep.Device, float64(r.o.GPUMem)/(1<<30), r.name, cmp.Or(r.o.Routing, "the model's own routing"))
	if err := sim.WriteSVG(w, r.sd.Spans(), r.drawFrom, r.drawTo, title); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// deviceTimer is implemented by devices that time their own streams, a CUDA GPU with events:
// Mark puts a point on the compute stream after the work enqueued so far, waits for it and
// reports the counters up to it. Bench marks each token, so that a token's device time and
// stall are the device's and not the host's guess.
type deviceTimer interface {
	Mark() GPUStats
}

var _ deviceTimer = (*cuda.GPU)(nil)

// benchSnap is the clock and the counters at one moment of a benchmark run.
type benchSnap struct {
	t     float64
	off   OffloadStats
	dv    sim.Stats
	gpu   GPUStats // at a Mark of a deviceTimer (timed)
	timed bool
}

// tokenStats are the figures of the decode step between snapshots a and b; pcie is the
// simulated link's rate (0 on other devices), hostMem the host memory's when the host
// computes experts on a GPU's behalf (0: it does not).
func tokenStats(a, b benchSnap, pcie, hostMem float64) offload.TokenStats {
	st := offload.TokenStats{
		Latency:   b.t - a.t,
		Stall:     b.dv.ComputeStalled - a.dv.ComputeStalled,
		Compute:   b.dv.ComputeBusy - a.dv.ComputeBusy,
		Moved:     float64(b.off.BytesCopied - a.off.BytesCopied),
		Needed:    float64(b.off.NeededBytes - a.off.NeededBytes),
		Hits:      int(b.off.Hits - a.off.Hits),
		Misses:    int(b.off.Misses - a.off.Misses),
		OnCPU:     int(b.off.OnCPU - a.off.OnCPU),
		HostRead:  float64(b.off.HostBytes - a.off.HostBytes),
		Correct:   int(b.off.Correct - a.off.Correct),
		Predicted: int(b.off.Predicted - a.off.Predicted),
	}
	if b.timed {
		// The token's device time is compute and stall; the bytes move at the rate the copy
		// stream has shown so far (none yet: the limit is the compute).
		st.Stall = max(b.gpu.StallSeconds-a.gpu.StallSeconds, 0)
		st.Compute = max(b.gpu.DeviceSeconds-a.gpu.DeviceSeconds-st.Stall, 0)
		pcie = b.gpu.CopyBandwidth()
	}
	st.Limit = st.Compute
	if pcie > 0 {
		st.Limit = max(st.Limit, st.Needed/pcie)
	}
	if hostMem > 0 {
		st.Limit = max(st.Limit, st.HostRead/hostMem)
	}
	return st
}
