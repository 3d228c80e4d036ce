package engine

import (
	"errors"
	"slices"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/sim"
)

// routing is the experts chosen for one token and their mixing weights, in top-k order.
type routing struct {
	experts []int
	weights []float32
	// devWeights are the mixing weights in device memory where the device computed them
	// (committed routing) and weights is nil: only the fused experts read them.
	devWeights []float32
}

// route applies a MoE block's gating to one token's router logits (models.MoE.Route).
func route(moe *models.MoE, logits []float32) routing {
	experts, weights := moe.Route(logits)
	return routing{experts: experts, weights: weights}
}

// commitRoute is the routing of a token that computes with experts chosen ahead of its
// router (commit) when Output Weight Adjustment does not apply: the router's own
// probabilities of those experts, through the same softmax, renormalisation and scale as a
// routed choice.
func commitRoute(moe *models.MoE, logits []float32, experts []int) routing {
	return routing{experts: experts, weights: moe.WeightsOf(logits, experts)}
}

// dropped plans capacity-aware token drop (or expanded drop) for a batch: it returns which of
// each token's experts are computed (nil: all of them) and appends to routes the experts
// expanded drop adds beyond the top-k, with their weights.
func (m *Model) dropped(moe *models.MoE, logits []float32, routes []routing) ([][]bool, error) {
	if m.drop == nil || len(routes) < 2 {
		return nil, nil
	}
	E := moe.Experts
	b := multigpu.Batch{Routing: multigpu.Routing{Experts: E, K: moe.Used}}
	for _, rt := range routes {
		b.Choice = append(b.Choice, rt.experts...)
		b.Score = append(b.Score, rt.weights...)
	}
	if m.opts.Drop.Expand {
		b.Probs = make([]float32, len(routes)*E)
		for t, rt := range routes {
			moe.ExtraWeights(logits[t*E:(t+1)*E], rt.experts, rt.weights, b.Probs[t*E:(t+1)*E])
		}
	}
	s, err := m.drop.Plan(b)
	if err != nil {
		return nil, err
	}
	kept := make([][]bool, len(routes))
	for t := range kept {
		kept[t] = make([]bool, moe.Used)
	}
	for _, a := range s.Assign {
		if a.Choice >= 0 {
			kept[a.Token][a.Choice] = true
			continue
		}
		rt := &routes[a.Token]
		rt.experts = append(slices.Clip(rt.experts), a.Expert)
		rt.weights = append(slices.Clip(rt.weights), a.Score)
		kept[a.Token] = append(kept[a.Token], true)
	}
	return kept, nil
}

// localMoE runs a mixture-of-experts block on m's device on T rows of x (at positions pos0..) into out. It reads
// as the block's steps: select (the experts predicted for the pass, and under commit those it
// computes with instead of the router's choice), route (the router's choice and weights, and
// the Commit Router's prediction for the next layer), place and compute (each chosen expert
// where m.place keeps it, tokens grouped by expert so that its weights are read once per
// batch), combine (each token's expert outputs summed in its top-k order, as llama.cpp sums
// them). Where experts live and move is m.place's business; what computes is the selection's.
// When ev is not nil it is filled with the routing decision. cs holds the session's Commit
// Router predictions (nil: none).
func (m *Model) localMoE(b models.Backend, layer int, moe *models.MoE, x []float32, T, pos0 int, out []float32, ev *RouteEvent, cs *commitState) error {
	if l := m.routedOnDevice(layer, T, ev, cs); l != nil {
		m.moeOnDevice(b, l, moe, x, T, out)
		return nil
	}
	if l, gm := m.groupedOnDevice(layer, T, ev, cs); l != nil {
		m.moeGroupedOnDevice(b, gm, l, moe, x, T, out)
		m.sharedExpert(b, layer, moe, x, T, out)
		return nil
	}
	sel := m.selected(layer, moe, T, pos0, cs)
	if sel.commit != nil && ev == nil && m.commitDev != nil && m.commitDev.fits(moe) {
		// The device weighs the committed experts itself: the host never reads the routing.
		return m.moeCommitted(b, layer, moe, x, pos0, out, cs, sel.pred, sel.commit)
	}
	xAhead := m.readAhead(layer, x, T)
	logits, routes, err := m.routeTokens(b, layer, moe, x, T, pos0)
	if err != nil {
		return err
	}
	next, nextLayer, predEv, xh, err := m.observe(layer, moe, x, T, pos0, logits, routes, ev, cs)
	if err != nil {
		return err
	}
	if xh == nil {
		xh = xAhead
	}
	m.place.routed(layer, routes, sel.pred, sel.commit != nil)
	m.apply(sel, layer, moe, logits, routes)
	kept, err := m.dropped(moe, logits, routes)
	if err != nil {
		return err
	}
	ys, off, err := m.experts(b, layer, moe, x, xh, routes, kept, out)
	if err != nil {
		return err
	}
	if ys != nil { // else the device summed them into out
		m.combine(b, layer, routes, ys, off, out)
	}
	if err := m.place.Ahead(layer, moe.Used, nextLayer, next, predEv); err != nil {
		return err
	}
	m.sharedExpert(b, layer, moe, x, T, out)
	return nil
}

