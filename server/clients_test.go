package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/server"
)

// TestModelNames: any model name a client sends (LangChain's default gpt-3.5-turbo, ollama's
// llama3) is answered by the served model, and the answer names the real one; with
// StrictModelName another name is 404 on both APIs. GET /v1/models/{id} answers alike.
func TestModelNames(t *testing.T) {
	url, m := start(t, server.Options{})
	strict := serve(t, m, server.Options{StrictModelName: true, ModelName: "tiny"})
	chat := `{"model":"gpt-3.5-turbo","messages":[{"role":"user","content":"Hi"}],"max_tokens":2,"temperature":0}`
	ollama := `{"model":"llama3","messages":[{"role":"user","content":"Hi"}],"stream":false,"options":{"num_predict":2}}`
	var got struct{ Model string }
	for _, c := range []struct {
		url, method, path, body string
		status                  int
		model                   string // the model the answer names
	}{
		{url, "POST", "/v1/chat/completions", chat, 200, "tinymoe-qwen2moe"},
		{url, "POST", "/api/chat", ollama, 200, "tinymoe-qwen2moe"},
		{url, "GET", "/v1/models/gpt-3.5-turbo", "", 200, "tinymoe-qwen2moe"},
		{url, "GET", "/v1/models/tinymoe-qwen2moe", "", 200, "tinymoe-qwen2moe"},
		{strict, "POST", "/v1/chat/completions", chat, 404, ""},
		{strict, "POST", "/api/chat", ollama, 404, ""},
		{strict, "GET", "/v1/models/gpt-3.5-turbo", "", 404, ""},
		{strict, "GET", "/v1/models/tiny", "", 200, "tiny"},
		{strict, "POST", "/api/chat", strings.Replace(ollama, "llama3", "tiny:latest", 1), 200, "tiny"},
	} {
		r := request(t, c.method, c.url+c.path, "", c.body)
		if r.status != c.status {
			t.Errorf("%s %s (%s): %d %s, want %d", c.method, c.path, c.body, r.status, r.body, c.status)
			continue
		}
		if c.status != 200 {
			continue
		}
		if c.path == "/v1/models/"+strings.TrimPrefix(c.path, "/v1/models/") && strings.HasPrefix(c.path, "/v1/models/") {
			var o struct{ ID string }
			if err := json.Unmarshal([]byte(r.body), &o); err != nil || o.ID != c.model {
				t.Errorf("%s: %s, want the id %q", c.path, r.body, c.model)
			}
			continue
		}
		if err := json.Unmarshal([]byte(r.body), &got); err != nil || got.Model != c.model {
			t.Errorf("%s %s: %s, want the answer to name %q", c.method, c.path, r.body, c.model)
		}
	}
}

// TestClampedRequests: max_tokens beyond the room the context leaves is clamped to it, the
// answer ending with finish_reason "length", as llama-server and ollama do; ollama options
// that llama.cpp reads as a bound (temperature -1, top_p 2, top_k -5) are taken so, not a 500.
func TestClampedRequests(t *testing.T) {
	url, _ := start(t, server.Options{})
	r := post(t, url+"/v1/completions", "", `{"prompt":"The old prince","max_tokens":1000000000,"temperature":0}`)
	var c struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(r.body), &c); r.status != 200 || err != nil || len(c.Choices) != 1 {
		t.Fatalf("max_tokens 1e9: %d %s", r.status, r.body)
	}
	// The bundled model stops on its own at times: then it is "stop", and short of the room.
	if f := c.Choices[0].FinishReason; f != "length" && f != "stop" || f == "length" && c.Usage.PromptTokens+c.Usage.CompletionTokens != 128 {
		t.Errorf("max_tokens 1e9: finish %q after %d+%d tokens of a 128-token context", f, c.Usage.PromptTokens, c.Usage.CompletionTokens)
	}
	for _, opts := range []string{`{"temperature":-1}`, `{"top_p":2,"temperature":0.7,"seed":1}`, `{"top_k":-5,"temperature":0.7,"seed":1}`} {
		r := post(t, url+"/api/generate", "", `{"prompt":"The old prince","stream":false,"options":`+strings.TrimSuffix(opts, "}")+`,"num_predict":3}}`)
		if r.status != 200 || !strings.Contains(r.body, `"done":true`) {
			t.Errorf("ollama options %s: %d %s", opts, r.status, r.body)
		}
	}
}

