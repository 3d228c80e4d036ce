package offload

// commitPolicy is CommitMoE's: it copies the experts predicted for the next MoE layer while a
// layer computes, and a single-token pass then computes with them, never falling back to the
// router's choice (Output Weight Adjustment repairs the weights; see the engine's commit.go). With the
// oracle it computes with the router's own choice, loading on demand. Where it does not
// commit and prediction serves worst, a token's first MoE layer and a prompt's passes, it
// weighs each miss as cpu-miss does (weighedMisses).
type commitPolicy struct{}

func (commitPolicy) predictors() []string {
	return []string{"router", "prev-token", "frequency", "oracle"}
}

func (commitPolicy) minSlots(_, _, used int, predictor string) int {
	if predictor == "oracle" {
		return used // nothing loads ahead
	}
	return 2 * used // this layer's experts, and the next one's loading
}

func (commitPolicy) loadsAhead() bool                        { return true }
func (commitPolicy) commits() bool                           { return true }
func (commitPolicy) copiesBehind(*Offloader, ExpertKey) bool { return false }
func (commitPolicy) prepare(f *Offloader) error              { return fillSlots(f) }

func (commitPolicy) hostsLayer(*Offloader, int) bool { return true }

func (commitPolicy) onHost(f *Offloader, layer int, experts, tokens []int) []bool {
	return weighedMisses(f, layer, experts, tokens)
}
