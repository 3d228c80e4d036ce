package tracerec_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/tracerec"
)

func TestRoutingReport(t *testing.T) {
	m, err := engine.Open("../models/testdata/tiny.gguf", engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	text := "The quick brown fox jumps over the lazy dog. " + "It was a bright cold day in April, and the clocks were striking thirteen."
	r, err := tracerec.Routing(context.Background(), m, text, 8)
	if err != nil {
		t.Fatal(err)
	}
	info := m.Info()
	if len(r.Layers) != info.Layers {
		t.Fatalf("%d layers reported, the model has %d MoE layers", len(r.Layers), info.Layers)
	}
	for _, l := range r.Layers {
		sum := 0
		for _, n := range l.Load {
			sum += n
		}
		if l.Tokens != r.Tokens || sum != l.Tokens*l.Used || l.Experts != info.Experts || l.Used != info.ExpertsUsed {
			t.Errorf("layer %d: %d tokens of %d, load sum %d, %d/%d experts", l.Layer, l.Tokens, r.Tokens, sum, l.Used, l.Experts)
		}
		if l.MaxOverMean < 1 || math.Abs(l.Balancedness*l.MaxOverMean-1) > 1e-9 {
			t.Errorf("layer %d: max/mean %v, balancedness %v", l.Layer, l.MaxOverMean, l.Balancedness)
		}
		if !(0 <= l.KLP10 && l.KLP10 <= l.KLP50 && l.KLP50 <= l.KLP90 && l.KLP90 <= l.KLMax) {
			t.Errorf("layer %d: KL quantiles %v %v %v out of order or above %v", l.Layer, l.KLP10, l.KLP50, l.KLP90, l.KLMax)
		}
	}
	for _, bad := range []int{-1, 1} {
		if _, err := tracerec.Routing(context.Background(), m, text, bad); err == nil {
			t.Errorf("window %d: no error", bad)
		}
	}
	if _, err := tracerec.Routing(context.Background(), m, "\xff\xfe", 0); err == nil {
		t.Error("invalid UTF-8: no error")
	}
}

// TestBundledRouting checks what makes the trained models a yardstick for expert selection:
// routing that is learnt, not uniform. On held-out text the busiest expert of most layers gets
// at least 1.5x the mean load, and the router's certainty varies from token to token.
func TestBundledRouting(t *testing.T) {
	models, _ := filepath.Glob("../models/testdata/tinymoe-*.gguf")
	models = slices.DeleteFunc(models, func(p string) bool { return strings.HasSuffix(p, ".commit-router.gguf") })
	if len(models) == 0 {
		t.Fatal("no bundled trained models in ../models/testdata")
	}
	text, err := os.ReadFile("../models/testdata/war-and-peace-heldout.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range models {
		t.Run(filepath.Base(path), func(t *testing.T) {
			m, err := engine.Open(path, engine.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			r, err := tracerec.Routing(context.Background(), m, string(text[:40000]), 0)
			if err != nil {
				t.Fatal(err)
			}
			skewed := 0
			for _, l := range r.Layers {
				t.Logf("layer %d: max/mean %.2f, KL mean %.3f sd %.3f p10 %.3f p90 %.3f", l.Layer, l.MaxOverMean, l.KLMean, l.KLStd, l.KLP10, l.KLP90)
				if l.MaxOverMean >= 1.5 {
					skewed++
				}
				if l.KLP90 < 1.5*l.KLP10 || l.KLStd <= 0 {
					t.Errorf("layer %d: router certainty barely varies (p10 %.4f, p90 %.4f)", l.Layer, l.KLP10, l.KLP90)
				}
			}
			if 2*skewed <= len(r.Layers) {
				t.Errorf("only %d of %d layers have a busiest expert at 1.5x the mean load", skewed, len(r.Layers))
			}
		})
	}
}
