package multigpu

import (
	"fmt"
	"math"
	"slices"
)

// Modality is what a token encodes: a multimodal model's batch mixes text with image patches
// and video frames, whose tokens carry far less information each (seeds/001).
type Modality uint8

const (
	Text Modality = iota
	Image
	Video
)

func (m Modality) String() string {
	switch m {
	case Text:
		return "text"
	case Image:
		return "image"
	case Video:
		return "video"
	}
	return fmt.Sprintf("Modality(%d)", int(m))
}

// Visual says whether m is an image or video token.
func (m Modality) Visual() bool { return m == Image || m == Video }

// Batch is one MoE layer's batch as the planner sees it: the router's top-k choice of every
// token and what else a policy may use.
type Batch struct {
	Routing
	// Layer is the MoE layer, for policies that keep state per layer (EPLB's load window).
	Layer int
	// Probs, when set, is every expert's gating score for every token (tokens*Experts, the
	// same scale as Routing.Score): expanded drop and rerouting choose experts outside the
	// top-k by it.
	Probs []float32
	// Home is the device each token lives on, where its hidden state is and its output must
	// return; nil: the batch split into contiguous equal shards, one per device.
	Home []int
	// Modality of each token; nil: all text.
	Modality []Modality
	// Entropy of each token's hidden state (MACS's semantic weight); nil: unknown.
	Entropy []float32
	// Features, when set, is each token's hidden state (tokens*Dim), for MACS's semantic
	// rerouting.
	Features []float32
	Dim      int
	// Affinity, when set, is each token's semantic affinity to every expert (tokens*Experts):
	// the cosine of its hidden state with the expert's centroid (Affinities), for MACS's
	// rerouting in place of Features. Computed on the token's home device, it crosses the
	// link as Experts numbers per token where Features would be the whole hidden state.
	Affinity []float32
}

// HomeOf is the device token t lives on among devices.
func (b Batch) HomeOf(t, devices int) int {
	if b.Home != nil {
		return b.Home[t]
	}
	return t * devices / max(b.Tokens(), 1)
}

// ModalityOf is token t's modality.
func (b Batch) ModalityOf(t int) Modality {
	if b.Modality == nil {
		return Text
	}
	return b.Modality[t]
}

// Check validates a batch for a placement over devices.
func (b Batch) Check(devices int) error {
	if err := b.Routing.check(); err != nil {
		return err
	}
	T := b.Tokens()
	if b.Probs != nil {
		if len(b.Probs) != T*b.Experts {
			return fmt.Errorf("batch: %d gating scores for %d tokens of %d experts", len(b.Probs), T, b.Experts)
		}
		for i, p := range b.Probs {
			if math.IsNaN(float64(p)) || math.IsInf(float64(p), 0) {
				return fmt.Errorf("batch: gating score of token %d for expert %d is %v", i/b.Experts, i%b.Experts, p)
			}
		}
	}
	if b.Home != nil {
		if len(b.Home) != T {
			return fmt.Errorf("batch: %d home devices for %d tokens", len(b.Home), T)
		}
		for t, d := range b.Home {
			if d < 0 || d >= devices {
				return fmt.Errorf("batch: token %d lives on device %d of %d", t, d, devices)
			}
		}
	}
	if b.Modality != nil && len(b.Modality) != T {
		return fmt.Errorf("batch: %d modality tags for %d tokens", len(b.Modality), T)
	}
	for t, m := range b.Modality {
		if m > Video {
			return fmt.Errorf("batch: token %d has modality %v", t, m)
		}
	}
	if b.Entropy != nil {
		if len(b.Entropy) != T {
			return fmt.Errorf("batch: %d entropies for %d tokens", len(b.Entropy), T)
		}
		for t, h := range b.Entropy {
			if !(h >= 0) || math.IsInf(float64(h), 0) {
				return fmt.Errorf("batch: entropy of token %d is %v: want a finite value >= 0", t, h)
			}
		}
	}
	if b.Features != nil && (b.Dim < 1 || len(b.Features) != T*b.Dim) {
		return fmt.Errorf("batch: %d feature values for %d tokens of dimension %d", len(b.Features), T, b.Dim)
	}
	if b.Affinity != nil {
		if len(b.Affinity) != T*b.Experts {
			return fmt.Errorf("batch: %d affinities for %d tokens of %d experts", len(b.Affinity), T, b.Experts)
		}
		for i, a := range b.Affinity {
			// A cosine, with room for rounding.
			if !(a >= -1.001 && a <= 1.001) {
				return fmt.Errorf("batch: affinity of token %d for expert %d is %v: want a cosine, -1 to 1", i/b.Experts, i%b.Experts, a)
			}
		}
	}
	return nil
}

