package predictor

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Split selects the pairs Evaluate scores.
type Split int

const (
	Validation Split = iota // the held-out pairs
	Training                // the pairs the router was trained on (Train is the function)
	All
)

func (s Split) String() string {
	switch s {
	case Validation:
		return "validation"
	case Training:
		return "training"
	case All:
		return "all"
	}
	return fmt.Sprintf("Split(%d)", int(s))
}

// EvalReport is how well a Router predicts the routing of a dataset.
type EvalReport struct {
	Split Split
	Used  int // k
	Nets  []NetEval
	// Over all nets' samples:
	Samples      int
	Accuracy     float64
	FreqAccuracy float64
	Loss         float64
	Buckets      []Bucket
}

// NetEval is one net's score.
type NetEval struct {
	Net         int
	Target      string // what it predicts: "MoE layer 2 (block 5)" or "next token's first MoE layer (block 1)"
	TargetLayer int    // the block index of the MoE layer it predicts
	Samples     int
	// Accuracy is the mean over samples of |Pred ∩ True| / k, where True is the experts the
	// trace recorded for the target layer (the router's actual choice, with whatever bias
	// the model applies in choosing) and Pred the top k of the predicted logits.
	Accuracy float64
	// FreqAccuracy is the baseline of always predicting the k experts the target layer used
	// most often in the training pairs (in all pairs for split All).
	FreqAccuracy float64
	Loss         float64 // mean KL(softmax(true logits) || softmax(predicted)) in nats
	// Buckets[c] gathers the samples with exactly c correct experts (c = 0..k): CommitMoE's
	// Figure 2, certainty against accuracy.
	Buckets []Bucket
}

// Bucket gathers the samples with one number of correctly predicted experts.
type Bucket struct {
	Correct int
	Samples int
	Share   float64 // of the samples scored
	// MeanKL is the mean router certainty of these samples: KL(softmax(true logits of the
	// target layer) || uniform) in nats. The paper finds it grows with Correct.
	MeanKL float64
}

// Evaluate scores r on ds's pairs of the given split. The split is drawn as Train drew it,
// from the validation fraction and seed in r.Info (0.2 and 42 for a router with no training
// record), so a router evaluated on the trace it was trained on is scored on the pairs it
// never saw. Like Train, it requires only that the dataset have the router's routing shape.
func Evaluate(r *Router, ds *Dataset, split Split) (EvalReport, error) {
	if r == nil || ds == nil {
		return EvalReport{}, errors.New("predictor: evaluate: no router or no dataset")
	}
	if err := r.ID.CheckShape(IdentityOf(ds.h)); err != nil {
		return EvalReport{}, fmt.Errorf("predictor: evaluate: %w", err)
	}
	if len(r.Nets) != ds.m {
		return EvalReport{}, fmt.Errorf("predictor: evaluate: router has %d nets for %d MoE layers", len(r.Nets), ds.m)
	}
	for j, n := range r.Nets {
		if err := n.check(ds.d, ds.e, j == ds.m-1); err != nil {
			return EvalReport{}, fmt.Errorf("predictor: evaluate: net %d: %w", j, err)
		}
	}
	if split < Validation || split > All {
		return EvalReport{}, fmt.Errorf("predictor: evaluate: unknown split %d", int(split))
	}
	frac, seed := r.Info.ValFraction, r.Info.Seed
	if frac == 0 {
		d := DefaultTrainOptions()
		frac, seed = d.ValFraction, d.Seed
	}
	if !(frac > 0 && frac < 1) {
		return EvalReport{}, fmt.Errorf("predictor: evaluate: validation fraction %v in the router's training record", frac)
	}
	val := ds.split(frac, seed)
	rep := EvalReport{Split: split, Used: ds.k, Nets: make([]NetEval, ds.m)}
	for j := range r.Nets {
		var scored, counted []int32
		switch split {
		case Validation:
			scored, counted = ds.samples(j, val, true), ds.samples(j, val, false)
		case Training:
			scored = ds.samples(j, val, false)
			counted = scored
		case All:
			scored = make([]int32, ds.Samples(j))
			for i := range scored {
				scored[i] = int32(i)
			}
			counted = scored
		}
		rep.Nets[j] = evalNet(r, ds, j, scored, counted)
	}
	rep.Buckets = make([]Bucket, ds.k+1)
	var hits, freq, loss float64
	for _, ne := range rep.Nets {
		rep.Samples += ne.Samples
		hits += ne.Accuracy * float64(ne.Samples)
		freq += ne.FreqAccuracy * float64(ne.Samples)
		loss += ne.Loss * float64(ne.Samples)
		for c, b := range ne.Buckets {
			rep.Buckets[c].Samples += b.Samples
			rep.Buckets[c].MeanKL += b.MeanKL * float64(b.Samples)
		}
	}
	finishBuckets(rep.Buckets, rep.Samples)
	if rep.Samples > 0 {
		n := float64(rep.Samples)
		rep.Accuracy, rep.FreqAccuracy, rep.Loss = hits/n, freq/n, loss/n
	}
	return rep, nil
}