// readAhead enqueues the read-back of a decoded token's input to layer, where the host may
// compute some of the layer's experts, on a device that reads ahead (device.ReadAheader), and
// returns where it lands (nil: not read): the read-back of the router's logits, which the host
// waits for next, waits for it too, so that a host layer waits once, as llama.cpp's split
// does, not twice. It lands in the exchange arena, which it resets: the layer's host work
// starts there.
func (m *Model) readAhead(layer int, x []float32, T int) []float32 {
	ra, ok := m.ops.(device.ReadAheader)
	if !ok || !m.resident || T != 1 || m.replay != nil || !m.place.hostsLayer(layer) {
		return nil
	}
	ex := m.exchangeArena()
	ex.reset()
	d := m.arch.Config.Embd
	xh := ex.floats(d)
	ra.ReadAhead(xh, x[:d])
	return xh
}

// selection is which experts a pass computes with: pred, the experts predicted for it while
// the previous layer ran (the Commit Router's, or the placement's heuristic's), and commit,
// those it computes with instead of the router's choice (commit at batch size 1), or nil for
// the router's own.
type selection struct{ pred, commit []int }

// selected returns layer's selection for a pass of T tokens at pos0.
func (m *Model) selected(layer int, moe *models.MoE, T, pos0 int, cs *commitState) selection {
	var learnt []int
	if cs != nil && T == 1 {
		j := m.commit.idx[layer]
		learnt = cs.take(j, pos0)
		if learnt == nil && j == 0 && m.commit.compute {
			m.commit.stats.FirstByRouter()
		}
	}
	pred, commit := m.place.Predicted(layer, learnt, T, moe.Used)
	if m.commit != nil && !m.commit.cross && m.commit.idx[layer] == 0 {
		commit = nil // the cross-token prediction only prefetched
	}
	return selection{pred: pred, commit: commit}
}

// apply makes the routing of a committed pass compute with the experts loaded ahead of the
// router, never falling back, weighted by Output Weight Adjustment; the router's own choice
// stays as it is.
func (m *Model) apply(sel selection, layer int, moe *models.MoE, logits []float32, routes []routing) {
	if sel.commit != nil {
		routes[0] = m.commitRouting(layer, moe, logits[:moe.Experts], routes[0], sel.commit)
	}
}

// observe hands the layer's routing to those who read it: the observer's event ev, and the
// Commit Router, whose prediction for the next MoE layer (nextLayer, ready once predEv has
// happened) it makes from this layer's router input before this layer's experts are
// enqueued, so that their copies overlap them. xh is that input where the host reads it,
// when it was read (nil: not).
func (m *Model) observe(layer int, moe *models.MoE, x []float32, T, pos0 int, logits []float32, routes []routing, ev *RouteEvent, cs *commitState) (next []int, nextLayer int, predEv device.Event, xh []float32, err error) {
	d := m.arch.Config.Embd
	// The router's input, where the host reads it.
	if ev != nil || cs != nil && T == 1 {
		xh = m.toHost(x[:T*d])
	}
	ev.fill(moe, xh, logits, routes)
	if cs == nil || T != 1 {
		return nil, 0, nil, xh, nil
	}
	nj, npos, next, err := m.predict(layer, xh[:d], pos0)
	if err != nil {
		return nil, 0, nil, nil, err
	}
	cs.pending[nj], cs.pos[nj] = next, npos
	if ev != nil {
		ev.Predicted = next
	}
	return next, m.commit.moe[nj], m.dev.Compute().Record(), xh, nil
}