// Placement says which devices hold a copy of each expert's weights.
type Placement struct {
	Devices int
	Holders [][]int // per expert, the devices holding it, each once
}

// RoundRobin places expert e on device e mod devices, the static placement of DeepSpeed-MoE
// and FastMoE: every device holds the same number of experts (give or take one), no copies.
func RoundRobin(experts, devices int) (Placement, error) {
	if experts < 1 || devices < 1 {
		return Placement{}, fmt.Errorf("placement: %d experts on %d devices", experts, devices)
	}
	p := Placement{Devices: devices, Holders: make([][]int, experts)}
	for e := range p.Holders {
		p.Holders[e] = []int{e % devices}
	}
	return p, nil
}

// Local lists the experts device d holds, in order.
func (p Placement) Local(d int) []int {
	var l []int
	for e, h := range p.Holders {
		if slices.Contains(h, d) {
			l = append(l, e)
		}
	}
	return l
}

// Holds says whether device d holds expert e.
func (p Placement) Holds(d, e int) bool { return slices.Contains(p.Holders[e], d) }

// Check validates a placement of experts.
func (p Placement) Check(experts int) error {
	if p.Devices < 1 {
		return fmt.Errorf("placement: %d devices", p.Devices)
	}
	if len(p.Holders) != experts {
		return fmt.Errorf("placement of %d experts for a layer of %d", len(p.Holders), experts)
	}
	for e, h := range p.Holders {
		if len(h) == 0 {
			return fmt.Errorf("placement: no device holds expert %d", e)
		}
		for i, d := range h {
			if d < 0 || d >= p.Devices || slices.Contains(h[:i], d) {
				return fmt.Errorf("placement: expert %d on device %d of %d (holders %v)", e, d, p.Devices, h)
			}
		}
	}
	return nil
}

// Assignment is one expert computation of one token: token Token's hidden state goes from its
// home device From to device To, which computes expert Expert on it and sends the result back.
type Assignment struct {
	Token, Expert int
	From, To      int
	// Choice is the index of Expert in the token's top-k choice, or -1 for an expert outside
	// it (expanded drop, rerouting): the combine weighs a top-k choice as the router did and
	// another expert by its gating score on the same scale.
	Choice int
	// Score is the gating score of Token for Expert.
	Score float32
}

// Fetch is a copy of an expert's weights to a device that does not hold it, made during the
// layer (HarMoEny's asynchronous fetch into a finished expert's slot), from a device that
// holds it or from the host's copy (From = Host).
type Fetch struct {
	Expert, From, To int
}

// Host is the source of a Fetch from host memory over PCIe.
const Host = -1

// Schedule is the token-to-expert-to-device plan of one MoE layer for one batch.
type Schedule struct {
	Devices, Experts, Tokens, K int
	Assign                      []Assignment
	Fetches                     []Fetch
	// Dropped counts the top-k choices not computed: a token whose choices are all dropped
	// passes through the residual unchanged.
	Dropped int
	// Rerouted counts assignments outside the top-k made in place of a dropped choice.
	Rerouted int
}

// DeviceLoad is the tokens each device computes (one per assignment).
func (s Schedule) DeviceLoad() []float64 {
	l := make([]float64, s.Devices)
	for _, a := range s.Assign {
		l[a.To]++
	}
	return l
}

// ExpertLoad is the tokens each expert computes, over all its copies.
func (s Schedule) ExpertLoad() []int {
	l := make([]int, s.Experts)
	for _, a := range s.Assign {
		l[a.Expert]++
	}
	return l
}

// Matrix is HarMoEny's S[from][expert][to]: the tokens of device from routed to expert that
// device to computes.
func (s Schedule) Matrix() [][][]int {
	m := make([][][]int, s.Devices)
	for f := range m {
		m[f] = make([][]int, s.Experts)
		for e := range m[f] {
			m[f][e] = make([]int, s.Devices)
		}
	}
	for _, a := range s.Assign {
		m[a.From][a.Expert][a.To]++
	}
	return m
}

