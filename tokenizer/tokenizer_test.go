package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/ollama/ollama/fs/ggml"
)

// TestAddSpecial: BOS/EOS follow add_bos_token/add_eos_token and
// llama.cpp's defaults (SentencePiece adds BOS; Qwen does not; DeepSeek's
// file asks for it).
func TestAddSpecial(t *testing.T) {
	for _, tc := range []struct {
		gguf           string
		addBOS         bool
		bos            int32
		first, lastEOS bool
	}{
		{"mistral.gguf.gz", true, 1, true, false},
		{"qwen3.gguf.gz", false, 151643, false, false},
		{"deepseek3.gguf.gz", true, 0, true, false},
	} {
		tok := loadTokenizer(t, tc.gguf, "")
		if tok.AddBOS() != tc.addBOS {
			t.Errorf("%s: AddBOS() = %v", tc.gguf, tok.AddBOS())
		}
		if bos, ok := tok.BOS(); !ok || bos != tc.bos {
			t.Errorf("%s: BOS() = %d, %v", tc.gguf, bos, ok)
		}
		plain, err := tok.Encode("Hello world", false, false)
		if err != nil {
			t.Fatal(err)
		}
		with, err := tok.Encode("Hello world", true, false)
		if err != nil {
			t.Fatal(err)
		}
		want := plain
		if tc.addBOS {
			want = append([]int32{tc.bos}, plain...)
		}
		if !slices.Equal(with, want) {
			t.Errorf("%s: Encode(addSpecial) = %v, want %v", tc.gguf, with, want)
		}
		empty, _ := tok.Encode("", true, false)
		if tc.addBOS && !slices.Equal(empty, []int32{tc.bos}) || !tc.addBOS && len(empty) != 0 {
			t.Errorf("%s: Encode(\"\", addSpecial) = %v", tc.gguf, empty)
		}
	}

	// add_eos_token appends EOS; Detokenize(removeSpecial) drops both.
	kv := loadKV(t, "mistral.gguf.gz")
	kv[keyAddEOS] = true
	tok, err := FromGGUF(kv)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("Hi", true, false)
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || ids[len(ids)-1] != 2 {
		t.Errorf("add_eos: %v", ids)
	}
	if got := tok.Detokenize(ids, true, true); got != " Hi" {
		// llama.cpp keeps the word's space once it has removed the BOS.
		t.Errorf("Detokenize(removeSpecial) = %q", got)
	}
	if got := tok.Detokenize(ids, false, true); got != "<s> Hi</s>" {
		t.Errorf("Detokenize = %q", got)
	}
}

// TestEOG: the end-of-generation set of each fixture.
func TestEOG(t *testing.T) {
	q := loadTokenizer(t, "qwen3.gguf.gz", "")
	for _, s := range []string{"<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"} {
		id, ok := q.TokenID(s)
		if !ok || !q.IsEOG(id) {
			t.Errorf("qwen3: %s (%d) not EOG", s, id)
		}
	}
	if id, _ := q.TokenID("<|im_start|>"); q.IsEOG(id) {
		t.Error("qwen3: <|im_start|> is EOG")
	}
	if q.EOS() != 151645 {
		t.Errorf("qwen3 EOS = %d", q.EOS())
	}
	m := loadTokenizer(t, "mistral.gguf.gz", "")
	if !m.IsEOG(2) || m.IsEOG(1) || m.IsEOG(-1) || m.IsEOG(1<<30) {
		t.Error("mistral EOG set wrong")
	}
}

