package engine_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/predictor"
)

const (
	bundledQwen    = "../models/testdata/tinymoe-qwen2moe.gguf"
	bundledMixtral = "../models/testdata/tinymoe-mixtral.gguf"
)

// heldOutPrefix is the start of the held-out text: enough for a few windows.
func heldOutPrefix(t *testing.T, n int) string {
	t.Helper()
	b, err := os.ReadFile(heldOutText)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
}

// Evaluating one token per pass computes what batches compute: the decode path that commit
// is measured with starts from the same numbers.
func TestDecodeEvalMatchesBatches(t *testing.T) {
	m, err := engine.Open(bundledQwen, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	text := heldOutPrefix(t, 4000)
	po := engine.PerplexityOptions{Window: 128, MaxTokens: 300}
	batched, err := m.PerplexityWith(context.Background(), text, po)
	if err != nil {
		t.Fatal(err)
	}
	po.Decode = true
	decoded, err := m.PerplexityWith(context.Background(), text, po)
	if err != nil {
		t.Fatal(err)
	}
	if batched.Tokens != 297 || decoded.Tokens != batched.Tokens {
		t.Fatalf("scored %d and %d tokens, want 297 (300 in windows of 128)", batched.Tokens, decoded.Tokens)
	}
	// Not bit for bit: a batch and a single token take different kernel paths (6e-7 relative
	// on this slice with an F32 cache), and with the F16 cache a batch's attention also reads
	// some keys and values that a single token reads rounded (5e-6).
	if d := math.Abs(decoded.NLL/batched.NLL - 1); d > 1e-4 {
		t.Errorf("one token per pass: NLL %v, batches %v (relative difference %.2g)", decoded.NLL, batched.NLL, d)
	}
}

// Offloading with the Commit Router moves experts but computes what committed routing without
// offloading computes, bit for bit, on the CPU and on a simulated GPU; the predictor's weights
// count against the device budget.
func TestOffloadCommitRouter(t *testing.T) {
	prompt := heldOutPrefix(t, 300)
	run := func(opts engine.Options) ([]int32, engine.CommitStats, engine.OffloadStats) {
		m, err := engine.Open(bundledQwen, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		s, _ := m.NewSession()
		defer s.Close()
		ids, _ := m.Tokenize(prompt, true)
		res, err := s.Generate(context.Background(), ids, engine.GenerateOptions{MaxTokens: 24, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
		if err != nil {
			t.Fatal(err)
		}
		cs, _ := m.CommitStats()
		ost, _ := m.Offload()
		return res.Tokens, cs, ost
	}
	want, wantStats, _ := run(engine.Options{Commit: &engine.CommitOptions{}})
	info, _ := engine.Inspect(bundledQwen)
	for _, dev := range []string{"cpu", "sim:rtx2080ti"} {
		opts := engine.Options{Device: dev, ContextLength: 512, Offload: &engine.OffloadOptions{Policy: offload.Commit}}
		st := offloadProbe(t, bundledQwen, opts)
		for _, mem := range []int64{st.Resident + 24*st.SlotBytes, st.Resident + info.ExpertBytes + 8<<20} {
			opts.Offload.GPUMem = mem
			got, cs, ost := run(opts)
			if !slices.Equal(got, want) {
				t.Errorf("%s, %d-byte budget: offloaded commit decoded %v, committed routing %v", dev, mem, got, want)
			}
			if !slices.EqualFunc(cs.Layers, wantStats.Layers, func(a, b engine.CommitLayerStats) bool { return a == b }) {
				t.Errorf("%s: commit counts %+v, without offloading %+v", dev, cs.Layers, wantStats.Layers)
			}
			if ost.Predicted == 0 || ost.Correct*2 < ost.Predicted {
				t.Errorf("%s: the offloader scored %d of %d predictions right", dev, ost.Correct, ost.Predicted)
			}
			if ost.PeakDeviceMem > ost.DeviceMemLimit {
				t.Errorf("%s: peak device memory %d over the %d budget", dev, ost.PeakDeviceMem, ost.DeviceMemLimit)
			}
		}
	}
}

// A Commit Router is refused for another model, when its file is damaged, and when the
// model has none (training's bad input: commitrouter's TestTrainBadInput).
func TestCommitRouterBadInput(t *testing.T) {
	dir := t.TempDir()
	open := func(pred string) error {
		m, err := engine.Open(bundledQwen, engine.Options{Commit: &engine.CommitOptions{Predictor: pred}})
		if err == nil {
			m.Close()
		}
		return err
	}
	other := predictor.SidecarPath(bundledMixtral)
	if err := open(other); err == nil || !strings.Contains(err.Error(), "tinymoe-mixtral") {
		t.Errorf("the Mixtral model's Commit Router on the Qwen model: %v", err)
	}
	b, err := os.ReadFile(predictor.SidecarPath(bundledQwen))
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.gguf")
	os.WriteFile(cut, b[:len(b)/2], 0o644)
	if err := open(cut); err == nil {
		t.Error("a truncated Commit Router file was accepted")
	}
	if err := open(filepath.Join(dir, "none.gguf")); err == nil || !strings.Contains(err.Error(), "none.gguf") {
		t.Errorf("a missing Commit Router file: %v", err)
	}
	// A model without a sidecar: the error says how to make one.
	if _, err := engine.Open(tinyModel, engine.Options{Commit: &engine.CommitOptions{}}); err == nil || !strings.Contains(err.Error(), "predictor train") {
		t.Errorf("a model without a Commit Router: %v", err)
	}
	if _, err := engine.Open(bundledQwen, engine.Options{Commit: &engine.CommitOptions{OWASpec: "a1=7,range=9"}}); err == nil || !strings.Contains(err.Error(), "range") {
		t.Errorf("an impossible OWA range: %v", err)
	}

}
