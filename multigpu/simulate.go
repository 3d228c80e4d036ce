package multigpu

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Workload supplies the batches of a simulated run: the routing of batch step at MoE layer
// layer (0-based among the MoE layers).
type Workload interface {
	Batch(step, layer int) (Batch, error)
}

// Skew is HarMoEny's synthetic router skew (seeds/004 §5.1): Hot experts per layer share
// probability Alpha, the others share the rest evenly, and every token draws its top-k from
// that distribution without replacement. Each token also gets a full set of gating scores
// whose top-k is its draw, so that expanded drop and rerouting have the scores they need.
type Skew struct {
	Experts, K, Tokens int
	Alpha              float64
	Hot                int // hot experts per layer; 0: 1
	Seed               uint64
	// Visual is the share of image tokens in every batch (0: text only), with entropies drawn
	// so that MACS has something to weigh: a synthetic multimodal batch.
	Visual float64
}

// Check validates the skew.
func (s Skew) Check() error {
	hot := max(s.Hot, 1)
	switch {
	case s.Experts < 1 || s.K < 1 || s.K > s.Experts:
		return fmt.Errorf("skew: top-%d of %d experts", s.K, s.Experts)
	case s.Tokens < 1 || s.Tokens > 1<<24:
		return fmt.Errorf("skew: %d tokens per batch: want 1 to %d", s.Tokens, 1<<24)
	case !(s.Alpha >= 0 && s.Alpha <= 1):
		return fmt.Errorf("skew %v: want a share from 0 to 1", s.Alpha)
	case hot > s.Experts || s.Hot < 0:
		return fmt.Errorf("skew: %d hot experts of %d", s.Hot, s.Experts)
	case !(s.Visual >= 0 && s.Visual <= 1):
		return fmt.Errorf("skew: visual share %v: want 0 to 1", s.Visual)
	}
	return nil
}

// Batch draws batch step of layer layer; the hot experts move from layer to layer, as a
// real model's do, so that every device has its hot layers.
func (s Skew) Batch(step, layer int) (Batch, error) {
	if err := s.Check(); err != nil {
		return Batch{}, err
	}
	hot := max(s.Hot, 1)
	E := s.Experts
	rng := rand.New(rand.NewPCG(s.Seed, uint64(step)<<32|uint64(layer)))
	p := make([]float64, E)
	isHot := make([]bool, E)
	for i := range hot {
		isHot[(layer*hot+i)%E] = true
	}
	for e := range p {
		if isHot[e] {
			p[e] = s.Alpha / float64(hot)
		} else if E > hot {
			p[e] = (1 - s.Alpha) / float64(E-hot)
		}
	}
	b := Batch{Routing: Routing{Experts: E, K: s.K}, Layer: layer, Probs: make([]float32, s.Tokens*E)}
	if s.Visual > 0 {
		b.Modality = make([]Modality, s.Tokens)
		b.Entropy = make([]float32, s.Tokens)
	}
	w := make([]float64, E)
	logit := make([]float64, E)
	for t := range s.Tokens {
		copy(w, p)
		if s.Visual > 0 {
			// Image patches carry spread-out entropies, and prefer the odd experts three to
			// one, so that a calibration run finds visual experts among them.
			b.Entropy[t] = float32(1 + 4*rng.Float64())
			if rng.Float64() < s.Visual {
				b.Modality[t] = Image
				for e := 1; e < E; e += 2 {
					w[e] *= 3
				}
			}
		}
		chosen := make([]int, 0, s.K)
		for range s.K {
			e := draw(rng, w)
			chosen = append(chosen, e)
			w[e] = 0
		}
		// Gating scores: noise for every expert, the drawn ones lifted above the rest in
		// draw order, then a softmax.
		top := math.Inf(-1)
		for e := range logit {
			logit[e] = rng.NormFloat64()
			top = max(top, logit[e])
		}
		for i, e := range chosen {
			logit[e] = top + 0.5 + float64(s.K-i)*0.5 + rng.Float64()*0.5
		}
		probs := b.Probs[t*E : (t+1)*E]
		var sum float64
		for e, l := range logit {
			v := math.Exp(l - top - float64(s.K)*0.5 - 1)
			probs[e] = float32(v)
			sum += v
		}
		for e := range probs {
			probs[e] = float32(float64(probs[e]) / sum)
		}
		for _, e := range chosen {
			b.Choice = append(b.Choice, e)
			b.Score = append(b.Score, probs[e])
		}
	}
	return b, nil
}

// draw samples an index with probability proportional to w; all-zero w gives the first
// positive index or 0.
func draw(rng *rand.Rand, w []float64) int {
	var sum float64
	for _, v := range w {
		sum += v
	}
	if sum <= 0 {
		for i, v := range w {
			if v > 0 {
				return i
			}
		}
		return 0
	}
	r := rng.Float64() * sum
	for i, v := range w {
		if r < v {
			return i
		}
		r -= v
	}
	for i := len(w) - 1; i >= 0; i-- {
		if w[i] > 0 {
			return i
		}
	}
	return 0
}

// SimConfig is the modelled machine and model of a simulated run.
type SimConfig struct {
	Cluster Cluster
	Expert  ExpertCost
	// Dense is the per-layer work outside the experts (attention, router, shared experts)
	// that every device runs on its own tokens, data-parallel: WeightBytes read once per
	// layer, FLOPsPerToken per token.
	Dense ExpertCost
	// Layers and Steps: MoE layers per batch and batches.
	Layers, Steps int
}

