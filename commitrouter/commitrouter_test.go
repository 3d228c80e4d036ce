package commitrouter_test

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/commitrouter"
	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/predictor"
	"github.com/commit-run/commit-run/trace"
	"github.com/commit-run/commit-run/tracerec"
)

const (
	bundledQwen    = "../models/testdata/tinymoe-qwen2moe.gguf"
	bundledMixtral = "../models/testdata/tinymoe-mixtral.gguf"
	heldOutText    = "../models/testdata/war-and-peace-heldout.txt"
)

// heldOutPrefix is the first n bytes of the held-out text.
func heldOutPrefix(t *testing.T, n int) string {
	t.Helper()
	b, err := os.ReadFile(heldOutText)
	if err != nil {
		t.Fatal(err)
	}
	return string(b[:n])
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
			rows, err := commitrouter.Quality(context.Background(), c.path, engine.Options{}, text, po, commitrouter.Variants("", ""))
			if err != nil {
				t.Fatal(err)
			}
			base, owaRow, crossRow := rows[0], rows[3], rows[6]
			info, _ := engine.Inspect(c.path)
			for _, r := range []commitrouter.Row{owaRow, crossRow} {
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

// Training refuses an empty trace and one recorded from another model; a trace cut short is
// scored on the tokens it holds, one cut inside its header is not.
func TestTrainBadInput(t *testing.T) {
	dir := t.TempDir()
	m, err := engine.Open(bundledQwen, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	empty := filepath.Join(dir, "empty.trace")
	w, err := trace.Create(empty, tracerec.Header(m, tracerec.Options{Inputs: trace.InputsF16, Logits: true}))
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := commitrouter.Train(context.Background(), m, empty, commitrouter.TrainOptions{TrainOptions: predictor.DefaultTrainOptions()}); err == nil || !strings.Contains(err.Error(), "no tokens") {
		t.Errorf("training on an empty trace: %v", err)
	}
	mx, err := engine.Open(bundledMixtral, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mx.Close()
	foreign := filepath.Join(dir, "mixtral.trace")
	w, err = trace.Create(foreign, tracerec.Header(mx, tracerec.Options{Inputs: trace.InputsF16, Logits: true}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tracerec.Text(context.Background(), mx, heldOutPrefix(t, 2000), 128, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := commitrouter.Train(context.Background(), m, foreign, commitrouter.TrainOptions{TrainOptions: predictor.DefaultTrainOptions()}); err == nil || !strings.Contains(err.Error(), "does not come from") {
		t.Errorf("training on another model's trace: %v", err)
	}

	// A trace cut short is scored on the tokens it holds; one cut inside its header is not.
	own := filepath.Join(dir, "own.trace")
	if w, err = trace.Create(own, tracerec.Header(m, tracerec.Options{Inputs: trace.InputsF16, Logits: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := tracerec.Text(context.Background(), m, heldOutPrefix(t, 6000), 128, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	b, _ := os.ReadFile(own)
	r, err := predictor.Load(predictor.SidecarPath(bundledQwen))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		n  int
		ok bool
	}{{len(b) * 2 / 3, true}, {20, false}} {
		os.WriteFile(own, b[:c.n], 0o644)
		rep, err := commitrouter.Evaluate(m, r, own, predictor.All, 0)
		if c.ok != (err == nil) || c.ok && rep.Samples == 0 {
			t.Errorf("a trace cut to %d of %d bytes: %d samples, %v", c.n, len(b), rep.Samples, err)
		}
	}
}
