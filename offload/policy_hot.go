package offload

import (
	"github.com/commit-run/commit-run/device"
)

// hotPolicy keeps on the device the experts the router has chosen most often so far,
// counted over every token of every pass (not only while they were on the device), and has
// the host compute the others, overlapped with the device's experts of the same layer. An
// expert the host computed is copied in behind its work when it has become more popular than
// the least used one on the device (the cache evicts by use count, seeded with that history),
// while the copy stream keeps up with the host. With a skewed router the device ends up
// holding each layer's favourites, which llama.cpp's split, placing whole layers, cannot; with
// uniform routing every layer keeps a share on the device, so that the host's and the
// device's work of each layer overlap. The numbers are the router's. Misses are weighed as
// cpu-miss weighs them: copied when the copy lands before the host would finish.
type hotPolicy struct{}

func (hotPolicy) predictors() []string                  { return nil }
func (hotPolicy) minSlots(_, _, used int, _ string) int { return used }
func (hotPolicy) loadsAhead() bool                      { return false }
func (hotPolicy) commits() bool                         { return false }
func (hotPolicy) prepare(f *Offloader) error            { return fillSlots(f) }
func (hotPolicy) hostsLayer(*Offloader, int) bool       { return true }

// onHost weighs each miss as cpu-miss does: the host computes it unless a copy would land
// first.
func (hotPolicy) onHost(f *Offloader, layer int, experts, tokens []int) []bool {
	return cpuMiss{}.onHost(f, layer, experts, tokens)
}

// copiesBehind copies a host-computed expert in when a slot is free or the router has chosen
// it more often than the cache's victim was used, and, on a device that weighs, while the
// copy stream keeps up with the host: its queue ends no more than one copy after the host's,
// so that the link works while the host does and no backlog builds up that later tokens would
// wait behind. (Allowing three copies of slack changed nothing measurable; none, as
// static-cache allows, cost Qwen3-30B-A3B 3% and Qwen1.5-MoE 4%.)
func (hotPolicy) copiesBehind(f *Offloader, k ExpertKey) bool {
	if p := f.planner; p != nil {
		copyTime := p.CopyDone(f.store.SlotBytes()) - p.CopyDone(0)
		if p.CopyDone(0) > p.HostDone(device.HostWork{})+copyTime {
			return false
		}
	}
	_, uses, full := f.cache.Victim()
	return !full || uint64(f.chosen(k)) > uses
}