// TestSlowBody: a body that does not arrive within BodyTimeout (a byte a second, or a
// Content-Length whose bytes never come) is answered 408 and the connection closed, within
// seconds; a body that arrives in time, and the stream after it, are not cut by the deadline.
func TestSlowBody(t *testing.T) {
	const timeout = 20 * time.Millisecond
	// A context of 1024 tokens, so that the stream below (1000 tokens, about half a second on
	// a fast core) outlasts the deadline many times over: 120 tokens of start's 128 once took
	// 39.8 ms, under the 40 ms this test asks of it.
	m, err := engine.Open(bundled, engine.Options{Threads: 2, KVType: "f32", ContextLength: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	url := serve(t, m, server.Options{BodyTimeout: timeout})
	addr := strings.TrimPrefix(url, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":", addr)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body within 5 s: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || time.Since(start) > 3*time.Second {
		t.Errorf("a stalled body: %d after %v, want 408 within seconds", resp.StatusCode, time.Since(start))
	}
	// A stream longer than the timeout, after a body that came at once, runs to its end.
	start = time.Now()
	r := post(t, url+"/v1/completions", "", `{"prompt":"The old prince","max_tokens":1000,"temperature":0,"ignore_eos":true,"stream":true}`)
	if r.status != 200 || !strings.Contains(r.body, "data: [DONE]") || strings.Contains(r.body, `"error"`) {
		t.Errorf("a stream after a prompt body: %d %s", r.status, r.body)
	}
	if took := time.Since(start); took < 4*timeout {
		t.Errorf("the stream took %v: too short to show a stream outliving the body's deadline", took)
	}
}

// cutServer serves the bundled model with request contexts derived from one that stop
// cancels, as serve's shutdown does after its grace period.
func cutServer(t *testing.T) (url string, stop context.CancelCauseFunc) {
	t.Helper()
	// A context of 1024 tokens, for streams of 1000: the bundled model writes 120 tokens in
	// about 40 ms, at times all of them before the client has read the first and cut.
	m, err := engine.Open(bundled, engine.Options{Threads: 2, KVType: "f32", ContextLength: 1024})
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Options{})
	if err := srv.SetModel(m); err != nil {
		t.Fatal(err)
	}
	base, stop := context.WithCancelCause(context.Background())
	ts := httptest.NewUnstartedServer(srv.Handler())
	ts.Config.BaseContext = func(net.Listener) context.Context { return base }
	ts.Start()
	t.Cleanup(func() {
		stop(nil)
		ts.Close()
		srv.Close()
		m.Close()
	})
	return ts.URL, stop
}

// TestCutAnswers: an answer the server's shutdown cuts never looks whole. A stream ends with
// an error event (OpenAI's "data: {"error": ...}", ollama's {"error": ...} line) and no
// [DONE] or done line; a whole answer is 503 with Retry-After.
func TestCutAnswers(t *testing.T) {
	long := `"max_tokens":1000,"temperature":0,"ignore_eos":true`
	for _, c := range []struct {
		name, path, body string
		done             string // what a whole stream ends with
	}{
		{"OpenAI stream", "/v1/completions", `{"prompt":"The old prince",` + long + `,"stream":true}`, "data: [DONE]"},
		{"ollama stream", "/api/generate", `{"prompt":"The old prince","raw":true,"options":{"num_predict":1000,"temperature":0}}`, `"done":true`},
	} {
		t.Run(c.name, func(t *testing.T) {
			url, stop := cutServer(t)
			resp, err := http.Post(url+c.path, "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			rd := bufio.NewReader(resp.Body)
			first, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("no first chunk: %v", err)
			}
			stop(server.ErrShutdown)
			rest, _ := io.ReadAll(rd)
			all := first + string(rest)
			lines := strings.Split(strings.TrimSpace(all), "\n")
			last := lines[len(lines)-1]
			if strings.Contains(all, c.done) || !strings.Contains(last, `"error"`) || !strings.Contains(last, "shutting down") {
				t.Errorf("a stream cut by shutdown ends with %q (%d lines), want an error event saying so and no %q", last, len(lines), c.done)
			}
		})
	}
	for _, c := range []struct{ name, path, body, shape string }{
		{"OpenAI whole", "/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],` + long + `}`, `"error":{"message":`},
		{"ollama whole", "/api/chat", `{"messages":[{"role":"user","content":"Hi"}],"stream":false}`, `{"error":"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			url, stop := cutServer(t)
			stop(server.ErrShutdown)
			r := post(t, url+c.path, "", c.body)
			if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, c.shape) || !strings.Contains(r.body, "shutting down") {
				t.Errorf("a whole answer cut by shutdown: %d %v %s, want 503 with Retry-After saying so", r.status, r.header, r.body)
			}
		})
	}
}

// TestCutStreamSDK: OpenAI's Go SDK reports a stream the shutdown cuts as an error, not as a
// whole answer.
func TestCutStreamSDK(t *testing.T) {
	url, stop := cutServer(t)
	c := client(url, "")
	s := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{Model: "any",
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("The old prince")}, MaxTokens: openai.Int(1000), Temperature: openai.Float(0)},
		option.WithJSONSet("ignore_eos", true))
	defer s.Close()
	n := 0
	for s.Next() {
		if n++; n == 1 {
			stop(server.ErrShutdown)
		}
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("a stream cut after %d chunks: the SDK's error is %v, want one saying the server is shutting down", n, err)
	}
}

// TestLlamaServerRoutes: /tokenize and /detokenize round-trip a text as the model's own
// tokenizer does, with pieces when asked; /props says the context and the slots; a bad id is
// a 400 that names it.
func TestLlamaServerRoutes(t *testing.T) {
	url, m := start(t, server.Options{Parallel: 2})
	text := "The old prince, <|im_end|> and 12345."
	want, err := m.Tokenize(text, false)
	if err != nil {
		t.Fatal(err)
	}
	var tk struct{ Tokens []int32 }
	r := post(t, url+"/tokenize", "", `{"content":"The old prince, <|im_end|> and 12345."}`)
	if err := json.Unmarshal([]byte(r.body), &tk); r.status != 200 || err != nil || !slices.Equal(tk.Tokens, want) {
		t.Errorf("tokenize: %d %s, want %v", r.status, r.body, want)
	}
	var pieces struct {
		Tokens []struct {
			ID    int32
			Piece string
		}
	}
	r = post(t, url+"/tokenize", "", `{"content":"The old prince","with_pieces":true}`)
	joined := ""
	if err := json.Unmarshal([]byte(r.body), &pieces); err != nil || r.status != 200 || len(pieces.Tokens) == 0 {
		t.Fatalf("tokenize with pieces: %d %s", r.status, r.body)
	}
	for _, p := range pieces.Tokens {
		joined += p.Piece
	}
	if strings.TrimSpace(joined) != "The old prince" {
		t.Errorf("tokenize with pieces: %s joins to %q", r.body, joined)
	}
	ids, _ := json.Marshal(want)
	var dt struct{ Content string }
	r = post(t, url+"/detokenize", "", `{"tokens":`+string(ids)+`}`)
	if err := json.Unmarshal([]byte(r.body), &dt); r.status != 200 || err != nil || dt.Content != m.Detokenize(want) || !strings.Contains(dt.Content, "old prince") {
		t.Errorf("detokenize: %d %s", r.status, r.body)
	}
	if r := post(t, url+"/detokenize", "", `{"tokens":[1,-4]}`); r.status != 400 || !strings.Contains(r.body, "tokens[1]") {
		t.Errorf("detokenize a bad id: %d %s, want 400 naming tokens[1]", r.status, r.body)
	}
	var props struct {
		Settings struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
		Slots    int    `json:"total_slots"`
		Template string `json:"chat_template"`
	}
	r = get(t, url+"/props", "")
	if err := json.Unmarshal([]byte(r.body), &props); r.status != 200 || err != nil || props.Settings.NCtx != 128 || props.Slots != 2 || props.Template != m.Info().ChatTemplate {
		t.Errorf("props: %d %s", r.status, r.body)
	}
}

// TestPromptBounds: a prompt whose bytes alone rule out the context is refused before it is
// tokenized, on both APIs; the next turn of a chat reports the tokens the KV cache held
// (usage.prompt_tokens_details.cached_tokens).
func TestPromptBounds(t *testing.T) {
	url, m := start(t, server.Options{MaxBodyBytes: 64 << 20})
	huge := strings.Repeat("the old prince ", 2<<20/15*2) // 4 MB
	begin := time.Now()
	for _, c := range []struct{ path, body, shape string }{
		{"/v1/completions", `{"prompt":"` + huge + `"}`, `"code":"context_length_exceeded"`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + huge + `"}]}`, `"param":"messages"`},
		{"/api/generate", `{"prompt":"` + huge + `"}`, `{"error":"`},
	} {
		r := post(t, url+c.path, "", c.body)
		if r.status != 400 || !strings.Contains(r.body, "no room for a reply") || !strings.Contains(r.body, c.shape) {
			t.Errorf("%s with a 4 MB prompt: %d %s", c.path, r.status, r.body)
		}
	}
	t.Logf("three 4 MB prompts refused in %v (the longest token is %d bytes)", time.Since(begin), m.MaxTokenBytes())

	turn := `{"messages":[{"role":"user","content":"Tell me of the old prince."}],"max_tokens":3,"temperature":0}`
	var first, second struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		}
	}
	json.Unmarshal([]byte(post(t, url+"/v1/chat/completions", "", turn).body), &first)
	json.Unmarshal([]byte(post(t, url+"/v1/chat/completions", "", turn).body), &second)
	if first.Usage.Details.Cached != 0 || second.Usage.Details.Cached == 0 || second.Usage.Details.Cached >= second.Usage.PromptTokens {
		t.Errorf("cached tokens: first turn %+v, the same again %+v; want 0, then all but the last prompt token", first.Usage, second.Usage)
	}
}

// TestContextOverflow: a chat that has outgrown the context drops its oldest turns after the
// system prompt until it fits, as ollama does, and says so (X-Context-Trimmed, the metric);
// with RefuseOverflow it is a 400 as before. Both APIs.
func TestContextOverflow(t *testing.T) {
	url, m := start(t, server.Options{})
	refusing := serve(t, m, server.Options{RefuseOverflow: true})
	var turns []string
	turns = append(turns, `{"role":"system","content":"You are the old prince's steward."}`)
	for i := 0; i < 12; i++ {
		turns = append(turns, fmt.Sprintf(`{"role":"user","content":"Tell me, turn %d, of the old prince and his daughter at Bald Hills."}`, i),
			`{"role":"assistant","content":"The old prince rose early and walked in the garden with his daughter."}`)
	}
	turns = append(turns, `{"role":"user","content":"And then?"}`)
	msgs := "[" + strings.Join(turns, ",") + "]"
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":` + msgs + `,"max_tokens":4,"temperature":0}`},
		{"/api/chat", `{"messages":` + msgs + `,"stream":false,"options":{"num_predict":4,"temperature":0}}`},
	} {
		r := post(t, url+c.path, "", c.body)
		n, _ := strconv.Atoi(r.header.Get("X-Context-Trimmed"))
		if r.status != 200 || n < 2 {
			t.Errorf("%s: a chat beyond the context: %d, %d messages dropped, %s", c.path, r.status, n, r.body)
		}
		if r := post(t, refusing+c.path, "", c.body); r.status != 400 || !strings.Contains(r.body, "no room for a reply") {
			t.Errorf("%s refusing overflow: %d %s, want 400", c.path, r.status, r.body)
		}
	}
	metrics := get(t, url+"/metrics", "").body
	if !strings.Contains(metrics, "commit_run_context_trimmed_messages_total") || strings.Contains(metrics, "commit_run_context_trimmed_messages_total 0\n") {
		t.Errorf("the trimmed messages are not counted:\n%s", metrics)
	}
	// The system prompt stays: the trimmed prompt still starts as the whole one does.
	ids, err := m.ChatTokens([]engine.Message{{Role: "system", Content: "You are the old prince's steward."}, {Role: "user", Content: "And then?"}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		}
	}
	r := post(t, url+"/v1/chat/completions", "", `{"messages":`+msgs+`,"max_tokens":4,"temperature":0}`)
	json.Unmarshal([]byte(r.body), &got)
	if got.Usage.PromptTokens < len(ids) || got.Usage.PromptTokens+128/8 > 128 {
		t.Errorf("the trimmed prompt is %d tokens: want at least the system prompt and the last turn (%d) and room for a reply", got.Usage.PromptTokens, len(ids))
	}
}

