package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"slices"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/owa"
	"github.com/commit-run/commit-run/predictor"
)

// CommitOptions turn on committed routing (CommitMoE): in a single-token pass, as decoding
// runs, each MoE layer computes with the experts the Commit Router predicted for it while the
// previous layer ran, and never falls back to the router's choice; Output Weight Adjustment
// repairs the mixing weights from the router's scores. The router still runs: its scores are
// what OWA and the accuracy counts use. A token's first MoE layer uses the router unless
// CrossToken is set, and always when the pass does not continue a single-token pass (the
// first decoded token after a prompt), as there is no previous token to predict from.
// Batched passes (prefill, batched evaluation) route as the router says.
//
// Without offloading this changes only the numbers, which is how commit's quality is
// measured (Model.PerplexityWith with TokenAtATime); with OffloadOptions.Policy commit, the
// offloader also prefetches the predicted experts.
type CommitOptions struct {
	// Predictor is the Commit Router file; "" = the model's sidecar file
	// (predictor.SidecarPath: model.gguf -> model.commit-router.gguf).
	Predictor string
	// OWA are the Output Weight Adjustment settings; nil = owa.Defaults for the model.
	OWA *owa.Params
	// OWASpec, when not empty, overrides them as owa.Parse reads it: "off", "neutral", or
	// a1=F,a2=F,range=MIN-MAX (a user's flag).
	OWASpec string
	// NoOWA weights the predicted experts with the router's own probabilities of them.
	NoOWA bool
	// OnlyAllWrong computes with the predicted experts only for a token and layer where none
	// of them is an expert the router chose, and with the router's elsewhere: CommitMoE's
	// Table 1 experiment (how much expert choice matters where prediction fails).
	OnlyAllWrong bool
	// CrossToken also commits each token's first MoE layer to the prediction made from the
	// previous token's last layer, CommitMoE's whole pipeline. Off, the first MoE layer
	// waits for its router, as ondemand does, and that prediction only prefetches: the
	// cross-token prediction is the hardest one (CommitMoE §4.2), and on the bundled models
	// committing to it costs far more quality than everything else (tinymoe-qwen2moe, first
	// 1024 held-out tokens: +36% perplexity with it, +0.6% without).
	CrossToken bool
}

// committer holds what committed routing needs; it is read-only after Open.
type committer struct {
	router *predictor.Router // nil: a modelled predictor (TimingOnlyOptions.ModelledPredictor)
	path   string
	owa    owa.Params
	useOWA bool
	only0  bool
	cross  bool        // CrossToken
	moe    []int       // MoE block indices, in order
	idx    map[int]int // block index -> MoE layer number
	bytes  int64       // device bytes of the predictor's weights
	// compute says whether single-token passes compute with the predictions (commit), or
	// only prefetch them (the prefetch policy with the Commit Router as its predictor).
	compute bool

	stats *predictor.CommitCounter
}

// CommitStats count what committed routing did since the model was opened
// (predictor.CommitStats).
type CommitStats = predictor.CommitStats

// CommitLayerStats are one MoE layer's commit counts (predictor.CommitLayerStats).
type CommitLayerStats = predictor.CommitLayerStats

// commitState is a session's pending predictions: what the Commit Router predicted for each
// MoE layer and for which position.
type commitState struct {
	pending [][]int
	pos     []int
}

// openCommit sets up committed routing when the options ask for it: Options.Commit, or
// offloading with the Commit Router as the predictor (commit's default). The Commit Router's
// weights live on the device.
func (m *Model) openCommit() error {
	if off := m.opts.Offload; off != nil {
		o := *off // the caller's options stay as they were
		if o.Predictor == "" && o.Policy == offload.Commit {
			o.Predictor = "router"
		}
		m.opts.Offload = &o
	}
	off := m.opts.Offload
	learnt := off != nil && off.Predictor == "router"
	o := m.opts.Commit
	if o == nil && !learnt {
		return nil
	}
	if o != nil && off != nil && !(learnt && off.Policy == offload.Commit) {
		return fmt.Errorf("commit: committed routing offloads with policy commit and predictor router, not policy %s with predictor %q", off.Policy, off.Predictor)
	}
	if o == nil {
		o = &CommitOptions{}
	}
	var c *committer
	var err error
	if m.replay != nil && m.replay.opts.ModelledPredictor {
		c, err = newModelledCommitter(m, *o)
	} else {
		c, err = newCommitter(m, *o)
	}
	if err != nil {
		return err
	}
	c.compute = off == nil || off.Policy == offload.Commit
	if err := m.dev.Memory().Alloc(c.bytes, "the Commit Router"); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	m.commit = c
	return nil
}

