package predictor

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
)

// newTestTrainer prepares net j of r to train on ds with batch buffers for n samples.
func newTestTrainer(ds *Dataset, r *Router, j, threads int) *netTrainer {
	o, _ := TrainOptions{Batch: 8, Threads: threads}.withDefaults()
	t := &netTrainer{j: j, ds: ds, net: r.Nets[j], o: &o, k: ds.k, p: newPool(threads)}
	t.alloc()
	return t
}

func (t *netTrainer) meanLoss(idx []int32) float64 {
	t.forward(idx)
	t.score(idx, false)
	var s float64
	for i := range idx {
		s += t.loss[i]
	}
	return s / float64(len(idx))
}

// The analytic gradient of the mean KL loss over a batch agrees with central differences,
// for the linear net and the MLP.
func TestGradientCheck(t *testing.T) {
	ds, _ := synth{m: 2, e: 4, k: 2, d: 5, seqs: 1, seqLen: 8, noise: 0.5, seed: 9}.dataset(t)
	idx := []int32{0, 2, 3, 5, 6}
	// A random router, its weights scaled up so that the predicted logits are far from
	// uniform, whose MLP keeps its pre-activations away from the ReLU's kink, where finite
	// differences lie.
	var r *Router
	for seed := uint64(1); r == nil; seed++ {
		c, err := NewRouter(IdentityOf(ds.h), nil, seed)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.Nets {
			for _, s := range [][]float32{n.W1, n.B1, n.W2, n.B2} {
				for i := range s {
					s[i] *= 3
				}
			}
		}
		tr := newTestTrainer(ds, c, 1, 1)
		tr.forward(idx)
		pre := make([]float32, len(idx)*tr.net.Hidden)
		gemm(tr.layers[0], 0, tr.net.Hidden, tr.x, len(idx), pre, tr.net.Hidden, false)
		tr.p.close()
		if !slices.ContainsFunc(pre, func(v float32) bool { return math.Abs(float64(v)) < 0.05 }) {
			r = c
		}
	}
	for j, name := range []string{"linear", "mlp"} {
		t.Run(name, func(t *testing.T) {
			tr := newTestTrainer(ds, r, j, 1)
			defer tr.p.close()
			n := len(idx)
			tr.forward(idx)
			tr.score(idx, true)
			type grad struct{ w, b []float32 }
			grads := make([]grad, len(tr.layers))
			for li, l := range tr.layers {
				grads[li] = grad{make([]float32, len(l.w)), make([]float32, len(l.b))}
				tr.gradient(l, n, func(r int, gw []float32, gb float32) {
					copy(grads[li].w[r*l.cols:], gw)
					grads[li].b[r] = gb
				})
			}
			const eps = 1e-2
			checked := 0
			for li, l := range tr.layers {
				for _, p := range []struct {
					vals, grad []float32
					what       string
				}{{l.w, grads[li].w, "w"}, {l.b, grads[li].b, "b"}} {
					for i := range p.vals {
						orig := p.vals[i]
						p.vals[i] = orig + eps
						up := tr.meanLoss(idx)
						p.vals[i] = orig - eps
						down := tr.meanLoss(idx)
						p.vals[i] = orig
						num := (up - down) / (2 * eps)
						ana := float64(p.grad[i])
						if math.Abs(num-ana) > 2e-4+0.02*math.Abs(ana) {
							t.Errorf("layer %d %s[%d]: analytic %.6f, numeric %.6f", li, p.what, i, ana, num)
						}
						checked++
					}
				}
			}
			if want := tr.net.Params(); checked != want {
				t.Errorf("checked %d parameters, the net has %d", checked, want)
			}
		})
	}
}