// experts computes the routed experts of len(routes) rows of x and returns their outputs
// ys, slot off[t]+k holding token t's k-th expert's (top-k first, then any expanded drop
// added), and off; or nil, having summed them into out, where the device computes them in
// its fused kernels (expertsOnDevice). kept (nil: all) says which choices token drop keeps; a dropped one's
// weight is set to 0 and its output is zeros. xh is x where the host reads it, if it was
// read already (nil: it is read here when the host computes some of the experts).
func (m *Model) experts(b models.Backend, layer int, moe *models.MoE, x, xh []float32, routes []routing, kept [][]bool, out []float32) ([]float32, []int, error) {
	d := m.arch.Config.Embd
	plan, planned, err := m.expertsOnDevice(b, layer, x, routes, kept, out)
	if err != nil || planned && plan == nil {
		return nil, nil, err // out holds the experts' sum
	}
	g := groupByExpert(b, moe.Experts, d, routes, kept)
	if m.smallExperts(b, layer, x, g.jobs) || m.fusedExperts(b, layer, x, g.jobs) {
		return g.gather(b, d), g.off, nil
	}
	if !planned {
		plan = m.place.OnHost(layer, g.active, g.tokens) // the experts the host computes
	}
	if err := m.computeJobs(b, layer, len(routes), x, xh, g.jobs, plan, g.yAll); err != nil {
		return nil, nil, err
	}
	return g.gather(b, d), g.off, nil
}

// expertGroups are a layer's routed rows grouped by expert: jobs, one per expert chosen
// (active[i] computing tokens[i] rows), writing their outputs to yAll in order, and inv, the
// row of yAll each slot off[t]+k (token t's k-th choice) takes.
type expertGroups struct {
	off            []int
	jobs           []expertJob
	active, tokens []int
	yAll           []float32
	inv            []int32
}

// groupByExpert groups routes' rows by expert, so that an expert's weights are read once
// per pass. A choice kept says is dropped gets weight 0 and yAll's last row, zeros.
func groupByExpert(b models.Backend, experts, d int, routes []routing, kept [][]bool) expertGroups {
	T := len(routes)
	g := expertGroups{off: make([]int, T+1)}
	for t, r := range routes {
		g.off[t+1] = g.off[t] + len(r.experts)
	}
	n := g.off[T]
	slotToken := make([]int, n)
	byExpert := make([][]int, experts) // slots
	for t, r := range routes {
		for k, e := range r.experts {
			slotToken[g.off[t]+k] = t
			if kept != nil && !kept[t][k] {
				routes[t].weights[k] = 0 // dropped: its output stays zero
				continue
			}
			byExpert[e] = append(byExpert[e], g.off[t]+k)
		}
	}
	// The experts' outputs land in yAll in the order they are computed, then move to their
	// slots; a dropped slot takes yAll's last row, zeros.
	g.yAll = b.Floats((n + 1) * d)
	b.Zero(g.yAll[n*d:])
	g.inv = make([]int32, n)
	for s := range g.inv {
		g.inv[s] = int32(n)
	}
	pos := 0
	for e, slots := range byExpert {
		if len(slots) == 0 {
			continue
		}
		rows := len(slots)
		j := expertJob{e: e, n: rows, at: pos, y: g.yAll[pos*d : (pos+rows)*d]}
		inOrder := true
		j.rows = make([]int32, rows)
		for k, s := range slots {
			g.inv[s] = int32(pos + k)
			j.rows[k] = int32(slotToken[s])
			inOrder = inOrder && j.rows[k] == int32(k)
		}
		if inOrder {
			j.rows = nil // the expert reads the layer's input as it is
		}
		g.jobs, g.active, g.tokens = append(g.jobs, j), append(g.active, e), append(g.tokens, rows)
		pos += rows
	}
	return g
}

// gather moves the experts' outputs from yAll to their slots.
func (g expertGroups) gather(b models.Backend, d int) []float32 {
	ys := b.Floats(g.off[len(g.off)-1] * d)
	b.Gather(ys, g.yAll, g.inv, d)
	return ys
}

// computeJobs computes each job on the T rows of x on the device, from where the placement
// keeps its weights, or on the host where plan says so, overlapped with the device's. The
// jobs' outputs are rows of yAll (expertJob.at).
func (m *Model) computeJobs(b models.Backend, layer, T int, x, xh []float32, jobs []expertJob, plan []bool, yAll []float32) error {
	d := m.arch.Config.Embd
	var xReady device.Event // when the device has computed xh
	var ex *arena           // in a pass in device memory, the host's side of the exchange
	if plan != nil {
		if m.resident {
			ex = m.exchangeArena()
			defer ex.reset()
		}
		// Read before the device's experts are enqueued, so that the host computes its
		// experts while the device computes the others, unless observe read it already.
		switch {
		case xh != nil:
		case ex != nil:
			xh = ex.floats(T * d)
			m.ops.Read(xh, x[:T*d])
		default:
			xh = m.toHost(x[:T*d])
		}
		xReady = m.dev.Compute().Record()
	}
	jobs, plan, err := m.groupedExperts(b, layer, T, x, jobs, plan, yAll)
	if err != nil {
		return err
	}
	var onHost []expertJob
	for i, j := range jobs {
		if plan != nil && plan[i] {
			onHost = append(onHost, j)
			continue
		}
		w, done, err := m.place.Weights(layer, j.e, false)
		if err != nil {
			return err
		}
		m.label("expert", "", layer, j.e)
		m.expertFFN(b, b.MatMulID, m.charger, layer, j.e, &models.FFN{Gate: w.Gate, Up: w.Up, Down: w.Down}, j.input(b, x, d), j.n, j.y)
		if err := done(); err != nil {
			return err
		}
	}
	if len(onHost) > 0 {
		return m.hostExperts(layer, onHost, xh, xReady, yAll, ex)
	}
	return nil
}

