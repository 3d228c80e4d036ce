package multigpu

import (
	"fmt"
	"math"
	"slices"
)

// HarMoEny rebalances a layer's tokens from overloaded devices to the least loaded one, which
// fetches any expert it lacks from the host's pinned copy into the slot of an expert it has
// finished (seeds/004 §4). Nothing is dropped and every token keeps its top-k: only where an
// expert is computed changes, so quality is untouched and the straggler shrinks.
type HarMoEny struct {
	// Threshold is the token threshold q: no move of fewer tokens, and no move to a device
	// without room for q more below the average, so that a fetched expert computes long
	// enough to hide the next fetch behind it. 0: HarMoEnyThreshold(Cluster, Cost).
	Threshold int
	Cluster   Cluster
	Cost      ExpertCost
}

// Name is the policy's name in reports.
func (HarMoEny) Name() string { return "harmoeny" }

// threshold is q as set, or by eq. 4 from the hardware when unset.
func (h HarMoEny) threshold() (int, error) {
	switch {
	case h.Threshold < 0:
		return 0, fmt.Errorf("HarMoEny: threshold %d tokens: want 0 (eq. 4) or more", h.Threshold)
	case h.Threshold > 0:
		return h.Threshold, nil
	}
	q, err := HarMoEnyThreshold(h.Cluster, h.Cost)
	if err != nil {
		return 0, fmt.Errorf("HarMoEny: no threshold set and none derived: %w", err)
	}
	return q, nil
}

// HarMoEnyThreshold is the token threshold of eq. 4 (seeds/004 §4.4): the fewest tokens
// whose pass through an expert of m×p and p×m weights (about 4mpq FLOPs at phi = c.FLOPS)
// outlasts copying that expert's 2mp·d_type bytes from the host at beta = c.HostBW, so the
// asynchronous fetch of the next expert hides behind the current one. It is the smallest
// integer q > phi·d_type / (2·beta); the expert's shape cancels out.
func HarMoEnyThreshold(c Cluster, x ExpertCost) (int, error) {
	for _, v := range []struct {
		name string
		v    float64
	}{{"device FLOPS", c.FLOPS}, {"host bandwidth", c.HostBW}, {"bytes per weight element", x.ElementBytes}} {
		if !(v.v > 0) || math.IsInf(v.v, 0) {
			return 0, fmt.Errorf("HarMoEny threshold: %s %v: want a finite value > 0", v.name, v.v)
		}
	}
	r := c.FLOPS * x.ElementBytes / (2 * c.HostBW)
	if !(r < 1<<53) { // beyond this a float64 has no fraction left, and an int may overflow
		return 0, fmt.Errorf("HarMoEny threshold: %v tokens: too many to plan with", r)
	}
	return int(math.Floor(r)) + 1, nil
}

