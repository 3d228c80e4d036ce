package tokenizer

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/ollama/ollama/fs/ggml"
)

// The golden files hold llama.cpp's answers for tools/tokgolden/texts.json,
// produced by tools/tokgolden (node-llama-cpp's prebuilt llama.cpp) for
// vocab-only GGUFs of real tokenizers. See tools/tokgolden/README.md.

type goldenCase struct {
	Text         string  `json:"text"`
	Special      bool    `json:"special"`
	IDs          []int32 `json:"ids"`
	Detok        string  `json:"detok"`
	DetokSpecial string  `json:"detok_special"`
}

type goldenFile struct {
	Vocab        string            `json:"vocab"`
	Pre          string            `json:"pre"`
	GGUF         string            `json:"gguf"`
	LlamaCpp     string            `json:"llama_cpp"`
	Cases        []goldenCase      `json:"cases"`
	BOS          *int32            `json:"bos"`
	EOS          *int32            `json:"eos"`
	AddBOS       *bool             `json:"add_bos"`
	EOG          []int32           `json:"eog"`
	Attrs        map[string]uint32 `json:"attrs"`
	PiecesSHA256 string            `json:"pieces_sha256"`
	PiecesSample map[string]string `json:"pieces_sample"`
}

var (
	kvCacheMu sync.Mutex
	kvCache   = map[string]ggml.KV{}
)

// loadKV decodes a gzipped vocab-only GGUF from testdata, once per test
// binary, and returns a copy callers may modify.
func loadKV(t testing.TB, name string) ggml.KV {
	t.Helper()
	kvCacheMu.Lock()
	defer kvCacheMu.Unlock()
	kv, ok := kvCache[name]
	if !ok {
		f, err := os.Open(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		g, err := ggml.Decode(bytes.NewReader(raw), -1)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		kv = g.KV()
		kvCache[name] = kv
	}
	return maps.Clone(kv)
}

var (
	tokCacheMu sync.Mutex
	tokCache   = map[string]*Tokenizer{}
)

// loadTokenizer builds the tokenizer for a testdata GGUF with the given
// tokenizer.ggml.pre (empty keeps the file's).
func loadTokenizer(t testing.TB, gguf, pre string) *Tokenizer {
	t.Helper()
	key := gguf + "|" + pre
	tokCacheMu.Lock()
	tok, ok := tokCache[key]
	tokCacheMu.Unlock()
	if ok {
		return tok
	}
	kv := loadKV(t, gguf)
	if pre != "" {
		kv[keyPre] = pre
	}
	tok, err := FromGGUF(kv)
	if err != nil {
		t.Fatalf("%s (pre %q): %v", gguf, pre, err)
	}
	tokCacheMu.Lock()
	tokCache[key] = tok
	tokCacheMu.Unlock()
	return tok
}

func readGoldens(t testing.TB) []goldenFile {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "golden", "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden files (%v); run tools/tokgolden", err)
	}
	var out []goldenFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var g goldenFile
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out = append(out, g)
	}
	return out
}

// jsString decodes bytes as a JavaScript engine does (WHATWG UTF-8: each
// maximal invalid subsequence becomes one U+FFFD). llama.cpp's detokenized
// bytes reached the golden files through such a decoder, so ours must too
// before comparing.
func jsString(b []byte) string {
	var out []rune
	for i := 0; i < len(b); {
		c := b[i]
		if c < 0x80 {
			out = append(out, rune(c))
			i++
			continue
		}
		var need int
		lo, hi := byte(0x80), byte(0xBF)
		var cp rune
		switch {
		case c >= 0xC2 && c <= 0xDF:
			need, cp = 1, rune(c&0x1F)
		case c >= 0xE0 && c <= 0xEF:
			need, cp = 2, rune(c&0x0F)
			if c == 0xE0 {
				lo = 0xA0
			} else if c == 0xED {
				hi = 0x9F
			}
		case c >= 0xF0 && c <= 0xF4:
			need, cp = 3, rune(c&0x07)
			if c == 0xF0 {
				lo = 0x90
			} else if c == 0xF4 {
				hi = 0x8F
			}
		default:
			out = append(out, utf8.RuneError)
			i++
			continue
		}
		j, ok := i+1, true
		for k := 0; k < need; k++ {
			if j >= len(b) || b[j] < lo || b[j] > hi {
				ok = false
				break
			}
			cp = cp<<6 | rune(b[j]&0x3F)
			j++
			lo, hi = 0x80, 0xBF
		}
		if !ok {
			out = append(out, utf8.RuneError)
		} else {
			out = append(out, cp)
		}
		i = j
	}
	return string(out)
}

