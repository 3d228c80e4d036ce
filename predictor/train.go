package predictor

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"
)

// TrainOptions configure Train. A zero field takes its default (DefaultTrainOptions): the
// CommitMoE recipe of Adam at 5e-5, halved every 5 epochs, batches of 32, an 80/20 split
// with seed 42, early stopping on the validation loss.
type TrainOptions struct {
	LR         float64 // Adam's learning rate at the start (5e-5)
	StepEpochs int     // the rate is multiplied by Gamma every StepEpochs epochs (5)
	Gamma      float64 // (0.5)
	MaxEpochs  int     // (100)
	Patience   int     // stop a net after this many epochs without a real improvement (10)
	// MinDelta is the relative improvement of the best validation loss that counts as real
	// for Patience (1e-4; negative: any). Late in the schedule the rate is so small that
	// every epoch improves the loss by a hair, and without a threshold no net would stop
	// before MaxEpochs. The best weights are kept whatever the size of their improvement.
	MinDelta    float64
	Batch       int     // samples per Adam step (32)
	ValFraction float64 // share of the tokens held out for validation (0.2)
	Seed        uint64  // split, shuffles and random initialisation (42; 0 too means 42)
	Threads     int     // worker goroutines; 0 = runtime.GOMAXPROCS(0)
	// Init is the warm start, as for NewRouter; nil draws every net at random.
	Init [][]float32
	// Progress, when set, is called after every epoch of every net. Calls never overlap.
	Progress func(EpochReport)
}

// DefaultTrainOptions returns the options a zero TrainOptions stands for.
func DefaultTrainOptions() TrainOptions {
	return TrainOptions{LR: 5e-5, StepEpochs: 5, Gamma: 0.5, MaxEpochs: 100, Patience: 10, MinDelta: 1e-4, Batch: 32, ValFraction: 0.2, Seed: 42}
}

func (o TrainOptions) withDefaults() (TrainOptions, error) {
	d := DefaultTrainOptions()
	if o.LR == 0 {
		o.LR = d.LR
	}
	if o.StepEpochs == 0 {
		o.StepEpochs = d.StepEpochs
	}
	if o.Gamma == 0 {
		o.Gamma = d.Gamma
	}
	if o.MaxEpochs == 0 {
		o.MaxEpochs = d.MaxEpochs
	}
	if o.Patience == 0 {
		o.Patience = d.Patience
	}
	if o.Batch == 0 {
		o.Batch = d.Batch
	}
	if o.MinDelta == 0 {
		o.MinDelta = d.MinDelta
	}
	if o.ValFraction == 0 {
		o.ValFraction = d.ValFraction
	}
	if o.Seed == 0 {
		o.Seed = d.Seed
	}
	if o.Threads == 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
	switch {
	case !(o.LR > 0 && o.LR < 1):
		return o, fmt.Errorf("learning rate %v: want 0 < lr < 1", o.LR)
	case o.StepEpochs < 0:
		return o, fmt.Errorf("step epochs %d: want >= 1", o.StepEpochs)
	case !(o.Gamma > 0 && o.Gamma <= 1):
		return o, fmt.Errorf("gamma %v: want 0 < gamma <= 1", o.Gamma)
	case o.MaxEpochs < 0 || o.Patience < 0:
		return o, fmt.Errorf("epochs %d, patience %d: want >= 1", o.MaxEpochs, o.Patience)
	case o.Batch < 0 || o.Batch > 1<<16:
		return o, fmt.Errorf("batch %d: want 1..%d", o.Batch, 1<<16)
	case math.IsNaN(o.MinDelta) || o.MinDelta >= 1:
		return o, fmt.Errorf("min delta %v: want below 1", o.MinDelta)
	case !(o.ValFraction > 0 && o.ValFraction < 1):
		return o, fmt.Errorf("validation fraction %v: want 0 < f < 1", o.ValFraction)
	case o.Threads < 0:
		return o, fmt.Errorf("threads %d: want >= 0", o.Threads)
	}
	return o, nil
}

