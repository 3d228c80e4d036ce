package engine_test

import (
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
)

// Under a skewed router hot fills the device with each layer's favourites, copying them in
// behind the host: its hit rate climbs above cpu-miss's, whose cache keeps what the prompt
// left, and it decodes faster than llama.cpp's split at the same memory.
func TestHotFollowsPopularity(t *testing.T) {
	host, err := engine.LoadHost("xeon-e5-2680v4")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := engine.SimBench(engine.SimBenchOptions{Shape: "mixtral-8x7b@q4km", Device: "sim:rtx2080ti",
		Tokens: 128, PromptLen: 16, Policies: []offload.Policy{offload.CPUMiss, offload.Static, offload.Hot}, HostLayers: 21,
		HostRates: host.Rates(), Synthetic: engine.DefaultSynthetic})
	if err != nil {
		t.Fatal(err)
	}
	miss, static, hot := rep.Policies[0], rep.Policies[1], rep.Policies[2]
	t.Logf("hit rate: cpu-miss %.3f, static %.3f, hot %.3f; tokens/s %.1f, %.1f, %.1f", miss.HitRate, static.HitRate, hot.HitRate,
		miss.TokensPerSecond, static.TokensPerSecond, hot.TokensPerSecond)
	if !(hot.HitRate > miss.HitRate+0.03) || !(hot.MovedPerToken > 0) {
		t.Errorf("hot: hit rate %.3f (cpu-miss %.3f), %.0f bytes moved a token: it did not follow popularity", hot.HitRate, miss.HitRate, hot.MovedPerToken)
	}
	if !(hot.TokensPerSecond > static.TokensPerSecond) {
		t.Errorf("hot %.1f tokens/s, static %.1f", hot.TokensPerSecond, static.TokensPerSecond)
	}
}