// TestUnknownPre: llama.cpp's default pre-tokenizer stands in for an unknown
// or missing tokenizer.ggml.pre, with a warning; known pre-tokenizers this
// package cannot do are refused.
func TestUnknownPre(t *testing.T) {
	def := loadTokenizer(t, "qwen3.gguf.gz", "default")
	for _, pre := range []string{"no-such-pre", ""} {
		kv := loadKV(t, "qwen3.gguf.gz")
		if pre == "" {
			delete(kv, keyPre)
		} else {
			kv[keyPre] = pre
		}
		tok, err := FromGGUF(kv)
		if err != nil {
			t.Fatal(err)
		}
		w := tok.Warnings()
		if len(w) != 1 || !strings.Contains(w[0], keyPre) || !strings.Contains(w[0], "default") || (pre != "" && !strings.Contains(w[0], pre)) {
			t.Errorf("pre %q: warnings %q", pre, w)
		}
		text := "Hello 1234567 world!!  \n\n x"
		a, _ := tok.Encode(text, false, false)
		b, _ := def.Encode(text, false, false)
		if !slices.Equal(a, b) {
			t.Errorf("pre %q: %v, default gives %v", pre, a, b)
		}
	}
	kv := loadKV(t, "qwen3.gguf.gz")
	kv[keyPre] = "kimi-k2"
	if _, err := FromGGUF(kv); err == nil || !strings.Contains(err.Error(), "kimi-k2") {
		t.Errorf("kimi-k2: err %v", err)
	}
}

