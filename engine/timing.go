package engine

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
)

// Model.Time is the one way in for what measures the engine: package bench's harnesses and
// automatic placement's candidates time their runs with it, so that every figure they give
// comes from the passes a user's tokens take.

// TimeOptions configure Model.Time: prompts decoded greedily at batch size 1.
type TimeOptions struct {
	// Name names the run in its figures (PolicyReport.Policy): a policy's name, or
	// "resident".
	Name    string
	Prompts []string
	// PromptIDs, when set, are the prompts as token ids, and Prompts is not used: a model
	// shape's, whose tokens stand for nothing.
	PromptIDs [][]int32
	// Tokens are decoded per prompt, 2 or more: the first is the time to first token.
	Tokens int
	// Warmup is the decode steps of each prompt left out of the figures, so that they show
	// a policy's steady state once its cache has filled (0: none).
	Warmup int
	// TimelineTokens is how many of the last prompt's last decode tokens Timing.From and To
	// span (0: 2).
	TimelineTokens int
}

// prompts is how many prompts o decodes.
func (o TimeOptions) prompts() int {
	if o.PromptIDs != nil {
		return len(o.PromptIDs)
	}
	return len(o.Prompts)
}

// Validate says what of o a run cannot take.
func (o TimeOptions) Validate() error {
	n := o.Tokens
	if n < 2 || n > 1<<20 {
		return fmt.Errorf("bench: %d tokens per prompt: want 2 to %d (the first is the time to first token)", n, 1<<20)
	}
	if o.Warmup < 0 || o.Warmup > n-2 {
		return fmt.Errorf("bench: %d warm-up tokens of %d: want 0 to %d, so that one decode step is timed", o.Warmup, n, n-2)
	}
	if o.prompts() == 0 {
		return fmt.Errorf("bench: no prompts")
	}
	return nil
}

// Timing is what Model.Time measured.
type Timing struct {
	Row PolicyReport
	// Simulated says the times are the simulated GPU's virtual time (numbers computed on the
	// CPU, or none computed in a timing-only run), not this machine's wall clock; Calibrated
	// that its profile was checked against a real GPU.
	Simulated, Calibrated bool
	// HostRates are what cpu-miss weighed a copy against, where the host computes experts on
	// a device's behalf (nil on the CPU, and where the policy never does).
	HostRates *HostRates
	// Predictor is what the offloader predicted with ("" without offloading).
	Predictor string
	// From and To are the last prompt's last decode tokens on a simulated device's timeline
	// (Model.Timeline), never reaching back into its prefill.
	From, To float64
}

// Time decodes o.Tokens tokens greedily after each prompt, at batch size 1, and reports
// per-token latency, time to first token and the offloader's figures. On a simulated device
// every figure comes from its timeline, and the physical limit (DESIGN.md §6) is
// max(compute, bytes not resident at the token's start / effective PCIe rate, expert bytes
// the host read / its memory's rate, HostRates.Memory). On a CUDA GPU the latency is still
// the wall clock, what the user waits, but the stall and the compute come from the device's
// events (deviceTimer) and the limit divides the bytes by the copy stream's bandwidth
// measured so far in the run.
func (m *Model) Time(ctx context.Context, o TimeOptions) (Timing, error) {
	if err := o.Validate(); err != nil {
		return Timing{}, err
	}
	s, err := m.NewSession()
	if err != nil {
		return Timing{}, err
	}
	defer s.Close()
	r := newTimer(m, s, o)
	for i := range o.prompts() {
		if err := r.prompt(ctx, i); err != nil {
			return Timing{}, err
		}
	}
	if len(r.st) == 0 {
		return Timing{}, fmt.Errorf("bench: no decode steps were timed")
	}
	r.t.Row = r.row()
	return r.t, nil
}

// timer times one run's prompts on an opened model and sums what its decode steps did.
type timer struct {
	m         *Model
	s         *Session
	o         TimeOptions
	t         Timing
	sd        *sim.Device // the simulated device, or nil
	simulated bool
	timer     deviceTimer // the device's own stream timer, or nil
	timed     bool
	pcie      float64 // the simulated link's rate
	hostMem   float64 // host memory's rate where the host computes experts

	st              []offload.TokenStats // the timed decode steps
	devTime         float64              // device seconds of the timed tokens, summed
	per             GPUTokenStats        // a GPU's counters of the timed tokens, summed
	ttft, ttftLimit float64
}

func newTimer(m *Model, s *Session, o TimeOptions) *timer {
	r := &timer{m: m, s: s, o: o}
	r.sd, r.simulated = m.dev.(*sim.Device)
	r.t.Simulated = r.simulated
	if m.off != nil && m.off.Planner() != nil && m.off.Options().Policy.UsesHost() {
		hr, _ := m.opts.HostRates.WithDefaults() // Open checked them
		r.t.HostRates, r.hostMem = &hr, hr.Memory
	}
	if r.simulated {
		r.t.Calibrated = r.sd.Profile().Calibrated
		r.pcie = r.sd.Profile().PCIeEffective
	}
	r.timer, r.timed = m.dev.(deviceTimer)
	return r
}