// TestGoldenEncode: our ids equal llama.cpp's for every text, vocabulary
// and pre-tokenizer, with and without special-token parsing; so does
// llama.cpp's detokenizer output.
func TestGoldenEncode(t *testing.T) {
	for _, g := range readGoldens(t) {
		t.Run(g.Vocab+"-"+g.Pre, func(t *testing.T) {
			t.Parallel()
			tok := loadTokenizer(t, g.GGUF, g.Pre)
			if len(tok.Warnings()) > 0 {
				t.Errorf("unexpected warnings: %v", tok.Warnings())
			}
			fails := 0
			for i, c := range g.Cases {
				got, err := tok.Encode(c.Text, false, c.Special)
				if err != nil {
					t.Errorf("case %d Encode(%q, special=%v): %v", i, c.Text, c.Special, err)
					continue
				}
				if !slices.Equal(got, c.IDs) && fails < 5 {
					fails++
					t.Errorf("case %d Encode(%q, special=%v)\n got %v\nwant %v (%s)", i, c.Text, c.Special, got, c.IDs, g.LlamaCpp)
				}
				if d := jsString([]byte(tok.Detokenize(c.IDs, false, false))); d != c.Detok {
					t.Errorf("case %d Detokenize(%v, special=false) = %q, llama.cpp %q", i, c.IDs, d, c.Detok)
				}
				if d := jsString([]byte(tok.Detokenize(c.IDs, false, true))); d != c.DetokSpecial {
					t.Errorf("case %d Detokenize(%v, special=true) = %q, llama.cpp %q", i, c.IDs, d, c.DetokSpecial)
				}
			}
		})
	}
}

// TestGoldenVocab: special ids, end-of-generation set, token attributes and
// every token's rendered piece agree with llama.cpp.
func TestGoldenVocab(t *testing.T) {
	for _, g := range readGoldens(t) {
		if g.PiecesSHA256 == "" {
			continue
		}
		t.Run(g.Vocab, func(t *testing.T) {
			t.Parallel()
			tok := loadTokenizer(t, g.GGUF, g.Pre)
			if bos, ok := tok.BOS(); g.BOS != nil && (!ok || bos != *g.BOS) {
				t.Errorf("BOS() = %d, %v; llama.cpp %d", bos, ok, *g.BOS)
			}
			if g.EOS != nil && tok.EOS() != *g.EOS {
				t.Errorf("EOS() = %d; llama.cpp %d", tok.EOS(), *g.EOS)
			}
			if g.AddBOS != nil && tok.AddBOS() != *g.AddBOS {
				t.Errorf("AddBOS() = %v; llama.cpp %v", tok.AddBOS(), *g.AddBOS)
			}
			if got := tok.EOGTokens(); !slices.Equal(got, g.EOG) {
				t.Errorf("EOG tokens %v; llama.cpp %v", got, g.EOG)
			}
			for id := range tok.VocabSize() {
				want := uint32(attrNormal)
				if a, ok := g.Attrs[strconv.Itoa(id)]; ok {
					want = a
				}
				if got := uint32(tok.attrs[id]); got != want {
					t.Errorf("token %d %q attributes %#x; llama.cpp %#x", id, tok.tokens[id], got, want)
				}
			}
			h := sha256.New()
			for id := range tok.VocabSize() {
				p := jsString([]byte(tok.TokenText(int32(id))))
				if want, ok := g.PiecesSample[strconv.Itoa(id)]; ok && p != want {
					t.Errorf("TokenText(%d) = %q; llama.cpp %q", id, p, want)
				}
				h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(p))))
				h.Write([]byte(p))
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != g.PiecesSHA256 {
				t.Errorf("TokenText over the vocabulary hashes to %s; llama.cpp's pieces to %s", got, g.PiecesSHA256)
			}
		})
	}
}

// TestGoldenRoundTrip: Decode(Encode(s)) == s for every golden text.
func TestGoldenRoundTrip(t *testing.T) {
	for _, g := range readGoldens(t) {
		t.Run(g.Vocab+"-"+g.Pre, func(t *testing.T) {
			t.Parallel()
			tok := loadTokenizer(t, g.GGUF, g.Pre)
			for _, c := range g.Cases {
				// SentencePiece prompts get a space after each special token
				// (llama.cpp does so too), and a literal "▁" in the text is
				// SentencePiece's own space, so those do not round-trip there.
				if tok.Model() == "llama" && (c.Special || strings.Contains(c.Text, "\u2581")) {
					continue
				}
				ids, err := tok.Encode(c.Text, false, c.Special)
				if err != nil {
					t.Fatal(err)
				}
				if got := tok.Decode(ids); got != c.Text {
					t.Errorf("Decode(Encode(%q, special=%v)) = %q", c.Text, c.Special, got)
				}
			}
		})
	}
}
