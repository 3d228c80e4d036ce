package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/shapes"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/trace"
)

// SimOptions configure Sim, a timing-only benchmark: decode tokens of a model shape on a
// simulated GPU, with no weights and no arithmetic, so shapes far larger than this machine
// can hold are timed. Routing comes from a recorded trace or a synthetic router.
type SimOptions struct {
	// Model, when set, is timed instead of a public shape, through the engine's own passes
	// run timing only (engine.TimingOnlyOptions), replaying the routing it chooses while decoding
	// Prompts greedily (Tokens per prompt).
	Model   *engine.Model
	Prompts []string
	// Shape is a public model shape with its weight type, e.g. "mixtral-8x7b@q4_k".
	Shape string
	// Device is "sim:<profile>" (a built-in profile name or a JSON file).
	Device string
	// GPUMem is the device memory budget in bytes; 0 = the profile's memory.
	GPUMem float64
	// Context is the KV cache fill the attention is priced at (0 = 512).
	Context  int
	Policies []offload.Policy
	// HostLayers is static's N: the first N MoE layers' experts stay on the host.
	HostLayers int
	Eviction   offload.Eviction
	Tokens     int // decode tokens timed (0 = 64)
	// PromptLen is the prompt prefilled before the timed decode, for the time to first
	// token (shapes only: a model's -m routing covers decode steps); 0 = none.
	PromptLen int
	// Trace, when set, replays a recorded routing trace; otherwise Synthetic draws routing.
	Trace     string
	Synthetic trace.SynthOptions // Layers, Experts and Used are taken from the shape
	// Predictor feeds prefetch and commit: oracle, prev-token, frequency or accuracy=P.
	Predictor string
	// CrossToken makes commit commit each token's first MoE layer too (engine.CommitOptions).
	CrossToken bool
	// AllowCommit lets policy auto choose commit, which changes the output.
	AllowCommit bool
	Seed        uint64
	// HostRates price the experts the host computes (cpu-miss, static): a host profile's
	// (engine.LoadHost) or given rates; a zero Bandwidth measures this machine's.
	HostRates engine.HostRates
	// Host names where HostRates come from in the report, e.g. a host profile's name.
	Host string
	// Timeline, when set, receives an SVG of the last TimelineTokens tokens per policy.
	Timeline       func(p offload.Policy) (io.WriteCloser, error)
	TimelineTokens int
}

// SimReport is the outcome of Sim.
type SimReport struct {
	Shape       string
	Device      string
	Calibrated  bool // whether the profile was checked against a real GPU
	GPUMem      float64
	ExpertBytes float64
	Resident    float64
	Tokens      int
	PromptLen   int    // prompt tokens prefilled before the decode (0: no time to first token)
	Routing     string // where the routing came from
	Synthetic   bool   // routing drawn by a synthetic router: label every figure so
	Predictor   string
	// HostRates are the rates the host computed experts at, with Host saying where they
	// came from; nil when no policy computes on the host.
	HostRates *engine.HostRates `json:",omitempty"`
	Host      string            `json:",omitempty"`
	Policies  []engine.PolicyReport
}

// policies are the policies to time: all four unless some are named.
func (o *SimOptions) policies() []offload.Policy {
	if len(o.Policies) > 0 {
		return o.Policies
	}
	return []offload.Policy{offload.OnDemand, offload.Prefetch, offload.Commit, offload.CPUMiss}
}

// autoSample is the routing auto placement's sample needs, in tokens (0 without auto).
func (o *SimOptions) autoSample() int {
	if slices.Contains(o.Policies, offload.Auto) {
		return engine.AutoSample
	}
	return 0
}

// Sim runs the timing-only benchmark.
func Sim(o SimOptions) (*SimReport, error) {
	var err error
	name, ok := strings.CutPrefix(o.Device, "sim:")
	if !ok || name == "" {
		return nil, fmt.Errorf("device %q: the timing-only benchmark runs on sim:<profile> (profiles: %s)", o.Device, strings.Join(sim.Profiles(), ", "))
	}
	prof, err := sim.LoadProfile(name)
	if err != nil {
		return nil, err
	}
	ctx := cmp.Or(o.Context, 512)
	if o.Model != nil {
		return simBenchModel(o, prof)
	}
	return simBenchShape(o, prof, ctx)
}