func TestTrainLearnsAndIsDeterministic(t *testing.T) {
	s := synth{m: 3, e: 8, k: 2, d: 12, seqs: 40, seqLen: 50, noise: 0.05, seed: 1}
	ds, _ := s.dataset(t)
	id := IdentityOf(ds.h)
	o := TrainOptions{LR: 1e-2, StepEpochs: 10, MaxEpochs: 30, Patience: 30, Batch: 32}

	untrained, err := NewRouter(id, nil, 42)
	if err != nil {
		t.Fatal(err)
	}
	before, err := Evaluate(untrained, ds, Validation)
	if err != nil {
		t.Fatal(err)
	}
	// Chance is k/E = 0.25; a random net is no better than it.
	if before.Accuracy > 0.45 {
		t.Fatalf("untrained accuracy %.3f: the synthetic task is too easy to prove anything", before.Accuracy)
	}

	var mu sync.Mutex
	epochs := map[int]int{}
	o.Threads = 1
	o.Progress = func(e EpochReport) {
		mu.Lock()
		defer mu.Unlock()
		if e.Epoch != epochs[e.Net]+1 {
			t.Errorf("net %d: epoch %d after %d", e.Net, e.Epoch, epochs[e.Net])
		}
		epochs[e.Net] = e.Epoch
	}
	r1, err := Train(context.Background(), ds, id, o)
	if err != nil {
		t.Fatal(err)
	}
	after, err := Evaluate(r1, ds, Validation)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("validation accuracy %.3f -> %.3f (frequency baseline %.3f)", before.Accuracy, after.Accuracy, after.FreqAccuracy)
	for _, ne := range after.Nets {
		t.Logf("net %d (%s): accuracy %.3f, baseline %.3f, loss %.4f, %d samples", ne.Net, ne.Target, ne.Accuracy, ne.FreqAccuracy, ne.Loss, ne.Samples)
		if ne.Accuracy < 0.9 || ne.Accuracy <= ne.FreqAccuracy {
			t.Errorf("net %d: accuracy %.3f (baseline %.3f): did not learn", ne.Net, ne.Accuracy, ne.FreqAccuracy)
		}
	}
	for j, in := range r1.Info.Nets {
		if epochs[j] != in.Epochs || in.Epochs != 30 || in.BestEpoch < 1 || in.Init != "random" {
			t.Errorf("net %d: info %+v, progress saw %d epochs", j, in, epochs[j])
		}
		if math.Abs(in.ValLoss-after.Nets[j].Loss) > 1e-4*max(1, in.ValLoss) {
			t.Errorf("net %d: recorded validation loss %v, Evaluate %v", j, in.ValLoss, after.Nets[j].Loss)
		}
		if in.TrainSamples+in.ValSamples != ds.Samples(j) || in.ValSamples != after.Nets[j].Samples {
			t.Errorf("net %d: %d + %d samples of %d", j, in.TrainSamples, in.ValSamples, ds.Samples(j))
		}
	}
	if r1.Info.Seed != 42 || r1.Info.ValFraction != 0.2 || r1.Info.LR != 1e-2 || r1.Info.Tokens != ds.Tokens() {
		t.Errorf("info %+v", r1.Info)
	}

	o.Threads, o.Progress = 3, nil
	r3, err := Train(context.Background(), ds, id, o)
	if err != nil {
		t.Fatal(err)
	}
	for j := range r1.Nets {
		a, b := r1.Nets[j], r3.Nets[j]
		for i, p := range [][2][]float32{{a.W1, b.W1}, {a.B1, b.B1}, {a.W2, b.W2}, {a.B2, b.B2}} {
			if !slices.Equal(p[0], p[1]) {
				t.Errorf("net %d, tensor %d: 1 and 3 threads differ", j, i)
			}
		}
	}
}

// With targets that are pure noise, the validation loss only gets worse after the first few
// epochs: training stops Patience epochs after the best one and keeps its weights.
func TestEarlyStopping(t *testing.T) {
	ds, _ := synth{m: 2, e: 6, k: 2, d: 24, seqs: 10, seqLen: 30, noiseOnly: true, seed: 4}.dataset(t)
	o := TrainOptions{LR: 3e-2, MaxEpochs: 60, Patience: 4, MinDelta: -1, Batch: 16}
	var mu sync.Mutex
	var reports []EpochReport
	o.Progress = func(e EpochReport) {
		mu.Lock()
		reports = append(reports, e)
		mu.Unlock()
	}
	r, err := Train(context.Background(), ds, IdentityOf(ds.h), o)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := Evaluate(r, ds, Validation)
	if err != nil {
		t.Fatal(err)
	}
	for j, in := range r.Info.Nets {
		if in.Epochs >= o.MaxEpochs || in.Epochs != in.BestEpoch+o.Patience {
			t.Errorf("net %d: ran %d epochs, best %d, patience %d", j, in.Epochs, in.BestEpoch, o.Patience)
		}
		best := math.Inf(1)
		for _, e := range reports {
			if e.Net == j {
				best = min(best, e.ValLoss)
				if e.Best != (e.Epoch == in.BestEpoch) && e.Epoch >= in.BestEpoch {
					t.Errorf("net %d epoch %d: Best = %v, best epoch %d", j, e.Epoch, e.Best, in.BestEpoch)
				}
			}
		}
		if in.ValLoss != best {
			t.Errorf("net %d: kept validation loss %v, best reported %v", j, in.ValLoss, best)
		}
		// The weights returned are the best epoch's: they score its validation loss.
		if got := ev.Nets[j].Loss; math.Abs(got-in.ValLoss) > 1e-5*in.ValLoss {
			t.Errorf("net %d: returned weights score %v, best epoch %v", j, got, in.ValLoss)
		}
	}
}

