package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestInspectQwen35MoE: inspect describes qwen35moe's hybrid stack: which layers are gated
// DeltaNet and their heads, convolution and state, and the full-attention layers' output gate.
func TestInspectQwen35MoE(t *testing.T) {
	path := goldenFile(t, "qwen35moe-q4km")
	out, _ := mustRun(t, "", "inspect", path)
	for _, want := range []string{"qwen35moe", "3 of 4 layers gated DeltaNet (2 key and 4 value heads of 32, a convolution of 4; 57.00 KiB of recurrent state per sequence)",
		"1 full-attention layer with a sigmoid-gated output", "16 routed, top-4, 1 shared"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect does not say %q:\n%s", want, out)
		}
	}
	js, _ := mustRun(t, "", "inspect", "--json", path)
	var info inspectJSON
	if err := json.Unmarshal([]byte(js), &info); err != nil {
		t.Fatal(err)
	}
	if info.DeltaNetLayers != 3 || info.DeltaNetKHeads != 2 || info.DeltaNetVHeads != 4 || info.DeltaNetHeadDim != 32 ||
		info.DeltaNetConvK != 4 || info.RecurrentState != 3*(3*256+4*32*32)*4 || info.GatedAttention != 1 {
		t.Errorf("inspect --json: %+v", info)
	}
}
