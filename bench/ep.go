package bench

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/shapes"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/trace"
)

// EPOptions configure EP, a simulated expert-parallel benchmark: batches of tokens routed
// through every MoE layer of a model shape, spread over Devices simulated GPUs, planned by
// each policy side by side.
type EPOptions struct {
	// Model, when set, gives the costs (its own tensors) instead of Shape.
	Model *engine.Model
	// Shape is a public model shape with its weight type, e.g. "qwen1.5-moe-a2.7b@q4_k".
	Shape string
	// Device is "sim:<profile>": every rank is that GPU.
	Device  string
	Devices int
	// LinkBandwidth is each device's all-to-all rate, bytes/s; 0: the profile's measured
	// PCIe rate (consumer cards exchange through PCIe).
	LinkBandwidth float64
	// Tokens per batch, Steps batches (defaults 1024 and 8).
	Tokens, Steps int
	// Context is the KV cache fill attention is priced at (0 = 512).
	Context int
	// Routing: a recorded trace (Trace), or HarMoEny's synthetic skew: Skew of the tokens'
	// probability on Hot experts per layer (0: 1), Visual share of image tokens.
	Trace  string
	Skew   float64
	Hot    int
	Visual float64
	Seed   uint64
	// Policies are planned in order (multigpu.PolicyNames; all by default).
	Policies []string
	// Gamma and Metric are the capacity factor and drop metric of the capacity-aware
	// policies (0: 1.5; score).
	Gamma  float64
	Metric multigpu.DropMetric
	// HarMoEnyThreshold is HarMoEny's token threshold q; 0: eq. 4 from the profile.
	HarMoEnyThreshold int
}

// EPReport is the result of EP.
type EPReport struct {
	Shape, Device, Routing string
	Devices, Tokens, Steps int
	Synthetic              bool
	LinkBandwidth          float64
	// Gamma is the capacity factor the capacity-aware policies used; HarMoEnyThreshold the q
	// HarMoEny planned with.
	Gamma             float64
	HarMoEnyThreshold int
	Rows              []multigpu.SimReport
}

// EP simulates expert parallelism over Devices GPUs of the profile for each policy.
func EP(o EPOptions) (*EPReport, error) {
	if err := o.resolve(); err != nil {
		return nil, err
	}
	prof, ok := strings.CutPrefix(o.Device, "sim:")
	if !ok {
		return nil, fmt.Errorf("--ep simulates its devices: pass --device sim:<profile> (e.g. sim:rtx4090), not %q", o.Device)
	}
	p, err := sim.LoadProfile(prof)
	if err != nil {
		return nil, err
	}
	shape, err := o.loadShape()
	if err != nil {
		return nil, err
	}
	link := o.LinkBandwidth
	if link == 0 {
		link = p.PCIeEffective
	}
	cfg := epConfig(p, shape, o.Devices, link, o.Steps)
	if o.HarMoEnyThreshold < 0 {
		return nil, fmt.Errorf("HarMoEny threshold %d tokens: want 0 (eq. 4) or more", o.HarMoEnyThreshold)
	}
	env := multigpu.PolicyEnv{Experts: shape.Experts, Devices: o.Devices, Gamma: o.Gamma, Metric: o.Metric, Seed: o.Seed,
		Cluster: cfg.Cluster, Cost: cfg.Expert, HarMoEnyQ: o.HarMoEnyThreshold}
	rep := &EPReport{Shape: shape.Name, Device: p.Name, Devices: o.Devices, Tokens: o.Tokens, Steps: o.Steps, LinkBandwidth: link, Gamma: o.Gamma}
	w, err := o.workload(shape, &env, rep)
	if err != nil {
		return nil, err
	}
	start, err := multigpu.RoundRobin(shape.Experts, o.Devices)
	if err != nil {
		return nil, err
	}
	if len(o.Policies) == 0 {
		o.Policies = multigpu.PolicyNames()
	}
	if rep.HarMoEnyThreshold = o.HarMoEnyThreshold; rep.HarMoEnyThreshold == 0 {
		if rep.HarMoEnyThreshold, err = multigpu.HarMoEnyThreshold(cfg.Cluster, cfg.Expert); err != nil {
			return nil, err
		}
	}
	for _, name := range o.Policies {
		pol, err := multigpu.NewPolicy(strings.TrimSpace(name), env)
		if err != nil {
			return nil, err
		}
		r, err := multigpu.Simulate(pol, w, start, cfg)
		if err != nil {
			return nil, err
		}
		rep.Rows = append(rep.Rows, r)
	}
	return rep, nil
}

