package server_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/server"
)

// TestOllamaClient drives the ollama routes with ollama's own Go client: chat and generate,
// streamed and not, list, show, ps and version; greedy answers equal the engine's, and an
// unknown model is ollama's 404.
func TestOllamaClient(t *testing.T) {
	addr, m := start(t, server.Options{})
	base, _ := url.Parse(addr)
	c := api.NewClient(base, http.DefaultClient)
	ctx := context.Background()
	const n = 10
	greedyOpts := map[string]any{"temperature": 0, "num_predict": n, "repeat_penalty": 1}

	ids, err := m.ChatTokens([]engine.Message{{Role: "user", Content: "Tell me of the old prince."}})
	if err != nil {
		t.Fatal(err)
	}
	want := greedy(t, m, ids, m.Info().ChatStop, n)
	for _, stream := range []bool{true, false} {
		var text strings.Builder
		var last api.ChatResponse
		parts := 0
		err := c.Chat(ctx, &api.ChatRequest{Model: "tinymoe-qwen2moe:latest", Messages: []api.Message{{Role: "user", Content: "Tell me of the old prince."}},
			Stream: &stream, Options: greedyOpts}, func(r api.ChatResponse) error {
			text.WriteString(r.Message.Content)
			last = r
			parts++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if text.String() != want || !last.Done || last.EvalCount == 0 || last.PromptEvalCount != len(ids) || (stream && parts < 3) || (!stream && parts != 1) {
			t.Errorf("chat, stream %v: %q in %d parts, last %+v; want %q", stream, text.String(), parts, last, want)
		}
	}

	pids, err := m.ChatTokens([]engine.Message{{Role: "user", Content: "Once upon a time"}})
	if err != nil {
		t.Fatal(err)
	}
	wantGen := greedy(t, m, pids, m.Info().ChatStop, n)
	var gen strings.Builder
	if err := c.Generate(ctx, &api.GenerateRequest{Model: "tinymoe-qwen2moe", Prompt: "Once upon a time", Options: greedyOpts}, func(r api.GenerateResponse) error {
		gen.WriteString(r.Response)
		return nil
	}); err != nil || gen.String() != wantGen {
		t.Errorf("generate: %q (%v), want %q", gen.String(), err, wantGen)
	}
	rids, _ := m.Tokenize("Once upon a time", true)
	wantRaw := greedy(t, m, rids, nil, n)
	gen.Reset()
	if err := c.Generate(ctx, &api.GenerateRequest{Prompt: "Once upon a time", Raw: true, Options: greedyOpts}, func(r api.GenerateResponse) error {
		gen.WriteString(r.Response)
		return nil
	}); err != nil || gen.String() != wantRaw {
		t.Errorf("raw generate: %q (%v), want %q", gen.String(), err, wantRaw)
	}

	list, err := c.List(ctx)
	if err != nil || len(list.Models) != 1 || list.Models[0].Name != "tinymoe-qwen2moe:latest" || list.Models[0].Size == 0 || list.Models[0].Details.Format != "gguf" {
		t.Errorf("list: %+v, %v", list, err)
	}
	show, err := c.Show(ctx, &api.ShowRequest{Model: "tinymoe-qwen2moe"})
	if err != nil || show.Details.Family != m.Info().Architecture || show.ModelInfo["general.architecture"] != m.Info().Architecture {
		t.Errorf("show: %+v, %v", show, err)
	}
	ps, err := c.ListRunning(ctx)
	if err != nil || len(ps.Models) != 1 || ps.Models[0].ContextLength != m.ContextLength() {
		t.Errorf("ps: %+v, %v", ps, err)
	}
	if v, err := c.Version(ctx); err != nil || v == "" {
		t.Errorf("version: %q, %v", v, err)
	}

	// Another model's name is answered by this one, which the answer names; a strict server
	// refuses it with ollama's 404, as ollama does.
	var other api.ChatResponse
	stream := false
	if err := c.Chat(ctx, &api.ChatRequest{Model: "llama3", Messages: []api.Message{{Role: "user", Content: "Tell me of the old prince."}}, Stream: &stream, Options: greedyOpts},
		func(r api.ChatResponse) error { other = r; return nil }); err != nil || other.Model != "tinymoe-qwen2moe" || other.Message.Content != want {
		t.Errorf("a request naming llama3: %+v, %v; want this model's answer under its own name", other, err)
	}
	strictURL, _ := url.Parse(serve(t, m, server.Options{StrictModelName: true}))
	strict := api.NewClient(strictURL, http.DefaultClient)

	// ollama's errors: its status and message.
	for _, e := range []struct {
		name   string
		err    error
		status int
	}{
		{"unknown model, strict", strict.Chat(ctx, &api.ChatRequest{Model: "llama3", Messages: []api.Message{{Role: "user", Content: "x"}}}, func(api.ChatResponse) error { return nil }), 404},
		{"bad option", c.Chat(ctx, &api.ChatRequest{Messages: []api.Message{{Role: "user", Content: "x"}}, Options: map[string]any{"num_predict": "ten"}}, func(api.ChatResponse) error { return nil }), 400},
		{"an unknown role", c.Chat(ctx, &api.ChatRequest{Messages: []api.Message{{Role: "robot", Content: "x"}}}, func(api.ChatResponse) error { return nil }), 400},
		{"show an unknown model, strict", func() error { _, err := strict.Show(ctx, &api.ShowRequest{Model: "mistral"}); return err }(), 404},
	} {
		var se api.StatusError
		if !errors.As(e.err, &se) || se.StatusCode != e.status || se.ErrorMessage == "" {
			t.Errorf("%s: %v, want status %d with a message", e.name, e.err, e.status)
		}
	}
}