// Plan runs HarMoEny's steps 2 and 3 (Algorithm 1): every device's counts of its tokens per
// expert give the static schedule S[from][expert][to], every choice sent to a holder of its
// expert (the token's own device when it holds one, else the least loaded holder so far), and
// Algorithm 2 rebalances S. A device left computing an expert it does not hold fetches it
// once from the host. Of each (home, expert) group the choices that stay on their static
// device are the first in batch order; the last ones move.
func (h HarMoEny) Plan(b Batch, p Placement) (Schedule, error) {
	if err := b.Check(p.Devices); err != nil {
		return Schedule{}, err
	}
	if err := p.Check(b.Experts); err != nil {
		return Schedule{}, err
	}
	q, err := h.threshold()
	if err != nil {
		return Schedule{}, err
	}
	D, E, K := p.Devices, b.Experts, b.K
	s := newSchedule(b, p)

	// The metadata exchange: the counts are all a device learns of the others' tokens.
	to := make([]int, len(b.Choice))
	load := make([]float64, D)
	S := harMatrix(D, E)
	for i, e := range b.Choice {
		f := b.HomeOf(i/K, D)
		d := nearest(p, e, f, load)
		to[i] = d
		load[d]++
		S[f][e][d]++
	}
	rebalance(S, q)

	// S says how many of a group go where, not which: keep each choice where it was while
	// its device has room for the group, then fill the devices that gained, lowest first.
	room := harMatrix(D, E)
	for f := range S {
		for e := range S[f] {
			copy(room[f][e], S[f][e])
		}
	}
	var moved []int
	for i, e := range b.Choice {
		f := b.HomeOf(i/K, D)
		if room[f][e][to[i]] > 0 {
			room[f][e][to[i]]--
			continue
		}
		moved = append(moved, i)
	}
	for _, i := range moved {
		e, f := b.Choice[i], b.HomeOf(i/K, D)
		d := 0
		for room[f][e][d] == 0 {
			d++
		}
		to[i] = d
		room[f][e][d]--
	}

	s.Assign = make([]Assignment, len(b.Choice))
	for i, e := range b.Choice {
		s.Assign[i] = Assignment{Token: i / K, Expert: e, From: b.HomeOf(i/K, D), To: to[i], Choice: i % K, Score: b.Score[i]}
	}
	// HarMoEny keeps every expert in pinned host memory and fetches from there, which leaves
	// the device links to the all-to-all.
	for d := range D {
		for e := range E {
			if p.Holds(d, e) {
				continue
			}
			for f := range D {
				if S[f][e][d] > 0 {
					s.Fetches = append(s.Fetches, Fetch{Expert: e, From: Host, To: d})
					break
				}
			}
		}
	}
	return s, nil
}

// harMove is one step of Algorithm 2: n of source device from's tokens for expert, taken
// from device src (the most loaded) and given to device dst (the least loaded).
type harMove struct {
	from, expert, src, dst, n int
}

// rebalance is Algorithm 2 (seeds/004 §4.2) on S[from][expert][to], in place, returning its
// steps. While a device computes more than t_avg = floor(total / devices): take the most
// loaded device g_max, the source g_from sending it the most tokens over all experts, and the
// expert e_max of g_from's that sends it the most; t_move = S[g_from][e_max][g_max]. Stop if
// t_move < q, or if the least loaded device g_min is g_max or lacks room for q tokens below
// t_avg; else move min(t_move, t_avg - load[g_min]) of them to g_min. Ties go to the lower
// index, as torch's argmax and argmin do. Receivers never pass t_avg, so tokens move at most
// once and the straggler never grows. q below 1 counts as 1: a move of nothing would never end.
func rebalance(S [][][]int, q int) []harMove {
	D := len(S)
	if D == 0 {
		return nil
	}
	q = max(q, 1)
	load := make([]int, D)
	total := 0
	for f := range S {
		for e := range S[f] {
			for d, n := range S[f][e] {
				load[d] += n
				total += n
			}
		}
	}
	avg := total / D
	var steps []harMove
	for {
		gmax := slices.Index(load, slices.Max(load))
		if load[gmax] <= avg {
			return steps
		}
		from, most := 0, -1
		for f := range S {
			n := 0
			for e := range S[f] {
				n += S[f][e][gmax]
			}
			if n > most {
				from, most = f, n
			}
		}
		emax := 0
		for e := range S[from] {
			if S[from][e][gmax] > S[from][emax][gmax] {
				emax = e
			}
		}
		move := S[from][emax][gmax]
		if move < q {
			return steps // too few tokens to hide an expert fetch behind
		}
		gmin := slices.Index(load, slices.Min(load))
		if gmin == gmax || q > avg-load[gmin] {
			return steps // no device has room for q more
		}
		n := min(move, avg-load[gmin])
		S[from][emax][gmax] -= n
		S[from][emax][gmin] += n
		load[gmax] -= n
		load[gmin] += n
		steps = append(steps, harMove{from: from, expert: emax, src: gmax, dst: gmin, n: n})
	}
}

// harMatrix is a zero S[from][expert][to].
func harMatrix(devices, experts int) [][][]int {
	m := make([][][]int, devices)
	for f := range m {
		m[f] = make([][]int, experts)
		for e := range m[f] {
			m[f][e] = make([]int, devices)
		}
	}
	return m
}
