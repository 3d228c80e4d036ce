package offload

// prefetchPolicy copies the experts predicted for the next MoE layer while a layer computes,
// and falls back to copying on demand what the prediction missed (MoE-Infinity's way): the
// numbers stay the router's. Its slots hold this layer's top-k and the next one's. Where
// prediction serves worst, a token's first MoE layer and a prompt's passes, it weighs each
// miss as cpu-miss does (weighedMisses).
type prefetchPolicy struct{}

func (prefetchPolicy) predictors() []string                    { return []string{"prev-token", "router", "frequency"} }
func (prefetchPolicy) minSlots(_, _, used int, _ string) int   { return 2 * used }
func (prefetchPolicy) loadsAhead() bool                        { return true }
func (prefetchPolicy) commits() bool                           { return false }
func (prefetchPolicy) copiesBehind(*Offloader, ExpertKey) bool { return false }
func (prefetchPolicy) prepare(f *Offloader) error              { return fillSlots(f) }

func (prefetchPolicy) hostsLayer(*Offloader, int) bool { return true }

func (prefetchPolicy) onHost(f *Offloader, layer int, experts, tokens []int) []bool {
	return weighedMisses(f, layer, experts, tokens)
}
