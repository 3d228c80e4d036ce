package multigpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// MACS's hyperparameters as the paper runs them (seeds/001, appendix A.1): the entropy-to-weight
// sensitivity delta and the modality adaptation strength rho. The paper gives no value for
// eta, the weight of semantic affinity in rerouting, nor for the capacity floor.
const (
	MACSDelta = 1.5
	MACSRho   = 0.6
	// MACSClassThreshold is appendix A.2's margin on the difference of an expert's visual and
	// text activation frequencies that makes it modality-specific.
	MACSClassThreshold = 0.1
)

// macsEps is eq. 4's epsilon: it keeps a batch whose visual tokens all have one entropy (sigma
// 0) at z = 0, weight 1/2, instead of dividing by zero.
const macsEps = 1e-6

// ExpertClass is an expert's modality bias, m_j of MACS's eq. 8: a visual expert gains capacity
// when a batch is mostly visual and loses it when mostly text, a text expert the reverse, and a
// shared expert keeps the base capacity.
type ExpertClass int8

const (
	TextExpert ExpertClass = -1
	Shared     ExpertClass = 0
	Visual     ExpertClass = +1
)

func (c ExpertClass) String() string {
	switch c {
	case TextExpert:
		return "text"
	case Shared:
		return "shared"
	case Visual:
		return "visual"
	}
	return fmt.Sprintf("ExpertClass(%d)", int(c))
}

// ActivationCounts is a calibration batch's statistics for ClassifyExperts: counts[j][m] is how
// many tokens of modality m have expert j in their top-k, tokens[m] how many tokens of modality
// m the batch has. Counts of several batches add up.
func ActivationCounts(b Batch) (counts [][3]float64, tokens [3]float64, err error) {
	// The home devices play no part here: any device count will do.
	if err := b.Check(math.MaxInt32); err != nil {
		return nil, tokens, fmt.Errorf("MACS calibration: %w", err)
	}
	counts = make([][3]float64, b.Experts)
	for t := range b.Tokens() {
		m := b.ModalityOf(t)
		tokens[m]++
		for _, e := range b.Choice[t*b.K : (t+1)*b.K] {
			counts[e][m]++
		}
	}
	return counts, tokens, nil
}

// ClassifyExperts sorts experts into visual, text and shared from a calibration run (seeds/001
// appendix A.2, eqs. 12-13): f_j^m = counts[j][m] / tokens[m] is the share of modality m's
// tokens that activate expert j (image and video pooled as visual), Delta_j = f_j^vis -
// f_j^txt, and an expert is visual when Delta_j >= threshold, text when Delta_j <= -threshold,
// shared otherwise. The paper's threshold is 0.1 (MACSClassThreshold) on its frequencies; with
// per-token frequencies, which average k/experts (1/16 for top-8 of 128), a threshold scaled to
// that mean may suit better: the caller chooses.
func ClassifyExperts(counts [][3]float64, tokens [3]float64, threshold float64) ([]ExpertClass, error) {
	if len(counts) == 0 {
		return nil, fmt.Errorf("MACS calibration: no experts")
	}
	if !(threshold > 0) || math.IsInf(threshold, 0) {
		return nil, fmt.Errorf("MACS calibration: threshold %v: want a finite value > 0", threshold)
	}
	for m, n := range tokens {
		if !(n >= 0) || math.IsInf(n, 0) {
			return nil, fmt.Errorf("MACS calibration: %v %v tokens", Modality(m), n)
		}
	}
	txt, vis := tokens[Text], tokens[Image]+tokens[Video]
	if txt == 0 || vis == 0 {
		// Without both modalities a frequency difference means nothing.
		return nil, fmt.Errorf("MACS calibration: %v text and %v visual tokens: want both", txt, vis)
	}
	classes := make([]ExpertClass, len(counts))
	for j, c := range counts {
		for m, n := range c {
			if !(n >= 0) || math.IsInf(n, 0) {
				return nil, fmt.Errorf("MACS calibration: expert %d: %v activations by %v tokens", j, n, Modality(m))
			}
		}
		d := (c[Image]+c[Video])/vis - c[Text]/txt
		switch {
		case d >= threshold:
			classes[j] = Visual
		case d <= -threshold:
			classes[j] = TextExpert
		}
	}
	return classes, nil
}

