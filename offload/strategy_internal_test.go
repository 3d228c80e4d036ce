package offload

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// TestOffloadPolicies holds each policy type to what the policy is: its predictors and their
// default, the slots it needs, whether it loads ahead or commits, and that ondemand never
// computes on the host (TestHostPlan and TestStatic check which experts the others put
// there).
func TestOffloadPolicies(t *testing.T) {
	const layers, experts, used = 4, 16, 2
	for _, c := range []struct {
		policy             Policy
		predictor          string // the default
		slots              int
		loadsAhead, commit bool
		rejects            string // a predictor it refuses, "" when it takes none
	}{
		{OnDemand, "", used, false, false, ""},
		{Prefetch, "prev-token", 2 * used, true, false, "oracle"},
		{Commit, "router", 2 * used, true, true, "accuracy=0.8"},
		{CPUMiss, "", used, false, false, ""},
		{Static, "", layers * experts, false, false, ""},
		{StaticCache, "", layers * experts, false, false, ""},
		{Hot, "", used, false, false, ""},
	} {
		t.Run(c.policy.String(), func(t *testing.T) {
			o := Options{Policy: c.policy}
			pol, err := newStrategy(&o, layers)
			if err != nil {
				t.Fatal(err)
			}
			if o.Predictor != c.predictor || pol.loadsAhead() != c.loadsAhead || pol.commits() != c.commit {
				t.Errorf("predictor %q, loads ahead %v, commits %v; want %q, %v, %v", o.Predictor, pol.loadsAhead(), pol.commits(), c.predictor, c.loadsAhead, c.commit)
			}
			if got := pol.minSlots(layers, experts, used, o.Predictor); got != c.slots {
				t.Errorf("%d slots at least, want %d", got, c.slots)
			}
			if _, ok := pol.(onDemand); ok {
				if pol.onHost(nil, 0, []int{1, 2}, []int{1, 1}) != nil || pol.copiesBehind(nil, ExpertKey{}) {
					t.Errorf("%s computes experts on the host", c.policy)
				}
			}
			for _, p := range pol.predictors() {
				if _, err := newStrategy(&Options{Policy: c.policy, Predictor: p}, layers); err != nil {
					t.Errorf("its own predictor %q: %v", p, err)
				}
			}
			if c.rejects == "" {
				return
			}
			if _, err := newStrategy(&Options{Policy: c.policy, Predictor: c.rejects}, layers); err == nil || !strings.Contains(err.Error(), c.rejects) {
				t.Errorf("predictor %q: error %v, want one that names it", c.rejects, err)
			}
		})
	}
	if got := (commitPolicy{}).minSlots(layers, experts, used, "oracle"); got != used {
		t.Errorf("commit with the oracle: %d slots at least, want %d: nothing loads ahead", got, used)
	}
	for _, o := range []Options{
		{Policy: Policy(42)},
		{Policy: Static, HostLayers: -1},
		{Policy: Static, HostLayers: layers + 1},
		{Policy: OnDemand, HostLayers: 2},
	} {
		if _, err := newStrategy(&o, layers); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// A layer's host experts are priced in the parallel regions the engine computes them in: two
// (all gates and ups, then all downs), however many there are.
func TestExpertRegions(t *testing.T) {
	for _, c := range []struct{ n, regions int }{{0, 0}, {1, 2}, {2, 2}, {8, 2}} {
		if got := expertRegions(c.n); got != c.regions {
			t.Errorf("expertRegions(%d) = %d, want %d", c.n, got, c.regions)
		}
	}
	w := ExpertWeights{Gate: quant.Matrix{Data: make([]byte, 10)}, Up: quant.Matrix{Data: make([]byte, 10)}, Down: quant.Matrix{Data: make([]byte, 10)}}
	one := hostBatch(device.HostWork{}, w, 1, 0)
	two := hostBatch(one, w, 1, 1)
	if one.Kernels != 2 || two.Kernels != 2 || two.Bytes != 60 {
		t.Errorf("one expert %+v, two %+v: want 2 kernels, then 2 kernels and 60 bytes", one, two)
	}
}
