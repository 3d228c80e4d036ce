package offload

import (
	"github.com/commit-run/commit-run/device"
)

// staticCache is llama.cpp's split with its cache of host experts in device memory: the
// device layers' experts stay in their slots as under static, and the slots they leave (if
// any: it needs no more than static) cache the host layers' experts, least recently used
// out. A host layer's expert the cache
// holds is computed on the device; one it misses, on the host, and then copied into the
// cache behind the computation, so that a skewed router's favourites end up on the device.
// Nothing ever waits for a copy, and the numbers stay the router's.
type staticCache struct{ staticPolicy }

// onHost puts on the host the experts of a host layer that the cache misses, and those it
// holds whose copy would land after the host, behind its queued work, would have computed
// them (a device that cannot weigh, the CPU, waits for the copy); a prompt's as static.
func (p staticCache) onHost(f *Offloader, layer int, experts, tokens []int) []bool {
	if f.moeIdx[layer] >= p.hostLayers {
		return nil
	}
	if batched(tokens) && f.cache.Slots() > len(f.kept) {
		return cpuMiss{}.onHost(f, layer, experts, tokens) // as static in a prompt
	}
	plan := make([]bool, len(experts))
	var work device.HostWork
	onHost := 0
	for i, e := range experts {
		k := ExpertKey{Layer: layer, Expert: e}
		w, err := f.store.Expert(k)
		if err != nil {
			continue // weights reports it
		}
		next := hostBatch(work, w, tokens[i], onHost)
		if _, ok := f.cache.Lookup(k); ok && (f.planner == nil || f.landsAt[k] <= f.planner.HostDone(next)) {
			continue
		}
		plan[i], work = true, next
		onHost++
	}
	return plan
}

// copiesBehind copies a host-computed expert into the cache, if the device layers leave it
// a slot, while the copy stream keeps up with the host: when the copies queued so far end no
// later than the host's queued work, so that the link is busy while the host is and no queue
// of copies builds up that later tokens would wait behind. The CPU, which cannot weigh,
// always copies.
func (staticCache) copiesBehind(f *Offloader, _ ExpertKey) bool {
	if f.cache.Slots() <= len(f.kept) {
		return false // no cache beside the device layers: static
	}
	return f.planner == nil || f.planner.CopyDone(0) <= f.planner.HostDone(device.HostWork{})
}
