package engine_test

import (
	"math"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
)

// The simulator's one published calibration point (issue 25): llama.cpp's server with
// -ngl 99 --n-cpu-moe 36 decodes Qwen3-30B-A3B-2507 Q4_K_M at 36.7 tokens/s on an RTX 2080
// 8 GB beside an i9-10900X (AlexsJones/llmfit pull request 755). The same split, timed by the
// engine's own scheduler on the rtx2080 and i9-10900x profiles, must stay within 25% of it,
// so that a change to the pricing that breaks the calibration is seen. The figure is
// simulated time, the same on every machine.
func TestCalibrationPoint(t *testing.T) {
	host, err := engine.LoadHost("i9-10900x")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := engine.SimBench(engine.SimBenchOptions{Shape: "qwen3-30b-a3b@q4km", Device: "sim:rtx2080", Tokens: 16,
		Policies: []offload.Policy{offload.Static}, HostLayers: 36, HostRates: host.Rates(), Host: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	const published = 36.7
	got := rep.Policies[0].TokensPerSecond
	t.Logf("static, 36 of 48 MoE layers on the host: %.1f tokens/s, published %.1f", got, published)
	if math.Abs(got/published-1) > 0.25 {
		t.Errorf("static decodes at %.1f tokens/s, more than 25%% from the published %.1f", got, published)
	}
}