// LayerReport is one MoE layer of a simulated run, averaged over the batches.
type LayerReport struct {
	MaxLoad      float64 // tokens on the busiest device
	Balancedness float64 // mean/max device load
	Straggler    float64 // seconds of the slowest device's expert work
	Total        float64 // seconds of the layer: all-to-alls and the straggler
}

// SimReport is one policy's simulated run.
type SimReport struct {
	Policy string
	Layers []LayerReport
	// Latency is the mean seconds of one batch through every layer, the dense parts
	// included; Throughput the tokens per second that makes.
	Latency, Throughput float64
	// Dropped and Extra are shares of the top-k choices: dropped, and computed beyond the
	// top-k (expanded drop, rerouting).
	Dropped, Extra float64
	// Fetches is the mean expert copies per batch (HarMoEny), Replans the placements
	// changed (EPLB).
	Fetches float64
	Replans int
}

// Simulate runs a policy over a workload on the modelled machine, starting from placement
// start on every layer, and checks every schedule it makes.
func Simulate(pol Policy, w Workload, start Placement, cfg SimConfig) (SimReport, error) {
	if err := cfg.check(start); err != nil {
		return SimReport{}, err
	}
	c := cfg.Cluster
	rep := SimReport{Policy: pol.Name(), Layers: make([]LayerReport, cfg.Layers)}
	place := make([]Placement, cfg.Layers)
	for l := range place {
		place[l] = start
	}
	replacer, _ := pol.(Replacer)
	var sums simSums
	for step := range cfg.Steps {
		var latency float64
		for l := range cfg.Layers {
			b, s, lt, err := simulateLayer(pol, w, place[l], cfg, step, l)
			if err != nil {
				return SimReport{}, err
			}
			rep.Layers[l].add(s.DeviceLoad(), lt)
			// The dense part runs on every device's share of the batch at once.
			share := math.Ceil(float64(b.Tokens()) / float64(c.Devices))
			latency += c.Launch + max(cfg.Dense.WeightBytes/c.MemBW, share*cfg.Dense.FLOPsPerToken/c.FLOPS) + lt.Total
			sums.add(b, s, l)
			if replacer != nil {
				if np, ok := replacer.Replace(l, place[l]); ok {
					if err := np.Check(b.Experts); err != nil {
						return SimReport{}, fmt.Errorf("%s: new placement of layer %d: %w", pol.Name(), l, err)
					}
					place[l] = np
					rep.Replans++
				}
			}
		}
		rep.Latency += latency
	}
	rep.average(sums, cfg.Steps)
	return rep, nil
}

// check reports a machine, model or starting placement a simulation cannot run on.
func (cfg *SimConfig) check(start Placement) error {
	c := cfg.Cluster
	if err := c.Check(cfg.Expert); err != nil {
		return err
	}
	if err := c.Check(cfg.Dense); err != nil {
		return fmt.Errorf("dense part: %w", err)
	}
	if cfg.Layers < 1 || cfg.Steps < 1 {
		return fmt.Errorf("simulate: %d layers, %d batches", cfg.Layers, cfg.Steps)
	}
	if start.Devices != c.Devices {
		return fmt.Errorf("simulate: placement on %d devices, cluster of %d", start.Devices, c.Devices)
	}
	return nil
}

// simulateLayer plans batch step of layer l on placement p, checks the schedule, and times
// it on the cluster.
func simulateLayer(pol Policy, w Workload, p Placement, cfg SimConfig, step, l int) (Batch, Schedule, LayerTime, error) {
	b, err := w.Batch(step, l)
	if err != nil {
		return Batch{}, Schedule{}, LayerTime{}, fmt.Errorf("batch %d, layer %d: %w", step, l, err)
	}
	b.Layer = l
	s, err := pol.Plan(b, p)
	if err != nil {
		return Batch{}, Schedule{}, LayerTime{}, fmt.Errorf("%s: batch %d, layer %d: %w", pol.Name(), step, l, err)
	}
	if err := s.Check(b, p); err != nil {
		return Batch{}, Schedule{}, LayerTime{}, fmt.Errorf("%s: batch %d, layer %d: %w", pol.Name(), step, l, err)
	}
	lt, err := cfg.Cluster.Time(s, cfg.Expert)
	if err != nil {
		return Batch{}, Schedule{}, LayerTime{}, err
	}
	return b, s, lt, nil
}

// add sums one batch's loads and times into the layer's report; average divides them.
func (lr *LayerReport) add(load []float64, lt LayerTime) {
	lr.MaxLoad += Straggler(load)
	lr.Balancedness += Balancedness(load)
	lr.Straggler += lt.Straggler
	lr.Total += lt.Total
}

// simSums are the counts over every batch and layer that the report's shares and means
// divide.
type simSums struct{ choices, dropped, extra, fetches, tokens float64 }

func (m *simSums) add(b Batch, s Schedule, layer int) {
	m.choices += float64(len(b.Choice))
	m.dropped += float64(s.Dropped)
	m.extra += float64(s.Rerouted)
	m.fetches += float64(len(s.Fetches))
	if layer == 0 {
		m.tokens += float64(b.Tokens())
	}
}

// average turns the sums over steps batches into the report's means, shares and throughput.
func (rep *SimReport) average(m simSums, steps int) {
	n := float64(steps)
	for l := range rep.Layers {
		lr := &rep.Layers[l]
		lr.MaxLoad /= n
		lr.Balancedness /= n
		lr.Straggler /= n
		lr.Total /= n
	}
	if rep.Latency > 0 {
		rep.Throughput = m.tokens / rep.Latency
	}
	rep.Latency /= n
	rep.Dropped, rep.Extra = m.dropped/m.choices, m.extra/m.choices
	rep.Fetches = m.fetches / n
}
