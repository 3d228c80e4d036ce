package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/server"
)

// personSchema bounds every value, so that a whole answer has at most personMaxBytes bytes:
// a gap of whitespace is at most a newline and 4 spaces inside the object (5 bytes; 16 gaps
// and 1 before it), the name 10 characters of at most 6 bytes (an escape) and its quotes,
// the age a sign and 16 digits, the keys, colons, commas and braces 29, "peace" 7, false 5.
// Every token is at least a byte, so max_tokens personMaxBytes cannot cut an answer short.
const (
	personSchema = `{"type": "object", "properties": {
		"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"},
		"mood": {"enum": ["war", "peace"]}, "ok": {"type": "boolean"}},
		"required": ["name", "age", "mood", "ok"], "additionalProperties": false}`
	personMaxBytes = 1 + 16*5 + 62 + 17 + 29 + 7 + 5
)

// checkPerson validates an answer against personSchema, independently of package grammar.
func checkPerson(text string) error {
	d := json.NewDecoder(strings.NewReader(text))
	d.DisallowUnknownFields()
	var p struct {
		Name *string
		Age  *int64
		Mood *string
		OK   *bool `json:"ok"`
	}
	if err := d.Decode(&p); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("text after the value")
	}
	switch {
	case p.Name == nil || p.Age == nil || p.Mood == nil || p.OK == nil:
		return fmt.Errorf("a required property is missing")
	case utf8.RuneCountInString(*p.Name) > 10:
		return fmt.Errorf("name %q is over 10 characters", *p.Name)
	case *p.Mood != "war" && *p.Mood != "peace":
		return fmt.Errorf("mood %q is not in the enum", *p.Mood)
	}
	// encoding/json matches keys without regard to case: the schema's are exact.
	var keys map[string]json.RawMessage
	json.Unmarshal([]byte(text), &keys)
	for k := range keys {
		if !slices.Contains([]string{"name", "age", "mood", "ok"}, k) {
			return fmt.Errorf("key %q is not the schema's", k)
		}
	}
	return nil
}

// startStructured serves the bundled model with its whole trained context of 256 tokens,
// which a short prompt and personMaxBytes fit.
func startStructured(t *testing.T) (string, *engine.Model) {
	m, err := engine.Open(bundled, engine.Options{Threads: 2, ContextLength: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return serve(t, m, server.Options{}), m
}

// TestStructuredOutputOpenAI: with the official SDK, a json_schema answer from the bundled
// model (which writes prose) parses and validates on every one of 50 seeds, sampled at
// temperature 1, and ends with finish_reason "stop"; streamed too; json_object on the
// completions route; a max_tokens too small ends an unfinished value with "length"; a schema
// the grammar cannot enforce is a 400 that names the keyword.
func TestStructuredOutputOpenAI(t *testing.T) {
	addr, _ := startStructured(t)
	c := client(addr, "")
	ctx := context.Background()
	var schema map[string]any
	if err := json.Unmarshal([]byte(personSchema), &schema); err != nil {
		t.Fatal(err)
	}
	format := openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
		JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Schema: schema, Strict: openai.Bool(true)}}}
	params := func(seed int) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: "tinymoe-qwen2moe", Messages: []openai.ChatCompletionMessageParamUnion{
			openai.UserMessage("Describe Pierre as JSON.")}, MaxTokens: openai.Int(personMaxBytes), Temperature: openai.Float(1),
			Seed: openai.Int(int64(seed)), ResponseFormat: format}
	}
	distinct := map[string]bool{}
	for seed := range 50 {
		r, err := c.Chat.Completions.New(ctx, params(seed))
		if err != nil {
			t.Fatal(err)
		}
		text := r.Choices[0].Message.Content
		if err := checkPerson(text); err != nil || r.Choices[0].FinishReason != "stop" {
			t.Fatalf("seed %d: %q, finish %q: %v", seed, text, r.Choices[0].FinishReason, err)
		}
		distinct[text] = true
		if seed < 3 {
			t.Logf("seed %d: %d tokens: %q", seed, r.Usage.CompletionTokens, text)
		}
	}
	if len(distinct) < 25 {
		t.Errorf("50 seeds gave %d distinct answers: the sampling is not the model's", len(distinct))
	}

	stream := c.Chat.Completions.NewStreaming(ctx, params(7))
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || checkPerson(acc.Choices[0].Message.Content) != nil || acc.Choices[0].FinishReason != "stop" {
		t.Errorf("streamed: %q, finish %q, %v", acc.Choices[0].Message.Content, acc.Choices[0].FinishReason, err)
	}

	short := params(1)
	short.MaxTokens = openai.Int(3)
	if r, err := c.Chat.Completions.New(ctx, short); err != nil || r.Choices[0].FinishReason != "length" || json.Valid([]byte(r.Choices[0].Message.Content)) {
		t.Errorf("3 tokens: %v %+v", err, r)
	}

	for seed := range 5 {
		r := post(t, addr+"/v1/completions", "", fmt.Sprintf(`{"prompt": "The old prince", "max_tokens": 200, "seed": %d, "temperature": 1,
			"response_format": {"type": "json_object"}}`, seed))
		var cr struct {
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal([]byte(r.body), &cr); err != nil || r.status != 200 {
			t.Fatalf("completions json_object: %d %s", r.status, r.body)
		}
		var obj map[string]any
		if ch := cr.Choices[0]; ch.FinishReason == "stop" && json.Unmarshal([]byte(ch.Text), &obj) != nil ||
			ch.FinishReason == "length" && !strings.HasPrefix(strings.TrimSpace(ch.Text), "{") {
			t.Errorf("completions json_object, seed %d: %q, finish %q", seed, ch.Text, ch.FinishReason)
		}
	}

	for _, c := range []struct{ format, want string }{
		{`{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 0}}}`, `"minimum"`},
		{`{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}}}}`, `"$ref"`},
		{`{"type": "json_schema"}`, "json_schema"},
		{`{"type": "yaml"}`, "yaml"},
	} {
		r := post(t, addr+"/v1/chat/completions", "", `{"messages": [{"role": "user", "content": "Hi"}], "response_format": `+c.format+`}`)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, strings.ReplaceAll(c.want, `"`, `\"`)) || !strings.Contains(r.body, "response_format") {
			t.Errorf("response_format %s: %d %s, want a 400 naming %s", c.format, r.status, r.body, c.want)
		}
	}
}

