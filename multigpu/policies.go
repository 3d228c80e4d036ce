package multigpu

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Static sends every top-k choice to a device holding its expert and drops nothing: with the
// RoundRobin placement, the DeepSpeed-MoE / FastMoE baseline that the straggler effect hurts.
type Static struct{}

func (Static) Name() string { return "round-robin" }

func (Static) Plan(b Batch, p Placement) (Schedule, error) {
	if err := checkPlan(b, p); err != nil {
		return Schedule{}, err
	}
	s := newSchedule(b, p)
	load := make([]float64, p.Devices)
	for i, e := range b.Choice {
		t := i / b.K
		from := b.HomeOf(t, p.Devices)
		to := nearest(p, e, from, load)
		load[to]++
		s.Assign = append(s.Assign, Assignment{Token: t, Expert: e, From: from, To: to, Choice: i % b.K, Score: b.Score[i]})
	}
	return s, nil
}

// CapacityDrop is capacity-aware inference (seeds/000): each device limits the tokens it sends
// to an expert to the capacity of its share of the batch, floor(Gamma * tokens * k / experts),
// and drops the overflow by Metric before the all-to-all, so no expert's load can exceed the
// capacity times the devices.
type CapacityDrop struct {
	Gamma  float64
	Metric DropMetric
	Seed   uint64 // for ByRandom
	// Expand is expanded drop: every token also offers itself to each expert of its own device
	// (the paper's m local candidates), scored by its gating score, so that experts under
	// capacity take tokens beyond the top-k without any more communication. Needs the batch's
	// Probs. A token may end with more than k experts, as the paper keeps them. Offers only
	// fill capacity the top-k choices leave: expansion drops no choice token drop keeps.
	Expand bool
	// DeviceLevel bounds the sum over each device's experts, n_l * capacity, instead of each
	// expert: one hot expert may use the spare capacity of its device's cold ones.
	DeviceLevel bool
}

func (c CapacityDrop) Name() string {
	n := "token-drop"
	if c.Expand {
		n = "expanded-drop"
	}
	if c.DeviceLevel {
		n += "/device"
	}
	return n
}

// candidate is one (token, expert) pair offered to an expert under capacity.
type candidate struct {
	token, expert, choice int // choice -1: a local expert outside the top-k
	score                 float32
	to                    int
}

func (c CapacityDrop) Plan(b Batch, p Placement) (Schedule, error) {
	if err := c.check(b, p); err != nil {
		return Schedule{}, err
	}
	s := newSchedule(b, p)
	rng := rand.New(rand.NewPCG(c.Seed, 0xd209))
	offerRng := rand.New(rand.NewPCG(c.Seed, 0xe4a7))
	// Each device enforces capacity on its own tokens: no communication decides a drop.
	shards := make([][]int, p.Devices)
	for t := range b.Tokens() {
		h := b.HomeOf(t, p.Devices)
		shards[h] = append(shards[h], t)
	}
	local := make([][]int, p.Devices)
	for d := range local {
		local[d] = p.Local(d)
	}
	load := make([]float64, p.Devices)
	for from, tokens := range shards {
		if len(tokens) == 0 {
			continue
		}
		capacity, err := Capacity(len(tokens), b.K, b.Experts, c.Gamma)
		if err != nil {
			return Schedule{}, err
		}
		groups, order := c.candidates(b, p, from, tokens, local[from], load)
		for _, g := range order {
			limit := capacity
			if c.DeviceLevel {
				limit = capacity * len(local[g])
			}
			c.admit(&s, groups[g], limit, from, rng, offerRng)
		}
	}
	return s, nil
}

// check reports options or a batch the plan cannot use.
func (c CapacityDrop) check(b Batch, p Placement) error {
	if err := checkPlan(b, p); err != nil {
		return err
	}
	if !(c.Gamma >= 0) || math.IsInf(c.Gamma, 0) {
		return fmt.Errorf("%s: capacity factor %v: want 0 or more", c.Name(), c.Gamma)
	}
	if !c.Metric.Valid() {
		return fmt.Errorf("%s: unknown metric %v", c.Name(), c.Metric)
	}
	if c.Expand && b.Probs == nil {
		return fmt.Errorf("%s: the batch has no gating scores beyond the top-k", c.Name())
	}
	return nil
}

// candidates groups device from's tokens' top-k choices, and under Expand their offers to
// the device's own experts local, by what capacity limits: an expert, or under DeviceLevel
// a device. order lists the groups ascending, so that the plan does not depend on the map's.
// load counts the choices sent to each device so far, to spread those of a replicated expert.
func (c CapacityDrop) candidates(b Batch, p Placement, from int, tokens, local []int, load []float64) (groups map[int][]candidate, order []int) {
	groups = map[int][]candidate{}
	add := func(cd candidate) {
		g := cd.expert
		if c.DeviceLevel {
			g = cd.to
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], cd)
	}
	for _, t := range tokens {
		choice := b.Choice[t*b.K : (t+1)*b.K]
		for i, e := range choice {
			to := nearest(p, e, from, load)
			load[to]++ // spreads the choices of a replicated expert over its copies
			add(candidate{token: t, expert: e, choice: i, score: b.Score[t*b.K+i], to: to})
		}
		if c.Expand {
			for _, e := range local {
				if !slices.Contains(choice, e) {
					add(candidate{token: t, expert: e, choice: -1, score: b.Probs[t*b.Experts+e], to: from})
				}
			}
		}
	}
	slices.Sort(order)
	return groups, order
}