// smallExpertMACs bounds the multiply-adds of an expert's product that smallExperts takes:
// below it, splitting a product's rows over the threads costs more in waking and waiting
// than it saves (a few microseconds each, against about 50 for a product of this size).
const smallExpertMACs = 1 << 19

// serialDevice is a device whose kernels can compute on the calling goroutine alone
// (cpu.Device.Serial).
type serialDevice interface {
	Serial() device.Kernels
}

// smallExperts computes a layer's experts jobs at once, one expert per thread, each
// product on its thread alone, where every product is small and the experts are the
// model's own weights on the CPU: a decode batch of several sequences routes its tokens to
// many experts with a row or two each, and a thread per product's rows would be woken and
// waited for three times per expert. The numbers are the same: each output is one kernel's
// whichever thread computes it. It returns false, having done nothing, where it does not
// apply.
func (m *Model) smallExperts(b models.Backend, layer int, x []float32, jobs []expertJob) bool {
	sd, ok := m.dev.(serialDevice)
	moe := m.arch.Layers[layer].MoE
	if !ok || m.off != nil || m.resident || len(jobs) < 2 || !moe.PlainExperts() {
		return false
	}
	d := m.arch.Config.Embd
	for _, j := range jobs {
		if w := moe.GateExps.Expert(j.e); w.Rows*w.Cols*j.n > smallExpertMACs {
			return false
		}
	}
	// The activations come from the pass's arena, which is not safe for concurrent use:
	// every job's is taken here.
	sj := smallPool.Get().(*smallJobs)
	sj.jobs, sj.k, sj.ws = jobs, sd.Serial(), sj.ws[:0]
	for _, j := range jobs {
		// The model's own weights (no offloader): nothing to copy or wait for.
		w := offload.ExpertWeights{Gate: moe.GateExps.Expert(j.e), Up: moe.UpExps.Expert(j.e), Down: moe.DownExps.Expert(j.e)}
		nff := w.Gate.Rows
		sj.ws = append(sj.ws, smallWork{w: w, in: j.input(b, x, d), g: b.Floats(j.n * nff), u: b.Floats(j.n * nff)})
	}
	m.dev.Parallel(len(jobs), sj.fn)
	sj.jobs, sj.k = nil, nil
	clear(sj.ws)
	smallPool.Put(sj)
	return true
}

// fusedExperts computes a layer's experts jobs on the CPU in two parallel regions, where
// smallExperts does not take them: every expert's gate and up products in one, their biases
// and activation, then every down product in one, instead of three regions per expert, each
// waited for (a decoded token of OLMoE's shape has eight experts a layer, gpt-oss's four).
// The numbers are the same: each output is one kernel's. It returns false, having done
// nothing, where it does not apply (the weights are not the model's own on the CPU).
func (m *Model) fusedExperts(b models.Backend, layer int, x []float32, jobs []expertJob) bool {
	md, ok := m.dev.(device.Batcher)
	moe := m.arch.Layers[layer].MoE
	if !ok || m.off != nil || m.resident || len(jobs) < 2 {
		return false
	}
	fj := fusedPool.Get().(*fusedJobs)
	for _, j := range jobs {
		fj.ws = append(fj.ws, offload.ExpertWeights{Gate: moe.GateExps.Expert(j.e), Up: moe.UpExps.Expert(j.e), Down: moe.DownExps.Expert(j.e)})
		fj.ys = append(fj.ys, j.y)
	}
	fj.run(md, b, moe, x, m.arch.Config.Embd, jobs)
	fj.reset()
	fusedPool.Put(fj)
	return true
}

// fusedJobs is the scratch of a layer's experts computed in two parallel regions
// (fusedExperts, hostExperts), from a pool so that a layer allocates none.
type fusedJobs struct {
	ws    []offload.ExpertWeights // each job's weights
	ys    [][]float32             // each job's outputs
	ps    []device.BatchProduct
	gs    [][]float32 // each expert's gate and up outputs
	dones []func() error
}

