package main

import (
	"fmt"
	"math/rand/v2"

	"github.com/commit-run/commit-run/models"
)

// tokenNormal is llama.cpp's LLAMA_TOKEN_TYPE_NORMAL in tokenizer.ggml.token_type.
const tokenNormal = 1

// ordinaryTokens lists a GGUF file's ordinary tokens: no control, byte, unused or special
// tokens, which could end a generation or be treated apart by either engine.
func ordinaryTokens(f *models.File) ([]int32, error) {
	types := f.KV.Ints("tokenizer.ggml.token_type")
	var ids []int32
	for id, t := range types {
		if t == tokenNormal {
			ids = append(ids, int32(id))
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%s: no ordinary tokens in tokenizer.ggml.token_type", f.Path)
	}
	return ids, nil
}

// promptIDs draws n token ids from pool with a fixed seed: the same prompt for both engines
// and every run, and a shorter prompt is a prefix of a longer one.
func promptIDs(pool []int32, n int, seed uint64) []int32 {
	r := rand.New(rand.NewPCG(seed, 0x636f6d6d69742d72))
	out := make([]int32, n)
	for i := range out {
		out[i] = pool[r.IntN(len(pool))]
	}
	return out
}
