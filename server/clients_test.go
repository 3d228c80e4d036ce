package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

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
	url, _ := start(t, server.Options{BodyTimeout: timeout})
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
	r := post(t, url+"/v1/completions", "", `{"prompt":"The old prince","max_tokens":120,"temperature":0,"ignore_eos":true,"stream":true}`)
	if r.status != 200 || !strings.Contains(r.body, "data: [DONE]") || strings.Contains(r.body, `"error"`) {
		t.Errorf("a stream after a prompt body: %d %s", r.status, r.body)
	}
	if took := time.Since(start); took < 2*timeout {
		t.Errorf("the stream took %v: too short to show a stream outliving the body's deadline", took)
	}
}
