package offload

import (
	"github.com/commit-run/commit-run/device"
)

// cpuMiss computes an expert that is not in a slot on the host, from host memory, instead of
// copying it (Fiddler's and llama.cpp's way), when the host would finish first: nothing waits
// for a copy it does not need.
type cpuMiss struct{}

func (cpuMiss) predictors() []string                  { return nil }
func (cpuMiss) minSlots(_, _, used int, _ string) int { return used }
func (cpuMiss) loadsAhead() bool                      { return false }
func (cpuMiss) commits() bool                         { return false }

// copiesBehind fills a slot behind the host's computation on a device that cannot weigh the
// host against a copy (the CPU), so that later tokens find the expert resident; one that
// weighs copies when a copy is worth it.
func (cpuMiss) copiesBehind(f *Offloader, _ ExpertKey) bool { return f.planner == nil }

func (cpuMiss) prepare(f *Offloader) error { return fillSlots(f) }

func (cpuMiss) hostsLayer(*Offloader, int) bool { return true }

// onHost says which of a layer's experts the host computes (nil: none): tokens[i] rows go to
// experts[i]. On a device that cannot weigh host against copy
// (the CPU) that is every miss. On one with a Planner it is a miss the host would finish no
// later than its copy would land, behind the copies and host work planned before it, so that
// of several misses some are copied while others are computed. The planner prices the host's
// work for the expert's whole batch (device.HostRates): on a CPU a prompt's multiply-adds grow
// with its tokens, so its misses are copied once their arithmetic would outlast the copy.
func (cpuMiss) onHost(f *Offloader, layer int, experts, tokens []int) []bool {
	var plan []bool
	b := f.store.SlotBytes()
	var copied int64
	var work device.HostWork
	onHost := 0
	for i, e := range experts {
		k := ExpertKey{Layer: layer, Expert: e}
		if _, ok := f.cache.Lookup(k); ok {
			continue
		}
		if f.planner != nil {
			w, err := f.store.Expert(k)
			if err != nil {
				continue // Weights reports it
			}
			next := hostBatch(work, w, tokens[i], onHost)
			if f.planner.HostDone(next) > f.planner.CopyDone(copied+b) {
				copied += b
				continue
			}
			work = next
		}
		if plan == nil {
			plan = make([]bool, len(experts))
		}
		plan[i] = true
		onHost++
	}
	return plan
}