func newCommitter(m *Model, o CommitOptions) (*committer, error) {
	if len(m.info.MoELayers) == 0 {
		return nil, fmt.Errorf("commit: %s has no MoE layers", m.info.Path)
	}
	path := o.Predictor
	if path == "" {
		path = predictor.SidecarPath(m.info.Path)
	}
	r, err := predictor.Load(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && o.Predictor == "" {
			return nil, fmt.Errorf("commit: no Commit Router for %s at %s: train one with `commit-run predictor collect` and `commit-run predictor train`, or name a file with --predictor-file", m.info.Path, path)
		}
		return nil, fmt.Errorf("commit: %w", err)
	}
	if err := r.ID.Check(m.PredictorIdentity()); err != nil {
		return nil, fmt.Errorf("commit: %s: %w", path, err)
	}
	return newCommitterWith(m, o, r, path, r.Bytes())
}

// newModelledCommitter is a committer whose predictions a timing-only run supplies
// (TimingOnlyOptions.ModelledPredictor), with a modelled net's weights on the device.
func newModelledCommitter(m *Model, o CommitOptions) (*committer, error) {
	if len(m.info.MoELayers) == 0 {
		return nil, fmt.Errorf("commit: %s has no MoE layers", m.info.Path)
	}
	var bytes int64
	for range m.info.MoELayers {
		bytes += 4 * modelledParams(m)
	}
	return newCommitterWith(m, o, nil, "", bytes)
}

// modelledParams are the weights and biases of a modelled predictor net: one linear layer
// from the router input to every expert.
func modelledParams(m *Model) int64 {
	d, E := int64(m.arch.Config.Embd), int64(m.arch.Config.Experts)
	return d*E + E
}

func newCommitterWith(m *Model, o CommitOptions, r *predictor.Router, path string, bytes int64) (*committer, error) {
	c := &committer{router: r, path: path, useOWA: !o.NoOWA, only0: o.OnlyAllWrong, cross: o.CrossToken, moe: m.info.MoELayers,
		idx: map[int]int{}, bytes: bytes}
	c.owa = owa.Defaults(m.info.Architecture, m.info.Experts, m.info.ExpertsUsed)
	if o.OWA != nil {
		c.owa = *o.OWA
	}
	on, err := true, c.owa.Validate(m.info.ExpertsUsed)
	if err == nil && o.OWASpec != "" {
		c.owa, on, err = owa.Parse(o.OWASpec, c.owa, m.info.ExpertsUsed)
	}
	if err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	c.useOWA = c.useOWA && on
	for j, l := range c.moe {
		c.idx[l] = j
	}
	c.stats = predictor.NewCommitCounter(c.moe)
	return c, nil
}

func (c *committer) newState() *commitState {
	s := &commitState{pending: make([][]int, len(c.moe)), pos: make([]int, len(c.moe))}
	for j := range s.pos {
		s.pos[j] = -1
	}
	return s
}

// take returns the experts predicted for MoE layer j of the token at pos, or nil.
func (s *commitState) take(j, pos int) []int {
	if s.pos[j] != pos {
		return nil
	}
	p := s.pending[j]
	s.pending[j], s.pos[j] = nil, -1
	return p
}

// forget drops every prediction: a batched pass breaks the chain of single-token passes.
func (s *commitState) forget() {
	for j := range s.pos {
		s.pending[j], s.pos[j] = nil, -1
	}
}

// predict runs the Commit Router on layer's router input h (one token at pos) and returns the
// experts it predicts for the next MoE layer (the next token's first after the last) and the
// layer and position they are for; a timing-only run, which has no input to predict from,
// takes the prediction its replay recorded. The device is charged for it on the compute
// stream.
func (m *Model) predict(layer int, h []float32, pos int) (next, nextPos int, experts []int, err error) {
	c := m.commit
	j := c.idx[layer]
	next, nextPos = j+1, pos
	if next == len(c.moe) {
		next, nextPos = 0, pos+1
	}
	nm := m.arch.Layers[c.moe[next]].MoE
	m.label("predictor", "predict", layer, -1)
	if c.router != nil {
		n := c.router.Nets[j]
		m.charge("predictor", float64(4*n.Params()+4*(n.In+n.Hidden+n.Out)), float64(2*n.Params()))
	} else {
		p := float64(modelledParams(m))
		m.charge("predictor", 4*p+4*float64(m.arch.Config.Embd+nm.Experts), 2*p)
	}
	if m.replay != nil {
		experts, err = m.replay.predict(next, nextPos, nm)
		return next, nextPos, experts, err
	}
	logits := make([]float32, nm.Experts)
	c.router.Predict(j, h, logits)
	_, sel := nm.GateProbs(logits)
	return next, nextPos, nm.Choose(sel), nil
}

