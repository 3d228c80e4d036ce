package eprun

import (
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
)

// A MoE layer under expert parallelism, in HarMoEny's and DeepSpeed's steps: route locally,
// exchange the routing, plan, dispatch, compute, combine.

// MoE runs layer's MoE block under expert parallelism on rank r's T tokens of x (T may be 0)
// into out. The steps are HarMoEny's and DeepSpeed's: route locally, exchange the routing
// (metadata) with every rank, plan the layer's schedule, dispatch the hidden states to the
// ranks computing their experts, compute, send the results back and combine them in each
// token's top-k order, exactly as the single-device block does. observe, when not nil, sees
// the router's logits and choice.
func (g *Group) MoE(r, layer int, moe *models.MoE, x []float32, T int, out []float32, observe func(logits []float32, routes []Route)) error {
	rk := g.ranks[r]
	st := &layerStep{rk: rk, dev: rk.Device(), g: g, r: r, j: g.moeIdx[layer], layer: layer, moe: moe, x: x, T: T,
		N: len(g.ranks), E: moe.Experts, K: moe.Used, d: g.arch.Config.Embd, comm: g.comms[r], hb: rk.HostBackend()}
	t0 := g.clocks[r]()
	logits, routes, err := rk.Route(st.hb, layer, moe, x, T)
	if err != nil {
		return err
	}
	st.routes = routes
	if observe != nil {
		observe(logits, routes)
	}
	if err := st.exchangeRouting(logits); err != nil {
		return err
	}
	if err := st.plan(); err != nil {
		return err
	}
	if err := st.dispatch(); err != nil {
		return err
	}
	tD := g.clocks[r]()
	results, err := st.compute()
	if err != nil {
		return err
	}
	tC := g.clocks[r]()
	if err := st.combine(results, out); err != nil {
		return err
	}
	rk.SharedExpert(st.hb, layer, moe, x, T, out)
	g.record(st.j, r, tC-tD, g.clocks[r]()-t0, st.moved, st.s, st.b)
	return g.replace(r, st.j, moe)
}

// layerStep is one MoE layer's step of expert parallelism on rank r: what its stages (MoE)
// hand each other.
type layerStep struct {
	rk            Rank
	dev           device.Device
	g             *Group
	r, j, layer   int // rank, MoE layer, block
	moe           *models.MoE
	x             []float32 // this rank's T tokens' inputs
	T, N, E, K, d int
	comm          multigpu.Comm
	hb            models.Backend
	routes        []Route
	width         int      // floats of a token's metadata row
	all           [][]byte // every rank's metadata
	base          []int    // rank q's tokens are the batch's base[q]..base[q+1]
	b             multigpu.Batch
	s             multigpu.Schedule
	sendIdx       [][]int // the assignments this rank sends to each rank, and receives
	recvIdx       [][]int
	send, recv    [][]byte
	rows          [][]float32 // the hidden states received from each rank
	moved         int64
}

// exchangeRouting is the metadata exchange: the host reads its tokens' routing and sends it
// (with what the policy weighs: the gating scores, the hidden state's entropy, the experts'
// affinities) to every rank.
func (st *layerStep) exchangeRouting(logits []float32) error {
	g, d, E, K := st.g, st.d, st.E, st.K
	st.dev.Sync(st.dev.Compute().Record())
	st.width = 2 * K
	if g.needProbs {
		st.width += E
	}
	if g.needEntropy {
		st.width++
	}
	if g.centroids != nil {
		st.width += E
	}
	meta := make([]float32, st.T*st.width)
	var scratch []float64 // for the entropies
	if g.needEntropy {
		scratch = make([]float64, d)
	}
	for t, rt := range st.routes {
		row := meta[t*st.width : (t+1)*st.width]
		for k, e := range rt.Experts {
			row[k], row[K+k] = float32(e), rt.Weights[k]
		}
		rest := row[2*K:]
		if g.needProbs {
			st.moe.ExtraWeights(logits[t*E:(t+1)*E], rt.Experts, rt.Weights, rest[:E])
			rest = rest[E:]
		}
		if g.needEntropy {
			// MACS's information measure: the Shannon entropy of softmax(hidden state),
			// ln(d) less its KL divergence from uniform.
			rest[0] = float32(max(0, math.Log(float64(d))-multigpu.KLFromUniform(st.x[t*d:(t+1)*d], scratch)))
			rest = rest[1:]
		}
		if g.centroids != nil {
			multigpu.Affinities(st.x[t*d:(t+1)*d], g.centroids[st.j], g.centroidNorms[st.j], rest[:E])
		}
	}
	st.rk.Label("link", "metadata", st.layer, -1)
	counts, err := multigpu.AllGatherInt(st.comm, int64(st.T))
	if err != nil {
		return fmt.Errorf("layer %d: metadata exchange: %w", st.layer, err)
	}
	sizes := make([]int, st.N)
	st.base = make([]int, st.N+1)
	for i, n := range counts {
		if n < 0 || n > 1<<24 {
			return fmt.Errorf("layer %d: rank %d reports %d tokens", st.layer, i, n)
		}
		sizes[i] = int(n) * st.width * 4
		st.base[i+1] = st.base[i] + int(n)
	}
	if st.all, err = multigpu.AllGather(st.comm, f32bytes(meta), sizes); err != nil {
		return fmt.Errorf("layer %d: metadata exchange: %w", st.layer, err)
	}
	return nil
}