// TestStructuredOutputOllama: with ollama's client, format "json" gives an object and a
// schema a value that validates, on chat and generate; a schema the grammar cannot enforce
// is a 400 in ollama's shape naming the keyword.
func TestStructuredOutputOllama(t *testing.T) {
	addr, _ := startStructured(t)
	base, _ := url.Parse(addr)
	c := api.NewClient(base, http.DefaultClient)
	ctx := context.Background()
	stream := false
	for seed := range 10 {
		opts := map[string]any{"temperature": 1, "seed": seed, "num_predict": personMaxBytes}
		var chat api.ChatResponse
		err := c.Chat(ctx, &api.ChatRequest{Model: "tinymoe-qwen2moe", Messages: []api.Message{{Role: "user", Content: "Describe Pierre."}},
			Format: json.RawMessage(personSchema), Options: opts, Stream: &stream}, func(r api.ChatResponse) error { chat = r; return nil })
		if err != nil || checkPerson(chat.Message.Content) != nil || chat.DoneReason != "stop" {
			t.Fatalf("chat, seed %d: %v %q %q", seed, err, chat.Message.Content, chat.DoneReason)
		}
		var gen strings.Builder
		var last api.GenerateResponse
		err = c.Generate(ctx, &api.GenerateRequest{Model: "tinymoe-qwen2moe", Prompt: "Natasha", Format: json.RawMessage(`"json"`),
			Options: map[string]any{"temperature": 1, "seed": seed, "num_predict": 200}}, func(r api.GenerateResponse) error {
			gen.WriteString(r.Response)
			last = r
			return nil
		})
		var obj map[string]any
		if err != nil || last.DoneReason == "stop" && json.Unmarshal([]byte(gen.String()), &obj) != nil ||
			!strings.HasPrefix(strings.TrimSpace(gen.String()), "{") {
			t.Fatalf("generate json, seed %d: %v %q %q", seed, err, gen.String(), last.DoneReason)
		}
		if seed < 2 {
			t.Logf("generate json, seed %d: %s: %q", seed, last.DoneReason, gen.String())
		}
	}
	for _, f := range []string{`{"type": "string", "pattern": "^a"}`, `"yaml"`} {
		r := post(t, addr+"/api/chat", "", `{"model": "m", "messages": [{"role": "user", "content": "Hi"}], "format": `+f+`}`)
		want := "pattern"
		if f == `"yaml"` {
			want = "yaml"
		}
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, want) || !strings.HasPrefix(r.body, `{"error":`) {
			t.Errorf("format %s: %d %s, want a 400 naming %s", f, r.status, r.body, want)
		}
	}
}