// routedShape is what routing must fit: a model's MoE layers, experts and top-k.
type routedShape struct {
	name                  string
	layers, experts, used int
}

// simBenchShape times a public shape's decode on the simulated GPU prof with the engine's
// forward pass and offloader, timing only (shapes.Open): a prompt of o.PromptLen tokens (at least
// one, which is the time to first token only when PromptLen asks for it), then o.Tokens
// decode steps, routed as a trace or a synthetic router says, with the KV cache holding ctx
// positions (or all of them).
func simBenchShape(o SimOptions, prof *sim.Profile, ctx int) (*SimReport, error) {
	info, err := shapes.Inspect(o.Shape)
	if err != nil {
		return nil, err
	}
	budget, err := o.budget(prof)
	if err != nil {
		return nil, err
	}
	n := cmp.Or(o.Tokens, 64)
	if n < 1 || n > 1<<20 {
		return nil, fmt.Errorf("tokens %d: want 1 to %d", n, 1<<20)
	}
	if o.PromptLen < 0 || o.PromptLen > 1<<16 {
		return nil, fmt.Errorf("prompt length %d: want 0 to %d", o.PromptLen, 1<<16)
	}
	name := strings.TrimPrefix(info.Path, "shape:") // NAME@TYPE
	rs := routedShape{name: name, layers: len(info.MoELayers), experts: info.Experts, used: info.ExpertsUsed}
	rep := &SimReport{Shape: name, Device: "sim:" + prof.Name, Calibrated: prof.Calibrated, GPUMem: budget,
		Tokens: n, PromptLen: o.PromptLen, Predictor: cmp.Or(o.Predictor, "oracle")}
	// The prompt, the timed tokens, and the one the last of them predicts for.
	prompt := max(o.PromptLen, 1)
	tokens, err := benchRouting(o, rs, max(prompt+n+1, o.autoSample()), rep)
	if err != nil {
		return nil, err
	}
	to := engine.TimingOnlyOptions{Routing: func(pos, j int) []int {
		if pos >= len(tokens) || j >= len(tokens[pos]) {
			return nil
		}
		return tokens[pos][j]
	}}
	bo := Options{Options: engine.Options{ContextLength: max(ctx, prompt+n+1)}, PromptIDs: [][]int32{make([]int32, prompt)}, Tokens: n + 1,
		Routing: map[bool]string{true: "SYNTHETIC routing", false: "recorded routing"}[rep.Synthetic], moe: rs}
	br, err := o.timingOnly(rep, &bo, &to, rs.experts, func(opts engine.Options) (*engine.Model, error) { return shapes.Open(o.Shape, opts) })
	if err != nil {
		return nil, err
	}
	rep.ExpertBytes, rep.Resident = float64(br.SlotBytes), float64(br.Resident)
	if o.PromptLen == 0 {
		for i := range rep.Policies {
			rep.Policies[i].TTFT, rep.Policies[i].TTFTLimit = 0, 0
		}
	}
	return rep, nil
}

// budget is the device memory budget: GPUMem, or the whole card.
func (o *SimOptions) budget(prof *sim.Profile) (float64, error) {
	budget := o.GPUMem
	if budget == 0 {
		budget = float64(prof.MemoryBytes)
	}
	if budget > float64(prof.MemoryBytes) {
		return 0, fmt.Errorf("--gpu-mem %.1f GiB exceeds the %.1f GiB of %s", budget/(1<<30), float64(prof.MemoryBytes)/(1<<30), prof.Name)
	}
	return budget, nil
}

