package offload

import (
	"fmt"
)

// staticPolicy is llama.cpp's CPU/GPU expert split (--n-cpu-moe N, -ot exps=CPU): the routed
// experts of the first N MoE layers stay in host memory and the host computes them; every
// other expert is copied into a slot of its own when the model opens and stays there, so
// nothing moves while the model decodes. It is the strategy most users of MoE models on a
// small GPU run today.
type staticPolicy struct{ hostLayers int }

func (staticPolicy) predictors() []string { return nil }

// minSlots holds every expert of the device's layers; one at least, so that the slot cache
// exists when every layer is the host's.
func (p staticPolicy) minSlots(layers, experts, _ int, _ string) int {
	return max(1, (layers-p.hostLayers)*experts)
}

func (staticPolicy) loadsAhead() bool                        { return false }
func (staticPolicy) commits() bool                           { return false }
func (staticPolicy) copiesBehind(*Offloader, ExpertKey) bool { return false }

// onHost puts every expert of a host layer on the host, but in a prompt's pass, where a slot
// is left beside the device layers' experts, weighs each as cpu-miss does: llama.cpp copies a
// host layer's weights to the GPU for a large batch, since the host's arithmetic grows with
// the batch and the copy does not.
func (p staticPolicy) onHost(f *Offloader, layer int, experts, tokens []int) []bool {
	if f.moeIdx[layer] >= p.hostLayers {
		return nil
	}
	if batched(tokens) && f.cache.Slots() > len(f.kept) {
		return cpuMiss{}.onHost(f, layer, experts, tokens)
	}
	plan := make([]bool, len(experts))
	for i := range plan {
		plan[i] = true
	}
	return plan
}

// hostsLayer says whether layer is one of the host layers (static-cache's too).
func (p staticPolicy) hostsLayer(f *Offloader, layer int) bool { return f.moeIdx[layer] < p.hostLayers }

// prepare copies the device layers' experts into their slots and waits for the copies, as
// llama.cpp loads its weights before it serves: a run's first token finds them there. They
// stay pinned, so that no cache of host experts (static-cache) evicts them.
func (p staticPolicy) prepare(f *Offloader) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kept = make(map[ExpertKey]bool)
	for _, l := range f.store.Layers()[p.hostLayers:] {
		for e := 0; e < f.store.Experts(l); e++ {
			k := ExpertKey{Layer: l, Expert: e}
			if _, _, err := f.load(k); err != nil {
				return fmt.Errorf("static: %w", err)
			}
			if err := f.cache.Pin(k); err != nil {
				return fmt.Errorf("static: %w", err)
			}
			f.kept[k] = true
		}
	}
	f.dev.Sync(f.dev.Copy().Record())
	return nil
}

// batched says whether a layer's experts serve more than one token each somewhere: a
// prompt's pass.
func batched(tokens []int) bool {
	for _, n := range tokens {
		if n > 1 {
			return true
		}
	}
	return false
}
