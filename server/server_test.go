package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/server"
)

const bundled = "../models/testdata/tinymoe-qwen2moe.gguf"

// start serves the bundled model on a loopback port with o, and returns its URL and the
// model, which the caller may use beside the server.
func start(t *testing.T, o server.Options) (string, *engine.Model) {
	t.Helper()
	m, err := engine.Open(bundled, engine.Options{Threads: 2, KVType: "f32", ContextLength: 128})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return serve(t, m, o), m
}

// serve serves m with o until the test ends, and returns the server's URL.
func serve(t *testing.T, m *engine.Model, o server.Options) string {
	t.Helper()
	srv := server.New(o)
	if err := srv.SetModel(m); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	return ts.URL
}

// get is a GET with an optional bearer key.
func get(t *testing.T, url, key string) response {
	t.Helper()
	return request(t, "GET", url, key, "")
}

func client(url, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// greedy is what generate --greedy answers: the engine's greedy continuation of ids.
func greedy(t *testing.T, m *engine.Model, ids []int32, stop []string, n int) string {
	t.Helper()
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Generate(context.Background(), ids, engine.GenerateOptions{MaxTokens: n, Stop: stop, Sampler: engine.SamplerOptions{Greedy: true}})
	if err != nil {
		t.Fatal(err)
	}
	return res.Text
}

// TestOpenAISDK drives the server with OpenAI's official Go SDK: chat and completions,
// streamed and not, the models list, errors and a cancelled stream. Greedy answers equal the
// engine's greedy generation of the same prompt.
func TestOpenAISDK(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() { noLeaks(t, before) }) // after start's cleanup has closed the server
	url, m := start(t, server.Options{APIKey: "sesame"})
	c := client(url, "sesame")
	ctx := context.Background()
	const n = 12

	ids, err := m.ChatTokens([]engine.Message{{Role: "user", Content: "Tell me of the old prince."}})
	if err != nil {
		t.Fatal(err)
	}
	want := greedy(t, m, ids, m.Info().ChatStop, n)
	chat := openai.ChatCompletionNewParams{Model: "tinymoe-qwen2moe", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me of the old prince.")},
		MaxTokens: openai.Int(n), Temperature: openai.Float(0)}
	got, err := c.Chat.Completions.New(ctx, chat)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Choices) != 1 || got.Choices[0].Message.Content != want || got.Usage.PromptTokens != int64(len(ids)) || got.Usage.CompletionTokens == 0 {
		t.Errorf("chat: %+v, want the text %q after %d prompt tokens", got, want, len(ids))
	}

	chat.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, chat)
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if acc.Choices[0].Message.Content != want || chunks < 3 || acc.Usage.TotalTokens != got.Usage.TotalTokens || acc.Choices[0].FinishReason != got.Choices[0].FinishReason {
		t.Errorf("streamed chat: %q in %d chunks, usage %+v, finish %q; want %q, usage %+v, finish %q",
			acc.Choices[0].Message.Content, chunks, acc.Usage, acc.Choices[0].FinishReason, want, got.Usage, got.Choices[0].FinishReason)
	}

	prompt := "The old prince said that"
	pids, err := m.Tokenize(prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: "tinymoe-qwen2moe", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(n), Temperature: openai.Float(0)})
	if err != nil {
		t.Fatal(err)
	}
	if w := greedy(t, m, pids, nil, n); len(comp.Choices) != 1 || comp.Choices[0].Text != w || comp.Choices[0].FinishReason != "length" {
		t.Errorf("completion: %+v, want %q", comp.Choices, w)
	}

	// Log-probabilities, whole and streamed: the engine's own, the chosen token first under
	// greedy decoding; penalties as the engine applies them.
	lpChat := chat
	lpChat.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	lpChat.Logprobs, lpChat.TopLogprobs = openai.Bool(true), openai.Int(3)
	lpChat.PresencePenalty, lpChat.FrequencyPenalty = openai.Float(0.5), openai.Float(1)
	s0, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := s0.Generate(ctx, ids, engine.GenerateOptions{MaxTokens: n, Stop: m.Info().ChatStop, Logprobs: true, TopLogprobs: 3,
		Sampler: engine.SamplerOptions{Greedy: true, PresencePenalty: 0.5, FrequencyPenalty: 1}})
	s0.Close()
	if err != nil {
		t.Fatal(err)
	}
	lg, err := c.Chat.Completions.New(ctx, lpChat)
	if err != nil {
		t.Fatal(err)
	}
	content := lg.Choices[0].Logprobs.Content
	if lg.Choices[0].Message.Content != ref.Text || len(content) != len(ref.Logprobs) {
		t.Fatalf("logprobs: %q with %d entries, want %q with %d", lg.Choices[0].Message.Content, len(content), ref.Text, len(ref.Logprobs))
	}
	for i, e := range content {
		r := ref.Logprobs[i]
		if len(e.TopLogprobs) != 3 || math.Abs(e.Logprob-float64(r.Logprob)) > 1e-6 || e.Token != m.Detokenize([]int32{r.ID}) ||
			e.TopLogprobs[0].Logprob < e.TopLogprobs[1].Logprob || e.Logprob > 0 {
			t.Errorf("logprobs entry %d: %+v, want token %d at %v", i, e, r.ID, r.Logprob)
		}
	}
	ls := c.Chat.Completions.NewStreaming(ctx, lpChat)
	streamed := 0
	for ls.Next() {
		if ch := ls.Current(); len(ch.Choices) > 0 {
			streamed += len(ch.Choices[0].Logprobs.Content)
		}
	}
	if ls.Err() != nil || streamed != len(content) {
		t.Errorf("streamed logprobs: %d entries, want %d (%v)", streamed, len(content), ls.Err())
	}

	models, err := c.Models.List(ctx)
	if err != nil || len(models.Data) != 1 || models.Data[0].ID != "tinymoe-qwen2moe" {
		t.Errorf("models: %+v, %v", models, err)
	}
	// Another model's name is answered by this one, which the answer names; a strict
	// server refuses it.
	other := chat
	other.Model = "gpt-4o"
	if got, err := c.Chat.Completions.New(ctx, other); err != nil || got.Model != "tinymoe-qwen2moe" || got.Choices[0].Message.Content != want {
		t.Errorf("a request naming gpt-4o: %+v, %v; want this model's answer under its own name", got, err)
	}
	if mo, err := c.Models.Get(ctx, "gpt-4o"); err != nil || mo.ID != "tinymoe-qwen2moe" {
		t.Errorf("GET /v1/models/gpt-4o: %+v, %v", mo, err)
	}
	strict := client(serve(t, m, server.Options{APIKey: "sesame", StrictModelName: true}), "sesame")

	// Errors come back as the SDK's *openai.Error with the status and parameter.
	for _, e := range []struct {
		name   string
		c      openai.Client
		params openai.ChatCompletionNewParams
		status int
		param  string
	}{
		{"unknown model, strict", strict, openai.ChatCompletionNewParams{Model: "gpt-4o", Messages: chat.Messages}, 404, "model"},
		{"n > 1", c, openai.ChatCompletionNewParams{Model: chat.Model, Messages: chat.Messages, N: openai.Int(2)}, 400, "n"},
		{"no messages", c, openai.ChatCompletionNewParams{Model: chat.Model}, 400, "messages"},
		{"wrong key", client(url, "open"), chat, 401, ""},
	} {
		_, err := e.c.Chat.Completions.New(ctx, e.params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != e.status || apiErr.Param != e.param || apiErr.Message == "" {
			t.Errorf("%s: %v, want status %d naming %q", e.name, err, e.status, e.param)
		}
	}

	// A client that goes away mid-stream cancels its generation; the server goes on.
	cctx, cancel := context.WithCancel(ctx)
	long := chat
	long.MaxTokens = openai.Int(100)
	s := c.Chat.Completions.NewStreaming(cctx, long)
	if !s.Next() {
		t.Fatalf("cancelled stream: no first chunk: %v", s.Err())
	}
	cancel()
	for s.Next() {
	}
	s.Close()
	if again, err := c.Chat.Completions.New(ctx, chat); err != nil || again.Choices[0].Message.Content != want {
		t.Errorf("after a cancelled stream: %v, %+v", err, again)
	}
}

