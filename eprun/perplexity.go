package eprun

import (
	"context"
	"fmt"
	"math"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/sample"
)

// Perplexity scores windows of tokens spread over the ranks, window w on rank w mod N, and
// evaluated N at a time in lockstep, step tokens per pass, so that every MoE layer plans the
// tokens of N windows at once, each rank's its own. run runs each pass (Step, holding the
// model open). It returns the negative log-likelihood of every scored position (each but a
// window's last), summed in the order a single device sums it, so that with a policy that
// drops nothing the result is the single device's to the bit, and the positions it scored.
func (g *Group) Perplexity(ctx context.Context, wins [][]int32, step int, run func(work []func() error) error) (float64, int, error) {
	N := len(g.ranks)
	if g.multi {
		// Only this process's rank has tokens: the windows run one at a time on it.
		N = 1
	}
	kvs := make([]*models.KVCache, N)
	for r, rk := range g.ranks[:N] {
		kv, err := rk.NewKV()
		if err != nil {
			return 0, 0, err
		}
		dev := rk.Device()
		if err := dev.Memory().Alloc(kv.Bytes(), "a KV cache"); err != nil {
			return 0, 0, fmt.Errorf("perplexity, rank %d on %s: %w", r, dev.Name(), err)
		}
		defer dev.Memory().Free(kv.Bytes())
		kvs[r] = kv
	}
	nll := make([][]float64, len(wins)) // per window, per scored position
	for first := 0; first < len(wins); first += N {
		if err := g.scoreWindows(ctx, wins, first, kvs, step, nll, run); err != nil {
			return 0, 0, err
		}
	}
	var sum float64
	var n int
	for _, w := range nll {
		for _, v := range w {
			sum += v
			n++
		}
	}
	return sum, n, nil
}

// scoreWindows runs windows first.. on the ranks of kvs, one each, step tokens per pass, and
// appends each scored position's negative log-likelihood to nll.
func (g *Group) scoreWindows(ctx context.Context, wins [][]int32, first int, kvs []*models.KVCache, step int, nll [][]float64, run func([]func() error) error) error {
	N := len(kvs)
	vocab := g.arch.Config.Vocab
	probs := make([]float32, vocab)
	logits := make([][]float32, N)
	for pos := 0; ; pos += step {
		work := make([]func() error, N)
		tokens := make([][]int32, N)
		busy := false
		for r := range N {
			w := first + r
			if w >= len(wins) || pos >= len(wins[w]) {
				continue
			}
			tokens[r] = wins[w][pos:min(pos+step, len(wins[w]))]
			work[r] = func() (err error) {
				logits[r], err = g.ranks[r].Forward(kvs[r], tokens[r], pos)
				return err
			}
			busy = true
		}
		if !busy {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := run(work); err != nil {
			return err
		}
		for r, toks := range tokens {
			if work[r] == nil {
				continue
			}
			win := wins[first+r]
			for t := range toks {
				if p := pos + t; p+1 < len(win) {
					sample.Softmax(probs, logits[r][t*vocab:(t+1)*vocab])
					nll[first+r] = append(nll[first+r], -math.Log(math.Max(float64(probs[win[p+1]]), 1e-30)))
				}
			}
		}
	}
}
