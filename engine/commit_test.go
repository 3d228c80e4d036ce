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
	"github.com/commit-run/commit-run/trace"
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

// The bundled models' Commit Routers predict most of the router's experts on held-out text
// (far better than the most-used experts), the first MoE layer of each window's first token
// is routed by the router, and committing to the predictions keeps perplexity close to the
// model's own.
func TestCommitRouterBundled(t *testing.T) {
	for _, c := range []struct {
		path     string
		minAcc   float64 // per layer within a token, on this slice
		minCross float64 // any layer with the cross-token commit
		maxLoss  float64 // relative perplexity increase with the model's OWA settings
	}{
		{bundledQwen, 0.7, 0.35, 0.03},
		{bundledMixtral, 0.6, 0.3, 0.03},
	} {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			text := heldOutPrefix(t, 12000)
			po := engine.PerplexityOptions{Window: 256, MaxTokens: 1024, Decode: true}
			rows, err := engine.CommitQuality(context.Background(), c.path, engine.Options{}, text, po, engine.QualityVariants("", ""))
			if err != nil {
				t.Fatal(err)
			}
			base, owaRow, crossRow := rows[0], rows[3], rows[6]
			info, _ := engine.Inspect(c.path)
			for _, r := range []engine.QualityRow{owaRow, crossRow} {
				st := r.Stats
				if st.FirstByRouter != 4 {
					t.Errorf("%s: %d first layers routed for want of a prediction, want one per window (4)", r.Name, st.FirstByRouter)
				}
				for j, l := range st.Layers {
					if j == 0 && r.Name == owaRow.Name {
						// Within a token: the first layer waits for its router.
						if l.Tokens != 0 {
							t.Errorf("%s: the first MoE layer committed %d tokens", r.Name, l.Tokens)
						}
						continue
					}
					if l.Tokens < 1000 {
						t.Errorf("%s: layer %d committed %d tokens of ~1020", r.Name, l.Layer, l.Tokens)
					}
					min := c.minAcc
					if r.Name == crossRow.Name {
						// Committing to cross-token mistakes moves the hidden states away from
						// those the predictors learnt from, so every layer predicts worse.
						min = c.minCross
					}
					if acc := l.Accuracy(info.ExpertsUsed); acc < min {
						t.Errorf("%s: layer %d: accuracy %.3f, want at least %.2f", r.Name, l.Layer, acc, min)
					}
				}
			}
			for _, r := range rows {
				t.Logf("%-24s perplexity %.4f (%+.2f%%) accuracy %.3f all wrong %.3f OWA %.3f", r.Name, r.Perplexity, 100*r.Delta, r.Accuracy, r.AllWrong, r.OWA)
			}
			if !math.IsNaN(base.Accuracy) {
				t.Errorf("the router's own choice reports accuracy %v", base.Accuracy)
			}
			if owaRow.Delta > c.maxLoss {
				t.Errorf("commit with OWA: perplexity %.4f, %.2f%% above the base %.4f", owaRow.Perplexity, 100*owaRow.Delta, base.Perplexity)
			}
			for _, r := range rows[1:] {
				if r.Perplexity == base.Perplexity {
					t.Errorf("%s: perplexity %v is the base's exactly: the predictions changed nothing", r.Name, r.Perplexity)
				}
			}
		})
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
// model has none; training refuses an empty trace and one recorded from another model.
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

	m, err := engine.Open(bundledQwen, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	empty := filepath.Join(dir, "empty.trace")
	w, err := trace.Create(empty, m.TraceHeader(engine.TraceOptions{Inputs: trace.InputsF16, Logits: true}))
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := m.TrainCommitRouter(context.Background(), empty, engine.TrainRouterOptions{TrainOptions: predictor.DefaultTrainOptions()}); err == nil || !strings.Contains(err.Error(), "no tokens") {
		t.Errorf("training on an empty trace: %v", err)
	}
	mx, err := engine.Open(bundledMixtral, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mx.Close()
	foreign := filepath.Join(dir, "mixtral.trace")
	w, err = trace.Create(foreign, mx.TraceHeader(engine.TraceOptions{Inputs: trace.InputsF16, Logits: true}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mx.RecordTrace(context.Background(), heldOutPrefix(t, 2000), 128, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := m.TrainCommitRouter(context.Background(), foreign, engine.TrainRouterOptions{TrainOptions: predictor.DefaultTrainOptions()}); err == nil || !strings.Contains(err.Error(), "does not come from") {
		t.Errorf("training on another model's trace: %v", err)
	}

	// A trace cut short is scored on the tokens it holds; one cut inside its header is not.
	own := filepath.Join(dir, "own.trace")
	if w, err = trace.Create(own, m.TraceHeader(engine.TraceOptions{Inputs: trace.InputsF16, Logits: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := m.RecordTrace(context.Background(), heldOutPrefix(t, 6000), 128, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b, _ = os.ReadFile(own)
	r, err := predictor.Load(predictor.SidecarPath(bundledQwen))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n  int
		ok bool
	}{{len(b) * 2 / 3, true}, {20, false}} {
		os.WriteFile(own, b[:c.n], 0o644)
		rep, err := m.EvalCommitRouter(r, own, predictor.All, 0)
		if c.ok != (err == nil) || c.ok && rep.Samples == 0 {
			t.Errorf("a trace cut to %d of %d bytes: %d samples, %v", c.n, len(b), rep.Samples, err)
		}
	}
}