// take is the clock and the counters now.
func (r *timer) take() benchSnap {
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
func (r *timer) prompt(ctx context.Context, i int) error {
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
	_, err := r.s.Generate(ctx, ids, GenerateOptions{MaxTokens: r.o.Tokens, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true},
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
		return fmt.Errorf("bench %s, prompt %q: %w", r.o.Name, prompt, err)
	}
	r.t.To = last.t
	// The prompt's last decode tokens, never reaching back into its prefill.
	if k := min(cmp.Or(r.o.TimelineTokens, 2), r.o.Tokens-1, len(r.st)); k > 0 {
		r.t.From = r.t.To
		for _, x := range r.st[len(r.st)-k:] {
			r.t.From -= x.Latency
		}
	}
	return nil
}

// row summarises the run.
func (r *timer) row() PolicyReport {
	m := r.m
	var slots int
	if off, ok := m.Offload(); ok {
		slots = off.Slots
		r.t.Predictor = m.off.Options().Predictor
	}
	row := summarise(r.o.Name, slots, r.st)
	if m.off != nil && m.off.Options().Policy != offload.OnDemand && m.off.Options().Policy != offload.CPUMiss {
		row.Predictor = m.off.Options().Predictor
	}
	prompts := float64(r.o.prompts())
	row.TTFT = r.ttft / prompts
	row.TTFTLimit = r.ttftLimit / prompts
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

// PolicyReport is one run's figures, a policy's row of a benchmark's table; times in seconds.
type PolicyReport struct {
	Policy         string
	Predictor      string // what prefetch or commit predicted with ("" for the others)
	Slots          int
	Mean, P50, P90 float64 // per-token latency
	TTFT           float64 // time to first token, mean over prompts (real-model runs)
	// TTFTLimit is the prompt pass's physical limit, as LimitPerToken a decode step's.
	TTFTLimit       float64
	TokensPerSecond float64
	HitRate         float64 // experts found on the device when needed
	MovedPerToken   float64 // bytes
	StallPerToken   float64
	Accuracy        float64 // |predicted ∩ chosen| / k; NaN without a predictor
	OnCPUPerToken   float64 // experts computed on the host (cpu-miss, static)
	// Auto is auto placement's decision, in the row of policy auto: what it chose, what it
	// weighed and the figures it predicted for each.
	Auto          *AutoPlan `json:",omitempty"`
	LimitPerToken float64   // the physical limit (DESIGN.md §6), mean
	OverLimit     float64   // mean latency / mean limit
	// DeviceTimePerToken is the mean time a CUDA GPU's compute stream took per decode token,
	// between events recorded at consecutive tokens: set apart from the wall-clock latency,
	// it shows how much of a token the host's own work and its waits added. 0 (absent from
	// JSON) on other devices, whose time is the wall clock or the simulator's.
	DeviceTimePerToken float64 `json:",omitempty"`
	// GPU is the CUDA device's counters over the run, nil on other devices: its copy
	// stream's measured bandwidth, and products it left to the host.
	GPU *GPUStats `json:",omitempty"`
	// GPUPerToken is what a CUDA GPU did for a decoded token, the mean over the timed ones;
	// nil on other devices.
	GPUPerToken *GPUTokenStats `json:",omitempty"`
}

// GPUTokenStats are a CUDA GPU's counters for one decoded token.
type GPUTokenStats struct {
	// Launches are what the host issued: kernels, or one graph for a replayed decode step.
	Launches float64
	// Kernels are the kernels that ran, those of a replayed step included.
	Kernels float64
	// Reads are the host's waits for results of the device (the logits, and on the paths
	// that route on the host each MoE layer's router logits).
	Reads float64
}

// MarshalJSON writes the figures that do not apply (NaN: no predictor, no simulated clock)
// as null, which JSON can hold and NaN it cannot.
func (r PolicyReport) MarshalJSON() ([]byte, error) {
	type plain PolicyReport
	nullable := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		plain
		StallPerToken, Accuracy, LimitPerToken, OverLimit, TTFTLimit *float64
	}{plain(r), nullable(r.StallPerToken), nullable(r.Accuracy), nullable(r.LimitPerToken), nullable(r.OverLimit), nullable(r.TTFTLimit)})
}

// summarise is the figures of a run's timed decode steps st.
func summarise(policy string, slots int, st []offload.TokenStats) PolicyReport {
	r := PolicyReport{Policy: policy, Slots: slots}
	lat := make([]float64, len(st))
	var hits, needed, correct, predicted int
	var sumLimit float64
	for i, s := range st {
		lat[i] = s.Latency
		r.Mean += s.Latency
		r.MovedPerToken += s.Moved
		r.StallPerToken += s.Stall
		r.OnCPUPerToken += float64(s.OnCPU)
		sumLimit += s.Limit
		hits += s.Hits
		needed += s.Hits + s.Misses
		correct += s.Correct
		predicted += s.Predicted
	}
	k := float64(len(st))
	r.Mean /= k
	r.MovedPerToken /= k
	r.StallPerToken /= k
	r.OnCPUPerToken /= k
	r.LimitPerToken = sumLimit / k
	r.OverLimit = r.Mean / r.LimitPerToken
	r.TokensPerSecond = 1 / r.Mean
	slices.Sort(lat)
	r.P50 = lat[int(0.5*float64(len(lat)-1)+0.5)]
	r.P90 = lat[int(0.9*float64(len(lat)-1)+0.5)]
	r.HitRate = float64(hits) / float64(max(needed, 1))
	r.Accuracy = math.NaN()
	if predicted > 0 {
		r.Accuracy = float64(correct) / float64(predicted)
	}
	return r
}

// deviceTimer is implemented by devices that time their own streams, a CUDA GPU with events:
// Mark puts a point on the compute stream after the work enqueued so far, waits for it and
// reports the counters up to it. Time marks each token, so that a token's device time and
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