// ExpertCentroids is every expert's semantic centroid mu_k (seeds/001 appendix A.3, eq. 14):
// the mean hidden state of the tokens that have the expert in their top-k, experts*Dim values;
// an expert no token chose gets the zero vector, which rerouting scores as dissimilar (cosine 0)
// to everything.
func ExpertCentroids(b Batch) ([]float32, error) {
	if err := b.Check(math.MaxInt32); err != nil {
		return nil, fmt.Errorf("MACS centroids: %w", err)
	}
	if b.Features == nil {
		return nil, fmt.Errorf("MACS centroids: the batch has no hidden states")
	}
	D := b.Dim
	sum := make([]float64, b.Experts*D)
	n := make([]int, b.Experts)
	for i, e := range b.Choice {
		z := b.Features[i/b.K*D : (i/b.K+1)*D]
		for d, v := range z {
			sum[e*D+d] += float64(v)
		}
		n[e]++
	}
	mu := make([]float32, len(sum))
	for i, v := range sum {
		if n[i/D] > 0 {
			mu[i] = float32(v / float64(n[i/D]))
		}
	}
	return mu, nil
}

// SemanticWeights is every token's semantic weight w(x) (seeds/001 eqs. 4-5): a visual token's
// entropy is z-score normalised over the batch's visual tokens (image and video together, the
// population standard deviation, eps 1e-6) and mapped to sigmoid(-delta * z), so that a
// high-entropy background patch weighs little and a low-entropy, informative one nearly 1; a
// text token weighs 1, its semantic density being high. A batch without entropies weighs every
// token 1, which reduces MACS to counting tokens. b must pass Check.
func SemanticWeights(b Batch, delta float64) []float64 {
	T := b.Tokens()
	w := make([]float64, T)
	var sum float64
	n := 0
	for t := range w {
		w[t] = 1
		if b.Entropy != nil && b.ModalityOf(t).Visual() {
			sum += float64(b.Entropy[t])
			n++
		}
	}
	if n == 0 {
		return w
	}
	mu := sum / float64(n)
	var v float64
	for t := range w {
		if b.ModalityOf(t).Visual() {
			d := float64(b.Entropy[t]) - mu
			v += d * d // a second pass: E[h^2] - mu^2 cancels badly for close entropies
		}
	}
	sigma := math.Sqrt(v / float64(n))
	for t := range w {
		if b.ModalityOf(t).Visual() {
			z := (float64(b.Entropy[t]) - mu) / (sigma + macsEps)
			w[t] = 1 / (1 + math.Exp(delta*z))
		}
	}
	return w
}

// EffectiveLoads is each expert's effective load (seeds/001 eq. 6): the sum of the semantic
// weights w of the tokens that have it in their top-k.
func EffectiveLoads(b Batch, w []float64) []float64 {
	l := make([]float64, b.Experts)
	for i, e := range b.Choice {
		l[e] += w[i/b.K]
	}
	return l
}

// VisualRatio is the batch's effective visual ratio R_v (seeds/001 eq. 7): the visual tokens'
// share of the total semantic weight; 0 for an empty batch.
func VisualRatio(b Batch, w []float64) float64 {
	var vis, all float64
	for t, x := range w {
		all += x
		if b.ModalityOf(t).Visual() {
			vis += x
		}
	}
	if all == 0 {
		return 0
	}
	return vis / all
}

