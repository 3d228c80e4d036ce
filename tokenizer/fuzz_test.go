package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzVocabs are the tokenizers FuzzEncodeDecode exercises: every splitter
// path (hand-written qwen2/llama3/gpt2, the collapsed-regex and plain-regex
// paths of deepseek-llm) and SentencePiece.
var fuzzVocabs = []struct{ gguf, pre string }{
	{"qwen3.gguf.gz", ""},
	{"qwen3.gguf.gz", "llama3"},
	{"qwen3.gguf.gz", "olmo"},
	{"qwen3.gguf.gz", "deepseek-llm"},
	{"deepseek3.gguf.gz", ""},
	{"mistral.gguf.gz", ""},
}

// FuzzEncodeDecode: Encode never panics; it fails only where llama.cpp does
// (malformed UTF-8 decoding past U+10FFFF); valid UTF-8 round-trips through
// Decode on byte-level vocabularies (and on SentencePiece without special
// parsing or literal "▁"); the stream decoder yields the same text.
func FuzzEncodeDecode(f *testing.F) {
	for _, g := range readGoldens(f) {
		for _, c := range g.Cases {
			f.Add(c.Text, c.Special)
		}
		break
	}
	f.Add("\xf7\xbf\xbf\xbf x \xed\xa0\x80 \xc0\x80", true)
	f.Add("<|im_end|><|im_end|>\x00<s></s>", true)

	f.Fuzz(func(t *testing.T, text string, special bool) {
		valid := utf8.ValidString(text)
		for _, v := range fuzzVocabs {
			tok := loadTokenizer(t, v.gguf, v.pre)
			ids, err := tok.Encode(text, true, special)
			if err != nil {
				if valid {
					t.Fatalf("%s/%s: Encode(%q, special=%v): %v", v.gguf, v.pre, text, special, err)
				}
				continue
			}
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("%s/%s: id %d out of range", v.gguf, v.pre, id)
				}
			}
			plain, err := tok.Encode(text, false, special)
			if err != nil {
				t.Fatal(err)
			}
			_ = tok.Detokenize(ids, true, false)
			dec := tok.Decode(plain)
			if !valid {
				continue
			}
			if tok.Model() == "gpt2" || (!special && !strings.Contains(text, "\u2581")) {
				if dec != text {
					t.Fatalf("%s/%s: Decode(Encode(%q, special=%v)) = %q", v.gguf, v.pre, text, special, dec)
				}
			}
			d := tok.NewStreamDecoder()
			var b strings.Builder
			for _, id := range plain {
				b.WriteString(d.Next(id))
			}
			b.WriteString(d.Flush())
			// Streaming keeps SentencePiece's prefix space, Decode drops it.
			want := dec
			if tok.Model() == "llama" && len(plain) > 0 && strings.HasPrefix(tok.TokenText(plain[0]), " ") {
				want = " " + dec
			}
			if b.String() != want && utf8.ValidString(want) {
				t.Fatalf("%s/%s: streamed %q, Decode %q", v.gguf, v.pre, b.String(), want)
			}
		}
	})
}