// EpochReport is the state of one net after one epoch.
type EpochReport struct {
	Net         int
	Target      string // what the net predicts
	Epoch       int    // from 1
	LR          float64
	TrainLoss   float64 // mean KL over the epoch's samples, each at the moment it was trained on
	ValLoss     float64 // mean KL over the validation samples after the epoch
	ValAccuracy float64 // mean |predicted ∩ true| / k on the validation samples
	Best        bool    // a new best validation loss: these weights are kept (so far)
	Elapsed     time.Duration
}

// TrainInfo records how a Router was trained; Save stores it (floats as f32) and eval prints it.
type TrainInfo struct {
	Source      string // the trace header's Source
	Created     string // RFC 3339
	Tokens      int    // tokens in the dataset
	LR          float64
	StepEpochs  int
	Gamma       float64
	MaxEpochs   int
	Patience    int
	MinDelta    float64
	Batch       int
	ValFraction float64
	Seed        uint64
	Nets        []NetInfo
}

// NetInfo records the training of one net.
type NetInfo struct {
	Init                     string // "warm" or "random"
	TrainSamples, ValSamples int
	Epochs, BestEpoch        int     // epochs run; the one whose weights were kept (lowest validation loss)
	TrainLoss, ValLoss       float64 // at the best epoch
	ValAccuracy              float64 // at the best epoch
}