// MACS is modality-aware capacity scaling (seeds/001): capacity-aware token drop for
// multimodal batches, where counting tokens misjudges an expert's load, because hundreds of
// image patches carry less than a few words. It weighs each visual token by its entropy
// (eqs. 4-6), so that background patches take little of an expert's capacity; scales each
// expert's capacity by the batch's effective visual ratio and the expert's modality bias (eqs.
// 7-9), so that visual experts grow in image-heavy batches at text experts' expense and the
// reverse; and handles the overflow of an expert over its capacity by rerouting it to a spare
// expert on the same device, which costs no further communication, or dropping it (eqs. 10-11).
//
// The plan, in order, so that it is deterministic:
//
//  1. Weights w, effective loads, R_v and capacities C_j = max(C_base * (1 + Rho * m_j * (R_v -
//     0.5)), MinCapacity), C_base = Capacity(tokens, k, experts, Gamma), are computed over the
//     whole batch.
//  2. Every expert, in index order, ranks the tokens that chose it by retention score r(x) =
//     w(x) * max_j G(x)_j (eq. 11; ties: higher w, the more informative token, then text
//     before visual, then batch order)
//     and keeps the longest prefix of that ranking whose summed weight is at most C_j: the
//     lowest-retention tokens leave first, and a token that does not fit is not skipped for a
//     lighter one behind it, so no token is ever dropped before one it outranks.
//  3. The choices that left, all experts together, ranked as in 2 (then by expert choice
//     index), each look for a reroute in turn: on the device that computes the expert they left
//     (the copy on their home device if it holds one, else the first holder), the experts not
//     in the token's top-k nor already taken by it, whose effective load is below capacity and
//     stays within it with the token's weight added; the one with the highest score of eq. 10,
//     (1 - Eta) * G(x)_k + Eta * cos(z_x, mu_k) (the batch's Affinity, or from Centroids and
//     Features), or G(x)_k alone without them, takes it (ties: the lower expert), on that same device. A choice without one is
//     dropped (the fail-safe).
//
// Ranking the rerouting by retention gives the tokens most worth keeping the first pick of
// the spare capacity. A choice that left counts in Dropped whether or not it found a reroute
// (its top-k choice is not computed); a reroute is an assignment outside the top-k (Choice -1,
// the token's gating score for its new expert) and counts in Rerouted.
//
// The invariant: every expert's final effective load, the summed weight w of all tokens it
// computes over all its copies, its own top-k tokens and those rerouted to it alike, is at
// most C_j. With Expand, idle local experts also take tokens beyond their top-k (A.5).
type MACS struct {
	// Gamma is the base capacity factor gamma_0.
	Gamma float64
	// Delta is the entropy-to-weight sensitivity (MACSDelta), Rho the modality adaptation
	// strength (MACSRho), Eta in [0, 1] the weight of semantic affinity against the gating score
	// in rerouting.
	Delta, Rho, Eta float64
	// Classes is every expert's modality bias from calibration (ClassifyExperts); nil: all
	// shared, which leaves every capacity at the base.
	Classes []ExpertClass
	// Centroids, when set, is every expert's semantic centroid mu_k (experts*Dim,
	// ExpertCentroids), for the semantic affinity of rerouting with the batch's Features; a
	// batch's Affinity, computed where its hidden states live, takes their place. Without
	// either, rerouting scores by the gating score alone.
	Centroids []float32
	// MinCapacity is the floor on every expert's capacity (the paper's clamp against degenerate
	// capacities; it gives no value).
	MinCapacity float64
	// Reroute enables local semantic rerouting; without it, or without the batch's Probs, every
	// overflowing choice is dropped (the paper's "w/o Expanded").
	Reroute bool
	// Expand is the local expansion of appendix A.5: once top-k choices and reroutes are
	// placed, experts of each token's own device with capacity left also take tokens that did
	// not choose them, best rerouting score first, so that idle experts are used without
	// moving a token off its device. It needs the batch's Probs.
	Expand bool
}

// DefaultMACS is MACS with the paper's delta and rho at base capacity factor gamma, rerouting by
// gating score (eta 0: the paper gives no eta), each capacity at least one token.
func DefaultMACS(gamma float64) MACS {
	return MACS{Gamma: gamma, Delta: MACSDelta, Rho: MACSRho, MinCapacity: 1, Reroute: true}
}

func (MACS) Name() string { return "macs" }