// finishBuckets turns sums of KL into means and fills in the shares.
func finishBuckets(bs []Bucket, total int) {
	for c := range bs {
		b := &bs[c]
		b.Correct = c
		if b.Samples > 0 {
			b.MeanKL /= float64(b.Samples)
		}
		if total > 0 {
			b.Share = float64(b.Samples) / float64(total)
		}
	}
}

// evalChunk is the unit of parallel evaluation. Fixed, so that sums come out the same on any
// machine.
const evalChunk = 1024

// evalSums are the sums over one chunk of samples.
type evalSums struct {
	hits, freqHits int64
	loss           float64
	count          []int     // per correct count
	kl             []float64 // per correct count
}

func evalNet(r *Router, ds *Dataset, j int, scored, counted []int32) NetEval {
	k, e := ds.k, ds.e
	tl := (j + 1) % ds.m // the MoE layer predicted
	ne := NetEval{Net: j, Target: target(j, ds.m, ds.h.MoELayers), TargetLayer: ds.h.MoELayers[tl], Samples: len(scored)}

	uses := make([]float32, e)
	for _, i := range counted {
		_, ex := ds.target(j, int(i))
		for _, x := range ex {
			uses[x]++
		}
	}
	freq := topK(uses, k, nil)

	chunks := (len(scored) + evalChunk - 1) / evalChunk
	sums := make([]evalSums, chunks)
	next := make(chan int, chunks)
	for c := range chunks {
		next <- c
	}
	close(next)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), chunks) {
		wg.Go(func() {
			n := r.Nets[j]
			x := make([]float32, n.In)
			y := make([]float32, n.Out)
			hid := make([]float32, n.Hidden)
			ex := make([]float64, 2*e)
			top := make([]int, 0, k)
			for c := range next {
				s := &sums[c]
				s.count, s.kl = make([]int, k+1), make([]float64, k+1)
				for _, i := range scored[c*evalChunk : min((c+1)*evalChunk, len(scored))] {
					ds.input(j, int(i), x)
					n.Forward(x, y, hid)
					logits, truth := ds.target(j, int(i))
					correct := overlap(topK(y, k, top[:0]), truth)
					s.hits += int64(correct)
					s.freqHits += int64(overlap(freq, truth))
					s.loss += klGrad(logits, y, nil, 0, ex)
					s.count[correct]++
					s.kl[correct] += certainty(logits, ex)
				}
			}
		})
	}
	wg.Wait()

	ne.Buckets = make([]Bucket, k+1)
	var hits, freqHits int64
	var loss float64
	for _, s := range sums {
		hits += s.hits
		freqHits += s.freqHits
		loss += s.loss
		for c := range ne.Buckets {
			ne.Buckets[c].Samples += s.count[c]
			ne.Buckets[c].MeanKL += s.kl[c]
		}
	}
	finishBuckets(ne.Buckets, ne.Samples)
	if ne.Samples > 0 {
		n := float64(ne.Samples)
		ne.Accuracy = float64(hits) / (n * float64(k))
		ne.FreqAccuracy = float64(freqHits) / (n * float64(k))
		ne.Loss = loss / n
	}
	return ne
}

// certainty is the router certainty of CommitMoE §3: KL(softmax(logits) || uniform) =
// log E + Σ p log p, in nats. ex is scratch of len(logits).
func certainty(logits []float32, ex []float64) float64 {
	lse := logSumExp(logits, ex)
	kl := math.Log(float64(len(logits)))
	for _, v := range logits {
		lp := float64(v) - lse
		kl += math.Exp(lp) * lp
	}
	return max(kl, 0)
}
