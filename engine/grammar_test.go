package engine_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/grammar"
)

// TestGenerateGrammar: on the bundled model, which writes prose, a schema holds every sampled
// answer to a value that parses and fits it, ending at the value (the grammar's end, or EOS
// once it is whole); greedy decoding too; and a token limit too small cuts the value short
// with StopMaxTokens, as OpenAI's does.
func TestGenerateGrammar(t *testing.T) {
	m := openOpts(t, "../models/testdata/tinymoe-qwen2moe.gguf", engine.Options{Threads: 2, ContextLength: 512})
	defer m.Close()
	g, err := grammar.Compile([]byte(`{"type": "object", "properties": {
		"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
		"tags": {"type": "array", "items": {"enum": ["war", "peace"]}, "maxItems": 3}},
		"required": ["name", "age", "tags"], "additionalProperties": false}`))
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := m.Tokenize("Pierre said to Natasha", true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for seed := range 6 {
		o := engine.GenerateOptions{MaxTokens: 200, Grammar: g, Sampler: engine.SamplerOptions{Temperature: 1, Seed: uint64(seed)}}
		if seed == 5 {
			o.Sampler = engine.SamplerOptions{Greedy: true}
		}
		res, err := s.Generate(context.Background(), prompt, o)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Name *string
			Age  *int
			Tags []string
		}
		if res.Reason != engine.StopGrammar && res.Reason != engine.StopEOS || json.Unmarshal([]byte(res.Text), &v) != nil ||
			v.Name == nil || v.Age == nil || v.Tags == nil || !g.Match([]byte(res.Text)) {
			t.Fatalf("seed %d: %s: %q", seed, res.Reason, res.Text)
		}
		t.Logf("seed %d: %d tokens, %s: %q", seed, len(res.Tokens), res.Reason, res.Text)
	}
	res, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: 3, Grammar: grammar.JSONObject(),
		Sampler: engine.SamplerOptions{Temperature: 1}})
	if err != nil || res.Reason != engine.StopMaxTokens || json.Valid([]byte(res.Text)) {
		t.Fatalf("3 tokens of an object: %v %s %q", err, res.Reason, res.Text)
	}
}