// Check verifies a schedule against its batch and placement: every assignment sends a token
// from its home to a device that holds the expert or fetches it from a holder first, no
// token computes an expert twice, top-k choices carry their index and score, and every top-k
// choice is either computed or counted as dropped (tokens are conserved).
func (s Schedule) Check(b Batch, p Placement) error {
	T := b.Tokens()
	if s.Devices != p.Devices || s.Experts != b.Experts || s.Tokens != T || s.K != b.K {
		return fmt.Errorf("schedule of %d tokens, top-%d of %d experts on %d devices for a batch of %d, top-%d of %d on %d",
			s.Tokens, s.K, s.Experts, s.Devices, T, b.K, b.Experts, p.Devices)
	}
	fetched := map[[2]int]bool{}
	for _, f := range s.Fetches {
		if f.Expert < 0 || f.Expert >= s.Experts || f.To < 0 || f.To >= s.Devices || f.From < Host || f.From >= s.Devices {
			return fmt.Errorf("schedule: fetch %+v out of range", f)
		}
		if f.From != Host && !p.Holds(f.From, f.Expert) {
			return fmt.Errorf("schedule: fetch of expert %d from device %d, which does not hold it", f.Expert, f.From)
		}
		if p.Holds(f.To, f.Expert) || fetched[[2]int{f.Expert, f.To}] {
			return fmt.Errorf("schedule: fetch of expert %d to device %d, which has it", f.Expert, f.To)
		}
		fetched[[2]int{f.Expert, f.To}] = true
	}
	seen := map[[2]int]bool{}
	topk := 0
	extra := 0
	for _, a := range s.Assign {
		if a.Token < 0 || a.Token >= T || a.Expert < 0 || a.Expert >= s.Experts || a.To < 0 || a.To >= s.Devices {
			return fmt.Errorf("schedule: assignment %+v out of range", a)
		}
		if a.From != b.HomeOf(a.Token, s.Devices) {
			return fmt.Errorf("schedule: token %d sent from device %d, but it lives on %d", a.Token, a.From, b.HomeOf(a.Token, s.Devices))
		}
		if !p.Holds(a.To, a.Expert) && !fetched[[2]int{a.Expert, a.To}] {
			return fmt.Errorf("schedule: device %d computes expert %d without holding or fetching it", a.To, a.Expert)
		}
		if seen[[2]int{a.Token, a.Expert}] {
			return fmt.Errorf("schedule: token %d computes expert %d twice", a.Token, a.Expert)
		}
		seen[[2]int{a.Token, a.Expert}] = true
		switch {
		case a.Choice >= 0:
			if a.Choice >= b.K || b.Choice[a.Token*b.K+a.Choice] != a.Expert || b.Score[a.Token*b.K+a.Choice] != a.Score {
				return fmt.Errorf("schedule: assignment %+v is not the token's top-k choice %d", a, a.Choice)
			}
			topk++
		case a.Choice == -1:
			if slices.Contains(b.Choice[a.Token*b.K:(a.Token+1)*b.K], a.Expert) {
				return fmt.Errorf("schedule: assignment %+v marks a top-k choice as outside it", a)
			}
			if b.Probs != nil && b.Probs[a.Token*b.Experts+a.Expert] != a.Score {
				return fmt.Errorf("schedule: assignment %+v: the token's score for the expert is %v", a, b.Probs[a.Token*b.Experts+a.Expert])
			}
			extra++
		default:
			return fmt.Errorf("schedule: assignment %+v: choice %d", a, a.Choice)
		}
	}
	if topk+s.Dropped != len(b.Choice) {
		return fmt.Errorf("schedule: %d top-k choices computed and %d dropped of %d: tokens not conserved", topk, s.Dropped, len(b.Choice))
	}
	if s.Rerouted != extra {
		return fmt.Errorf("schedule: %d assignments outside the top-k, %d counted as rerouted", extra, s.Rerouted)
	}
	return nil
}

// Policy plans one MoE layer's batch onto devices holding experts as placed.
type Policy interface {
	Name() string
	Plan(b Batch, p Placement) (Schedule, error)
}

// Replacer is a Policy that moves experts between batches (EPLB): after a batch, the
// placement the layer should use from the next one on.
type Replacer interface {
	Policy
	Replace(layer int, current Placement) (Placement, bool)
}

// newSchedule is an empty schedule for b on p.
func newSchedule(b Batch, p Placement) Schedule {
	return Schedule{Devices: p.Devices, Experts: b.Experts, Tokens: b.Tokens(), K: b.K}
}

// nearest is the holder of expert e a token on device from is sent to: its own device when
// that holds e, else the holder with the fewest tokens so far (lowest index on ties).
func nearest(p Placement, e, from int, load []float64) int {
	h := p.Holders[e]
	if slices.Contains(h, from) {
		return from
	}
	best := h[0]
	for _, d := range h[1:] {
		if load[d] < load[best] {
			best = d
		}
	}
	return best
}