func (m MACS) check(b Batch, p Placement) error {
	if err := p.Check(b.Experts); err != nil {
		return fmt.Errorf("MACS: %w", err)
	}
	if err := b.Check(p.Devices); err != nil {
		return fmt.Errorf("MACS: %w", err)
	}
	for _, c := range []struct {
		name    string
		v, l, h float64
	}{
		{"capacity factor", m.Gamma, 0, math.Inf(1)},
		{"delta", m.Delta, 0, math.Inf(1)},
		{"rho", m.Rho, 0, math.Inf(1)},
		{"eta", m.Eta, 0, 1},
		{"minimum capacity", m.MinCapacity, 0, math.Inf(1)},
	} {
		if !(c.v >= c.l && c.v <= c.h) || math.IsInf(c.v, 0) {
			return fmt.Errorf("MACS: %s %v: want a finite value from %v to %v", c.name, c.v, c.l, c.h)
		}
	}
	if m.Classes != nil && len(m.Classes) != b.Experts {
		return fmt.Errorf("MACS: %d expert classes for %d experts", len(m.Classes), b.Experts)
	}
	for j, c := range m.Classes {
		if c < TextExpert || c > Visual {
			return fmt.Errorf("MACS: expert %d has class %v", j, c)
		}
	}
	for t := range b.Tokens() {
		choice := b.Choice[t*b.K : (t+1)*b.K]
		for i, e := range choice {
			if slices.Contains(choice[:i], e) {
				return fmt.Errorf("MACS: token %d chooses expert %d twice", t, e)
			}
		}
	}
	if m.Centroids != nil {
		if len(m.Centroids)%b.Experts != 0 || len(m.Centroids) == 0 ||
			(b.Features != nil && len(m.Centroids) != b.Experts*b.Dim) {
			return fmt.Errorf("MACS: %d centroid values for %d experts of dimension %d", len(m.Centroids), b.Experts, b.Dim)
		}
		for i, v := range m.Centroids {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("MACS: centroid of expert %d is not finite", i/(len(m.Centroids)/b.Experts))
			}
		}
		if b.Features != nil {
			for i, v := range b.Features {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					return fmt.Errorf("MACS: hidden state of token %d is not finite", i/b.Dim)
				}
			}
		}
	}
	return nil
}

// Capacities is every expert's capacity C_j (seeds/001 eqs. 3, 8-9) for b at effective visual
// ratio rv: the base capacity of eq. 3 scaled by 1 + Rho * m_j * (rv - 0.5), at least
// MinCapacity. Fractional, since effective loads are.
func (m MACS) Capacities(b Batch, rv float64) ([]float64, error) {
	if !(rv >= 0 && rv <= 1) {
		return nil, fmt.Errorf("MACS: visual ratio %v: want 0 to 1", rv)
	}
	base, err := Capacity(b.Tokens(), b.K, b.Experts, m.Gamma)
	if err != nil {
		return nil, fmt.Errorf("MACS: %w", err)
	}
	c := make([]float64, b.Experts)
	for j := range c {
		mj := 0.0
		if m.Classes != nil {
			mj = float64(m.Classes[j])
		}
		c[j] = max(float64(base)*(1+m.Rho*mj*(rv-0.5)), m.MinCapacity)
	}
	return c, nil
}

// macsHolder is the device that computes expert e for a token living on device home: home
// when it holds a copy, else the first holder.
func macsHolder(p Placement, e, home int) int {
	if p.Holds(home, e) {
		return home
	}
	return p.Holders[e][0]
}

// Plan plans b on p as MACS says: the kept top-k choices in batch order, then the reroutes in
// the order they were made.
func (m MACS) Plan(b Batch, p Placement) (Schedule, error) {
	if err := m.check(b, p); err != nil {
		return Schedule{}, err
	}
	w := SemanticWeights(b, m.Delta)
	capacity, err := m.Capacities(b, VisualRatio(b, w))
	if err != nil {
		return Schedule{}, err
	}
	pl := &macsPlan{m: m, b: b, p: p, w: w, capacity: capacity, load: make([]float64, b.Experts)}
	pl.retention()
	left := pl.keep()
	if b.Probs == nil || !(m.Reroute && len(left) > 0 || m.Expand) {
		return pl.s, nil
	}
	pl.scores()
	if m.Reroute {
		pl.reroute(left)
	}
	if m.Expand {
		pl.expand()
	}
	return pl.s, nil
}

// macsPlan is one batch's plan under way: its steps share the effective weights, the
// experts' capacities and loads, and the schedule they fill.
type macsPlan struct {
	m        MACS
	b        Batch
	p        Placement
	w        []float64 // each token's effective weight
	capacity []float64 // each expert's
	load     []float64 // effective load of what each expert computes so far
	r        []float64 // each token's retention score (eq. 11)
	s        Schedule

	local [][]int         // each device's experts
	aff   []float32       // token-expert affinities, or nil
	taken map[[2]int]bool // (token, expert) rerouted or expanded
}

