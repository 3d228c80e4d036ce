package offload

import (
	"fmt"
	"slices"
)

// A strategy is what makes the offloader's policies differ (Options.Policy):
// the fewest slots it runs with, whether it loads the next layer's predicted experts ahead,
// whether it computes with them (commit), which experts the host computes and whether it then
// keeps them in a slot, and what it puts on the device before the first pass. Each policy is
// one small type in a file of its own (policy_*.go); the offloader does the rest the same way
// for all.
type strategy interface {
	// predictors are the predictors the policy takes, the first its default ("": none).
	predictors() []string
	// minSlots is the fewest slots the policy runs with, for layers MoE layers of experts
	// experts, used per token, predicting with predictor.
	minSlots(layers, experts, used int, predictor string) int
	// loadsAhead says whether the policy copies the next layer's predicted experts while a
	// layer computes.
	loadsAhead() bool
	// commits says whether a single-token pass computes with the predicted experts.
	commits() bool
	// onHost says which of a layer's experts the host computes, as Offloader.OnHost; f's
	// lock is held.
	onHost(f *Offloader, layer int, experts, tokens []int) []bool
	// hostsLayer says whether onHost may put any of layer's experts on the host, so that a
	// device reads the layer's input back ahead of its routing; f's lock is held.
	hostsLayer(f *Offloader, layer int) bool
	// copiesBehind says whether expert k, which the host computes now, is then copied into
	// a slot for later tokens; f's lock is held.
	copiesBehind(f *Offloader, k ExpertKey) bool
	// prepare puts on the device what the policy keeps there from the start; f's lock is
	// not held.
	prepare(f *Offloader) error
}

// newStrategy returns the policy o names for a model of layers MoE layers, with o's
// predictor checked or defaulted.
func newStrategy(o *Options, layers int) (strategy, error) {
	p, predictor := o.Policy, &o.Predictor
	if o.HostLayers != 0 && !p.Split() {
		return nil, fmt.Errorf("offload: %d host layers are llama.cpp's split's (--n-cpu-moe: static, static-cache), not %s's", o.HostLayers, p)
	}
	var pol strategy
	switch p {
	case OnDemand:
		pol = onDemand{}
	case Prefetch:
		pol = prefetchPolicy{}
	case Commit:
		pol = commitPolicy{}
	case CPUMiss:
		pol = cpuMiss{}
	case Static, StaticCache:
		if o.HostLayers < 0 || o.HostLayers > layers {
			return nil, fmt.Errorf("offload: %s with %d host layers: the model has %d MoE layers", p, o.HostLayers, layers)
		}
		pol = staticPolicy{hostLayers: o.HostLayers}
		if p == StaticCache {
			pol = staticCache{staticPolicy{hostLayers: o.HostLayers}}
		}
	case Hot:
		pol = hotPolicy{}
		o.Eviction = LFU // hot is popularity: the cache evicts the least used
	case Auto:
		return nil, fmt.Errorf("offload: auto chooses a policy before the model opens (Open does, when no policy is given); it is not one the offloader runs")
	default:
		return nil, fmt.Errorf("offload: unknown policy %v", p)
	}
	ok := pol.predictors()
	if len(ok) == 0 {
		return pol, nil // it predicts nothing: whatever was named goes unused
	}
	if *predictor == "" {
		*predictor = ok[0]
	}
	if !slices.Contains(ok, *predictor) {
		return nil, fmt.Errorf("offload: %s with predictor %q: a running model can use router (the Commit Router), prev-token or frequency (commit also oracle: the router's own choice; accuracy=P models a predictor in timing runs)", p, *predictor)
	}
	return pol, nil
}

// fillSlots fills every slot when the model opens, as llama.cpp loads its weights before it
// serves, with the same share of each MoE layer's experts (the first of each, then the
// second, ...): with no routing seen yet, an even share is what leaves each layer's host and
// device work to overlap, and the first prompt does not start from an empty device. It waits
// for the copies. f's lock is not held.
func fillSlots(f *Offloader) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	layers := f.store.Layers()
	n := f.cache.Slots()
	for i := 0; i < n; i++ {
		l := layers[i%len(layers)]
		e := i / len(layers)
		if e >= f.store.Experts(l) {
			break
		}
		if _, _, err := f.load(ExpertKey{Layer: l, Expert: e}); err != nil {
			return fmt.Errorf("fill the expert slots: %w", err)
		}
	}
	f.dev.Sync(f.dev.Copy().Record())
	return nil
}
