package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/commit-run/commit-run/grammar"
)

// Structured output: OpenAI's response_format and ollama's format become a grammar the
// sampler holds the answer to (package grammar), so that the answer parses and fits the
// schema whatever the model would rather write; only max_tokens, the context or a stop
// string can cut it short.

// responseFormat reads OpenAI's response_format: text (or none), json_object, or json_schema
// with its schema. strict is accepted either way: the schema is always enforced, and a
// schema the grammar cannot enforce is refused, naming the keyword, never loosened.
func responseFormat(raw json.RawMessage) (*grammar.Grammar, *reqError) {
	if !present(raw) {
		return nil, nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, invalid("response_format", "response_format: want {\"type\": \"text\", \"json_object\" or \"json_schema\"}: %v", err)
	}
	switch f.Type {
	case "text":
		return nil, nil
	case "json_object":
		return grammar.JSONObject(), nil
	case "json_schema":
		if f.JSONSchema == nil {
			return nil, invalid("response_format", "response_format json_schema: want its json_schema object, with the schema")
		}
		if !present(f.JSONSchema.Schema) {
			return grammar.JSONObject(), nil
		}
		g, err := grammar.Compile(f.JSONSchema.Schema)
		if err != nil {
			return nil, invalid("response_format", "response_format.json_schema.schema: %v", schemaError(err))
		}
		return g, nil
	}
	return nil, invalid("response_format", "response_format type %q: want text, json_object or json_schema", f.Type)
}

// ollamaFormat reads ollama's format: "json" (an object, as ollama's JSON grammar has it) or
// a JSON schema.
func ollamaFormat(raw json.RawMessage) (*grammar.Grammar, error) {
	raw = bytes.TrimSpace(raw)
	if !present(raw) || string(raw) == `""` {
		return nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil || s != "json" {
			return nil, fmt.Errorf("format %s: want \"json\" or a JSON schema", raw)
		}
		return grammar.JSONObject(), nil
	}
	g, err := grammar.Compile(raw)
	if err != nil {
		return nil, fmt.Errorf("format: %v", schemaError(err))
	}
	return g, nil
}

// schemaError says what the grammar supports beside what it refused.
func schemaError(err error) error {
	var se *grammar.SchemaError
	if errors.As(err, &se) && se.Keyword != "" && se.Msg == "not supported" {
		return fmt.Errorf("%w (supported: type, properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength, enum, const, anyOf, oneOf)", err)
	}
	return err
}