// Started from the maps that generated the trace, every net is right from the first epoch,
// the MLP included (its warm start is the same linear map); and the router is stamped with
// the identity given, whatever the trace calls the model.
func TestTrainWarmStart(t *testing.T) {
	ds, a := synth{m: 3, e: 8, k: 2, d: 12, seqs: 10, seqLen: 50, noise: 0.05, seed: 6}.dataset(t)
	id := IdentityOf(ds.h)
	id.Model, id.Fingerprint = "renamed", fp1
	r, err := Train(context.Background(), ds, id, TrainOptions{MaxEpochs: 2, Init: a})
	if err != nil {
		t.Fatal(err)
	}
	if r.ID.Model != "renamed" || r.ID.Fingerprint != fp1 {
		t.Errorf("identity %+v", r.ID)
	}
	for j, in := range r.Info.Nets {
		if in.Init != "warm" || in.ValAccuracy < 0.95 || in.Epochs != 2 {
			t.Errorf("net %d: %+v", j, in)
		}
	}
	if r.Nets[2].Hidden != 24 {
		t.Errorf("cross-token net has hidden %d", r.Nets[2].Hidden)
	}
}

// MinDelta: with a rate that shrinks every epoch the loss improves by ever finer hairs; a
// threshold stops the nets much sooner, and they still keep their best weights.
func TestMinDelta(t *testing.T) {
	ds, _ := synth{m: 2, e: 6, k: 2, d: 8, seqs: 10, seqLen: 30, noise: 0.3, seed: 12}.dataset(t)
	epochs := map[float64]int{}
	for _, md := range []float64{-1, 1e-3} {
		var reports []EpochReport
		var mu sync.Mutex
		o := TrainOptions{LR: 1e-2, Gamma: 0.7, StepEpochs: 1, MaxEpochs: 60, Patience: 3, MinDelta: md, Threads: 1,
			Progress: func(e EpochReport) { mu.Lock(); reports = append(reports, e); mu.Unlock() }}
		r, err := Train(context.Background(), ds, IdentityOf(ds.h), o)
		if err != nil {
			t.Fatal(err)
		}
		for j, in := range r.Info.Nets {
			epochs[md] += in.Epochs
			best := math.Inf(1)
			for _, e := range reports {
				if e.Net == j {
					best = min(best, e.ValLoss)
				}
			}
			if in.ValLoss != best {
				t.Errorf("min delta %v, net %d: kept loss %v, best %v", md, j, in.ValLoss, best)
			}
		}
	}
	if epochs[1e-3] >= 60 || epochs[-1] < 2*epochs[1e-3] {
		t.Errorf("epochs of both nets: %d with any improvement counting, %d with min delta 1e-3", epochs[-1], epochs[1e-3])
	}
}

func TestTrainCancel(t *testing.T) {
	ds, _ := synth{m: 2, e: 4, k: 2, d: 8, seqs: 4, seqLen: 20, seed: 2}.dataset(t)
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err := Train(ctx, ds, IdentityOf(ds.h), TrainOptions{MaxEpochs: 1000, Progress: func(EpochReport) {
		if calls++; calls == 3 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestTrainErrors(t *testing.T) {
	ds, _ := synth{m: 2, e: 4, k: 2, d: 8, seqs: 2, seqLen: 10, seed: 2}.dataset(t)
	id := IdentityOf(ds.h)
	other := id
	other.Experts = 5
	tiny, _ := synth{m: 2, e: 4, k: 2, d: 8, seqs: 1, seqLen: 2, seed: 2}.dataset(t)
	tests := []struct {
		name string
		ds   *Dataset
		id   Identity
		o    TrainOptions
	}{
		{"nil dataset", nil, id, TrainOptions{}},
		{"other shape", ds, other, TrainOptions{}},
		{"bad lr", ds, id, TrainOptions{LR: -1}},
		{"bad fraction", ds, id, TrainOptions{ValFraction: 1.5}},
		{"bad min delta", ds, id, TrainOptions{MinDelta: 1}},
		{"bad init", ds, id, TrainOptions{Init: [][]float32{nil}}},
		{"too few pairs", tiny, id, TrainOptions{}},
		{"diverges", ds, id, TrainOptions{Init: [][]float32{nil, slices.Repeat([]float32{3e38}, 32)}}},
	}
	for _, tc := range tests {
		if _, err := Train(context.Background(), tc.ds, tc.id, tc.o); err == nil {
			t.Errorf("%s: no error", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

// BenchmarkTrain trains the nets of a router shaped like the bundled tinymoe model (embd 128,
// 16 experts, top 4, 4 MoE layers) for one epoch and reports training pairs per second.
func BenchmarkTrain(b *testing.B) {
	ds, _ := synth{m: 4, e: 16, k: 4, d: 128, seqs: 16, seqLen: 256, noise: 0.1, seed: 3}.dataset(b)
	id := IdentityOf(ds.h)
	o := TrainOptions{MaxEpochs: 1}
	var pairs int
	b.ResetTimer()
	for range b.N {
		r, err := Train(context.Background(), ds, id, o)
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range r.Info.Nets {
			pairs += n.TrainSamples + n.ValSamples
		}
	}
	b.ReportMetric(float64(pairs)/b.Elapsed().Seconds(), "samples/s")
}
