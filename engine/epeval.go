package engine

import (
	"context"
	"fmt"
	"math"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/sample"
)

// epPerplexity is PerplexityWith under expert parallelism: the windows are spread over the
// ranks, window w on rank w mod N, and evaluated N at a time in lockstep, step tokens per
// pass, so that every MoE layer plans the tokens of N windows at once, each rank's its own.
// The negative log-likelihood is summed in the order a single device sums it, so that with a
// policy that drops nothing the result is the single device's to the bit.
func (m *Model) epPerplexity(ctx context.Context, ids []int32, window, step int, res PerplexityResult) (PerplexityResult, error) {
	g := m.ep
	N := len(g.ranks)
	if g.multi {
		// Only this process's rank has tokens: the windows run one at a time on it.
		N = 1
	}
	var wins [][]int32
	for start := 0; start+1 < len(ids); start += window {
		wins = append(wins, ids[start:min(start+window, len(ids))])
	}
	kvs := make([]*models.KVCache, N)
	for r, rm := range g.ranks[:N] {
		kv, err := models.NewKVCache(m.arch, m.nctx, m.kvF16, models.HostAlloc)
		if err != nil {
			return res, err
		}
		if err := rm.dev.Memory().Alloc(kv.Bytes(), "a KV cache"); err != nil {
			return res, fmt.Errorf("perplexity, rank %d on %s: %w", r, rm.dev.Name(), err)
		}
		defer rm.dev.Memory().Free(kv.Bytes())
		kvs[r] = kv
	}
	nll := make([][]float64, len(wins)) // per window, per scored position
	vocab := m.arch.Config.Vocab
	probs := make([]float32, vocab)
	for first := 0; first < len(wins); first += N {
		for pos := 0; ; pos += step {
			work := make([]*epWork, N)
			busy := false
			for r := range N {
				w := first + r
				if w >= len(wins) || pos >= len(wins[w]) {
					continue
				}
				work[r] = &epWork{kv: kvs[r], tokens: wins[w][pos:min(pos+step, len(wins[w]))], pos0: pos, want: allLogits}
				busy = true
			}
			if !busy {
				break
			}
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if err := m.epStep(work); err != nil {
				return res, err
			}
			for r, wk := range work {
				if wk == nil {
					continue
				}
				win := wins[first+r]
				for t := range wk.tokens {
					if p := pos + t; p+1 < len(win) {
						sample.Softmax(probs, wk.logits[t*vocab:(t+1)*vocab])
						nll[first+r] = append(nll[first+r], -math.Log(math.Max(float64(probs[win[p+1]]), 1e-30)))
					}
				}
			}
		}
	}
	for _, w := range nll {
		for _, v := range w {
			res.NLL += v
			res.Tokens++
		}
	}
	res.Perplexity = math.Exp(res.NLL / float64(res.Tokens))
	res.BitsPerByte = res.NLL / math.Ln2 / float64(res.Bytes)
	return res, nil
}

// epStep runs a step holding the model open.
func (m *Model) epStep(work []*epWork) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return m.ep.step(work)
}
