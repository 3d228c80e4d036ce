package server_test

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/server"
)

// TestParallelRequests streams four chats at once through OpenAI's SDK from a server that
// batches them (--parallel 4): each answer equals the engine's greedy answer to its prompt
// alone, the decode steps shared passes, and nothing is left running afterwards.
func TestParallelRequests(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() { noLeaks(t, before) })
	const streams, n = 4, 48
	m, err := engine.Open(bundled, engine.Options{Threads: 2, KVType: "f32", ContextLength: 128, Parallel: streams})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	url := serve(t, m, server.Options{Parallel: streams})
	c := client(url, "")
	questions := []string{"Tell me of the old prince.", "What is the capital of France?", "Write a short poem about rain.", "Why is the sky blue?"}
	want := make([]string, streams)
	for i, q := range questions {
		ids, err := m.ChatTokens([]engine.Message{{Role: "user", Content: q}})
		if err != nil {
			t.Fatal(err)
		}
		want[i] = greedy(t, m, ids, m.Info().ChatStop, n)
	}
	got := make([]string, streams)
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for i, q := range questions {
		wg.Go(func() {
			stream := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "tinymoe-qwen2moe",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(q)}, MaxTokens: openai.Int(n), Temperature: openai.Float(0)})
			var acc openai.ChatCompletionAccumulator
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			if errs[i] = stream.Err(); errs[i] == nil && len(acc.Choices) == 1 {
				got[i] = acc.Choices[0].Message.Content
			}
		})
	}
	wg.Wait()
	for i := range questions {
		if errs[i] != nil {
			t.Errorf("stream %d: %v", i, errs[i])
		} else if got[i] != want[i] {
			t.Errorf("stream %d batched: %q, alone: %q", i, got[i], want[i])
		}
	}
	st, _ := m.BatchStats()
	t.Logf("decode steps: %d passes for %d tokens", st.Passes, st.Rows)
}

// TestBackToBackRequests: with no queue, a client that sends its next request as soon as it
// has read the last answer finds the session free; the session is given back before the
// answer's last bytes, not after.
func TestBackToBackRequests(t *testing.T) {
	url, _ := start(t, server.Options{Queue: -1})
	c := client(url, "")
	for i := range 40 {
		s := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{Model: "tinymoe-qwen2moe",
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once")}, MaxTokens: openai.Int(3)})
		for s.Next() {
		}
		if err := s.Err(); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}