// admit assigns the first limit of one group's candidates, in the metric's order, and
// counts the top-k choices beyond it as dropped.
func (c CapacityDrop) admit(s *Schedule, cds []candidate, limit, from int, rng, offerRng *rand.Rand) {
	// Top-k choices before expansion offers: an expert the top-k overflows keeps the
	// tokens token drop keeps, and the offers only fill spare capacity. The paper says
	// so in words ("no change in the token assignments in experts that are overflowed
	// by the top-k experts"); its Algorithm 2 ranks both together by score, which can
	// let an offer displace another token's top-k choice. The offers shuffle with
	// their own generator, so that ByRandom too keeps token drop's choices.
	slices.SortStableFunc(cds, func(a, b candidate) int { return cmp.Compare(offer(a), offer(b)) })
	n := 0
	for n < len(cds) && cds[n].choice >= 0 {
		n++
	}
	c.order(cds[:n], rng)
	c.order(cds[n:], offerRng)
	for i, cd := range cds {
		if i >= limit {
			if cd.choice >= 0 {
				s.Dropped++
			}
			continue
		}
		if cd.choice < 0 {
			s.Rerouted++
		}
		s.Assign = append(s.Assign, Assignment{Token: cd.token, Expert: cd.expert, From: from, To: cd.to, Choice: cd.choice, Score: cd.score})
	}
}

// order sorts the candidates of one group by the drop metric, those kept first.
func (c CapacityDrop) order(cds []candidate, rng *rand.Rand) {
	switch c.Metric {
	case ByScore:
		// Highest score first; ties keep batch order, so the plan is deterministic.
		slices.SortStableFunc(cds, func(a, b candidate) int { return cmp.Compare(b.score, a.score) })
	case ByReverseOrder:
		slices.Reverse(cds)
	case ByRandom:
		rng.Shuffle(len(cds), func(i, j int) { cds[i], cds[j] = cds[j], cds[i] })
	}
}

// offer orders a candidate: 0 for a top-k choice, 1 for an expansion offer.
func offer(c candidate) int {
	if c.choice < 0 {
		return 1
	}
	return 0
}

// EPLB places replicas of the experts from the load of a window of recent batches (seeds/002,
// DeepSeek's expert-parallel load balancer): every Every batches of a layer it re-plans Slots
// physical expert slots over the devices from the last Window batches' loads, and sends each
// token to the least loaded replica. It drops nothing.
type EPLB struct {
	Slots  int // physical expert slots over all devices, at least one per expert
	Window int // batches of load history; 0: 16
	Every  int // re-plan period in batches; 0: Window
	hist   map[int]*loadWindow
}

type loadWindow struct {
	loads [][]float64 // ring of per-expert loads
	next  int
	since int // batches since the last re-plan
}

// NewEPLB is an EPLB policy with empty load windows.
func NewEPLB(slots, window, every int) (*EPLB, error) {
	if window < 0 || every < 0 || slots < 1 {
		return nil, fmt.Errorf("EPLB: %d slots, window %d, every %d: want positive values", slots, window, every)
	}
	if window == 0 {
		window = 16
	}
	if every == 0 {
		every = window
	}
	return &EPLB{Slots: slots, Window: window, Every: every, hist: map[int]*loadWindow{}}, nil
}

func (*EPLB) Name() string { return "eplb" }

// Plan routes to the least loaded replica and records the layer's expert load.
func (x *EPLB) Plan(b Batch, p Placement) (Schedule, error) {
	s, err := Static{}.Plan(b, p)
	if err != nil {
		return s, err
	}
	w := x.hist[b.Layer]
	if w == nil {
		w = &loadWindow{}
		x.hist[b.Layer] = w
	}
	l := make([]float64, b.Experts)
	for _, e := range b.Choice {
		l[e]++
	}
	if len(w.loads) < x.Window {
		w.loads = append(w.loads, l)
	} else {
		w.loads[w.next] = l
	}
	w.next = (w.next + 1) % x.Window
	w.since++
	return s, nil
}

// Replace re-plans the layer's placement from its load window once Every batches have passed.
func (x *EPLB) Replace(layer int, current Placement) (Placement, bool) {
	w := x.hist[layer]
	if w == nil || w.since < x.Every || len(w.loads) == 0 {
		return current, false
	}
	w.since = 0
	sum := make([]float64, len(w.loads[0]))
	for _, l := range w.loads {
		for e, v := range l {
			sum[e] += v
		}
	}
	plan, err := PlanEPLB(sum, max(x.Slots, len(sum), current.Devices), current.Devices)
	if err != nil {
		return current, false
	}
	return plan.Placement(len(sum), current.Devices), true
}

// Placement is the plan as a Placement: two replicas of an expert packed onto one device
// become one copy there.
func (p EPLBPlan) Placement(experts, devices int) Placement {
	pl := Placement{Devices: devices, Holders: make([][]int, experts)}
	for s, e := range p.SlotExpert {
		if d := p.SlotDevice[s]; !slices.Contains(pl.Holders[e], d) {
			pl.Holders[e] = append(pl.Holders[e], d)
		}
	}
	return pl
}

func checkPlan(b Batch, p Placement) error {
	if err := p.Check(b.Experts); err != nil {
		return err
	}
	return b.Check(p.Devices)
}
