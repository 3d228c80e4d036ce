package tinymoe

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

// TestBundledBeatsUnigram checks the first thing a trained language model must show: on text
// it never saw, it predicts far better than the token frequencies of its training text. The
// engine scores the first windows of the held-out text (the closing numbers of issue 3 use the
// whole text: commit-run eval ppl).
func TestBundledBeatsUnigram(t *testing.T) {
	paths, _ := filepath.Glob("../../models/testdata/tinymoe-*.gguf")
	// Not the Commit Router sidecar files beside them.
	paths = slices.DeleteFunc(paths, func(p string) bool { return strings.HasSuffix(p, ".commit-router.gguf") })
	if len(paths) == 0 {
		t.Fatal("no bundled trained models")
	}
	src, err := FindText(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	train, held, err := Split(string(b))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			m, err := engine.Open(p, engine.Options{Threads: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			trainIDs, err := m.Tokenize(train, false)
			if err != nil {
				t.Fatal(err)
			}
			// A prefix of the held-out text, cut at a line end.
			part := held[:strings.LastIndexByte(held[:24000], '\n')+1]
			heldIDs, err := m.Tokenize(part, false)
			if err != nil {
				t.Fatal(err)
			}
			unigram := UnigramBitsPerByte(trainIDs, heldIDs, m.Info().Vocab, len(part))
			r, err := m.Perplexity(t.Context(), part, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("held-out prefix: %.3f bits/byte (perplexity %.2f), unigram %.3f", r.BitsPerByte, r.Perplexity, unigram)
			if r.BitsPerByte > unigram-0.4 {
				t.Errorf("%.3f bits/byte is not clearly better than the unigram's %.3f", r.BitsPerByte, unigram)
			}
		})
	}
}