// timingOnly runs bo's prompts with Run, every policy timing only with the routing to
// replays (for a model of experts experts, opened by open), and fills rep's policy rows and
// host rate: what the benchmarks of shapes and of a model's own routing share.
func (o *SimOptions) timingOnly(rep *SimReport, bo *Options, to *engine.TimingOnlyOptions, experts int, open func(engine.Options) (*engine.Model, error)) (*Report, error) {
	policies := o.policies()
	host := o.HostRates
	if slices.ContainsFunc(policies, offload.Policy.UsesHost) {
		rep.Host = o.Host
		if host.Bandwidth == 0 {
			m := cpu.MeasureHostRates()
			host.Bandwidth, host.FLOPS = m.Bandwidth, cmp.Or(host.FLOPS, m.FLOPS)
			rep.Host = "measured on this machine"
		}
		r, err := host.WithDefaults()
		if err != nil {
			return nil, err
		}
		rep.HostRates = &r
	}
	bo.Options.Device, bo.Options.HostRates, bo.Options.TimingOnly = o.Device, host, to
	bo.Policies, bo.GPUMem, bo.Eviction, bo.HostLayers = policies, int64(rep.GPUMem), o.Eviction, o.HostLayers
	bo.Commit, bo.TimelineTokens, bo.AllowCommit = &engine.CommitOptions{CrossToken: o.CrossToken}, o.TimelineTokens, o.AllowCommit
	if err := modelPredictor(bo, rep.Predictor, experts, o.Seed); err != nil {
		return nil, err
	}
	if o.Timeline != nil {
		bo.Timeline = policyTimeline(o.Timeline)
	}
	br, err := run(context.Background(), rep.Shape, open, *bo)
	if err != nil {
		return nil, err
	}
	rep.Policies = br.Rows
	for i := range rep.Policies {
		rep.Policies[i].Predictor = "" // the report's, for every policy
	}
	return br, nil
}

// modelPredictor makes bo's prefetch and commit predict with name: the offloader's
// heuristics (prev-token, frequency), or a modelled predictor (oracle, accuracy=P) of the
// routing bo's timing-only options replay, standing in for the Commit Router. Each run of a
// policy starts the modelled predictor afresh when its replay starts, at position 0 of the
// first MoE layer, so that every policy is given the same predictions.
func modelPredictor(bo *Options, name string, experts int, seed uint64) error {
	switch name {
	case "prev-token", "frequency":
		bo.Predictor = name
		return nil
	}
	pred, err := offload.ParsePredictor(name, experts, seed)
	if err != nil {
		return fmt.Errorf("%w, or the offloader's heuristics prev-token and frequency", err)
	}
	bo.Predictor = "router"
	to := bo.Options.TimingOnly
	routing := to.Routing
	to.Routing = func(pos, j int) []int {
		if pos == 0 && j == 0 {
			pred, _ = offload.ParsePredictor(name, experts, seed) // it parsed above
		}
		return routing(pos, j)
	}
	to.ModelledPredictor = true
	to.Predict = func(pos, j int) []int { return pred.Predict(pos, j, routing(pos, j)) }
	return nil
}

// policyTimeline adapts SimOptions.Timeline to Options.Timeline.
func policyTimeline(f func(offload.Policy) (io.WriteCloser, error)) func(string) (io.WriteCloser, error) {
	return func(name string) (io.WriteCloser, error) {
		p, err := offload.ParsePolicy(name)
		if err != nil {
			return nil, err
		}
		return f(p)
	}
}

// simBenchModel times o.Model's own decode of o.Prompts on the simulated GPU prof with the
// engine's forward pass and offloader: the routing the model chooses is recorded in a run
// that computes (o.Model's device), and every policy then runs timing only, replaying it
// (Run with engine.TimingOnlyOptions). prefetch's and commit's predictions are the engine's
// heuristics (prev-token, frequency) or a modelled predictor over the recorded routing
// (oracle, accuracy=P) standing in for a Commit Router.
func simBenchModel(o SimOptions, prof *sim.Profile) (*SimReport, error) {
	m := o.Model
	info := m.Info()
	n := cmp.Or(o.Tokens, 64)
	if n < 2 || n > 1<<20 {
		return nil, fmt.Errorf("tokens %d: want 2 to %d (the first is the time to first token)", n, 1<<20)
	}
	budget, err := o.budget(prof)
	if err != nil {
		return nil, err
	}
	// One more token than timed: the last timed token predicts its successor's first layer.
	rec, err := recordRouting(m, o.Prompts, max(n+1, o.autoSample()))
	if err != nil {
		return nil, err
	}
	rep := &SimReport{Shape: cmp.Or(info.Name, info.Architecture), Device: "sim:" + prof.Name, Calibrated: prof.Calibrated,
		GPUMem: budget, Tokens: (n - 1) * len(o.Prompts), Predictor: cmp.Or(o.Predictor, "oracle"),
		Routing: fmt.Sprintf("recorded while %s decoded %d prompts greedily", info.Path, len(o.Prompts))}
	to := rec.replay()
	bo := Options{Options: engine.Options{ContextLength: m.ContextLength(), KVType: m.KVType()}, Prompts: o.Prompts, Tokens: n,
		moe: routedShape{name: info.Name, layers: len(info.MoELayers), experts: info.Experts, used: info.ExpertsUsed}}
	br, err := o.timingOnly(rep, &bo, &to, info.Experts, func(opts engine.Options) (*engine.Model, error) { return engine.Open(info.Path, opts) })
	if err != nil {
		return nil, err
	}
	rep.ExpertBytes, rep.Resident = float64(br.SlotBytes), float64(br.Resident)
	return rep, nil
}

