package engine

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/offload"
)

// TestOffloadPolicies holds each policy type to what the policy is: its predictors and their
// default, whether it loads ahead or commits, and that only cpu-miss computes on the host
// (TestHostPlan checks which misses it computes there).
func TestOffloadPolicies(t *testing.T) {
	for _, c := range []struct {
		policy             offload.Policy
		predictor          string // the default
		loadsAhead, commit bool
		rejects            string // a predictor it refuses, "" when it takes none
	}{
		{offload.OnDemand, "", false, false, ""},
		{offload.Prefetch, "prev-token", true, false, "oracle"},
		{offload.Commit, "router", true, true, "accuracy=0.8"},
		{offload.CPUMiss, "", false, false, ""},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			var name string
			pol, err := newOffloadPolicy(c.policy, &name)
			if err != nil {
				t.Fatal(err)
			}
			if name != c.predictor || pol.loadsAhead() != c.loadsAhead || pol.commits() != c.commit {
				t.Errorf("predictor %q, loads ahead %v, commits %v; want %q, %v, %v", name, pol.loadsAhead(), pol.commits(), c.predictor, c.loadsAhead, c.commit)
			}
			if _, host := pol.(cpuMiss); !host && pol.onHost(nil, 0, []int{1, 2}, []int{1, 1}) != nil {
				t.Errorf("%s computes experts on the host", c.policy)
			}
			for _, p := range pol.predictors() {
				if _, err := newOffloadPolicy(c.policy, &p); err != nil {
					t.Errorf("its own predictor %q: %v", p, err)
				}
			}
			if c.rejects == "" {
				return
			}
			bad := c.rejects
			if _, err := newOffloadPolicy(c.policy, &bad); err == nil || !strings.Contains(err.Error(), c.rejects) {
				t.Errorf("predictor %q: error %v, want one that names it", c.rejects, err)
			}
		})
	}
	var name string
	if _, err := newOffloadPolicy(offload.Policy(42), &name); err == nil {
		t.Error("an unknown policy: no error")
	}
}