// commitRouting is the routing of a token that computes with the predicted experts pred
// instead of the router's choice truth (made from logits): OWA's weights when it triggers,
// else the router's probabilities of the predicted experts through the model's gating. With
// OnlyAllWrong it keeps the router's choice unless every prediction is wrong.
func (m *Model) commitRouting(layer int, moe *models.MoE, logits []float32, truth routing, pred []int) routing {
	c := m.commit
	if c != nil && c.only0 && owa.Correct(truth.experts, pred) > 0 {
		m.countCommit(layer, truth.experts, pred, false)
		return truth
	}
	if p, on := m.owaParams(); on {
		if w, ok := owa.Adjust(moe.OWAScores(logits, truth.experts), truth.experts, pred, p); ok {
			m.countCommit(layer, truth.experts, pred, true)
			return routing{experts: pred, weights: w}
		}
	}
	m.countCommit(layer, truth.experts, pred, false)
	return commitRoute(moe, logits, pred)
}

// owaParams are the OWA settings committed routing uses, and whether it uses OWA: the
// Commit Router's options', or the model's defaults when a heuristic commits.
func (m *Model) owaParams() (owa.Params, bool) {
	if c := m.commit; c != nil {
		return c.owa, c.useOWA
	}
	return owa.Defaults(m.info.Architecture, m.info.Experts, m.info.ExpertsUsed), true
}

// countCommit adds a committed token of layer to the Commit Router's statistics: the
// router's choice truth, the experts committed to, and whether OWA adjusted their weights.
func (m *Model) countCommit(layer int, truth, pred []int, adjusted bool) {
	if c := m.commit; c != nil {
		c.stats.Add(c.idx[layer], owa.Correct(truth, pred), adjusted)
	}
}

// CommitStats reports committed routing's counts; ok is false when it is off.
func (m *Model) CommitStats() (CommitStats, bool) {
	if m.commit == nil {
		return CommitStats{}, false
	}
	return m.commit.stats.Stats(), true
}

// CommitRouterPath is the Commit Router file committed routing uses ("" when it is off).
func (m *Model) CommitRouterPath() string {
	if m.commit == nil {
		return ""
	}
	return m.commit.path
}

// PredictorIdentity is what a Commit Router for m must have been trained for.
func (m *Model) PredictorIdentity() predictor.Identity {
	return predictor.Identity{
		Model: m.info.Name, Arch: m.info.Architecture, Fingerprint: m.Fingerprint(),
		Layers: m.info.Layers, MoELayers: slices.Clone(m.info.MoELayers),
		Experts: m.info.Experts, Used: m.info.ExpertsUsed, Embd: m.info.Embedding,
	}
}

// Fingerprint identifies the model's routing: the SHA-256 of its architecture, its routers'
// and its token embedding's bytes. It binds a Commit Router or a trace to the model without
// hashing the whole file, whose bulk is the experts; a fine-tune changes the routers too.
func (m *Model) Fingerprint() string {
	m.fpOnce.Do(func() {
		h := sha256.New()
		h.Write([]byte(m.info.Architecture))
		h.Write(m.arch.TokenEmbd.Matrix().Data)
		for _, l := range m.arch.Layers {
			if l.MoE != nil {
				h.Write(l.MoE.Router.Matrix().Data)
			}
		}
		m.fp = hex.EncodeToString(h.Sum(nil))
	})
	return m.fp
}

// PredictorInit is the Commit Router's warm start (predictor.WarmStart): for MoE layer j's
// net, the router of the layer it predicts with each input column scaled by the ratio of that
// layer's FFN norm weight to layer j's.
func (m *Model) PredictorInit() [][]float32 {
	return predictor.WarmStart(m.arch, m.info.MoELayers)
}
