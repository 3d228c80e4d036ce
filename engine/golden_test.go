package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/synth"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// goldenDir holds what llama.cpp computed on each synthetic model of synth
// (regenerate with tools/golden/regen.sh; see tools/golden/README.md).
const goldenDir = "testdata/golden"

// TestGolden runs the engine on every golden model and compares it with llama.cpp: the
// next-token distribution after every prompt position (max absolute difference of any
// probability within 1e-3 for all-F32 models, 5e-3 for F16, BF16 and quantized ones) and the
// 32-token greedy continuation, which must be identical. The models are not stored: each is
// regenerated from its seed, and its SHA-256 must match the file llama.cpp ran on.
//
// Like the reference, the engine runs with an F32 KV cache and the reference's thread count.
func TestGolden(t *testing.T) {
	fxs, err := fixture.LoadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(fxs) == 0 {
		t.Fatalf("no fixtures in %s", goldenDir)
	}
	for _, fx := range fxs {
		t.Run(fx.Name, func(t *testing.T) { checkGolden(t, fx) })
	}
}

func checkGolden(t *testing.T, fx *fixture.Fixture) {
	path := goldenModel(t, fx)

	m, err := engine.Open(path, engine.Options{Threads: fx.Generator.Threads, KVType: "f32"})
	if err != nil {
		t.Fatalf("open %s: %v", fx.Name, err)
	}
	defer m.Close()

	t.Run("probs", func(t *testing.T) { checkProbs(t, m, fx) })
	t.Run("greedy", func(t *testing.T) { checkGreedy(t, m, fx) })
	t.Run("tokenize", func(t *testing.T) { checkTokenize(t, m, fx) })
}

// checkProbs compares the distribution after every prompt position and reports the first
// position beyond tolerance with the token, both probabilities and both top-5 lists, plus the
// worst difference over all positions.
func checkProbs(t *testing.T, m *engine.Model, fx *fixture.Fixture) {
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	tol := fx.Tolerance()
	var (
		next     int
		worst    fixture.Diff
		worstPos = -1
		failure  string
	)
	err = s.Probs(context.Background(), fx.Prompt, func(pos int, probs []float32) error {
		if pos != next {
			return fmt.Errorf("distribution for position %d, expected position %d", pos, next)
		}
		next++
		want := fx.Probs(pos)
		d := fixture.CompareProbs(probs, want)
		if worstPos < 0 || d.Exceeds(worst.Max) {
			worst, worstPos = d, pos
		}
		if d.Exceeds(tol) && failure == "" {
			got := make([]float64, len(probs))
			for i, v := range probs {
				got[i] = float64(v)
			}
			failure = fmt.Sprintf("%s: position %d (after token %d): p[token %d] = %.6f, llama.cpp %.6f, |diff| %.3g > %g\n"+
				"  engine top-5 %v, llama.cpp top-5 %v",
				fx.Name, pos, fx.Prompt[pos], d.Token, d.Got, d.Want, d.Max, tol,
				topWith(got, 5), topWith(want, 5))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s: Probs: %v", fx.Name, err)
	}
	if next != len(fx.Prompt) {
		t.Fatalf("%s: Probs reported %d positions, want %d", fx.Name, next, len(fx.Prompt))
	}
	if failure != "" {
		t.Errorf("%s\n  worst over all positions: |diff| %.3g at position %d token %d", failure, worst.Max, worstPos, worst.Token)
		return
	}
	t.Logf("%s: max |diff| %.3g at position %d (tolerance %g)", fx.Name, worst.Max, worstPos, tol)
}

// checkGreedy requires the identical greedy continuation; the fixtures' prompts were chosen so
// that no step of llama.cpp's continuation is a near-tie (margins are in the message).
func checkGreedy(t *testing.T, m *engine.Model, fx *fixture.Fixture) {
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Generate(context.Background(), fx.Prompt, engine.GenerateOptions{
		MaxTokens: len(fx.Greedy),
		Sampler:   engine.SamplerOptions{Greedy: true},
		IgnoreEOS: true,
	})
	if err != nil {
		t.Fatalf("%s: Generate: %v", fx.Name, err)
	}
	i := fixture.FirstMismatch(res.Tokens, fx.Greedy)
	switch {
	case i < 0:
		return
	case i >= len(res.Tokens):
		t.Errorf("%s: engine stopped after %d tokens (reason %q), llama.cpp made %d:\n  engine    %v\n  llama.cpp %v",
			fx.Name, len(res.Tokens), res.Reason, len(fx.Greedy), res.Tokens, fx.Greedy)
	default:
		t.Errorf("%s: greedy step %d: engine chose %d, llama.cpp %d (llama.cpp's top-1/top-2 logit margin there %.3f)\n"+
			"  engine    %v\n  llama.cpp %v", fx.Name, i, res.Tokens[i], fx.Greedy[i], fx.GreedyMargins[i], res.Tokens, fx.Greedy)
	}
}

// checkTokenize compares the tokenization of a few texts without special tokens, which the
// fixtures record from the same llama.cpp run.
func checkTokenize(t *testing.T, m *engine.Model, fx *fixture.Fixture) {
	for _, c := range fx.Tokenize {
		got, err := m.Tokenize(c.Text, false)
		if err != nil {
			t.Fatalf("%s: Tokenize(%q): %v", fx.Name, c.Text, err)
		}
		if !slices.Equal(got, c.IDs) {
			t.Errorf("%s: Tokenize(%q):\n  engine    %v\n  llama.cpp %v", fx.Name, c.Text, got, c.IDs)
		}
	}
}

// topWith lists the k most likely tokens as "id:prob".
func topWith(p []float64, k int) []string {
	var out []string
	for _, id := range fixture.Top(p, k) {
		out = append(out, fmt.Sprintf("%d:%.4f", id, p[id]))
	}
	return out
}

// goldenModel returns the model file a fixture was made from: the committed file of a bundled
// model, or the synth model regenerated into a temporary directory. Either way its hash must be
// the fixture's.
func goldenModel(t *testing.T, fx *fixture.Fixture) string {
	t.Helper()
	if fx.Model != "" {
		path := filepath.Join("..", filepath.FromSlash(fx.Model))
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("fixture %s: %v", fx.Name, err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != fx.SHA256 {
			t.Fatalf("%s has sha256 %x, but the fixture was made from %s: the model changed "+
				"(regenerate its fixture with tools/tinymoe/golden.sh)", fx.Model, sum, fx.SHA256)
		}
		return path
	}
	path := filepath.Join(t.TempDir(), fx.Name+".gguf")
	sum, err := synth.WriteGolden(fx.Name, path)
	if err != nil {
		t.Fatal(err)
	}
	if sum != fx.SHA256 {
		t.Fatalf("regenerated %s has sha256 %s, but the fixture was made from %s: the generator changed "+
			"(regenerate the fixtures with tools/golden/regen.sh) or this platform computes it differently", fx.Name, sum, fx.SHA256)
	}
	return path
}
