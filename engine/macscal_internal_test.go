package engine

import (
	"context"
	"os"
	"testing"

	"github.com/commit-run/commit-run/eprun"
	"github.com/commit-run/commit-run/multigpu"
)

// The calibration's centroids (eprun.Centroids over macsCalibration) are
// multigpu.ExpertCentroids of the routing the model reports for the same windows: every layer,
// every expert, and only the tokens asked for.
func TestMACSCentroids(t *testing.T) {
	const path = "../models/testdata/tinymoe-qwen2moe.gguf"
	raw, err := os.ReadFile("../models/testdata/war-and-peace-heldout.txt")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw[200000:203000])
	m, err := Open(path, Options{Threads: 2, ContextLength: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	moeIdx := make([]int, len(m.arch.Layers))
	batches := []multigpu.Batch{}
	for i, l := range m.arch.Layers {
		moeIdx[i] = -1
		if l.MoE != nil {
			moeIdx[i] = len(batches)
			batches = append(batches, multigpu.Batch{Routing: multigpu.Routing{Experts: l.MoE.Experts, K: l.MoE.Used}, Dim: m.arch.Config.Embd})
		}
	}
	n, err := m.Observe(context.Background(), text, 512, func(ev *RouteEvent) {
		b := &batches[moeIdx[ev.Layer]]
		b.Choice = append(b.Choice, ev.Selected...)
		b.Score = append(b.Score, ev.Weights...)
		b.Features = append(b.Features, ev.Input...)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n <= 512 {
		t.Fatalf("%d tokens: the text should span more than one window", n)
	}
	cal := eprun.Model{Arch: m.arch, Calibrate: macsCalibration(path, Options{Threads: 2})}
	mu, ran, err := eprun.Centroids(cal, text, 1<<20, moeIdx)
	if err != nil {
		t.Fatal(err)
	}
	if ran != n || len(mu) != len(batches) {
		t.Fatalf("ran %d tokens over %d layers; the model routed %d over %d", ran, len(mu), n, len(batches))
	}
	for j, b := range batches {
		want, err := multigpu.ExpertCentroids(b)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range want {
			if d := mu[j][i] - v; d > 1e-5 || d < -1e-5 {
				t.Fatalf("MoE layer %d, expert %d, element %d: %v, want %v", j, i/b.Dim, i%b.Dim, mu[j][i], v)
			}
		}
	}
	if _, ran, err := eprun.Centroids(cal, text, 100, moeIdx); err != nil || ran != 100 {
		t.Errorf("100 tokens asked: ran %d, %v", ran, err)
	}
	if _, _, err := eprun.Centroids(cal, "a", 100, moeIdx); err == nil {
		t.Error("a calibration text of one token: no error")
	}
}
