// Package autoplace chooses where a model's experts live on a GPU it does not fit (automatic
// placement): which offload policy, how many host layers and how large a cache run it
// fastest. It draws the routing sample the candidates replay (a trace's first tokens, or the
// synthetic router's), lists the placements a memory budget allows, has the caller time each
// (the engine's own scheduler, timing only, on the card's profile) and picks the fastest that
// fits; for a real card it describes the card as a simulated profile for those runs.
package autoplace

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/offload"
)

// Candidate is one placement automatic placement weighed, with its predicted figures.
type Candidate struct {
	Offload         offload.Options
	TokensPerSecond float64 // predicted decode rate; 0 when it does not fit
	TTFT            float64 // predicted time to first token of the sample's prompt, seconds
	Err             error   `json:"-"` // why it could not run (the budget too small), nil if it ran
}

// String names the candidate's placement as the bench and the decision line print it.
func (c Candidate) String() string {
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

// Plan is automatic placement's decision: the fastest candidate that fits, and all it weighed.
type Plan struct {
	Chosen     Candidate
	Candidates []Candidate
	// Routing says what routing the prediction assumed.
	Routing string
}

// Summary is the decision in one line, as the engine's Open reports it.
func (p *Plan) Summary() string {
	var others []string
	why := ""
	for _, c := range p.Candidates {
		if c.Err == nil && c.Offload != p.Chosen.Offload {
			others = append(others, fmt.Sprintf("%s %.1f", c, c.TokensPerSecond))
			if c.TokensPerSecond > p.Chosen.TokensPerSecond && why == "" {
				why = fmt.Sprintf(" and %.0f ms to the first token of its sample, the quickest of those within %.0f%% of the fastest", p.Chosen.TTFT*1e3, (1-tie)*100)
			}
		}
	}
	return fmt.Sprintf("auto placement: %s, predicted %.1f tokens/s%s (others: %s; %s)",
		p.Chosen, p.Chosen.TokensPerSecond, why, strings.Join(others, ", "), p.Routing)
}

// tie is how close to the fastest predicted decode rate a candidate with a quicker first
// token is chosen instead.
const tie = 0.97

// Options are what Choose weighs the candidates under.
type Options struct {
	// Budget is the device memory to fill, of Device (named in the error when nothing fits).
	Budget   int64
	Device   string
	Eviction offload.Eviction
	// Routing says where the routing sample came from.
	Routing string
	// Predictor is prefetch's and commit's ("": prev-token); AllowCommit lets Choose pick
	// commit, which changes the output.
	Predictor   string
	AllowCommit bool
}

// Run is what timing a candidate gave: its decode rate and time to first token, and the
// offloader's device memory beside the expert slots and the bytes of one slot.
type Run struct {
	TokensPerSecond, TTFT float64
	Resident, SlotBytes   int64
}

// Choose times every candidate placement of a model of experts routed experts in layers MoE
// layers with run, and returns the fastest that fits (within tie of it, the one with the
// quickest first token); commit, which changes the output, only when allowed. The candidates
// are the policies that move experts (ondemand, prefetch, cpu-miss, hot) with every slot the
// budget holds, and llama.cpp's split, plain at the fewest host layers whose device layers fit
// and with its cache at that count and a few more. A model whose experts all fit stays
// resident (static at 0 host layers).
func Choose(o Options, experts, layers int, run func(offload.Options) (Run, error)) (*Plan, error) {
	plan := &Plan{Routing: "predicted on " + o.Routing}
	try := func(oo offload.Options) (Candidate, Run) {
		var r Run
		err := offload.CheckTimed(oo.Policy, oo.Predictor)
		if err == nil {
			r, err = run(oo)
		}
		c := Candidate{Offload: oo, TokensPerSecond: r.TokensPerSecond, TTFT: r.TTFT, Err: err}
		plan.Candidates = append(plan.Candidates, c)
		return c, r
	}
	base := offload.Options{GPUMem: o.Budget, Eviction: o.Eviction}
	first := base
	first.Policy = offload.OnDemand
	c, r := try(first)
	if c.Err != nil {
		// The policy with the fewest slots does not fit: nothing will.
		return nil, fmt.Errorf("auto placement: the %s of %s cannot run the model even with its experts in host memory (a shorter context needs less; --gpu-mem and --policy place them by hand): %w",
			sizeString(o.Budget), o.Device, c.Err)
	}
	for _, oo := range candidates(o, base, experts, layers, r) {
		if slices.ContainsFunc(plan.Candidates, func(c Candidate) bool { return c.Offload == oo }) {
			continue
		}
		try(oo)
	}
	if err := plan.choose(); err != nil {
		return nil, err
	}
	return plan, nil
}

// candidates are the placements weighed after ondemand, whose run r says how many slots the
// budget holds beside what stays resident.
func candidates(o Options, base offload.Options, experts, layers int, r Run) []offload.Options {
	pf := base
	pf.Policy, pf.Predictor = offload.Prefetch, cmp.Or(o.Predictor, "prev-token")
	cands := []offload.Options{pf, {Policy: offload.CPUMiss, GPUMem: o.Budget, Eviction: o.Eviction}, {Policy: offload.Hot, GPUMem: o.Budget, Eviction: offload.LFU}}
	if o.AllowCommit {
		cm := pf
		cm.Policy = offload.Commit
		cands = append(cands, cm)
	}
	// The fewest host layers whose device layers' experts fit beside what stays resident.
	fit := (o.Budget - r.Resident) / max(r.SlotBytes, 1) / int64(max(experts, 1))
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
	return cands
}

// choose sets Chosen to the fastest candidate that ran or, within tie of it, the one with the
// quickest first token; a model whose experts all fit stays resident.
func (p *Plan) choose() error {
	best, resident := -1, false
	for i, c := range p.Candidates {
		if c.Err == nil && (best < 0 || c.TokensPerSecond > p.Candidates[best].TokensPerSecond) {
			best = i
		}
		// Every expert fits beside the rest: nothing need move, and no prediction on a
		// sample should talk the model out of the card.
		if c.Err == nil && c.Offload.Policy == offload.Static && c.Offload.HostLayers == 0 {
			best, resident = i, true
			break
		}
	}
	if best < 0 || math.IsNaN(p.Candidates[best].TokensPerSecond) {
		return fmt.Errorf("auto placement: no candidate ran")
	}
	if !resident {
		// A short sample does not rank decode rates within a few percent (Mixtral-8x7B on
		// sim:rtx4090 under uniform routing: static-cache 14 predicted at 59.6 tokens/s and hot
		// at 58.3 decoded 57.4 and 57.7), while their prompts can differ twofold (403 and
		// 177 ms): among those that close, the quickest to the first token.
		top := p.Candidates[best].TokensPerSecond
		for i, c := range p.Candidates {
			if c.Err == nil && c.TokensPerSecond >= tie*top && c.TTFT < p.Candidates[best].TTFT {
				best = i
			}
		}
	}
	p.Chosen = p.Candidates[best]
	return nil
}

// sizeString writes n bytes in GiB, or MiB below one GiB.
func sizeString(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}