// plan is the layer's schedule, which every rank plans alike from the metadata it received.
func (st *layerStep) plan() error {
	g := st.g
	st.dev.Sync(st.dev.Compute().Record())
	st.b = g.batch(st.all, st.base, st.width, st.E, st.K, st.j)
	place := g.place[st.r][st.j]
	var err error
	if st.s, err = g.pols[st.r].Plan(st.b, place); err != nil {
		return fmt.Errorf("layer %d: %s: %w", st.layer, g.policy, err)
	}
	if err := st.s.Check(st.b, place); err != nil {
		return fmt.Errorf("layer %d: %s: %w", st.layer, g.policy, err)
	}
	return nil
}

// dispatch sends the hidden state of every assignment from this rank, in schedule order, so
// that every rank knows what it receives without being told.
func (st *layerStep) dispatch() error {
	N, r, d := st.N, st.r, st.d
	st.sendIdx, st.recvIdx = make([][]int, N), make([][]int, N)
	for i, a := range st.s.Assign {
		if a.From == r {
			st.sendIdx[a.To] = append(st.sendIdx[a.To], i)
		}
		if a.To == r {
			st.recvIdx[a.From] = append(st.recvIdx[a.From], i)
		}
	}
	st.send, st.recv = make([][]byte, N), make([][]byte, N)
	st.rows = make([][]float32, N)
	for q := range N {
		buf := make([]float32, len(st.sendIdx[q])*d)
		for k, i := range st.sendIdx[q] {
			t := st.s.Assign[i].Token - st.base[r]
			copy(buf[k*d:(k+1)*d], st.x[t*d:(t+1)*d])
		}
		st.send[q] = f32bytes(buf)
		st.rows[q] = make([]float32, len(st.recvIdx[q])*d)
		st.recv[q] = f32bytes(st.rows[q])
		if q != r {
			st.moved += int64(len(st.send[q]) + len(st.recv[q]))
		}
	}
	st.rk.Label("link", "dispatch", st.layer, -1)
	if err := st.comm.AllToAll(st.send, st.recv); err != nil {
		return fmt.Errorf("layer %d: dispatch: %w", st.layer, err)
	}
	return nil
}

// compute runs the experts assigned to this rank on the hidden states it received, and
// returns their outputs by sender. HarMoEny's fetches are asynchronous copies from the host
// into a slot, so the fetched experts compute last, once their copy has landed, while the
// others compute.
func (st *layerStep) compute() ([][]float32, error) {
	rk, dev, g, r, j, d, E := st.rk, st.dev, st.g, st.r, st.j, st.d, st.E
	fetched := map[int]*models.FFN{}
	var fetchEv device.Event
	for _, f := range st.s.Fetches {
		if f.To != r || fetched[f.Expert] != nil {
			continue
		}
		rk.Label("copy", "fetch", st.layer, f.Expert)
		ffn, err := g.fetchExpert(r, st.moe, f.Expert, len(fetched))
		if err != nil {
			return nil, fmt.Errorf("layer %d: fetching expert %d: %w", st.layer, f.Expert, err)
		}
		fetched[f.Expert] = ffn
		fetchEv = dev.Copy().Record()
	}
	if ev := g.pending[r][j]; ev != nil {
		dev.Compute().Wait(ev)
		g.pending[r][j] = nil
	}
	type slot struct{ src, k int }
	byExpert := make([][]slot, E)
	for q := range st.N {
		for k, i := range st.recvIdx[q] {
			e := st.s.Assign[i].Expert
			byExpert[e] = append(byExpert[e], slot{q, k})
		}
	}
	order := make([]int, 0, E)
	for e := range E {
		if len(byExpert[e]) > 0 && fetched[e] == nil {
			order = append(order, e)
		}
	}
	for e := range E {
		if len(byExpert[e]) > 0 && fetched[e] != nil {
			order = append(order, e)
		}
	}
	results := make([][]float32, st.N)
	for q := range st.N {
		results[q] = make([]float32, len(st.recvIdx[q])*d)
	}
	waited := false
	for _, e := range order {
		sl := byExpert[e]
		n := len(sl)
		xe, ye := make([]float32, n*d), make([]float32, n*d)
		for i, p := range sl {
			copy(xe[i*d:(i+1)*d], st.rows[p.src][p.k*d:(p.k+1)*d])
		}
		ffn := fetched[e]
		if ffn != nil && !waited {
			dev.Compute().Wait(fetchEv)
			waited = true
		}
		if ffn == nil {
			ffn = &models.FFN{Gate: st.moe.GateExps.Expert(e), Up: st.moe.UpExps.Expert(e), Down: st.moe.DownExps.Expert(e)}
		}
		rk.Label("expert", "", st.layer, e)
		rk.Expert(st.hb, st.layer, e, ffn, xe, n, ye)
		for i, p := range sl {
			copy(results[p.src][p.k*d:(p.k+1)*d], ye[i*d:(i+1)*d])
		}
	}
	if len(fetched) > 0 {
		// A fetched expert visits for this pass; its slot is free again once the compute
		// stream is done with it.
		g.fetch[r].free = dev.Compute().Record()
	}
	return results, nil
}

