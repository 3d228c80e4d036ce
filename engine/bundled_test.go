package engine_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

// The bundled trained models (tools/tinymoe) and the held-out text they never trained on.
const (
	heldOutText = "../models/testdata/war-and-peace-heldout.txt"
	pplDir      = "testdata/ppl"
)

var pplWindows = flag.Int("ppl.windows", 32, "held-out windows TestBundledPerplexity scores (0 = all)")

// pplRecord is what tools/golden/ref/ppl.mjs wrote: llama.cpp's perplexity of the held-out
// text with the engine's windows, window by window.
type pplRecord struct {
	Model       string       `json:"model"`
	ModelSHA256 string       `json:"model_sha256"`
	TextSHA256  string       `json:"text_sha256"`
	Window      int          `json:"window"`
	Tokens      int          `json:"tokens"`
	Perplexity  float64      `json:"perplexity"`
	Windows     [][2]float64 `json:"windows"` // scored tokens, negative log-likelihood
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestBundledPerplexity checks the engine's held-out perplexity of each bundled model against
// llama.cpp's on the same file and the same tokens (regenerate with tools/tinymoe/golden.sh).
func TestBundledPerplexity(t *testing.T) {
	paths, _ := filepath.Glob(filepath.Join(pplDir, "*.json"))
	if len(paths) == 0 {
		t.Fatalf("no llama.cpp perplexity records in %s", pplDir)
	}
	text, err := os.ReadFile(heldOutText)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var rec pplRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		t.Run(filepath.Base(rec.Model), func(t *testing.T) {
			model := filepath.Join("..", filepath.FromSlash(rec.Model))
			if got := sha256File(t, model); got != rec.ModelSHA256 {
				t.Fatalf("%s changed since its record was made (regenerate with tools/tinymoe/golden.sh)", rec.Model)
			}
			if got := sha256File(t, heldOutText); got != rec.TextSHA256 {
				t.Fatalf("%s changed since %s was made", heldOutText, p)
			}
			m, err := engine.Open(model, engine.Options{KVType: "f32", Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ids, err := m.Tokenize(string(text), false)
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != rec.Tokens {
				t.Fatalf("engine has %d held-out tokens, llama.cpp %d", len(ids), rec.Tokens)
			}
			s, err := m.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			n := len(rec.Windows)
			if *pplWindows > 0 {
				n = min(n, *pplWindows)
			}
			var ours, theirs, scored float64
			for w := 0; w < n; w++ {
				win := ids[w*rec.Window : min((w+1)*rec.Window, len(ids))]
				var nll float64
				err := s.Probs(context.Background(), win, func(pos int, p []float32) error {
					if pos+1 < len(win) {
						nll -= math.Log(float64(p[win[pos+1]]))
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if want := rec.Windows[w][1]; math.Abs(nll-want) > 1e-4*want {
					t.Errorf("window %d: negative log-likelihood %.6f, llama.cpp %.6f", w, nll, want)
				}
				ours += nll
				theirs += rec.Windows[w][1]
				scored += rec.Windows[w][0]
			}
			po, pt := math.Exp(ours/scored), math.Exp(theirs/scored)
			t.Logf("perplexity over %d windows (%.0f tokens): engine %.5f, llama.cpp %.5f (whole text: llama.cpp %.4f)", n, scored, po, pt, rec.Perplexity)
			if math.Abs(po-pt) > 1e-4*pt {
				t.Errorf("perplexity %.5f, llama.cpp %.5f", po, pt)
			}
		})
	}
}

// TestBundledChat checks that `commit-run chat` on a bundled model answers a line with a
// paragraph: the file's chat template makes the conversation paragraphs of the story and its
// stop string ends the reply at the paragraph's end.
func TestBundledChat(t *testing.T) {
	models := bundledModels(t)
	for _, path := range models {
		t.Run(filepath.Base(path), func(t *testing.T) {
			m, err := engine.Open(path, engine.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if got := m.Info().ChatStop; len(got) != 1 || got[0] != "\n\n" {
				t.Fatalf("chat stop strings %q, want [\"\\n\\n\"]", got)
			}
			// A sampled reply of this small model now and then runs to the context's end (one
			// seed in twenty): most of three must end at the paragraph's end, none past it.
			ended := 0
			for seed := range uint64(3) {
				s, err := m.NewSession()
				if err != nil {
					t.Fatal(err)
				}
				res, err := s.Chat(context.Background(), []engine.Message{{Role: "user", Content: "Prince Andrew looked at Pierre and said nothing."}},
					engine.GenerateOptions{MaxTokens: 400, Sampler: engine.SamplerOptions{Temperature: 0.8, TopP: 0.95, Seed: 7 + seed}})
				s.Close()
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("reply (%s): %q", res.Reason, res.Text)
				if strings.Contains(res.Text, "\n\n") {
					t.Errorf("reply went on past the blank line: %q", res.Text)
				}
				if res.Reason == engine.StopString && len(res.Text) >= 10 {
					ended++
				}
			}
			if ended < 2 {
				t.Errorf("%d of 3 replies ended at a paragraph's end, want most", ended)
			}
		})
	}
}

// bundledModels are the trained models in ../models/testdata, without their Commit Router
// sidecar files.
func bundledModels(t *testing.T) []string {
	t.Helper()
	paths, _ := filepath.Glob("../models/testdata/tinymoe-*.gguf")
	paths = slices.DeleteFunc(paths, func(p string) bool { return strings.HasSuffix(p, ".commit-router.gguf") })
	if len(paths) == 0 {
		t.Fatal("no bundled trained models in ../models/testdata")
	}
	return paths
}