// TestBadMetadata: broken or hostile metadata is an error naming the key,
// never a panic.
func TestBadMetadata(t *testing.T) {
	base := func() ggml.KV {
		return ggml.KV{
			keyArch:   "qwen3",
			keyModel:  "gpt2",
			keyPre:    "qwen2",
			keyTokens: []string{"a", "b", "ab", "<|im_end|>"},
			keyMerges: []string{"a b"},
		}
	}
	if _, err := FromGGUF(base()); err != nil {
		t.Fatalf("minimal vocabulary: %v", err)
	}
	for _, tc := range []struct {
		name, key string
		edit      func(ggml.KV)
	}{
		{"no model", keyModel, func(kv ggml.KV) { delete(kv, keyModel) }},
		{"unknown model", keyModel, func(kv ggml.KV) { kv[keyModel] = "bert" }},
		{"model not a string", keyModel, func(kv ggml.KV) { kv[keyModel] = uint32(3) }},
		{"no tokens", keyTokens, func(kv ggml.KV) { delete(kv, keyTokens) }},
		{"empty tokens", keyTokens, func(kv ggml.KV) { kv[keyTokens] = []string{} }},
		{"tokens wrong type", keyTokens, func(kv ggml.KV) { kv[keyTokens] = []int32{1, 2} }},
		{"duplicate token", keyTokens, func(kv ggml.KV) { kv[keyTokens] = []string{"a", "b", "a"} }},
		{"no merges", keyMerges, func(kv ggml.KV) { delete(kv, keyMerges) }},
		{"merges wrong type", keyMerges, func(kv ggml.KV) { kv[keyMerges] = []float32{1} }},
		{"merges scalar", keyMerges, func(kv ggml.KV) { kv[keyMerges] = "a b" }},
		{"short token types", keyTokenType, func(kv ggml.KV) { kv[keyTokenType] = []int32{1} }},
		{"token types wrong type", keyTokenType, func(kv ggml.KV) { kv[keyTokenType] = []string{"x"} }},
		{"short scores", keyScores, func(kv ggml.KV) { kv[keyScores] = []float32{0} }},
		{"bos out of range", "tokenizer.ggml.bos_token_id", func(kv ggml.KV) { kv["tokenizer.ggml.bos_token_id"] = uint32(99) }},
		{"eos negative", "tokenizer.ggml.eos_token_id", func(kv ggml.KV) { kv["tokenizer.ggml.eos_token_id"] = int32(-5) }},
		{"eos wrong type", "tokenizer.ggml.eos_token_id", func(kv ggml.KV) { kv["tokenizer.ggml.eos_token_id"] = "2" }},
		{"padding huge", "tokenizer.ggml.padding_token_id", func(kv ggml.KV) { kv["tokenizer.ggml.padding_token_id"] = uint64(1 << 40) }},
		{"add_bos wrong type", keyAddBOS, func(kv ggml.KV) { kv[keyAddBOS] = uint32(1) }},
		{"template wrong type", keyChatTemplate, func(kv ggml.KV) { kv[keyChatTemplate] = []string{"x"} }},
		{"arch wrong type", keyArch, func(kv ggml.KV) { kv[keyArch] = 7 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := base()
			tc.edit(kv)
			tok, err := FromGGUF(kv)
			if err == nil {
				t.Fatalf("no error (tokenizer %v)", tok != nil)
			}
			if !strings.Contains(err.Error(), tc.key) {
				t.Errorf("error %q does not name %s", err, tc.key)
			}
		})
	}

	// Odd but loadable metadata must not panic either.
	odd := base()
	odd[keyTokens] = []string{"", "a", "\xff\xfe", "<0xZZ>", "<0x"}
	odd[keyTokenType] = []int32{0, 1, 1, typeByte, typeByte}
	odd[keyMerges] = []string{"", " ", "a", "a  b", "\xff"}
	tok, err := FromGGUF(odd)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"", "a", "aaa b \xff\xfe", "<0xZZ>"} {
		if _, err := tok.Encode(s, true, true); err != nil {
			t.Errorf("Encode(%q): %v", s, err)
		}
	}
	_ = tok.Decode([]int32{-1, 0, 1, 2, 3, 4, 5, 1 << 30})

	// A SentencePiece vocabulary without byte tokens cannot encode unknown
	// characters: llama.cpp throws, we return an error.
	spm, err := FromGGUF(ggml.KV{keyArch: "llama", keyModel: "llama", keyTokens: []string{"<unk>", "<s>", "</s>", "▁a"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spm.Encode("a", false, false); err != nil {
		t.Errorf("Encode(a): %v", err)
	}
	if _, err := spm.Encode("é", false, false); err == nil || !strings.Contains(err.Error(), "byte-fallback") {
		t.Errorf("Encode(é) without byte tokens: err %v", err)
	}
	// add_bos without a BOS token is an error when encoding, as llama.cpp asserts.
	nobos := base()
	nobos[keyAddBOS] = true
	nobos[keyPre] = "chatglm-bpe"
	tok, err = FromGGUF(nobos)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tok.Encode("a", true, false); err == nil {
		t.Error("Encode with add_bos and no BOS: no error")
	}
}

// TestArraysNotLoaded: a KV decoded with a small maxArraySize says so.
func TestArraysNotLoaded(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "*.gguf")
	if err != nil {
		t.Fatal(err)
	}
	kv := ggml.KV{keyArch: "qwen3", keyModel: "gpt2", keyPre: "qwen2", keyTokens: []string{"a", "b", "ab"}, keyMerges: []string{"a b"}}
	if err := ggml.WriteGGUF(f, kv, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		t.Fatal(err)
	}
	g, err := ggml.Decode(f, 1)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	_, err = FromGGUF(g.KV())
	if err == nil || !strings.Contains(err.Error(), "maxArraySize") || !strings.Contains(err.Error(), keyTokens) {
		t.Errorf("err %v", err)
	}
	// Decoded in full, the same file loads.
	if _, err := os.Stat(f.Name()); err == nil {
		r, _ := os.Open(f.Name())
		defer r.Close()
		g, err := ggml.Decode(r, -1)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := FromGGUF(g.KV())
		if err != nil {
			t.Fatal(err)
		}
		if ids, _ := tok.Encode("ab", false, false); !slices.Equal(ids, []int32{2}) {
			t.Errorf("Encode(ab) = %v", ids)
		}
	}
}

// TestStreamDecoder: characters split across tokens come out whole, once.
func TestStreamDecoder(t *testing.T) {
	for _, gguf := range []string{"qwen3.gguf.gz", "mistral.gguf.gz", "deepseek3.gguf.gz"} {
		tok := loadTokenizer(t, gguf, "")
		text := "Grüße 你好 👨‍👩‍👧‍👦 🇩🇪 ok"
		ids, err := tok.Encode(text, false, false)
		if err != nil {
			t.Fatal(err)
		}
		d := tok.NewStreamDecoder()
		var b strings.Builder
		for _, id := range ids {
			s := d.Next(id)
			if !utf8.ValidString(s) {
				t.Errorf("%s: Next(%d) = %q is not valid UTF-8", gguf, id, s)
			}
			b.WriteString(s)
		}
		b.WriteString(d.Flush())
		want := text
		if tok.Model() == "llama" {
			want = " " + text // pieces keep SentencePiece's prefix space
		}
		if b.String() != want {
			t.Errorf("%s: streamed %q, want %q", gguf, b.String(), want)
		}
	}
	// Invalid bytes become U+FFFD; an unfinished sequence waits, then flushes.
	tok := loadTokenizer(t, "mistral.gguf.gz", "")
	byteID := func(b byte) int32 {
		id, err := tok.byteToken(b)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	d := tok.NewStreamDecoder()
	if s := d.Next(byteID(0xE4)); s != "" {
		t.Errorf("lead byte alone gave %q", s)
	}
	if s := d.Next(byteID(0xBD)); s != "" {
		t.Errorf("two of three bytes gave %q", s)
	}
	if s := d.Next(byteID(0xA0)); s != "你" {
		t.Errorf("completed sequence gave %q", s)
	}
	if s := d.Next(byteID(0x80)); s != "\uFFFD" {
		t.Errorf("stray continuation gave %q", s)
	}
	d.Next(byteID(0xF0))
	if s := d.Flush(); s != "\uFFFD" {
		t.Errorf("Flush of unfinished sequence gave %q", s)
	}
}

// TestConcurrentEncode: a Tokenizer is shared by goroutines (run with -race).
func TestConcurrentEncode(t *testing.T) {
	tok := loadTokenizer(t, "qwen3.gguf.gz", "")
	want, _ := tok.Encode("Hello 世界 1234 <|im_end|>", false, true)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				got, err := tok.Encode("Hello 世界 1234 <|im_end|>", false, true)
				if err != nil || !slices.Equal(got, want) {
					t.Errorf("got %v, %v", got, err)
					return
				}
				_, _ = tok.RenderChat([]Message{{Role: "user", Content: "x"}}, true)
			}
		})
	}
	wg.Wait()
}