// retention computes eq. 11's retention score. The largest gating score of all experts is
// the largest of the top-k, on Routing.Score's scale, so it needs no Probs.
func (pl *macsPlan) retention() {
	b, K := pl.b, pl.b.K
	pl.r = make([]float64, b.Tokens())
	for t := range pl.r {
		top := b.Score[t*K]
		for _, v := range b.Score[t*K : (t+1)*K] {
			top = max(top, v)
		}
		pl.r[t] = pl.w[t] * float64(top)
	}
}

// rank orders top-k slots (t*K+i) by retention, most worth keeping first.
func (pl *macsPlan) rank(x, y int) int {
	K, r, w := pl.b.K, pl.r, pl.w
	tx, ty := x/K, y/K
	if c := cmp.Compare(r[ty], r[tx]); c != 0 {
		return c
	}
	if c := cmp.Compare(w[ty], w[tx]); c != 0 {
		return c
	}
	vx, vy := pl.b.ModalityOf(tx).Visual(), pl.b.ModalityOf(ty).Visual()
	if vx != vy {
		if vy {
			return -1
		}
		return 1
	}
	return cmp.Compare(x, y)
}

// keep is step 2: each expert keeps the best-ranked prefix of its slots within its capacity,
// and the schedule gets those in batch order. It returns the slots left over.
func (pl *macsPlan) keep() (left []int) {
	b, p, K := pl.b, pl.p, pl.b.K
	byExpert := make([][]int, b.Experts)
	for i, e := range b.Choice {
		byExpert[e] = append(byExpert[e], i)
	}
	kept := make([]bool, len(b.Choice))
	for e, slots := range byExpert {
		slices.SortFunc(slots, pl.rank)
		for n, i := range slots {
			if pl.load[e]+pl.w[i/K] > pl.capacity[e] {
				left = append(left, slots[n:]...)
				break
			}
			pl.load[e] += pl.w[i/K]
			kept[i] = true
		}
	}
	pl.s = newSchedule(b, p)
	for i, e := range b.Choice {
		if !kept[i] {
			pl.s.Dropped++
			continue
		}
		t := i / K
		home := b.HomeOf(t, p.Devices)
		pl.s.Assign = append(pl.s.Assign, Assignment{Token: t, Expert: e, From: home, To: macsHolder(p, e, home), Choice: i % K, Score: b.Score[i]})
	}
	return left
}

// scores readies what rerouting and expansion score by: each device's experts and, where
// MACS has centroids, the tokens' affinities to them.
func (pl *macsPlan) scores() {
	m, b, E := pl.m, pl.b, pl.b.Experts
	pl.local = make([][]int, pl.p.Devices)
	for d := range pl.local {
		pl.local[d] = pl.p.Local(d)
	}
	pl.aff = b.Affinity
	if pl.aff == nil && m.Centroids != nil && b.Features != nil && m.Eta > 0 {
		pl.aff = make([]float32, b.Tokens()*E)
		norms := CentroidNorms(m.Centroids, b.Dim)
		for t := range b.Tokens() {
			Affinities(b.Features[t*b.Dim:(t+1)*b.Dim], m.Centroids, norms, pl.aff[t*E:(t+1)*E])
		}
	}
	if pl.m.Eta <= 0 {
		pl.aff = nil
	}
	pl.taken = map[[2]int]bool{}
}

// score is eq. 10's S(x, E_k).
func (pl *macsPlan) score(t, k int) float64 {
	E := pl.b.Experts
	v := float64(pl.b.Probs[t*E+k])
	if pl.aff != nil {
		v = (1-pl.m.Eta)*v + pl.m.Eta*float64(pl.aff[t*E+k])
	}
	return v
}

// fits says whether expert k has room for token t.
func (pl *macsPlan) fits(t, k int) bool {
	return pl.load[k] < pl.capacity[k] && pl.load[k]+pl.w[t] <= pl.capacity[k]
}

// add sends token t to expert k on device d beyond its top-k.
func (pl *macsPlan) add(t, k, d int) {
	b := pl.b
	pl.taken[[2]int{t, k}] = true
	pl.load[k] += pl.w[t]
	pl.s.Rerouted++
	pl.s.Assign = append(pl.s.Assign, Assignment{Token: t, Expert: k, From: b.HomeOf(t, pl.p.Devices), To: d, Choice: -1, Score: b.Probs[t*b.Experts+k]})
}

