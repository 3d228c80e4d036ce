package engine_test

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// longFixture is llama.cpp on a long sequence of a golden model with a sliding window
// (tools/golden/ref/long.mjs): the logits after a few prompt positions and the greedy
// continuation, with llama.cpp's top-1/top-2 margin at each step.
type longFixture struct {
	Name           string    `json:"name"`
	SHA256         string    `json:"sha256"`
	Vocab          int       `json:"vocab"`
	Prompt         []int32   `json:"prompt"`
	LogitPositions []int     `json:"logit_positions"`
	Logits         string    `json:"logits"`
	Greedy         []int32   `json:"greedy"`
	GreedyMargins  []float64 `json:"greedy_margins"`
	logits         []float32
}

func loadLongFixture(t *testing.T, path string) *longFixture {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var fx longFixture
	if err := json.NewDecoder(zr).Decode(&fx); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := base64.StdEncoding.DecodeString(fx.Logits)
	if err != nil || len(b) != 4*len(fx.LogitPositions)*fx.Vocab || len(fx.GreedyMargins) != len(fx.Greedy) || len(fx.Greedy) == 0 {
		t.Fatalf("%s: %d bytes of logits for %d positions of %d tokens, %d greedy tokens with %d margins (%v)",
			path, len(b), len(fx.LogitPositions), fx.Vocab, len(fx.Greedy), len(fx.GreedyMargins), err)
	}
	for i := 0; i < len(b); i += 4 {
		fx.logits = append(fx.logits, math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))
	}
	return &fx
}

// nearTie is the top-1/top-2 logit gap under which a greedy step is llama.cpp's by a hair: an
// engine that takes the other token there is not wrong (golden.mjs's MIN_MARGIN).
const nearTie = 0.05

// TestGoldenLong holds gpt-oss against llama.cpp far past its sliding window: a 900-token
// prompt and a 300-token greedy continuation. With a context of 4096 the windowed layers keep
// a ring of 384 slots (models.RingPeriod: the golden's window of 8 and passes of 256), which
// the prompt's passes go round twice and the continuation twice more; with 2048 they keep
// every position. Either way the next-token distributions at every 64th prompt position and
// the last must be llama.cpp's within the all-F32 golden tolerance, and the greedy tokens
// llama.cpp's up to the first step it took by a near-tie (a logit gap under 0.05), if any.
func TestGoldenLong(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "golden-long", "*.json.gz"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures in testdata/golden-long (%v)", err)
	}
	for _, p := range paths {
		fx := loadLongFixture(t, p)
		t.Run(fx.Name, func(t *testing.T) {
			path := goldenModel(t, &fixture.Fixture{Name: fx.Name, SHA256: fx.SHA256})
			perPos := map[int]float64{} // KV cache bytes per position of the context
			for _, ctxLen := range []int{4096, 2048} {
				t.Run(fmt.Sprint("context=", ctxLen), func(t *testing.T) { perPos[ctxLen] = checkLong(t, path, fx, ctxLen) })
			}
			if !(perPos[4096] < perPos[2048]) {
				t.Errorf("KV cache bytes per position: %v: the context of 4096 keeps no ring", perPos)
			}
		})
	}
}

// checkLong runs fx at a context of ctxLen and returns the KV cache's bytes per position.
func checkLong(t *testing.T, path string, fx *longFixture, ctxLen int) float64 {
	m, s := openSession(t, path, engine.Options{Threads: 2, KVType: "f32", ContextLength: ctxLen})
	defer m.Close()
	defer s.Close()
	kv := float64(m.KVCacheBytes()) / float64(ctxLen)
	ctx := context.Background()
	at := 0 // the next of LogitPositions
	err := s.Probs(ctx, fx.Prompt, func(pos int, probs []float32) error {
		if at >= len(fx.LogitPositions) || pos != fx.LogitPositions[at] {
			return nil
		}
		want := fixture.Softmax(fx.logits[at*fx.Vocab : (at+1)*fx.Vocab])
		at++
		if d := fixture.CompareProbs(probs, want); d.Exceeds(fixture.TolF32) {
			t.Errorf("position %d: p[token %d] = %.6f, llama.cpp %.6f, |diff| %.3g > %g", pos, d.Token, d.Got, d.Want, d.Max, fixture.TolF32)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if at != len(fx.LogitPositions) {
		t.Fatalf("compared %d of the %d positions with logits", at, len(fx.LogitPositions))
	}
	res, err := s.Generate(ctx, fx.Prompt, engine.GenerateOptions{MaxTokens: len(fx.Greedy), IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
	if err != nil {
		t.Fatal(err)
	}
	i := fixture.FirstMismatch(res.Tokens, fx.Greedy)
	switch {
	case i < 0:
	case i >= len(res.Tokens):
		t.Errorf("greedy: the engine stopped after %d tokens (%q), llama.cpp made %d", len(res.Tokens), res.Reason, len(fx.Greedy))
	case fx.GreedyMargins[i] < nearTie:
		t.Logf("greedy: llama.cpp's tokens up to step %d, which llama.cpp took by a logit gap of %.4f", i, fx.GreedyMargins[i])
	default:
		t.Errorf("greedy step %d (position %d): engine chose %d, llama.cpp %d by a logit gap of %.3f",
			i, len(fx.Prompt)+i, res.Tokens[i], fx.Greedy[i], fx.GreedyMargins[i])
	}
	return kv
}
