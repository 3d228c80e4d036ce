package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchText is a few KB of the multilingual golden text, repeated.
func benchText(b *testing.B) string {
	src, err := os.ReadFile(filepath.Join("..", "tools", "tokgolden", "texts.json"))
	if err != nil {
		b.Skip(err)
	}
	return strings.Repeat(string(src), 4)
}

func BenchmarkFromGGUF(b *testing.B) {
	for _, gguf := range []string{"qwen3.gguf.gz", "mistral.gguf.gz"} {
		kv := loadKV(b, gguf)
		b.Run(gguf, func(b *testing.B) {
			for b.Loop() {
				if _, err := FromGGUF(kv); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncode(b *testing.B) {
	text := benchText(b)
	for _, v := range fuzzVocabs {
		tok := loadTokenizer(b, v.gguf, v.pre)
		b.Run(strings.TrimSuffix(v.gguf, ".gguf.gz")+"-"+v.pre, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, err := tok.Encode(text, true, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