var fusedPool = sync.Pool{New: func() any { return new(fusedJobs) }}

// run computes moe's experts jobs with the weights ws into ys from their rows of x (d wide):
// every gate and up product in one of md's parallel regions, their biases and activation
// (SwiGLU, or gpt-oss's), then every down product in one and its bias. The numbers are
// expertFFN's: each product is one kernel's, and the rest is the same operations in the same
// order.
func (fj *fusedJobs) run(md device.Batcher, b models.Backend, moe *models.MoE, x []float32, d int, jobs []expertJob) {
	for i, j := range jobs {
		w := fj.ws[i]
		in := j.input(b, x, d)
		g, u := b.Floats(j.n*w.Gate.Rows), b.Floats(j.n*w.Up.Rows)
		fj.ps = append(fj.ps, device.BatchProduct{W: w.Gate, X: in, T: j.n, Out: g}, device.BatchProduct{W: w.Up, X: in, T: j.n, Out: u})
		fj.gs = append(fj.gs, g, u)
	}
	md.MatMulIDs(fj.ps)
	fj.ps = fj.ps[:0]
	for i, j := range jobs {
		g, u := fj.gs[2*i], fj.gs[2*i+1]
		nff := fj.ws[i].Gate.Rows
		gb, ub, _ := moe.ExpertBiases(j.e)
		addBias(b, u, ub)
		addBias(b, g, gb)
		if a := moe.OAI; a != nil {
			b.SwiGLUOAI(g, u, nff, a.Alpha, a.Limit)
		} else {
			b.SwiGLU(g, u, nff)
		}
		fj.ps = append(fj.ps, device.BatchProduct{W: fj.ws[i].Down, X: g, T: j.n, Out: fj.ys[i]})
	}
	md.MatMulIDs(fj.ps)
	if moe.DownBias != nil {
		for i, j := range jobs {
			_, _, db := moe.ExpertBiases(j.e)
			addBias(b, fj.ys[i], db)
		}
	}
}

// reset empties the scratch, dropping its references.
func (fj *fusedJobs) reset() {
	clear(fj.ws)
	clear(fj.ys)
	clear(fj.ps)
	clear(fj.gs)
	clear(fj.dones)
	fj.ws, fj.ys, fj.ps, fj.gs, fj.dones = fj.ws[:0], fj.ys[:0], fj.ps[:0], fj.gs[:0], fj.dones[:0]
}

// smallJobs is one smallExperts call's experts, from a pool with its function value made
// once, so that a layer allocates nothing.
type smallJobs struct {
	jobs []expertJob
	ws   []smallWork
	k    device.Kernels
	fn   func(i int)
}

// smallWork is an expert's weights and activations in smallExperts.
type smallWork struct {
	w        offload.ExpertWeights
	in, g, u []float32
}

var smallPool = sync.Pool{New: func() any {
	sj := &smallJobs{}
	sj.fn = sj.run
	return sj
}}

// run computes expert i's SwiGLU on its thread alone.
func (sj *smallJobs) run(i int) {
	j, w, k := sj.jobs[i], &sj.ws[i], sj.k
	k.MatMulID(w.w.Gate, w.in, j.n, w.g)
	k.MatMulID(w.w.Up, w.in, j.n, w.u)
	models.HostOps{K: k}.SwiGLU(w.g, w.u, w.w.Gate.Rows)
	k.MatMulID(w.w.Down, w.g, j.n, j.y)
}

// expertJob is one routed expert of a layer's pass: its n tokens' rows of the layer's input
// (nil: the first n, in order) and where its outputs land: y, rows at .. at+n-1 of the
// layer's experts' outputs.
type expertJob struct {
	e, n, at int
	rows     []int32
	y        []float32
}