// TestTokenText: pieces as llama.cpp renders them.
func TestTokenText(t *testing.T) {
	m := loadTokenizer(t, "mistral.gguf.gz", "")
	for id, want := range map[int32]string{1: "<s>", 2: "</s>", 0: "<unk>", 13: "\n", 22557: " Hello"} {
		if got := m.TokenText(id); got != want {
			t.Errorf("mistral TokenText(%d) = %q, want %q", id, got, want)
		}
	}
	q := loadTokenizer(t, "qwen3.gguf.gz", "")
	for id, want := range map[int32]string{9707: "Hello", 1879: " world", 151645: "<|im_end|>", 198: "\n", -1: "", 1 << 30: ""} {
		if got := q.TokenText(id); got != want {
			t.Errorf("qwen3 TokenText(%d) = %q, want %q", id, got, want)
		}
	}
	if q.VocabSize() != 151669 || m.VocabSize() != 32000 {
		t.Errorf("VocabSize %d %d", q.VocabSize(), m.VocabSize())
	}
}

// TestFixturesSmall keeps the committed fixtures within budget.
func TestFixturesSmall(t *testing.T) {
	var total int64
	err := filepath.Walk("testdata", func(_ string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			total += info.Size()
		}
		return err
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if total > 12<<20 {
		t.Errorf("testdata is %d bytes, over 12 MiB", total)
	}
}