// noLeaks waits for the goroutines to come back to before, give or take the HTTP client's
// idle connections.
func noLeaks(t *testing.T, before int) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before+4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+4 {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestBadRequests: every malformed or refused request gets a clear error with OpenAI's
// shape and the right status, and the server keeps serving.
func TestBadRequests(t *testing.T) {
	url, _ := start(t, server.Options{APIKey: "sesame", MaxBodyBytes: 4 << 10, LocalOnly: true})
	ok := `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}`
	big := `{"prompt":"` + strings.Repeat("the old prince ", 400) + `"}`
	for _, c := range []struct {
		name, method, path, body, key, host string
		status                              int
		says                                string
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", `{"messages":[`, "sesame", "", 400, "malformed JSON"},
		{"a wrong type", "POST", "/v1/chat/completions", `{"messages":"hi"}`, "sesame", "", 400, "want an array"},
		{"a wrong type inside", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":"9"}`, "sesame", "", 400, "max_tokens"},
		{"no messages", "POST", "/v1/chat/completions", `{"messages":[]}`, "sesame", "", 400, "at least one message"},
		{"an unknown role", "POST", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, "sesame", "", 400, "wizard"},
		{"an image", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "sesame", "", 400, "only text"},
		{"tools", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, "sesame", "", 400, "function object"},
		{"a body over the cap", "POST", "/v1/completions", big, "sesame", "", 413, "request body over"},
		{"max_tokens -1", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, "sesame", "", 400, "max_tokens -1"},
		{"temperature 3", "POST", "/v1/completions", `{"prompt":"x","temperature":3}`, "sesame", "", 400, "temperature"},
		{"an empty prompt", "POST", "/v1/completions", `{"prompt":""}`, "sesame", "", 400, "prompt"},
		{"presence_penalty 3", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"presence_penalty":3}`, "sesame", "", 400, "want -2 to 2"},
		{"top_logprobs 21", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, "sesame", "", 400, "top_logprobs 21"},
		{"top_logprobs without logprobs", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, "sesame", "", 400, "with logprobs true"},
		{"a completion's logprobs 6", "POST", "/v1/completions", `{"prompt":"x","logprobs":6}`, "sesame", "", 400, "want 0 to 5"},
		{"no key", "POST", "/v1/chat/completions", ok, "", "", 401, "API key"},
		{"a wrong key", "GET", "/v1/models", "", "open", "", 401, "API key"},
		{"a wrong scheme", "GET", "/v1/models", "", "Basic sesame", "", 401, "API key"},
		{"the scheme in lower case (RFC 6750)", "GET", "/v1/models", "", "bearer sesame", "", 200, ""},
		{"a foreign Host", "GET", "/v1/models", "", "sesame", "attacker.example:8080", 403, "not this machine"},
		{"an unknown route", "GET", "/v2/models", "", "sesame", "", 404, "no route"},
		{"a wrong method", "GET", "/v1/chat/completions", "", "sesame", "", 405, "takes POST"},
		{"ollama: malformed JSON", "POST", "/api/chat", `{"messages":`, "sesame", "", 400, "malformed JSON"},
		{"ollama: a prompt beyond the context", "POST", "/api/generate", `{"prompt":"` + strings.Repeat("prince ", 300) + `"}`, "sesame", "", 400, "no room for a reply"},
		{"ollama: num_predict -3", "POST", "/api/generate", `{"prompt":"x","options":{"num_predict":-3}}`, "sesame", "", 400, "num_predict -3"},
		{"ollama: repeat_penalty -1", "POST", "/api/generate", `{"prompt":"x","options":{"repeat_penalty":-1}}`, "sesame", "", 400, "repeat_penalty -1"},
		{"ollama: temperature 500", "POST", "/api/chat", `{"messages":[{"role":"user","content":"x"}],"options":{"temperature":500}}`, "sesame", "", 400, "temperature 500"},
		{"ollama: repeat_last_n -2", "POST", "/api/generate", `{"prompt":"x","options":{"repeat_last_n":-2}}`, "sesame", "", 400, "repeat_last_n -2"},
		{"ollama: no key", "GET", "/api/tags", "", "", "", 401, "API key"},
		{"ollama: an unknown route", "GET", "/api/pull", "", "sesame", "", 404, "no route"},
		{"ollama: a wrong method", "GET", "/api/chat", "", "sesame", "", 405, "takes POST"},
		{"ollama: a foreign Host", "GET", "/api/tags", "", "sesame", "attacker.example", 403, "not this machine"},
	} {
		req, err := http.NewRequest(c.method, url+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.key != "" {
			auth := "Bearer " + c.key
			if strings.Contains(c.key, " ") {
				auth = c.key // a scheme of its own
			}
			req.Header.Set("Authorization", auth)
		}
		if c.host != "" {
			req.Host = c.host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		shape := `"error":{"message":` // OpenAI's; ollama's is {"error": "..."}
		if strings.HasPrefix(c.path, "/api/") {
			shape = `{"error":"`
		}
		if resp.StatusCode != c.status || c.says != "" && (!strings.Contains(string(b), c.says) || !strings.Contains(string(b), shape)) {
			t.Errorf("%s: %d %s, want %d saying %q", c.name, resp.StatusCode, b, c.status, c.says)
		}
	}
	// A prompt longer than the context, within the body cap.
	prompt := strings.Repeat("prince ", 300)
	resp := post(t, url+"/v1/completions", "sesame", `{"prompt":"`+prompt+`"}`)
	if resp.status != 400 || !strings.Contains(resp.body, "context_length_exceeded") || !strings.Contains(resp.body, `"param":"prompt"`) {
		t.Errorf("a prompt beyond the context: %d %s", resp.status, resp.body)
	}
	// A completion's log-probabilities: parallel arrays, one entry a token.
	r := post(t, url+"/v1/completions", "sesame", `{"prompt":"The old prince","logprobs":2,"max_tokens":3,"temperature":0}`)
	var lp struct {
		Choices []struct {
			Text     string
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []float64            `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			}
		}
	}
	if err := json.Unmarshal([]byte(r.body), &lp); err != nil || r.status != 200 || len(lp.Choices) != 1 {
		t.Fatalf("completion logprobs: %d %s (%v)", r.status, r.body, err)
	}
	l := lp.Choices[0].Logprobs
	if len(l.Tokens) != 3 || len(l.TokenLogprobs) != 3 || len(l.TopLogprobs) != 3 || len(l.TextOffset) != 3 || strings.Join(l.Tokens, "") != lp.Choices[0].Text {
		t.Errorf("completion logprobs: %+v", lp.Choices[0])
	}
	// Still serving, on a local Host header of each kind.
	for _, host := range []string{"", "localhost:8080", "127.0.0.1", "[::1]:1234"} {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(ok))
		req.Header.Set("Authorization", "Bearer sesame")
		if host != "" {
			req.Host = host
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil || r.StatusCode != 200 {
			t.Errorf("Host %q after the bad requests: %v %v", host, r, err)
		}
		if r != nil {
			r.Body.Close()
		}
	}
	// /health needs no key.
	if r, err := http.Get(url + "/health"); err != nil || r.StatusCode != 200 {
		t.Errorf("health: %v %v", r, err)
	}
}

type response struct {
	status int
	body   string
	header http.Header
}

func post(t *testing.T, url, key, body string) response {
	t.Helper()
	return request(t, "POST", url, key, body)
}

// request sends method to url with body and, when key is set, the bearer key.
func request(t *testing.T, method, url, key, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return response{r.StatusCode, string(b), r.Header}
}

// TestHealthWhileLoading: /health and the API say 503 until the model is set.
func TestHealthWhileLoading(t *testing.T) {
	srv := server.New(server.Options{})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	for _, path := range []string{"/health", "/v1/models"} {
		r, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 503 || r.Header.Get("Retry-After") == "" {
			t.Errorf("%s while loading: %d, Retry-After %q", path, r.StatusCode, r.Header.Get("Retry-After"))
		}
	}
	if r := post(t, ts.URL+"/v1/chat/completions", "", `{"messages":[{"role":"user","content":"x"}]}`); r.status != 503 {
		t.Errorf("chat while loading: %d %s", r.status, r.body)
	}
}

// TestCORS: with no origins allowed, a browser page elsewhere gets no CORS headers; an allowed
// origin's preflight is answered without the key, and its answers carry the header.
func TestCORS(t *testing.T) {
	for _, c := range []struct {
		origins []string
		origin  string
		allowed bool
	}{
		{nil, "https://evil.example", false},
		{[]string{"https://app.example"}, "https://evil.example", false},
		{[]string{"https://app.example"}, "https://app.example", true},
		{[]string{"*"}, "https://any.example", true},
	} {
		srv := server.New(server.Options{APIKey: "k", CORSOrigins: c.origins})
		ts := httptest.NewServer(srv.Handler())
		req, _ := http.NewRequest("OPTIONS", ts.URL+"/v1/chat/completions", nil)
		req.Header.Set("Origin", c.origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		got := r.Header.Get("Access-Control-Allow-Origin")
		if c.allowed != (got == c.origin && r.StatusCode == 204 && strings.Contains(r.Header.Get("Access-Control-Allow-Headers"), "Authorization")) ||
			!c.allowed && got != "" {
			t.Errorf("origins %v, preflight from %s: %d, Allow-Origin %q", c.origins, c.origin, r.StatusCode, got)
		}
		req, _ = http.NewRequest("GET", ts.URL+"/health", nil)
		req.Header.Set("Origin", c.origin)
		if r, err = http.DefaultClient.Do(req); err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if got := r.Header.Get("Access-Control-Allow-Origin"); c.allowed != (got == c.origin) {
			t.Errorf("origins %v, GET from %s: Allow-Origin %q", c.origins, c.origin, got)
		}
		ts.Close()
	}
}
