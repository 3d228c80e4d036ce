package grammar

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/tokenizer"
	"github.com/ollama/ollama/fs/ggml"
)

// testVocab: every printable byte, the bytes of two-byte characters, and tokens that cross
// JSON's structure, with a special token (id 0) and an end-of-generation one (id 1).
func testVocab() ([]string, *Vocab) {
	pieces := []string{"<|special|>", "<|eos|>", "", "\n", "\n  ", "\t", "\xc3", "\xa9", "é", "日本",
		`{"`, `":`, `",`, `"}`, ` "`, `"`, `true`, `null`, `12`, `-0.`, `e+`, `abc"`, `\u00`, `\"`, `"]`,
		`[{`, `}]`, `},`, `name`, `age`, `tags`, `kind`, `dog`, `", "`, `": "`, `": `, "\xe6\x97", "\xa5"}
	for b := 0x20; b < 0x7f; b++ {
		pieces = append(pieces, string(rune(b)))
	}
	v := NewVocab(pieces, func(id int32) bool { return id == 0 }, []int32{1})
	return pieces, v
}

// TestMatcher: Mask allows exactly the tokens whose bytes the recognizer accepts from the
// current state (special tokens never, the end-of-generation token after a whole value), on
// random walks through the allowed tokens, which always end in a value the grammar matches.
func TestMatcher(t *testing.T) {
	pieces, v := testVocab()
	schema, err := Compile([]byte(testSchema))
	if err != nil {
		t.Fatal(err)
	}
	for gi, g := range []*Grammar{JSON(), JSONObject(), schema} {
		for seed := range 40 {
			rng := rand.New(rand.NewPCG(uint64(seed), uint64(gi)))
			m := NewMatcher(v, g)
			var text []byte
			logits := make([]float32, len(pieces))
			for step := 0; !m.Done(); step++ {
				if step > 2000 {
					t.Fatalf("%s seed %d: no end after 2000 tokens: %q", g, seed, text)
				}
				for i := range logits {
					logits[i] = 0
				}
				if !m.Mask(logits) {
					t.Fatalf("%s seed %d: no token allowed after %q", g, seed, text)
				}
				var allowed []int32
				for id, p := range pieces {
					want := false
					switch {
					case id == 0 || p == "":
					case id == 1:
						want = m.r.Complete()
					default:
						want = m.r.Clone().Feed([]byte(p))
					}
					if got := !math.IsInf(float64(logits[id]), -1); got != want {
						t.Fatalf("%s seed %d after %q: token %q allowed %v, want %v", g, seed, text, p, got, want)
					}
					if want {
						allowed = append(allowed, int32(id))
					}
				}
				// Closing tokens are drawn more often, so that walks end.
				id := allowed[rng.IntN(len(allowed))]
				if step > 30 {
					for _, a := range allowed {
						if a == 1 || bytes.ContainsAny([]byte(pieces[a]), "}]\"") && rng.IntN(2) == 0 {
							id = a
						}
					}
				}
				m.Accept(id)
				if err := m.Err(); err != nil {
					t.Fatal(err)
				}
				if id != 1 {
					text = append(text, pieces[id]...)
				}
			}
			if !g.Match(text) || !json.Valid(text) {
				t.Fatalf("%s seed %d: ended with %q, which does not match", g, seed, text)
			}
		}
	}
}

func TestMatcherRefuses(t *testing.T) {
	_, v := testVocab()
	m := NewMatcher(v, JSONObject())
	m.Accept(1) // end of generation before a value
	if m.Err() == nil || m.Done() {
		t.Error("EOS first: want an error")
	}
	m = NewMatcher(v, JSONObject())
	m.Accept(16) // true: not an object
	if m.Err() == nil || m.Mask(make([]float32, v.Size())) {
		t.Error("true for an object: want an error, and no token allowed after it")
	}
}

// qwen3 loads the vocabulary of Qwen3 from the tokenizer's test data (a vocab-only GGUF of
// the real tokenizer): 151,669 tokens, byte-level BPE and the special ones.
//
// qwen3Logits is the size of Qwen3's output, padded beyond the vocabulary: the filter masks
// the padding too.
const qwen3Logits = 151936