// resolve fills in the defaults and rejects sizes and rates out of range before any profile
// or shape is loaded.
func (o *EPOptions) resolve() error {
	if o.Devices < 1 || o.Devices > 1024 {
		return fmt.Errorf("--ep %d: want 1 to 1024 devices", o.Devices)
	}
	if o.Tokens == 0 {
		o.Tokens = 1024
	}
	if o.Steps == 0 {
		o.Steps = 8
	}
	if o.Context == 0 {
		o.Context = 512
	}
	if o.Gamma == 0 {
		o.Gamma = 1.5
	}
	if o.Tokens < 1 || o.Tokens > 1<<20 || o.Steps < 1 || o.Steps > 1<<16 {
		return fmt.Errorf("expert-parallel bench: %d tokens per batch, %d batches: want 1 to %d and 1 to %d", o.Tokens, o.Steps, 1<<20, 1<<16)
	}
	if !(o.Gamma > 0) || math.IsInf(o.Gamma, 0) {
		return fmt.Errorf("capacity factor %v: want more than 0", o.Gamma)
	}
	if !(o.LinkBandwidth >= 0) || math.IsInf(o.LinkBandwidth, 0) {
		return fmt.Errorf("link bandwidth %v bytes/s: want a positive rate, or 0 for the profile's PCIe", o.LinkBandwidth)
	}
	return nil
}

// loadShape is the model's own shape, or the public one named, priced at the options'
// context: both from the tensors of a file (engine.Model.Shape), a shape's as synth builds
// it (shapes.Open), so that a shape and its file price the same.
func (o *EPOptions) loadShape() (*offload.Shape, error) {
	var shape *offload.Shape
	var err error
	switch {
	case o.Model != nil:
		shape, err = o.Model.Shape(o.Context)
	case o.Shape != "":
		// Opened timing only: nothing is read but the tensors' sizes and types.
		none := &engine.TimingOnlyOptions{Routing: func(int, int) []int { return nil }}
		var m *engine.Model
		if m, err = shapes.Open(o.Shape, engine.Options{Device: o.Device, TimingOnly: none, ContextLength: o.Context}); err != nil {
			return nil, err
		}
		defer m.Close()
		shape, err = m.Shape(o.Context)
	default:
		err = fmt.Errorf("expert-parallel bench: give a model (-m) or a --shape")
	}
	if err != nil {
		return nil, err
	}
	if err := shape.Validate(); err != nil {
		return nil, err
	}
	if shape.Embd < 1 {
		return nil, fmt.Errorf("shape %s: hidden width %d", shape.Name, shape.Embd)
	}
	return shape, nil
}

// epConfig prices the shape's layers on devices GPUs of profile p, linked at link bytes/s.
func epConfig(p *sim.Profile, shape *offload.Shape, devices int, link float64, steps int) multigpu.SimConfig {
	return multigpu.SimConfig{
		Cluster: multigpu.Cluster{Devices: devices, FLOPS: p.PeakFLOPS, MemBW: p.MemoryBandwidth, LinkBW: link,
			HostBW: p.PCIeEffective, LinkLatency: p.CopyLatency, Launch: 3 * p.LaunchOverhead},
		Expert: multigpu.ExpertCost{WeightBytes: shape.ExpertBytes, FLOPsPerToken: shape.ExpertFLOPs,
			// Activations travel as 16-bit values, as NCCL all-to-alls of inference engines send them.
			TokenBytes: 2 * float64(shape.Embd), ElementBytes: 2 * shape.ExpertBytes / max(shape.ExpertFLOPs, 1)},
		Dense: multigpu.ExpertCost{WeightBytes: shape.Attn.Bytes + shape.Router.Bytes + shape.Shared.Bytes,
			FLOPsPerToken: shape.Attn.FLOPs + shape.Router.FLOPs + shape.Shared.FLOPs},
		Layers: shape.MoELayers, Steps: steps,
	}
}

