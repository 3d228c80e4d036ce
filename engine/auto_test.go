package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/trace"
	"github.com/commit-run/commit-run/tracerec"
)

// smallCard writes a profile of the rtx2080ti with mem bytes of memory.
func smallCard(t *testing.T, mem int64) string {
	t.Helper()
	p, err := sim.LoadProfile("rtx2080ti")
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.MemoryBytes = "small", mem
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "small.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return "sim:" + path
}

// TestAutoPlacementOpen: Open on a GPU with no placement asked for places the experts itself
// when the model does not fit, with an exact policy (commit only with AutoCommit), says so, and
// the numbers stay those of the CPU; a model that fits is left resident; NoAuto and a card too
// small even for offloading are clear errors.
func TestAutoPlacementOpen(t *testing.T) {
	prompt := []int32{1, 5, 9, 14, 3, 27, 8, 2, 11, 6}
	base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
	for _, path := range []string{"../models/testdata/tinymoe-qwen2moe.gguf", "../models/testdata/tinymoe-mixtral.gguf"} {
		want := runOn(t, path, base, prompt, 6)
		o := base
		o.Device = smallCard(t, 10<<20)
		m, err := engine.Open(path, o)
		if err != nil {
			t.Fatal(err)
		}
		plan, ok := m.AutoPlan()
		m.Close()
		if !ok || !strings.Contains(m.DeviceNote(), "auto placement: "+plan.Chosen.String()) {
			t.Fatalf("%s: no automatic placement on a 10 MiB card: %v, note %q", path, ok, m.DeviceNote())
		}
		for _, c := range plan.Candidates {
			if c.Offload.Policy == offload.Commit {
				t.Errorf("%s: weighed commit without AutoCommit", path)
			}
		}
		got := runOn(t, path, o, prompt, 6)
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%s: auto placement (%s) greedy %v, on the CPU %v", path, plan.Chosen, got.tokens, want.tokens)
		}
		for pos := range want.probs {
			if !slices.Equal(got.probs[pos], want.probs[pos]) {
				t.Fatalf("%s: auto placement (%s): probabilities differ at position %d", path, plan.Chosen, pos)
			}
		}

		o.AutoCommit = true
		m, err = engine.Open(path, o)
		if err != nil {
			t.Fatal(err)
		}
		plan, _ = m.AutoPlan()
		m.Close()
		if !slices.ContainsFunc(plan.Candidates, func(c engine.AutoCandidate) bool { return c.Offload.Policy == offload.Commit }) {
			t.Errorf("%s: AutoCommit, but commit was not weighed", path)
		}
	}

	fits := base
	fits.Device = "sim:rtx2080ti"
	const moe = "../models/testdata/tinymoe-qwen2moe.gguf"
	m, err := engine.Open(moe, fits)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.AutoPlan(); ok {
		t.Error("automatic placement of a model that fits the card")
	}
	m.Close()

	for _, c := range []struct {
		name   string
		mem    int64
		noAuto bool
		want   string
	}{
		{"NoAuto", 10 << 20, true, "do not fit"},
		{"too small for the resident weights", 1 << 20, false, "cannot run the model even with its experts in host memory"},
	} {
		o := base
		o.Device, o.NoAuto = smallCard(t, c.mem), c.noAuto
		if _, err := engine.Open(moe, o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// TestAutoPlacementTrace: with Options.AutoTrace, Open's automatic placement predicts with the
// model's own recorded routing and says so; a trace of another model, one too short for the
// sample and a missing file are clear errors.
func TestAutoPlacementTrace(t *testing.T) {
	const qwen, mixtral = "../models/testdata/tinymoe-qwen2moe.gguf", "../models/testdata/tinymoe-mixtral.gguf"
	dir := t.TempDir()
	record := func(model, name string, chars int) string {
		t.Helper()
		m, err := engine.Open(model, engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		path := filepath.Join(dir, name)
		w, err := trace.Create(path, tracerec.Header(m, tracerec.Options{}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tracerec.Text(context.Background(), m, heldOutPrefix(t, chars), 64, w); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
	own, short, foreign := record(qwen, "own.trace", 1500), record(qwen, "short.trace", 40), record(mixtral, "mixtral.trace", 400)
	o := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64, Device: smallCard(t, 10<<20), AutoTrace: own}
	m, err := engine.Open(qwen, o)
	if err != nil {
		t.Fatal(err)
	}
	plan, ok := m.AutoPlan()
	m.Close()
	if !ok || !strings.Contains(plan.Routing, own) || !strings.Contains(m.DeviceNote(), own) {
		t.Fatalf("auto placement with the model's trace: %v, routing %q, note %q", ok, plan.Routing, m.DeviceNote())
	}
	for _, c := range []struct{ trace, want string }{
		{foreign, "routes"},
		{short, "tokens; the routing sample needs"},
		{filepath.Join(dir, "missing.trace"), "missing.trace"},
	} {
		o.AutoTrace = c.trace
		if m, err := engine.Open(qwen, o); err == nil || !strings.Contains(err.Error(), c.want) {
			if m != nil {
				m.Close()
			}
			t.Errorf("trace %s: %v, want an error saying %q", c.trace, err, c.want)
		}
	}
}