// routingRecord is the routing a model chose for each of several prompts, by position and MoE
// layer, and the prompt its replay is at.
type routingRecord struct {
	prompts []map[[2]int][]int
	cur     int
}

// recordRouting runs each prompt and n greedy tokens after it and records every position's
// routing.
func recordRouting(m *engine.Model, prompts []string, n int) (*routingRecord, error) {
	if len(prompts) == 0 {
		return nil, fmt.Errorf("bench: no prompts")
	}
	moeIndex := map[int]int{}
	for i, l := range m.Info().MoELayers {
		moeIndex[l] = i
	}
	s, err := m.NewSession()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	r := &routingRecord{cur: -1}
	var cur map[[2]int][]int
	s.ObserveRouting(func(ev *engine.RouteEvent) {
		j := moeIndex[ev.Layer]
		for t := 0; t < ev.Tokens; t++ {
			cur[[2]int{ev.Pos0 + t, j}] = slices.Clone(ev.Selected[t*ev.Used : (t+1)*ev.Used])
		}
	})
	for _, p := range prompts {
		ids, err := m.Tokenize(p, true)
		if err != nil {
			return nil, err
		}
		cur = map[[2]int][]int{}
		r.prompts = append(r.prompts, cur)
		s.Reset()
		if _, err := s.Generate(context.Background(), ids, engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}); err != nil {
			return nil, fmt.Errorf("bench: prompt %q: %w", p, err)
		}
	}
	return r, nil
}

// at is the recorded routing of MoE layer j at pos in the prompt the replay is at (nil when
// none was recorded).
func (r *routingRecord) at(pos, j int) []int {
	if r.cur < 0 || r.cur >= len(r.prompts) {
		return nil
	}
	return r.prompts[r.cur][[2]int{pos, j}]
}

// replay returns timing-only options that replay the prompts in their recorded order, each
// from its start: a pass's first token at position 0 begins the next prompt. Timing-only runs
// of every policy each replay the whole record.
func (r *routingRecord) replay() engine.TimingOnlyOptions {
	return engine.TimingOnlyOptions{Routing: func(pos, j int) []int {
		if pos == 0 && j == 0 {
			r.cur = (r.cur + 1) % len(r.prompts)
		}
		return r.at(pos, j)
	}}
}

// benchRouting returns n tokens of routing for the shape.
func benchRouting(o SimOptions, shape routedShape, n int, rep *SimReport) ([][][]int, error) {
	out := make([][][]int, 0, n)
	if o.Trace != "" {
		r, err := trace.OpenFor(o.Trace, shape.name, shape.layers, shape.experts, shape.used)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		h := r.Header()
		for len(out) < n {
			t, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			layers := make([][]int, len(t.Layers))
			for i, l := range t.Layers {
				layers[i] = l.Experts
			}
			out = append(out, layers)
		}
		if len(out) < n {
			return nil, fmt.Errorf("trace %s holds %d tokens, the benchmark asks for %d", o.Trace, len(out), n)
		}
		rep.Routing, rep.Synthetic = fmt.Sprintf("trace %s (%s)", o.Trace, h.Source), h.Synthetic
		return out, nil
	}
	so := o.Synthetic
	so.Layers, so.Experts, so.Used = shape.layers, shape.experts, shape.used
	so.Seed = o.Seed
	sr, err := trace.NewSynthRouter(so)
	if err != nil {
		return nil, err
	}
	for len(out) < n {
		t := sr.Next()
		layers := make([][]int, len(t.Layers))
		for i, l := range t.Layers {
			layers[i] = l.Experts
		}
		out = append(out, layers)
	}
	rep.Routing, rep.Synthetic = sr.Header(shape.name).Source, true
	return out, nil
}