// workload is the routing the policies plan: a recorded trace, or HarMoEny's synthetic skew.
// It names the routing in rep, and for a skew with image tokens gives env the calibration
// batches MACS classes its experts from, drawn apart from the measured ones.
func (o *EPOptions) workload(shape *offload.Shape, env *multigpu.PolicyEnv, rep *EPReport) (multigpu.Workload, error) {
	if o.Trace != "" {
		tw, err := loadTraceWorkload(o.Trace, shape, o.Tokens, o.Steps)
		if err != nil {
			return nil, err
		}
		rep.Routing, rep.Synthetic = tw.source, tw.synthetic
		return tw, nil
	}
	sk := multigpu.Skew{Experts: shape.Experts, K: shape.Used, Tokens: o.Tokens, Alpha: o.Skew, Hot: o.Hot, Seed: o.Seed, Visual: o.Visual}
	if err := sk.Check(); err != nil {
		return nil, err
	}
	rep.Synthetic = true
	if o.Visual > 0 {
		cal := sk
		cal.Seed = ^o.Seed // batches apart from the measured ones
		env.Calibrate = func(layer int) (multigpu.Batch, error) { return cal.Batch(0, layer) }
	}
	rep.Routing = fmt.Sprintf("skew %.2f on %d hot expert(s) per layer, seed %d", o.Skew, max(o.Hot, 1), o.Seed)
	if o.Visual > 0 {
		rep.Routing += fmt.Sprintf(", %.0f%% image tokens", 100*o.Visual)
	}
	return sk, nil
}

// traceWorkload serves batches of consecutive recorded tokens.
type traceWorkload struct {
	tokens          []*trace.Token
	experts, k, per int
	logits          bool
	source          string
	synthetic       bool
}

func loadTraceWorkload(path string, shape *offload.Shape, per, steps int) (*traceWorkload, error) {
	r, err := trace.OpenFor(path, shape.Name, shape.MoELayers, shape.Experts, shape.Used)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	h := r.Header()
	w := &traceWorkload{experts: h.Experts, k: h.Used, per: per, logits: h.Logits, synthetic: h.Synthetic,
		source: fmt.Sprintf("trace %s (%s)", path, h.Source)}
	for len(w.tokens) < per*steps {
		t, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		w.tokens = append(w.tokens, t)
	}
	if len(w.tokens) < per*steps {
		return nil, fmt.Errorf("trace %s holds %d tokens; %d batches of %d need %d", path, len(w.tokens), steps, per, per*steps)
	}
	return w, nil
}

// Batch is tokens [step*per, (step+1)*per) at MoE layer layer. With logits recorded, the
// scores are the router's softmax (the scale expanded drop compares across experts);
// without, the recorded mixing weights and no scores beyond the top-k.
func (w *traceWorkload) Batch(step, layer int) (multigpu.Batch, error) {
	b := multigpu.Batch{Routing: multigpu.Routing{Experts: w.experts, K: w.k}, Layer: layer}
	if w.logits {
		b.Probs = make([]float32, 0, w.per*w.experts)
	}
	for _, t := range w.tokens[step*w.per : (step+1)*w.per] {
		lr := t.Layers[layer]
		b.Choice = append(b.Choice, lr.Experts...)
		if !w.logits {
			b.Score = append(b.Score, lr.Weights...)
			continue
		}
		p := make([]float32, len(lr.Logits))
		copy(p, lr.Logits)
		models.Softmax(p)
		b.Probs = append(b.Probs, p...)
		for _, e := range lr.Experts {
			b.Score = append(b.Score, p[e])
		}
	}
	return b, nil
}
