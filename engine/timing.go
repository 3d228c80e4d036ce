package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"time"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/runstats"
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
	// WarmupPrompt runs the last prompt once before the timed ones, untimed, through its
	// prompt pass and one decode step, as llama-bench warms up before its repetitions: what a device does once
	// (a GPU's first launch of each kernel, scratch and pinned buffers growing to a pass's
	// size, a decode step's graph captured) stays out of the first timed prompt's time to
	// first token. The last, so that no prompt is timed right after itself: an offloader's
	// cache then holds what the prompt before the first left, as it does for every other.
	WarmupPrompt bool
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

// PolicyReport is one run's figures, a policy's row of a benchmark's table; times in seconds
// (runstats.Report).
type PolicyReport = runstats.Report

// KernelShare is a kernel's launches and device time in a prompt pass or a decoded token
// (runstats.KernelShare), in PolicyReport.Kernels.
type KernelShare = runstats.KernelShare

// GPUTokenStats are a CUDA GPU's counters for one decoded token (runstats.GPUTokenStats).
type GPUTokenStats = runstats.GPUTokenStats

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
	if o.WarmupPrompt {
		if err := r.warm(ctx); err != nil {
			return Timing{}, err
		}
	}
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
	perPrompt       GPUTokenStats        // and of the prompts up to their first tokens
	ttft, ttftLimit float64
	// profiled: the GPU times each kernel (Options.ProfileKernels); pre and dec sum its
	// kernels' time in the prompt passes and in the timed decode steps.
	profiled bool
	pre, dec runstats.KernelSum
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
	if _, r.profiled = m.KernelProfile(); r.profiled {
		r.pre, r.dec = runstats.KernelSum{}, runstats.KernelSum{}
	}
	return r
}

// profile is the GPU's kernel profile now, where it keeps one.
func (r *timer) profile() []cuda.KernelTime {
	if !r.profiled {
		return nil
	}
	p, _ := r.m.KernelProfile()
	return p
}

// profileMarks are a prompt's kernel profiles where its phases meet: before its pass, where
// its timed decode steps start and after the latest of them.
type profileMarks struct{ start, decode, end []cuda.KernelTime }

// profileToken takes the kernel profile at the prompt's token tok: the prompt pass ends at
// the first, the timed steps start at the warm-up's last and end at each one after it.
func (r *timer) profileToken(tok int, pm *profileMarks) {
	if !r.profiled {
		return
	}
	p := r.profile()
	if tok == 0 {
		r.pre.Add(pm.start, p)
	}
	if tok == r.o.Warmup {
		pm.decode = p
	} else if tok > r.o.Warmup {
		pm.end = p
	}
}

// take is the clock and the counters now.
func (r *timer) take() runstats.Snapshot {
	t, ok := r.m.Clock()
	if !ok {
		t = float64(time.Now().UnixNano()) / 1e9
	}
	sn := runstats.Snapshot{T: t}
	sn.Off, _ = r.m.Offload()
	if r.simulated {
		sn.Dev = r.sd.Stats()
	}
	if r.timed {
		sn.GPU, sn.Timed = r.timer.Mark(), true
	}
	return sn
}

// ids returns prompt i as token ids, and what names it in an error.
func (r *timer) ids(i int) ([]int32, string, error) {
	if r.o.PromptIDs != nil {
		return r.o.PromptIDs[i], fmt.Sprintf("%d of %d tokens", i, len(r.o.PromptIDs[i])), nil
	}
	ids, err := r.m.Tokenize(r.o.Prompts[i], true)
	return ids, r.o.Prompts[i], err
}

// warm generates the warm-up prompt (TimeOptions.WarmupPrompt), untimed: its prompt pass and
// one decode step.
func (r *timer) warm(ctx context.Context) error {
	ids, prompt, err := r.ids(r.o.prompts() - 1)
	if err != nil {
		return err
	}
	r.s.Reset()
	if _, err := r.s.Generate(ctx, ids, GenerateOptions{MaxTokens: 2, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true}}); err != nil {
		return fmt.Errorf("bench %s, the warm-up prompt %q: %w", r.o.Name, prompt, err)
	}
	return nil
}

// prompt generates from prompt i and times its tokens: the first as the time to it, those
// after the warm-up as decode steps.
func (r *timer) prompt(ctx context.Context, i int) error {
	ids, prompt, err := r.ids(i)
	if err != nil {
		return err
	}
	r.s.Reset()
	start := r.take()
	last := start
	tok := 0
	pm := profileMarks{start: r.profile()}
	_, err = r.s.Generate(ctx, ids, GenerateOptions{MaxTokens: r.o.Tokens, IgnoreEOS: true, Sampler: SamplerOptions{Greedy: true},
		OnToken: func(Token) error {
			now := r.take()
			switch {
			case tok == 0:
				r.ttft += now.T - start.T
				r.ttftLimit += runstats.Step(start, now, r.pcie, r.hostMem).Limit
				r.perPrompt.Add(start.GPU, now.GPU)
			case tok > r.o.Warmup:
				r.st = append(r.st, runstats.Step(last, now, r.pcie, r.hostMem))
				r.devTime += now.GPU.DeviceSeconds - last.GPU.DeviceSeconds
				r.per.Add(last.GPU, now.GPU)
			}
			r.profileToken(tok, &pm)
			tok++
			last = now
			return nil
		}})
	if err != nil {
		return fmt.Errorf("bench %s, prompt %q: %w", r.o.Name, prompt, err)
	}
	if pm.end != nil {
		r.dec.Add(pm.decode, pm.end)
	}
	r.t.To = last.T
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
	row := runstats.Summarise(r.o.Name, slots, r.st)
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
		row.GPUPerToken, row.GPUPerPrompt = r.per.Over(n), r.perPrompt.Over(prompts)
		if r.profiled {
			row.Kernels = &runstats.KernelReport{Prefill: r.pre.Shares(prompts), Decode: r.dec.Shares(n)}
		}
	} else if !r.simulated {
		row.StallPerToken, row.LimitPerToken, row.OverLimit = math.NaN(), math.NaN(), math.NaN()
	}
	return row
}

// deviceTimer is implemented by devices that time their own streams, a CUDA GPU with events:
// Mark puts a point on the compute stream after the work enqueued so far, waits for it and
// reports the counters up to it. Time marks each token, so that a token's device time and
// stall are the device's and not the host's guess.
type deviceTimer interface {
	Mark() GPUStats
}

var _ deviceTimer = (*cuda.GPU)(nil)