// groupedExperts computes the device's jobs of GroupMinTokens(T) tokens or more whose experts
// are on the device (all of them where the model is resident; an offloader's in a slot)
// together where the device groups experts (device.GroupedExperts) and the pass runs in its
// memory: their rows of x gathered into one input, then a launch per product for all of
// them, the numbers those of the jobs one by one. It returns the jobs left to compute and
// their plan. An expert still to be copied is left to be computed alone as its copy lands:
// grouped, the layer's products would wait for its last copy, and a prompt's next layer for
// all of them (on sim:rtx4090, Mixtral-8x7B with the card's whole memory took 0.22 s to its
// first token grouping the copied experts, against 0.19 s).
func (m *Model) groupedExperts(b models.Backend, layer, T int, x []float32, jobs []expertJob, plan []bool, yAll []float32) ([]expertJob, []bool, error) {
	gd, ok := m.dev.(device.GroupedExperts)
	_, simulated := m.dev.(*sim.Device)
	if !ok || !(m.resident || simulated) || m.opts.ungrouped {
		return jobs, plan, nil
	}
	least, big := gd.GroupMinTokens(T), 0
	for i, j := range jobs {
		if j.n >= least && (plan == nil || !plan[i]) {
			big++
		}
	}
	if big < 2 { // a decode step's jobs: nothing to group, nothing allocated
		return jobs, plan, nil
	}
	var group, rest []expertJob
	var restPlan []bool
	for i, j := range jobs {
		onHost := plan != nil && plan[i]
		if j.n >= least && !onHost && m.place.Holds(layer, j.e) {
			group = append(group, j)
			continue
		}
		rest = append(rest, j)
		if plan != nil {
			restPlan = append(restPlan, onHost)
		}
	}
	if len(group) < 2 { // one expert gains nothing from a group
		return jobs, plan, nil
	}
	moe, e := m.arch.Layers[layer].MoE, group[0].e
	if !gd.GroupsExperts(expertMatrices(moe, e, moe.GateExps.Expert(e), moe.UpExps.Expert(e), moe.DownExps.Expert(e))) {
		return jobs, plan, nil // no grouped product for their types: nothing gathered for it
	}
	grouped, err := m.expertGroup(b, gd, layer, x, group, yAll)
	if err != nil || !grouped { // !grouped: experts unlike each other, or kernels the device lacks
		return jobs, plan, err
	}
	return rest, restPlan, nil
}

// expertGroup computes jobs (two or more, whose weights are on the device) in
// the device's grouped products. It returns false, having computed nothing, where the device
// has none for their types.
func (m *Model) expertGroup(b models.Backend, gd device.GroupedExperts, layer int, x []float32, jobs []expertJob, yAll []float32) (grouped bool, err error) {
	moe := m.arch.Layers[layer].MoE
	ex := make([]device.ExpertMatrices, len(jobs))
	dones := make([]func() error, 0, len(jobs))
	defer func() {
		for _, done := range dones {
			err = errors.Join(err, done())
		}
	}()
	for i, j := range jobs {
		w, done, err := m.place.Weights(layer, j.e, false)
		if err != nil {
			return false, err
		}
		dones = append(dones, done)
		ex[i] = expertMatrices(moe, j.e, w.Gate, w.Up, w.Down)
	}
	d := m.arch.Config.Embd
	off, at := make([]int32, len(jobs)+1), make([]int32, len(jobs))
	var rows []int32
	for i, j := range jobs {
		off[i+1], at[i] = off[i]+int32(j.n), int32(j.at)
		if j.rows == nil {
			for t := 0; t < j.n; t++ {
				rows = append(rows, int32(t))
			}
		} else {
			rows = append(rows, j.rows...)
		}
	}
	n, ff := int(off[len(jobs)]), ex[0].Gate.Rows
	xs := b.Floats(n * d)
	b.Gather(xs, x, rows, d)
	m.label("experts", "grouped", layer, -1) // a constant name: no formatting on a pass without a labeler
	return gd.ExpertGroups(ex, xs, off, at, yAll, b.Floats(2*n*ff)), nil
}

// input returns the job's rows of x, gathered in b's memory when they are not x's first n.
func (j expertJob) input(b models.Backend, x []float32, d int) []float32 {
	if j.rows == nil {
		return x[:j.n*d]
	}
	xe := b.Floats(j.n * d)
	b.Gather(xe, x, j.rows, d)
	return xe
}

