package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestInspectGPTOSS: inspect describes what sets gpt-oss apart: its sliding-window layers and
// sinks, its biased router and experts, and their activation.
func TestInspectGPTOSS(t *testing.T) {
	path := goldenFile(t, "gpt-oss-mxfp4")
	out, _ := mustRun(t, "", "inspect", path)
	for _, want := range []string{"gpt-oss", "sliding window of 8 positions on 2 of 3 layers, a sink logit per head",
		"expert ffn 64 (biased, swiglu-oai)", "biased logits, softmax of the top-k", "MXFP4"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect does not say %q:\n%s", want, out)
		}
	}
	js, _ := mustRun(t, "", "inspect", "--json", path)
	var info inspectJSON
	if err := json.Unmarshal([]byte(js), &info); err != nil {
		t.Fatal(err)
	}
	if info.SlidingWindow != 8 || info.SlidingLayers != 2 || !info.AttentionSinks || !info.RouterBias || !info.ExpertBiases ||
		info.Activation != "swiglu-oai" || info.Gating != "softmax of the top-k" {
		t.Errorf("inspect --json: %+v", info)
	}
}
