package engine

import (
	"fmt"
	"slices"

	"github.com/commit-run/commit-run/offload"
)

// An offloadPolicy is what makes the offloader's policies differ (OffloadOptions.Policy):
// how many layers' experts its slots must hold at least, whether it loads the next layer's
// predicted experts ahead, whether it computes with them (commit), and which misses the host
// computes (cpu-miss). Each policy is one small type in a file of its own (policy_*.go); the
// offloader does the rest the same way for all.
type offloadPolicy interface {
	// predictors are the predictors the policy takes, the first its default ("": none).
	predictors() []string
	// loadsAhead says whether the policy copies the next layer's predicted experts while a
	// layer computes: its slots hold two layers' top-k, unless it predicts with the oracle.
	loadsAhead() bool
	// commits says whether a single-token pass computes with the predicted experts.
	commits() bool
	// onHost says which of a layer's experts the host computes, as placement.onHost; f's
	// lock is held.
	onHost(f *offloader, layer int, experts, tokens []int) []bool
}

// newOffloadPolicy returns policy p, with its predictor checked or defaulted.
func newOffloadPolicy(p offload.Policy, predictor *string) (offloadPolicy, error) {
	var pol offloadPolicy
	switch p {
	case offload.OnDemand:
		pol = onDemand{}
	case offload.Prefetch:
		pol = prefetchPolicy{}
	case offload.Commit:
		pol = commitPolicy{}
	case offload.CPUMiss:
		pol = cpuMiss{}
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