// hostExperts computes the experts hostPlan put on the host (cpu-miss) from xh, the layer's
// input on the host, which the device computed by xReady; the device's later work waits for
// them. Where the host's kernels compute several products in one parallel region (the CPU's,
// also behind a real or simulated GPU: hostMulti), a layer's host experts take two regions,
// as fusedExperts's on the CPU, not three each (as offload's planners price them): a static
// split's host layer computes a token's top-k there, and a cpu-miss layer its one miss.
//
// In a pass in device memory (ex, the exchange arena, not nil) the host writes the outputs
// in ex, rows as in yAll, and they go to yAll in one write for each run of adjacent rows: one
// a layer where the host computes all of its experts (a static split's host layer).
func (m *Model) hostExperts(layer int, jobs []expertJob, xh []float32, xReady device.Event, yAll []float32, ex *arena) error {
	host := m.dev.Host()
	host.Wait(xReady)
	// The host's activations come from a pooled arena, reused token after token.
	ha := m.hostArena()
	defer m.putArena(ha)
	hb := &backend{Kernels: host, Ops: models.HostOps{K: host}, a: ha}
	d := m.arch.Config.Embd
	var out hostOutputs
	if ex != nil {
		lo, hi := jobs[0].at, 0
		for _, j := range jobs {
			lo, hi = min(lo, j.at), max(hi, j.at+j.n)
		}
		out.first, out.d = lo*d, d
		out.ys = ex.floats((hi - lo) * d)
	}
	var err error
	if md, ok := hostMulti(host); ok {
		err = m.hostExpertsAtOnce(md, hb, layer, jobs, xh, out)
	} else {
		err = m.hostExpertsOneByOne(host, hb, layer, jobs, xh, out)
	}
	if err != nil {
		return err
	}
	if ex != nil {
		for i := 0; i < len(jobs); {
			k := i + 1
			for k < len(jobs) && jobs[k].at == jobs[k-1].at+jobs[k-1].n {
				k++
			}
			lo, hi := jobs[i].at*d, (jobs[k-1].at+jobs[k-1].n)*d
			m.ops.Write(yAll[lo:hi], out.ys[lo-out.first:hi-out.first])
			i = k
		}
	}
	// The device combines the experts' outputs once the host's are back.
	m.dev.Compute().Wait(host.Record())
	return nil
}

// hostOutputs is where the host writes its experts' outputs: their rows of yAll (ys nil), or
// of ys, host memory standing for yAll's rows of d floats from the float first on.
type hostOutputs struct {
	ys       []float32
	first, d int
}

// of returns j's output rows.
func (o hostOutputs) of(j expertJob) []float32 {
	if o.ys == nil {
		return j.y
	}
	at := j.at*o.d - o.first
	return o.ys[at : at+len(j.y)]
}

// hostMulti returns the host's MatMulIDs where its kernels have it: the CPU's own, a
// simulated GPU's host's, or a GPU's host's (its Kernels, whose products finish before the
// call returns either way).
func hostMulti(h device.HostKernels) (device.Batcher, bool) {
	if b, ok := h.(device.Batcher); ok {
		return b, true
	}
	if u, ok := h.(interface{ Kernels() device.Kernels }); ok {
		b, ok := u.Kernels().(device.Batcher)
		return b, ok
	}
	return nil, false
}

// hostExpertsAtOnce computes the experts jobs on the host in md's two parallel regions
// (fusedJobs.run), with the same numbers as one by one.
func (m *Model) hostExpertsAtOnce(md device.Batcher, hb *backend, layer int, jobs []expertJob, xh []float32, out hostOutputs) (err error) {
	fj := fusedPool.Get().(*fusedJobs)
	defer func() {
		for _, done := range fj.dones {
			err = errors.Join(err, done())
		}
		fj.reset()
		fusedPool.Put(fj)
	}()
	for _, j := range jobs {
		w, done, werr := m.place.Weights(layer, j.e, true)
		if werr != nil {
			return werr
		}
		fj.dones = append(fj.dones, done)
		fj.ws, fj.ys = append(fj.ws, w), append(fj.ys, out.of(j))
	}
	m.label("cpu", "cpu", layer, -1)
	fj.run(md, hb, m.arch.Layers[layer].MoE, xh, m.arch.Config.Embd, jobs)
	return nil
}

// hostExpertsOneByOne computes the experts jobs on the host one after the other, each
// product a parallel region of its own.
func (m *Model) hostExpertsOneByOne(host device.HostKernels, hb *backend, layer int, jobs []expertJob, xh []float32, out hostOutputs) error {
	d := m.arch.Config.Embd
	for _, j := range jobs {
		w, done, err := m.place.Weights(layer, j.e, true)
		if err != nil {
			return err
		}
		m.label("cpu", "cpu", layer, j.e)
		m.expertFFN(hb, host.MatMulID, nil, layer, j.e, &models.FFN{Gate: w.Gate, Up: w.Up, Down: w.Down}, j.input(hb, xh, d), j.n, out.of(j))
		if err := done(); err != nil {
			return err
		}
	}
	return nil
}

