package main

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/commit-run/commit-run/engine"
)

// parseTokens parses "1,2,3" (spaces allowed, and the brackets of a JSON array, so that the
// "tokens" of generate --json can be pasted back) into token ids.
func parseTokens(s string) ([]int32, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]") {
		t = strings.TrimSpace(t[1 : len(t)-1])
	}
	if t == "" {
		return nil, fmt.Errorf("--tokens: no token ids given (want a list like 1,2,3)")
	}
	parts := strings.Split(t, ",")
	ids := make([]int32, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("--tokens: empty id at position %d (want a list like 1,2,3)", i)
		}
		v, err := strconv.ParseInt(p, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens: %q at position %d is not a token id (want a list like 1,2,3)", p, i)
		}
		if v < 0 {
			return nil, fmt.Errorf("--tokens: negative id %d at position %d", v, i)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}

// checkVocab reports the first id outside the model's vocabulary. The engine rejects such ids
// too, but here the message can say which position and what the range is.
func checkVocab(ids []int32, vocab int) error {
	if vocab <= 0 {
		return nil // the model did not say; leave it to the engine
	}
	for i, id := range ids {
		if int(id) >= vocab {
			return fmt.Errorf("--tokens: id %d at position %d is out of range: the vocabulary has %d tokens (0..%d)", id, i, vocab, vocab-1)
		}
	}
	return nil
}

// genFlags are the generation flags shared by generate and chat.
type genFlags struct {
	maxTokens     int
	greedy        bool
	temp          float32
	topK          int
	topP          float32
	repeatPenalty float32
	repeatLastN   int
	seed          uint64
	stop          []string
	ignoreEOS     bool

	fs *pflag.FlagSet
}

// Defaults follow llama.cpp's so that results are comparable with it.
func (g *genFlags) register(fs *pflag.FlagSet, withIgnoreEOS bool) {
	g.fs = fs
	fs.IntVarP(&g.maxTokens, "max-tokens", "n", 0, "maximum tokens to generate (0 = until end of text or the context is full)")
	fs.BoolVar(&g.greedy, "greedy", false, "always pick the most likely token (overrides the sampling flags)")
	fs.Float32Var(&g.temp, "temp", 0.8, "sampling temperature (0 = greedy)")
	fs.IntVar(&g.topK, "top-k", 40, "sample from the K most likely tokens (0 = off)")
	fs.Float32Var(&g.topP, "top-p", 0.95, "nucleus sampling mass (1 = off)")
	fs.Float32Var(&g.repeatPenalty, "repeat-penalty", 1.0, "penalty for recently seen tokens (1 = off)")
	fs.IntVar(&g.repeatLastN, "repeat-last-n", 64, "how many recent tokens the repeat penalty looks at (0 = 64)")
	fs.Uint64Var(&g.seed, "seed", 0, "sampling seed (default: random)")
	fs.StringArrayVar(&g.stop, "stop", nil, "stop when `STR` is generated (repeatable)")
	if withIgnoreEOS {
		fs.BoolVar(&g.ignoreEOS, "ignore-eos", false, "keep generating past end-of-text tokens")
	}
}

// maxGenTokens rejects -n values that can only be typos: no context is that long.
const maxGenTokens = maxCtx

// options validates the flags and builds the engine's options. The seed is drawn at random
// unless --seed was given, so repeated runs differ as users expect; callers print it so that
// a run can be replayed.
func (g *genFlags) options() (engine.GenerateOptions, error) {
	var o engine.GenerateOptions
	finite := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }
	switch {
	case g.maxTokens < 0 || g.maxTokens > maxGenTokens:
		return o, fmt.Errorf("-n %d: want 0 (no limit) to %d", g.maxTokens, maxGenTokens)
	case !finite(g.temp) || g.temp < 0:
		return o, fmt.Errorf("--temp %v: want a number >= 0", g.temp)
	case g.topK < 0:
		return o, fmt.Errorf("--top-k %d: want >= 0 (0 = off)", g.topK)
	case !finite(g.topP) || g.topP < 0 || g.topP > 1:
		return o, fmt.Errorf("--top-p %v: want a number in [0, 1]", g.topP)
	case !finite(g.repeatPenalty) || g.repeatPenalty < 0:
		return o, fmt.Errorf("--repeat-penalty %v: want a number >= 0 (1 = off)", g.repeatPenalty)
	case g.repeatLastN < 0:
		return o, fmt.Errorf("--repeat-last-n %d: want >= 0", g.repeatLastN)
	}
	for _, s := range g.stop {
		if s == "" {
			return o, fmt.Errorf("--stop: empty string would stop at once")
		}
	}
	seed := g.seed
	if g.fs == nil || !g.fs.Changed("seed") {
		var b [8]byte
		rand.Read(b[:])
		seed = binary.LittleEndian.Uint64(b[:])
		g.seed = seed
	}
	o.MaxTokens = g.maxTokens
	o.Stop = g.stop
	o.IgnoreEOS = g.ignoreEOS
	o.Sampler = engine.SamplerOptions{
		Temperature:   g.temp,
		TopK:          g.topK,
		TopP:          g.topP,
		RepeatPenalty: g.repeatPenalty,
		RepeatLastN:   g.repeatLastN,
		Seed:          seed,
		Greedy:        g.greedy,
	}
	return o, nil
}