// Train fits a Router for id on ds: every net minimises the mean over its minibatches of
// KL(softmax(true logits) || softmax(predicted logits)) with Adam (PyTorch's semantics:
// beta 0.9/0.999, eps 1e-8, bias correction) under a step schedule, and stops after Patience
// epochs without a better validation loss (by MinDelta), keeping its best epoch's weights.
//
// The split is by tokens, once, the same for every net: a permutation of the dataset's tokens
// drawn from math/rand/v2's PCG seeded with (Seed, "split") puts its first
// round(ValFraction x tokens) tokens in validation, and a pair goes where its input token
// went (so no token's h(j) is trained on by one net and validated by another, and Evaluate
// can draw the same split again from the seed and fraction in TrainInfo). Each epoch visits
// a net's training pairs in an order shuffled by PCG(Seed, "shuf"+j), in minibatches (the
// last one smaller); random initial weights come from PCG(Seed, "init"+j). Nets train concurrently on a pool of Threads workers, and each
// step of a net is itself spread over the pool by samples (forward, loss) and by weight rows
// (gradient and update), every sum taken in sample order: so the result is bit-for-bit the
// same for any Threads. ctx is checked between minibatches.
//
// id is the identity the router is stamped with; the dataset must have its routing shape
// (block count, MoE layers, experts, top-k, width). That the trace was recorded from that
// very model is for the caller to check: the trace header's Fingerprint says.
func Train(ctx context.Context, ds *Dataset, id Identity, o TrainOptions) (*Router, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("predictor: train: %w", err)
	}
	if ds == nil {
		return nil, errors.New("predictor: train: no dataset")
	}
	if err := id.CheckShape(IdentityOf(ds.h)); err != nil {
		return nil, fmt.Errorf("predictor: train: the trace does not fit: %w", err)
	}
	r, err := NewRouter(id, o.Init, o.Seed)
	if err != nil {
		return nil, err
	}
	val := ds.split(o.ValFraction, o.Seed)
	m := len(r.Nets)
	ts := make([]*netTrainer, m)
	for j := range ts {
		t := &netTrainer{j: j, ds: ds, net: r.Nets[j], o: &o, k: ds.k, target: target(j, m, ds.h.MoELayers),
			train: ds.samples(j, val, false), val: ds.samples(j, val, true)}
		if len(t.train) == 0 || len(t.val) == 0 {
			return nil, fmt.Errorf("predictor: train: net %d (%s) has %d training and %d validation pairs: the trace is too short (%d tokens)",
				j, t.target, len(t.train), len(t.val), ds.n)
		}
		ts[j] = t
	}
	p := newPool(o.Threads)
	defer p.close()
	// The first net to fail stops the others: their work would be thrown away.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		t0 = time.Now()
	)
	report := func(e EpochReport) {
		if o.Progress == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		e.Elapsed = time.Since(t0)
		o.Progress(e)
	}
	for _, t := range ts {
		wg.Go(func() {
			t.p = p
			t.alloc()
			if err := t.run(ctx, report); err != nil {
				stop(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("predictor: train: %w", err)
	}
	r.Info = TrainInfo{
		Source: ds.h.Source, Created: time.Now().UTC().Format(time.RFC3339), Tokens: ds.n,
		LR: o.LR, StepEpochs: o.StepEpochs, Gamma: o.Gamma, MaxEpochs: o.MaxEpochs, Patience: o.Patience, MinDelta: o.MinDelta,
		Batch: o.Batch, ValFraction: o.ValFraction, Seed: o.Seed, Nets: make([]NetInfo, m),
	}
	for j, t := range ts {
		t.info.Init = "random"
		if o.Init != nil && o.Init[j] != nil {
			t.info.Init = "warm"
		}
		t.info.TrainSamples, t.info.ValSamples = len(t.train), len(t.val)
		r.Info.Nets[j] = t.info
	}
	return r, nil
}

// layer is one affine map of a net with its Adam moments.
type layer struct {
	rows, cols     int
	w, b           []float32
	mw, vw, mb, vb []float32
}

func newLayer(rows, cols int, w, b []float32) *layer {
	return &layer{rows: rows, cols: cols, w: w, b: b,
		mw: make([]float32, len(w)), vw: make([]float32, len(w)), mb: make([]float32, len(b)), vb: make([]float32, len(b))}
}

// netTrainer trains one net. Its batch buffers hold up to bufN samples row by row.
type netTrainer struct {
	j      int
	ds     *Dataset
	net    *Net
	o      *TrainOptions
	p      *pool
	k      int
	target string
	train  []int32
	val    []int32
	info   NetInfo

	layers []*layer
	step   int
	bufN   int
	x      []float32 // inputs, bufN x In
	hid    []float32 // hidden activations, bufN x Hidden
	gh     []float32 // loss gradient wrt the hidden layer's pre-activations
	y      []float32 // predicted logits, bufN x Out
	g      []float32 // loss gradient wrt the predicted logits (already divided by the batch)
	loss   []float64
	hits   []int32
	parts  []partScratch // one per pool part
}

// partScratch is what one part of a parallel phase works in.
type partScratch struct {
	row    []float32 // a gradient row
	active []int     // samples with a non-zero gradient
	topk   []int
	exp    []float64 // 2 x Out
}

// evalBatch is the chunk in which validation runs: larger than a training batch, since the
// weights do not change within it.
const evalBatch = 256

func (t *netTrainer) alloc() {
	n := t.net
	t.layers = []*layer{newLayer(len(n.B1), n.In, n.W1, n.B1)}
	if n.Hidden > 0 {
		t.layers = append(t.layers, newLayer(n.Out, n.Hidden, n.W2, n.B2))
	}
	t.bufN = max(t.o.Batch, evalBatch)
	t.x = make([]float32, t.bufN*n.In)
	t.hid = make([]float32, t.bufN*n.Hidden)
	t.gh = make([]float32, t.bufN*n.Hidden)
	t.y = make([]float32, t.bufN*n.Out)
	t.g = make([]float32, t.bufN*n.Out)
	t.loss = make([]float64, t.bufN)
	t.hits = make([]int32, t.bufN)
	t.parts = make([]partScratch, t.p.threads)
	for i := range t.parts {
		t.parts[i] = partScratch{row: make([]float32, max(n.In, n.Hidden)), active: make([]int, t.bufN),
			topk: make([]int, 0, t.k), exp: make([]float64, 2*n.Out)}
	}
}

func (t *netTrainer) run(ctx context.Context, report func(EpochReport)) error {
	o := t.o
	rng := rand.New(rand.NewPCG(o.Seed, streamShuffle+uint64(t.j)))
	order := append([]int32(nil), t.train...)
	best := snapshot(t.net)
	bestLoss := math.Inf(1) // the lowest validation loss, whose weights best holds
	real := math.Inf(1)     // the last validation loss that improved by MinDelta
	since := 0              // epochs since real was set
	for epoch := 1; epoch <= o.MaxEpochs; epoch++ {
		lr := o.LR * math.Pow(o.Gamma, float64((epoch-1)/o.StepEpochs))
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		var sum float64
		for b := 0; b < len(order); b += o.Batch {
			if err := ctx.Err(); err != nil {
				return err
			}
			idx := order[b:min(b+o.Batch, len(order))]
			t.forward(idx)
			t.score(idx, true)
			t.update(len(idx), lr)
			for s := range idx {
				sum += t.loss[s]
			}
		}
		trainLoss := sum / float64(len(order))
		valLoss, valAcc, err := t.validate(ctx)
		if err != nil {
			return err
		}
		if math.IsNaN(trainLoss) || math.IsInf(trainLoss, 0) || math.IsNaN(valLoss) || math.IsInf(valLoss, 0) {
			return fmt.Errorf("net %d (%s) diverged in epoch %d (loss %v): lower the learning rate", t.j, t.target, epoch, trainLoss)
		}
		improved := valLoss < bestLoss
		if valLoss < real*(1-max(o.MinDelta, 0)) {
			real, since = valLoss, 0
		} else {
			since++
		}
		if improved {
			bestLoss = valLoss
			best.take(t.net)
			t.info.BestEpoch, t.info.TrainLoss, t.info.ValLoss, t.info.ValAccuracy = epoch, trainLoss, valLoss, valAcc
		}
		t.info.Epochs = epoch
		report(EpochReport{Net: t.j, Target: t.target, Epoch: epoch, LR: lr, TrainLoss: trainLoss, ValLoss: valLoss, ValAccuracy: valAcc, Best: improved})
		if since >= o.Patience {
			break
		}
	}
	best.give(t.net)
	return nil
}

// weights is a copy of a net's weights: the best epoch's, kept for early stopping.
type weights [4][]float32

func snapshot(n *Net) *weights {
	return &weights{cloneF(n.W1), cloneF(n.B1), cloneF(n.W2), cloneF(n.B2)}
}

func (w *weights) take(n *Net) {
	for i, s := range [4][]float32{n.W1, n.B1, n.W2, n.B2} {
		copy(w[i], s)
	}
}

func (w *weights) give(n *Net) {
	for i, s := range [4][]float32{n.W1, n.B1, n.W2, n.B2} {
		copy(s, w[i])
	}
}

// validate returns the mean loss and accuracy over the validation pairs.
func (t *netTrainer) validate(ctx context.Context) (loss, acc float64, err error) {
	var hits int64
	for b := 0; b < len(t.val); b += t.bufN {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		idx := t.val[b:min(b+t.bufN, len(t.val))]
		t.forward(idx)
		t.score(idx, false)
		for s := range idx {
			loss += t.loss[s]
			hits += int64(t.hits[s])
		}
	}
	n := float64(len(t.val))
	return loss / n, float64(hits) / (n * float64(t.k)), nil
}

// forward computes the predicted logits (and hidden activations) of samples idx into t.y.
func (t *netTrainer) forward(idx []int32) {
	n, d := len(idx), t.net.In
	t.p.run(n, d, func(_, lo, hi int) {
		for s := lo; s < hi; s++ {
			t.ds.input(t.j, int(idx[s]), t.x[s*d:(s+1)*d])
		}
	})
	l1 := t.layers[0]
	if t.net.Hidden == 0 {
		t.p.run(l1.rows, n*l1.cols, func(_, lo, hi int) { gemm(l1, lo, hi, t.x, n, t.y, t.net.Out, false) })
		return
	}
	l2 := t.layers[1]
	t.p.run(l1.rows, n*l1.cols, func(_, lo, hi int) { gemm(l1, lo, hi, t.x, n, t.hid, t.net.Hidden, true) })
	t.p.run(l2.rows, n*l2.cols, func(_, lo, hi int) { gemm(l2, lo, hi, t.hid, n, t.y, t.net.Out, false) })
}

// score computes each sample's loss and hits, and with grad the gradients wrt the logits
// (t.g) and the hidden pre-activations (t.gh).
func (t *netTrainer) score(idx []int32, grad bool) {
	n, e, h := len(idx), t.net.Out, t.net.Hidden
	scale := 1 / float64(n)
	cost := 8 * e
	if grad {
		cost += e * h
	}
	t.p.run(n, cost, func(part, lo, hi int) {
		ps := &t.parts[part]
		for s := lo; s < hi; s++ {
			logits, experts := t.ds.target(t.j, int(idx[s]))
			y := t.y[s*e : (s+1)*e]
			var g []float32
			if grad {
				g = t.g[s*e : (s+1)*e]
			}
			t.loss[s] = klGrad(logits, y, g, scale, ps.exp)
			if !grad { // accuracy is only reported for validation
				t.hits[s] = int32(overlap(topK(y, t.k, ps.topk[:0]), experts))
			}
			if grad && h > 0 {
				gh, act := t.gh[s*h:(s+1)*h], t.hid[s*h:(s+1)*h]
				clear(gh)
				for o, v := range g {
					if v != 0 {
						axpy(v, t.net.W2[o*h:(o+1)*h], gh)
					}
				}
				for i, a := range act {
					if a <= 0 {
						gh[i] = 0
					}
				}
			}
		}
	})
}

// update takes one Adam step of every weight from the gradients of the batch's n samples.
func (t *netTrainer) update(n int, lr float64) {
	t.step++
	a := newAdamStep(lr, t.step)
	for _, l := range t.layers {
		t.gradient(l, n, func(r int, gw []float32, gb float32) {
			cols := l.cols
			a.apply(l.w[r*cols:(r+1)*cols], l.mw[r*cols:(r+1)*cols], l.vw[r*cols:(r+1)*cols], gw)
			a.apply1(&l.b[r], &l.mb[r], &l.vb[r], gb)
		})
	}
}

// gradient computes the gradient of every row of l over the batch's n samples, in parallel
// by rows, and hands each row to visit (from the pool's goroutines, each row once). Both
// layers' gradients come from the forward pass and score, taken before any weight changes,
// so updating one layer's rows while the other's gradient is computed is safe.
func (t *netTrainer) gradient(l *layer, n int, visit func(r int, gw []float32, gb float32)) {
	a, g, ldg := t.x, t.g, t.net.Out // the first layer of a linear net
	cost := n * l.cols
	switch {
	case t.net.Hidden > 0 && l == t.layers[0]:
		g, ldg = t.gh, t.net.Hidden
		cost /= 2 // half the ReLUs are off
	case t.net.Hidden > 0:
		a = t.hid
	}
	t.p.run(l.rows, cost, func(part, lo, hi int) {
		gradRows(l.cols, lo, hi, a, g, ldg, n, &t.parts[part], visit)
	})
}

// gradRows computes the gradient of rows lo..hi of a layer with cols inputs: row r's weights'
// is the sum over samples s, in order, of g[s][r] x a[s] (g has ldg values per sample), its
// bias's the sum of g[s][r]. Samples whose g is zero (a ReLU that was off) are skipped, and
// four at a time go through one pass over the row, adding in the same order as one by one.
func gradRows(cols, lo, hi int, a []float32, g []float32, ldg, n int, ps *partScratch, visit func(r int, gw []float32, gb float32)) {
	acc := ps.row[:cols]
	for r := lo; r < hi; r++ {
		act := ps.active[:0]
		for s := 0; s < n; s++ {
			if g[s*ldg+r] != 0 {
				act = append(act, s)
			}
		}
		clear(acc)
		var gb float32
		i := 0
		for ; i+4 <= len(act); i += 4 {
			s0, s1, s2, s3 := act[i], act[i+1], act[i+2], act[i+3]
			g0, g1, g2, g3 := g[s0*ldg+r], g[s1*ldg+r], g[s2*ldg+r], g[s3*ldg+r]
			a0, a1, a2, a3 := a[s0*cols:(s0+1)*cols], a[s1*cols:(s1+1)*cols], a[s2*cols:(s2+1)*cols], a[s3*cols:(s3+1)*cols]
			a0, a1, a2, a3 = a0[:len(acc)], a1[:len(acc)], a2[:len(acc)], a3[:len(acc)]
			for c, v := range acc {
				v += g0 * a0[c]
				v += g1 * a1[c]
				v += g2 * a2[c]
				v += g3 * a3[c]
				acc[c] = v
			}
			gb += g0
			gb += g1
			gb += g2
			gb += g3
		}
		for ; i < len(act); i++ {
			s := act[i]
			gs := g[s*ldg+r]
			axpy(gs, a[s*cols:(s+1)*cols], acc)
			gb += gs
		}
		visit(r, acc, gb)
	}
}

// gemm sets out[s][r] = b[r] + w[r]·x[s] (then max(0, ·) with relu) for rows lo..hi of l
// and samples 0..n-1, where out has ldo values per sample. Each sum runs over the columns in
// order from zero, whatever grouping computes it, so results do not depend on how rows and
// samples are split. Four samples share each load of a weight, and their four independent
// sums keep the adder busy (measured faster than two rows by four samples, or eight samples).
func gemm(l *layer, lo, hi int, x []float32, n int, out []float32, ldo int, relu bool) {
	cols := l.cols
	for r := lo; r < hi; r++ {
		w := l.w[r*cols : (r+1)*cols]
		b := l.b[r]
		s := 0
		for ; s+4 <= n; s += 4 {
			x0, x1, x2, x3 := x[s*cols:(s+1)*cols], x[(s+1)*cols:(s+2)*cols], x[(s+2)*cols:(s+3)*cols], x[(s+3)*cols:(s+4)*cols]
			x0, x1, x2, x3 = x0[:len(w)], x1[:len(w)], x2[:len(w)], x3[:len(w)]
			var c0, c1, c2, c3 float32
			for i, wi := range w {
				c0 += wi * x0[i]
				c1 += wi * x1[i]
				c2 += wi * x2[i]
				c3 += wi * x3[i]
			}
			out[s*ldo+r], out[(s+1)*ldo+r], out[(s+2)*ldo+r], out[(s+3)*ldo+r] = act(c0+b, relu), act(c1+b, relu), act(c2+b, relu), act(c3+b, relu)
		}
		for ; s < n; s++ {
			xs := x[s*cols : (s+1)*cols]
			xs = xs[:len(w)]
			var c float32
			for i, wi := range w {
				c += wi * xs[i]
			}
			out[s*ldo+r] = act(c+b, relu)
		}
	}
}

func act(v float32, relu bool) float32 {
	if relu {
		return max(v, 0)
	}
	return v
}

// axpy adds a x x to y.
func axpy(a float32, x, y []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// klGrad returns KL(softmax(t) || softmax(y)) in nats, computed in float64 through
// log-sum-exp, and, when g is not nil, sets g to its gradient wrt y times scale:
// (softmax(y) - softmax(t)) x scale. ex is scratch of 2 x len(y).
func klGrad(t, y []float32, g []float32, scale float64, ex []float64) float64 {
	n := len(y)
	et, ey := ex[:n], ex[n:2*n]
	lt, ly := logSumExp(t, et), logSumExp(y, ey)
	// et and ey now hold exp(v - max); their sums are exp(lse - max).
	var kl float64
	for i := range y {
		lp := float64(t[i]) - lt
		lq := float64(y[i]) - ly
		p := math.Exp(lp)
		kl += p * (lp - lq)
		if g != nil {
			g[i] = float32((math.Exp(lq) - p) * scale)
		}
	}
	return max(kl, 0)
}

// logSumExp returns log Σ exp(v), leaving exp(v - max) in e.
func logSumExp(v []float32, e []float64) float64 {
	m := float64(v[0])
	for _, x := range v {
		m = max(m, float64(x))
	}
	var s float64
	for i, x := range v {
		e[i] = math.Exp(float64(x) - m)
		s += e[i]
	}
	return m + math.Log(s)
}

// adamStep holds the constants of one Adam step.
type adamStep struct {
	b1, b2, ob1, ob2 float32 // betas and one minus them
	size             float32 // lr / (1 - beta1^t)
	bc2              float32 // sqrt(1 - beta2^t)
	eps              float32
}

func newAdamStep(lr float64, step int) adamStep {
	const b1, b2 = 0.9, 0.999
	return adamStep{b1: b1, b2: b2, ob1: 1 - b1, ob2: 1 - b2,
		size: float32(lr / (1 - math.Pow(b1, float64(step)))),
		bc2:  float32(math.Sqrt(1 - math.Pow(b2, float64(step)))), eps: 1e-8}
}

// apply is torch.optim.Adam's update (foreach off, no weight decay, no amsgrad):
// m = lerp(m, g, 1-b1); v = b2 v + (1-b2) g²; w -= size x m / (sqrt(v)/bc2 + eps).
func (a adamStep) apply(w, m, v, g []float32) {
	m, v, g = m[:len(w)], v[:len(w)], g[:len(w)]
	for i := range w {
		gi := g[i]
		mi := m[i] + a.ob1*(gi-m[i])
		vi := a.b2*v[i] + a.ob2*gi*gi
		m[i], v[i] = mi, vi
		w[i] -= a.size * (mi / (float32(math.Sqrt(float64(vi)))/a.bc2 + a.eps))
	}
}

// apply1 is apply for one value.
func (a adamStep) apply1(w, m, v *float32, g float32) {
	mi := *m + a.ob1*(g-*m)
	vi := a.b2**v + a.ob2*g*g
	*m, *v = mi, vi
	*w -= a.size * (mi / (float32(math.Sqrt(float64(vi)))/a.bc2 + a.eps))
}

// pool runs the parts of parallel phases on a fixed set of goroutines, shared by every net
// in training, so that the nets and the parts of each net's steps together never use more
// than Threads cores.
type pool struct {
	threads int
	work    chan func()
}

func newPool(threads int) *pool {
	p := &pool{threads: threads, work: make(chan func(), 4*threads)}
	for range threads {
		go func() {
			for f := range p.work {
				f()
			}
		}()
	}
	return p
}

func (p *pool) close() { close(p.work) }

// minPart is the least work (multiply-adds) worth a part of its own.
const minPart = 1 << 15

// run splits items 0..n-1, each costing about cost, into contiguous parts and calls fn on
// each from the pool, returning when all are done. part numbers the parts from 0, below
// p.threads.
func (p *pool) run(n, cost int, fn func(part, lo, hi int)) {
	parts := min(p.threads, n, max(1, n*cost/minPart))
	var wg sync.WaitGroup
	wg.Add(parts)
	for q := range parts {
		lo, hi := q*n/parts, (q+1)*n/parts
		p.work <- func() {
			defer wg.Done()
			fn(q, lo, hi)
		}
	}
	wg.Wait()
}
