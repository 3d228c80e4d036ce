package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestInspectGLM4MoE: inspect describes what sets glm4moe apart: its leading dense layer, the
// next-token-prediction block it holds but never runs, and its routing.
func TestInspectGLM4MoE(t *testing.T) {
	path := goldenFile(t, "glm4moe-q4km")
	out, _ := mustRun(t, "", "inspect", path)
	for _, want := range []string{"glm4moe", "3 (1 dense, 2 MoE), and 1 next-token-prediction block not run",
		"sigmoid, selection bias, top-4 within the best 2 of 4 groups, renormalised, scaled by 1.8"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect does not say %q:\n%s", want, out)
		}
	}
	js, _ := mustRun(t, "", "inspect", "--json", path)
	var info inspectJSON
	if err := json.Unmarshal([]byte(js), &info); err != nil {
		t.Fatal(err)
	}
	if info.Layers != 3 || info.DenseLayers != 1 || info.NextN != 1 || info.Gating != "sigmoid" || !info.SelectionBias ||
		info.ExpertGroups != 4 || info.ExpertGroupsUsed != 2 || !info.WeightsNorm || info.WeightsScale != 1.8 {
		t.Errorf("inspect --json: %+v", info)
	}
}
