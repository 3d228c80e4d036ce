package main

import (
	"slices"
	"testing"

	"github.com/commit-run/commit-run/models"
)

func TestPromptIDs(t *testing.T) {
	f, err := models.Open("../../../models/testdata/tiny.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pool, err := ordinaryTokens(f)
	if err != nil {
		t.Fatal(err)
	}
	types := f.KV.Ints("tokenizer.ggml.token_type")
	if len(pool) == 0 || len(pool) >= len(types) {
		t.Fatalf("%d ordinary tokens of %d", len(pool), len(types))
	}
	for _, id := range pool {
		if types[id] != tokenNormal {
			t.Fatalf("token %d has type %d", id, types[id])
		}
	}
	long := promptIDs(pool, 64, 1)
	if !slices.Equal(promptIDs(pool, 16, 1), long[:16]) {
		t.Error("a shorter prompt is not a prefix of a longer one")
	}
	if !slices.Equal(promptIDs(pool, 64, 1), long) || slices.Equal(promptIDs(pool, 64, 2), long) {
		t.Error("prompts do not follow the seed")
	}
	for _, id := range long {
		if !slices.Contains(pool, id) {
			t.Errorf("prompt token %d is not an ordinary token", id)
		}
	}
}