// combine sends the results back to the ranks of their tokens, in the order they came, and
// sums each token's into out in its top-k order: its top-k, then the experts added beyond them
// in schedule order, as the single-device block lays them out. A dropped choice keeps a zero
// output and weighs nothing.
func (st *layerStep) combine(results [][]float32, out []float32) error {
	N, r, d, K, T := st.N, st.r, st.d, st.K, st.T
	back := make([][]float32, N)
	for q := range N {
		st.send[q] = f32bytes(results[q])
		back[q] = make([]float32, len(st.sendIdx[q])*d)
		st.recv[q] = f32bytes(back[q])
	}
	st.rk.Label("link", "combine", st.layer, -1)
	if err := st.comm.AllToAll(st.send, st.recv); err != nil {
		return fmt.Errorf("layer %d: combine: %w", st.layer, err)
	}
	routes := st.routes
	kept := make([][]bool, T)
	for t := range kept {
		kept[t] = make([]bool, K)
	}
	extra := map[int]int{} // assignment -> slot index within its token
	for i, a := range st.s.Assign {
		if a.From != r {
			continue
		}
		t := a.Token - st.base[r]
		if a.Choice >= 0 {
			kept[t][a.Choice] = true
			continue
		}
		rt := &routes[t]
		rt.Experts = append(slices.Clip(rt.Experts), a.Expert)
		rt.Weights = append(slices.Clip(rt.Weights), a.Score)
		extra[i] = len(rt.Experts) - 1
	}
	off := make([]int, T+1)
	for t := range routes {
		for k := range K {
			if !kept[t][k] {
				routes[t].Weights[k] = 0
			}
		}
		off[t+1] = off[t] + len(routes[t].Experts)
	}
	ys := make([]float32, off[T]*d)
	for q := range N {
		for k, i := range st.sendIdx[q] {
			a := st.s.Assign[i]
			t := a.Token - st.base[r]
			sl := off[t] + a.Choice
			if a.Choice < 0 {
				sl = off[t] + extra[i]
			}
			copy(ys[sl*d:(sl+1)*d], back[q][k*d:(k+1)*d])
		}
	}
	st.rk.Combine(st.hb, st.layer, routes, ys, off, out)
	return nil
}

// batch is the layer's batch as every rank sees it after the metadata exchange: rank q's
// tokens are tokens base[q].. of it, living on rank q.
func (g *Group) batch(all [][]byte, base []int, width, E, K, layer int) multigpu.Batch {
	T := base[len(base)-1]
	b := multigpu.Batch{Routing: multigpu.Routing{Experts: E, K: K}, Layer: layer, Home: make([]int, T)}
	b.Choice, b.Score = make([]int, 0, T*K), make([]float32, 0, T*K)
	if g.needProbs {
		b.Probs = make([]float32, 0, T*E)
	}
	if g.needEntropy {
		b.Entropy = make([]float32, 0, T)
	}
	if g.centroids != nil {
		b.Affinity = make([]float32, 0, T*E)
	}
	for q, raw := range all {
		meta := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(raw))), len(raw)/4)
		for t := range base[q+1] - base[q] {
			row := meta[t*width : (t+1)*width]
			b.Home[base[q]+t] = q
			for k := range K {
				b.Choice = append(b.Choice, int(row[k]))
			}
			b.Score = append(b.Score, row[K:2*K]...)
			rest := row[2*K:]
			if g.needProbs {
				b.Probs = append(b.Probs, rest[:E]...)
				rest = rest[E:]
			}
			if g.needEntropy {
				b.Entropy = append(b.Entropy, rest[0])
				rest = rest[1:]
			}
			if g.centroids != nil {
				b.Affinity = append(b.Affinity, rest[:E]...)
			}
		}
	}
	return b
}
