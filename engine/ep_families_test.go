package engine_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

// TestEPRunsNewFamilies: expert parallelism runs gpt-oss (its experts' biases and clamped
// activation), Qwen3.5 (DeltaNet layers, gated attention, the sigmoid shared gate) and GLM-4.5
// (sigmoid routing with the bias correction) with one device's numbers, to the bit: every
// position's probabilities of the golden prompt and a greedy generation, over policies that
// spread and move the experts.
func TestEPRunsNewFamilies(t *testing.T) {
	for _, name := range []string{"gpt-oss-f32", "gpt-oss-mxfp4", "qwen35moe-f32", "glm4moe-q8_0"} {
		path, fx := goldenNamed(t, name)
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
		want := runOn(t, path, base, fx.Prompt, 6)
		for _, ep := range []engine.EPOptions{{Devices: 2, Policy: "round-robin"}, {Devices: 3, Policy: "harmoeny", HarMoEnyThreshold: 2}} {
			o := base
			o.EP = &ep
			t.Run(fmt.Sprintf("%s/%d-%s", name, ep.Devices, ep.Policy), func(t *testing.T) {
				got := runOn(t, path, o, fx.Prompt, 6)
				if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) != 0 {
					t.Errorf("greedy %v, one device %v; probabilities differ by %g", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
				}
			})
		}
	}
}