func qwen3(tb testing.TB) (*tokenizer.Tokenizer, *Vocab) {
	f, err := os.Open(filepath.Join("..", "tokenizer", "testdata", "qwen3.gguf.gz"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := ggml.Decode(bytes.NewReader(raw), -1)
	if err != nil {
		tb.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(g.KV())
	if err != nil {
		tb.Fatal(err)
	}
	pieces := make([]string, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.TokenText(int32(id))
	}
	return tok, NewVocab(pieces, tok.IsSpecial, tok.EOGTokens())
}

// pieces are the vocabulary's tokens' bytes.
func (v *Vocab) pieces() []string {
	out := make([]string, v.size)
	for id := range out {
		out[id] = string(v.piece(int32(id)))
	}
	return out
}

// benchDoc is what the benchmark generates: keys, short and long strings with spaces and
// punctuation, non-ASCII text, numbers, a nested array, pretty-printed.
const benchDoc = `{
  "name": "Pierre Bezukhov",
  "age": 27,
  "tags": ["count", "Moscow", "freemason"],
  "kind": "dog",
  "ok": true,
  "score": -12.5e3,
  "bio": "The illegitimate son of a wealthy count, he inherits a vast fortune — and with it a place in Petersburg society — which he never quite knows how to use; «Что делать?» he asks himself, as the French march on Moscow."
}`

const benchSchema = `{"type": "object", "properties": {
  "name": {"type": "string"}, "age": {"type": "integer"},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "kind": {"enum": ["cat", "dog"]}, "ok": {"type": "boolean"}, "score": {"type": "number"},
  "bio": {"type": "string", "maxLength": 1000}},
  "required": ["name", "age", "bio"], "additionalProperties": false}`

// TestQwen3Document: the matcher allows every token of a real tokenizer's encoding of a
// document the schema accepts, and the document ends it.
func TestQwen3Document(t *testing.T) {
	tok, v := qwen3(t)
	ids, err := tok.Encode(benchDoc, false, false)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := Compile([]byte(benchSchema))
	if err != nil {
		t.Fatal(err)
	}
	logits := make([]float32, qwen3Logits)
	for _, g := range []*Grammar{JSON(), JSONObject(), schema} {
		m := NewMatcher(v, g)
		for i, id := range ids {
			clear(logits)
			if !m.Mask(logits) || math.IsInf(float64(logits[id]), -1) {
				t.Fatalf("%s: token %d (%q) of the document refused", g, i, tok.TokenText(id))
			}
			for j := v.Size(); j < qwen3Logits; j++ {
				if !math.IsInf(float64(logits[j]), -1) {
					t.Fatalf("%s: padding row %d allowed", g, j)
				}
			}
			m.Accept(id)
		}
		if !m.Done() {
			t.Errorf("%s: the document did not end the value", g)
		}
	}
	m := NewMatcher(v, schema)
	start := m.r.Clone()
	if n := testing.AllocsPerRun(5, func() {
		m.r.copyFrom(start)
		for _, id := range ids {
			m.Mask(logits)
			m.Accept(id)
		}
	}); n != 0 {
		t.Errorf("%v allocations for the document's tokens", n)
	}
}

// BenchmarkMatcher measures the time the grammar stage adds per token on Qwen3's real
// vocabulary (tokenizer/testdata/qwen3.gguf.gz: 151,669 tokens, in logits of 151,936 as
// Qwen3's output has them): Mask and Accept over the tokens of a pretty-printed document,
// under any JSON and under a schema, averaged over the document's mix of structure, keys,
// numbers and string text.
func BenchmarkMatcher(b *testing.B) {
	tok, v := qwen3(b)
	ids, err := tok.Encode(benchDoc, false, false)
	if err != nil {
		b.Fatal(err)
	}
	schema, err := Compile([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	logits := make([]float32, qwen3Logits)
	// A tool call in Hermes' format (Qwen3's) with the document as its arguments, and in
	// Qwen3.5's XML format with the document's bio as a raw value, with the markers as the
	// vocabulary's markup tokens.
	markup := NewVocab(v.pieces(), tok.IsSpecial, tok.EOGTokens(), Markup(tok.IsMarkup))
	hermes, err := Text("hermes", Lit("<tool_call>\n{\"name\": \""), OneOf(Alt{Lit: `describe", "arguments": `,
		Then: []Part{Value([]byte(benchSchema)), Lit("}\n</tool_call>")}}))
	if err != nil {
		b.Fatal(err)
	}
	xml, err := Text("xml", Lit("<tool_call>\n<function="), OneOf(Alt{Lit: "describe>\n", Then: []Part{Loop("</function>\n</tool_call>",
		Alt{Lit: "<parameter=bio>\n", Then: []Part{Until("\n</parameter>\n", 4096)}})}}))
	if err != nil {
		b.Fatal(err)
	}
	encode := func(text string) []int32 {
		ids, err := tok.Encode(text, false, true)
		if err != nil {
			b.Fatal(err)
		}
		return ids
	}
	bio := benchDoc[strings.Index(benchDoc, `"bio": "`)+8 : strings.LastIndex(benchDoc, `"`)]
	for _, c := range []struct {
		name string
		g    *Grammar
		v    *Vocab
		ids  []int32
	}{{"json", JSON(), v, ids}, {"schema", schema, v, ids},
		{"hermes-call", hermes, markup, encode("<tool_call>\n{\"name\": \"describe\", \"arguments\": " + benchDoc + "}\n</tool_call>")},
		{"xml-call", xml, markup, encode("<tool_call>\n<function=describe>\n<parameter=bio>\n" + bio + "\n</parameter>\n</function>\n</tool_call>")},
	} {
		b.Run(c.name, func(b *testing.B) {
			v, ids := c.v, c.ids
			m := NewMatcher(v, c.g)
			tokens := 0
			for b.Loop() {
				m.v, m.err, m.ended = v, nil, false
				m.r = c.g.Recognizer()
				for _, id := range ids {
					m.Mask(logits)
					m.Accept(id)
				}
				if m.Err() != nil || !m.Complete() {
					b.Fatalf("%s: %v, complete %v", c.name, m.Err(), m.Complete())
				}
				tokens += len(ids)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(tokens), "ms/token")
		})
	}
}

// FuzzSchemaWalk: whatever the schema, Compile does not panic, and a grammar it compiles
// never leads to a dead end: on a vocabulary that can spell any byte, some token is allowed
// at every step until the value is whole, and the walk's text then matches.
func FuzzSchemaWalk(f *testing.F) {
	for _, s := range append(slices.Clone(fuzzSchemas), `{"type": "string", "minLength": 3, "maxLength": 3}`,
		`{"enum": ["ü", 1, 12, [1, {"a": null}]]}`, `{"type": "array", "minItems": 2, "items": {"type": "array", "items": {"type": "object"}}}`,
		`{"anyOf": [{"const": "x"}, {"type": "integer"}, {"type": "array", "maxItems": 0}]}`) {
		f.Add([]byte(s), uint64(1))
	}
	pieces := []string{"<|eos|>", `{"`, `":`, `",`, `"}`, ` "`, `true`, `null`, `12`, `abc"`, "\n    "}
	for b := range 256 {
		pieces = append(pieces, string([]byte{byte(b)}))
	}
	v := NewVocab(pieces, func(int32) bool { return false }, []int32{0})
	logits := make([]float32, len(pieces))
	f.Fuzz(func(t *testing.T, schema []byte, seed uint64) {
		g, err := Compile(schema)
		if err != nil {
			return
		}
		rng := rand.New(rand.NewPCG(seed, 0))
		m := NewMatcher(v, g)
		var text []byte
		for step := 0; step < 400 && !m.Done(); step++ {
			clear(logits)
			if !m.Mask(logits) {
				t.Fatalf("%s: a dead end after %q", schema, text)
			}
			var allowed []int32
			for id, l := range logits {
				if !math.IsInf(float64(l), -1) {
					allowed = append(allowed, int32(id))
				}
			}
			id := allowed[rng.IntN(len(allowed))]
			m.Accept(id)
			if m.Err() != nil {
				t.Fatal(m.Err())
			}
			if id != 0 {
				text = append(text, pieces[id]...)
			}
		}
		if m.Done() && !g.Match(text) {
			t.Fatalf("%s: ended with %q, which does not match", schema, text)
		}
	})
}
