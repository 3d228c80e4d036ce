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
	sd, simulated := m.dev.(*sim.Device)
	rep.Device, rep.Simulated = m.dev.Name(), simulated
	var pcie, hostMem float64
	if m.off != nil && m.off.planner != nil && m.off.opts.Policy.UsesHost() {
		r, _ := opts.HostRates.WithDefaults() // Open checked them
		rep.HostRates, hostMem = &r, r.Memory
	}
	if simulated {
		rep.Calibrated = sd.Profile().Calibrated
		pcie = sd.Profile().PCIeEffective
	}
	timer, timed := m.dev.(deviceTimer)
	clock := func() float64 {
		if t, ok := m.Clock(); ok {
			return t
		}
		return float64(time.Now().UnixNano()) / 1e9
	}
	take := func() benchSnap {
		sn := benchSnap{t: clock()}
		sn.off, _ = m.Offload()
		if simulated {
			sn.dv = sd.Stats()
		}
		if timed {
			sn.gpu, sn.timed = timer.Mark(), true
		}
		return sn
	}
	var st []offload.TokenStats
	var devTime float64   // device seconds of the timed tokens, summed
	var per GPUTokenStats // a GPU's counters of the timed tokens, summed
	var ttft, ttftLimit float64
	var drawFrom, drawTo float64
	for i := range rep.Prompts {
		var ids []int32
		var prompt string
		if o.PromptIDs != nil {
			ids, prompt = o.PromptIDs[i], fmt.Sprintf("%d of %d tokens", i, len(o.PromptIDs[i]))
		} else {
			prompt = o.Prompts[i]
			if ids, err = m.Tokenize(prompt, true); err != nil {
				return PolicyReport{}, err
			}
		}
		s.Reset()
		start := take()
		last := start
		tok := 0
		_, err = s.Generate(ctx, ids, GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true},
			OnToken: func(Token) error {
				now := take()
				switch {
				case tok == 0:
					ttft += now.t - start.t
					ttftLimit += tokenStats(start, now, pcie, hostMem).Limit
				case tok > o.Warmup:
					st = append(st, tokenStats(last, now, pcie, hostMem))
					devTime += now.gpu.DeviceSeconds - last.gpu.DeviceSeconds
					per.Launches += float64(now.gpu.Launches - last.gpu.Launches)
					per.Kernels += float64(now.gpu.Kernels - last.gpu.Kernels)
					per.Reads += float64(now.gpu.Reads - last.gpu.Reads)
				}
				tok++
				last = now
				return nil
			}})
		if err != nil {
			return PolicyReport{}, fmt.Errorf("bench %s, prompt %q: %w", name, prompt, err)
		}
		drawTo = last.t
		// The prompt's last decode tokens, never reaching back into its prefill.
		if k := min(cmp.Or(o.TimelineTokens, 2), n-1, len(st)); k > 0 {
			drawFrom = drawTo
			for _, x := range st[len(st)-k:] {
				drawFrom -= x.Latency
			}
		}
	}
	if len(st) == 0 {
		return PolicyReport{}, fmt.Errorf("bench: no decode steps were timed")
	}
	var slots int
	if off, ok := m.Offload(); ok {
		slots = off.Slots
		rep.SlotBytes, rep.Resident = off.SlotBytes, off.Resident
		rep.Predictor = m.off.opts.Predictor
	}
	row := summarise(name, slots, st)
	if m.off != nil && m.off.opts.Policy != offload.OnDemand && m.off.opts.Policy != offload.CPUMiss {
		row.Predictor = m.off.opts.Predictor
	}
	row.TTFT = ttft / float64(rep.Prompts)
	row.TTFTLimit = ttftLimit / float64(rep.Prompts)
	if !simulated && !timed {
		row.TTFTLimit = math.NaN()
	}
	if g, ok := m.GPUStats(); ok {
		row.GPU = &g
	}
	if timed {
		row.DeviceTimePerToken = devTime / float64(len(st))
		n := float64(len(st))
		row.GPUPerToken = &GPUTokenStats{Launches: per.Launches / n, Kernels: per.Kernels / n, Reads: per.Reads / n}
	} else if !simulated {
		row.StallPerToken, row.LimitPerToken, row.OverLimit = math.NaN(), math.NaN(), math.NaN()
	}
	if o.Timeline != nil && simulated {
		w, err := o.Timeline(name)
		if err != nil {
			return row, err
		}
		title := fmt.Sprintf("%s on %s, %.2f GiB, policy %s, %s: the last decode tokens", m.info.Path, rep.Device, float64(o.GPUMem)/(1<<30), name, cmp.Or(o.Routing, "the model's own routing"))
		if err := sim.WriteSVG(w, sd.Spans(), drawFrom, drawTo, title); err != nil {
			w.Close()
			return row, err
		}
		if err := w.Close(); err != nil {
			return row, err
		}
	}
	return row, nil
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