// reroute is step 3: local semantic rerouting of the slots left, best-ranked first, each to
// the best-scored expert on the device that would have computed it which it did not choose
// and which has room.
func (pl *macsPlan) reroute(left []int) {
	b, K := pl.b, pl.b.K
	slices.SortFunc(left, pl.rank)
	for _, i := range left {
		t := i / K
		d := macsHolder(pl.p, b.Choice[i], b.HomeOf(t, pl.p.Devices))
		choice := b.Choice[t*K : (t+1)*K]
		best, bestScore := -1, 0.0
		for _, k := range pl.local[d] {
			if slices.Contains(choice, k) || pl.taken[[2]int{t, k}] || !pl.fits(t, k) {
				continue
			}
			if v := pl.score(t, k); best < 0 || v > bestScore {
				best, bestScore = k, v
			}
		}
		if best >= 0 {
			pl.add(t, best, d)
		} // else the fail-safe drop: no local expert has room
	}
}

// expand is local expansion: every (token, expert of its own device) it neither chose nor was
// rerouted to, best score first, while the expert has room.
func (pl *macsPlan) expand() {
	b, K := pl.b, pl.b.K
	type offer struct {
		t, k int
		v    float64
	}
	var offers []offer
	for t := range b.Tokens() {
		choice := b.Choice[t*K : (t+1)*K]
		for _, k := range pl.local[b.HomeOf(t, pl.p.Devices)] {
			if !slices.Contains(choice, k) && !pl.taken[[2]int{t, k}] {
				offers = append(offers, offer{t, k, pl.score(t, k)})
			}
		}
	}
	slices.SortStableFunc(offers, func(x, y offer) int { return cmp.Compare(y.v, x.v) })
	for _, o := range offers {
		if pl.fits(o.t, o.k) {
			pl.add(o.t, o.k, b.HomeOf(o.t, pl.p.Devices))
		}
	}
}

// macsNorm is v's Euclidean norm.
func macsNorm(v []float32) float64 {
	var s float64
	for _, x := range v {
		s += float64(x) * float64(x)
	}
	return math.Sqrt(s)
}

// CentroidNorms are the Euclidean norms of every expert's centroid (centroids holds experts
// rows of dim values), which Affinities divides by: computed once, not per token.
func CentroidNorms(centroids []float32, dim int) []float64 {
	n := make([]float64, len(centroids)/dim)
	for k := range n {
		n[k] = macsNorm(centroids[k*dim : (k+1)*dim])
	}
	return n
}

// Affinities writes the cosine similarity of hidden state z with every expert's centroid
// (ExpertCentroids, len(out) experts of len(z) values, their norms from CentroidNorms) into
// out: eq. 10's sim(z_x, mu_k), 0 for a zero vector. Where the hidden state lives, it turns
// the state into Batch.Affinity.
func Affinities(z, centroids []float32, norms []float64, out []float32) {
	D := len(z)
	nz := macsNorm(z)
	for k := range out {
		out[k] = float32(macsCosine(z, centroids[k*D:(k+1)*D], nz, norms[k]))
	}
}

// macsCosine is the cosine similarity of a and b of norms na and nb; 0 when either is the zero
// vector, which has no direction.
func macsCosine(a, b []float32, na, nb float64) float64 {
	if na == 0 || nb == 0 {
		return 0
	}
	var dot float64
	for i, x := range a {
		dot += float64(x) * float64(b[i])
	}
	return dot / (na * nb)
}

// KLFromUniform is KL(softmax(logits) || uniform) = ln(n) - H(softmax(logits)), in float64;
// p is scratch of len(logits). Of a hidden state, ln(n) less it is MACS's information measure,
// the entropy of softmax(state); of router logits, how sure the router is.
func KLFromUniform(logits []float32, p []float64) float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	var z float64
	for i, v := range logits {
		p[i] = math.Exp(float64(v) - mx)
		z += p[i]
	}
	h := 0.0
	for i := range p {
		if q := p[i] / z; q > 0 {
			h -= q * math.Log(q)
		}
	}
	return math.Log(float64(len(logits))) - h
}
