package engine

import (
	"cmp"
	"math"
	"slices"

	"github.com/commit-run/commit-run/offload"
)

// The prompt's pipeline. A prompt's pass routes many tokens per layer, so that most of a
// layer's experts are needed, each for several tokens, and no single-token prediction helps.
// On a device that can weigh the host against a copy (device.Planner), every policy but
// ondemand (the baseline) runs it: each layer's misses go to the host or over the link,
// whichever finishes first (cpu-miss's weighing, in onHost), and while a layer computes, the
// experts the next layer is likely to need are copied ahead, so that the link works while
// the device does (prefillAhead). llama.cpp weighs a large batch's host experts the same way:
// it copies their weights to the GPU when the batch is large enough.

// weighedMisses is prefetch's and commit's host share: where prediction serves worst, in a
// prompt's pass and in each token's first MoE layer (predicted across tokens, issue 5: 0.44
// to 0.47 of its experts right, against 0.8 and more for the later layers), each miss is
// weighed as cpu-miss weighs it instead of stalling on its copy. Elsewhere, and on a device
// that cannot weigh, they copy every miss (nil). f's lock is held.
func weighedMisses(f *offloader, layer int, experts, tokens []int) []bool {
	if f.planner == nil || !batched(tokens) && f.moeIdx[layer] != 0 {
		return nil
	}
	return cpuMiss{}.onHost(f, layer, experts, tokens)
}

// prefillAhead copies, once a prompt's layer has enqueued its experts, the experts of the next
// MoE layer that the pass's T tokens are likely to need and that the policy, weighing them
// with the tokens each is expected to serve, would put on the device. An expert's chance to
// be chosen by a token is read from how often its layer has chosen it (used of the layer's
// experts per token, with one use of each as the prior, so that a model's first prompt
// expects an even spread); it is copied when at least half of such passes would need it,
// most likely first, at most half the slots, so that the current layer's experts keep
// theirs. The last layer does not look ahead: the next pass is another token's. f's lock is
// held.
func (f *offloader) prefillAhead(layer, T, used int) error {
	next := f.next[layer]
	if next < 0 {
		return nil
	}
	n := f.store.Experts(next)
	counts := f.counts[next]
	total := float64(n)
	for _, c := range counts {
		total += float64(c)
	}
	type likely struct{ expert, tokens int }
	var want []likely
	for e := range n {
		if _, ok := f.cache.Lookup(offload.ExpertKey{Layer: next, Expert: e}); ok {
			continue
		}
		c := 1.0
		if e < len(counts) {
			c += float64(counts[e])
		}
		p := min(1, float64(used)*c/total) // per token
		if 1-math.Pow(1-p, float64(T)) < 0.5 {
			continue
		}
		want = append(want, likely{e, max(1, int(math.Round(p*float64(T))))})
	}
	slices.SortStableFunc(want, func(a, b likely) int { return cmp.Compare(b.tokens, a.tokens) })
	want = want[:min(len(want), f.cache.Slots()/2)]
	experts, tokens := make([]int, len(want)), make([]int, len(want))
	for i, w := range want {
		experts[i], tokens[i] = w.expert, w.tokens
	}
	host := f.pol.onHost(f, next, experts, tokens)
	for i, e := range experts {
		if host != nil && host[i] {
			continue
		}
		if _, _, err := f.load(offload.ExpertKey{Layer: next, Expert: e}); err != nil {
			return err
		}
		f.stats.Prefetched++
	}
	return nil
}