// TestLlamaServerConstraints: llama-server's own json_schema field constrains the answer as
// response_format does; its GBNF grammar field is refused by name, not ignored.
func TestLlamaServerConstraints(t *testing.T) {
	url, _ := start(t, server.Options{})
	schema := `{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}`
	for seed := 1; seed <= 5; seed++ {
		r := post(t, url+"/v1/completions", "", fmt.Sprintf(`{"prompt":"The answer:","max_tokens":60,"seed":%d,"temperature":1,"json_schema":%s}`, seed, schema))
		var c struct {
			Choices []struct {
				Text         string
				FinishReason string `json:"finish_reason"`
			}
		}
		var v struct{ OK *bool }
		if err := json.Unmarshal([]byte(r.body), &c); err != nil || r.status != 200 || len(c.Choices) != 1 {
			t.Fatalf("seed %d: %d %s", seed, r.status, r.body)
		}
		dec := json.NewDecoder(strings.NewReader(c.Choices[0].Text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil || v.OK == nil || c.Choices[0].FinishReason != "stop" {
			t.Errorf("seed %d: %q (%s) does not match the schema: %v", seed, c.Choices[0].Text, c.Choices[0].FinishReason, err)
		}
	}
	for _, c := range []struct{ body, says string }{
		{`{"prompt":"x","grammar":"root ::= \"yes\""}`, "grammar"},
		{`{"prompt":"x","json_schema":` + schema + `,"response_format":{"type":"json_object"}}`, "give one"},
		{`{"prompt":"x","json_schema":{"type":"string","pattern":"a+"}}`, "pattern"},
	} {
		if r := post(t, url+"/v1/completions", "", c.body); r.status != 400 || !strings.Contains(r.body, c.says) {
			t.Errorf("%s: %d %s, want 400 saying %q", c.body, r.status, r.body, c.says)
		}
	}
}
