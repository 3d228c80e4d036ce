package shapes_test

import (
	"testing"

	"github.com/commit-run/commit-run/shapes"
)

// GLM-4.5-Air's public shape: 46 layers run and the nextn block held aside, 96 heads of 128
// over 8 KV heads (96*128 is not its width of 4096), one dense layer and 45 MoE layers of
// 128 experts top-8 routed by sigmoid, at Q4_K_M's size of about 60 GiB without the nextn block.
func TestGLM45AirShape(t *testing.T) {
	in, err := shapes.Inspect("glm-4.5-air@q4km")
	if err != nil {
		t.Fatal(err)
	}
	if in.Architecture != "glm4moe" || in.Layers != 46 || in.NextN != 1 || len(in.MoELayers) != 45 || in.Heads != 96 ||
		in.HeadsKV != 8 || in.Experts != 128 || in.ExpertsUsed != 8 || in.Gating != "sigmoid" || !in.SelectionBias || in.ExpertGroups != 0 {
		t.Errorf("glm-4.5-air: %+v", in)
	}
	if gib := float64(in.ExpertBytes+in.NonExpertBytes) / (1 << 30); gib < 50 || gib > 75 {
		t.Errorf("glm-4.5-air@q4km: %.1f GiB of weights", gib)
	}
}