// routeTokens runs a MoE block's router on T rows of x at positions pos0.. and routes every
// token: by the router's logits, or in a timing-only run (whose logits are never computed) as
// its routing says.
func (m *Model) routeTokens(b models.Backend, layer int, moe *models.MoE, x []float32, T, pos0 int) ([]float32, []routing, error) {
	logits := b.Floats(T * moe.Experts)
	m.label("router", "router", layer, -1)
	b.MatMul(moe.Router.Matrix(), x, T, logits)
	addBias(b, logits, moe.RouterBias)
	logits = m.routerToHost(logits)
	if m.replay != nil {
		routes, err := m.replay.routes(layer, moe, pos0, T)
		return logits, routes, err
	}
	routes := make([]routing, T)
	for t := range routes {
		routes[t] = route(moe, logits[t*moe.Experts:(t+1)*moe.Experts])
	}
	return logits, routes, nil
}

// fill records the router's own choice in ev (nil: nothing), under commit too: what a
// predictor learns from.
func (ev *RouteEvent) fill(moe *models.MoE, x, logits []float32, routes []routing) {
	if ev == nil {
		return
	}
	ev.Experts, ev.Used = moe.Experts, moe.Used
	ev.Input, ev.Logits = x, logits
	ev.Selected = make([]int, 0, len(routes)*moe.Used)
	ev.Weights = make([]float32, 0, len(routes)*moe.Used)
	for _, r := range routes {
		ev.Selected = append(ev.Selected, r.experts...)
		ev.Weights = append(ev.Weights, r.weights...)
	}
}

// combine sums each token's expert outputs into out, weighted, in the order of its slots:
// slot off[t]+k of ys holds token t's k-th expert's output (top-k first, then any expert
// beyond them); a dropped choice has weight 0 and a zero output.
func (m *Model) combine(b models.Backend, layer int, routes []routing, ys []float32, off []int, out []float32) {
	d := m.arch.Config.Embd
	T := len(routes)
	m.label("combine", "combine", layer, -1)
	m.charge("combine", float64(4*d*(off[T]+T)), float64(2*d*off[T]))
	w := make([]float32, 0, off[T])
	o32 := make([]int32, T+1)
	for t, r := range routes {
		w = append(w, r.weights...)
		o32[t+1] = int32(off[t+1])
	}
	b.Combine(out, ys, w, o32, d)
}

// sharedExpert adds a MoE block's shared expert, gated where the architecture gates it, to
// out.
func (m *Model) sharedExpert(b models.Backend, layer int, moe *models.MoE, x []float32, T int, out []float32) {
	if moe.Shared == nil {
		return
	}
	d := m.arch.Config.Embd
	sh := b.Floats(T * d)
	m.label("shared", "shared", layer, -1)
	m.ffn(b, moe.Shared, x, T, sh)
	switch {
	case moe.SharedGate != nil:
		b.GatedAdd(out[:T*d], sh, x, moe.SharedGate, d, moe.SharedSigmoid)
	default:
		b.Add(out[:T*d], sh)
	}
}

// DropStats are capacity-aware token drop's counts since the model was opened
// (multigpu.DropStats).
type DropStats = multigpu.DropStats

// DropStats reports token drop's counts; ok is false when it is off.
func (m *Model) DropStats() (st DropStats, ok bool) {
	if m.drop == nil {
		return DropStats{}, false
	}
	return m.drop.Stats(), true
}

// expertFFN computes routed expert e of layer on T rows of x into out with the matrices f
// (where the placement keeps them): a plain SwiGLU block (swiglu), or gpt-oss's in llama.cpp's
// order: the up and gate products plus the expert's biases (ggml_add_id), the clamped
// SwiGLU-OAI, the down product plus its bias, each an operation of b's device.
func (m *Model) expertFFN(b models.Backend, matMul func(quant.Matrix, []float32, int, []float32), ch device.Charger, layer, e int, f *models.FFN, x []float32, T int, out []float32) {
	moe := m.arch.Layers[layer].MoE
	if moe.PlainExperts() {
		m.swiglu(b, matMul, ch, f, x, T, out)
		return
	}
	nff := f.Gate.Rows
	gb, ub, db := moe.ExpertBiases(e)
	g, u := b.Floats(T*nff), b.Floats(T*nff)
	matMul(f.Up, x, T, u)
	addBias(b, u, ub)
	matMul(f.Gate, x, T, g)
	addBias(b, g, gb)
	if a := moe.OAI; a != nil {
		b.SwiGLUOAI(g, u, nff, a.Alpha, a.Limit)
	} else {
		b.SwiGLU(g, u, nff)
	}
	if ch != nil {
		bytes, flops := sim.ActivationCost(T * nff)
		ch.Charge("swiglu", bytes, flops)
	}
	matMul(f.Down, g, T, out)
	addBias(b, out, db)
}

// addBias adds bias, when there is one, to every row of x.
func addBias(b models.Backend, x, bias []float32) {
	if bias != nil {
		b.AddRows(x, bias)
	}
}
