package engine_test

import (
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
)

// TestAutoPlacementShapes: on shapes that do not fit the card, bench's auto row runs the
// candidate auto predicted fastest; it weighed llama.cpp's split (plain and cached) at the
// fewest host layers that fit; its choice is exact (never commit unless allowed); and it
// decodes no slower than the splits and the exact policies timed beside it.
func TestAutoPlacementShapes(t *testing.T) {
	host, err := engine.LoadHost("i9-10900x")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		shape, device string
		gpuMem        float64
		hostLayers    int
	}{
		{"qwen3-30b-a3b@q4km", "sim:rtx2080", 0, 30},
		{"olmoe-1b-7b@q4km", "sim:rtx2080ti", 2 << 30, 10},
	} {
		rep, err := engine.SimBench(engine.SimBenchOptions{Shape: c.shape, Device: c.device, GPUMem: c.gpuMem, Tokens: 32, PromptLen: 16,
			Policies:   []offload.Policy{offload.OnDemand, offload.CPUMiss, offload.Static, offload.StaticCache, offload.Auto},
			HostLayers: c.hostLayers, HostRates: host.Rates(), Predictor: "accuracy=0.8"})
		if err != nil {
			t.Fatalf("%s: %v", c.shape, err)
		}
		auto := rep.Policies[len(rep.Policies)-1]
		plan := auto.Auto
		if plan == nil {
			t.Fatalf("%s: the auto row has no plan", c.shape)
		}
		t.Logf("%s: %s", c.shape, plan.Summary())
		var splits int
		for _, cand := range plan.Candidates {
			if cand.Err == nil && cand.TokensPerSecond > plan.Chosen.TokensPerSecond {
				t.Errorf("%s: chose %s at %.1f tokens/s over %s at %.1f", c.shape, plan.Chosen, plan.Chosen.TokensPerSecond, cand, cand.TokensPerSecond)
			}
			if cand.Offload.Policy == offload.Commit {
				t.Errorf("%s: weighed commit without being allowed to", c.shape)
			}
			if cand.Offload.Policy.Split() {
				splits++
			}
		}
		if splits < 2 {
			t.Errorf("%s: weighed %d placements of llama.cpp's split", c.shape, splits)
		}
		for _, p := range rep.Policies[:len(rep.Policies)-1] {
			if auto.TokensPerSecond < p.TokensPerSecond*0.97 {
				t.Errorf("%s: auto (%s) decodes at %.1f tokens/s, %s at %.1f", c.shape, plan.Chosen, auto.TokensPerSecond, p.Policy, p.TokensPerSecond)
			}
		}
	}
}
