package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/commit-run/commit-run/engine"
)

// TestQueue: beyond the Parallel running requests, Queue requests wait their turn and the
// next gets 503 with Retry-After; a waiting client that goes away leaves the queue.
func TestQueue(t *testing.T) {
	m, err := engine.Open("../models/testdata/tiny.gguf", engine.Options{ContextLength: 64, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := New(Options{Queue: 1, Parallel: 2})
	if err := s.SetModel(m); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	var releases []func()
	for i := range 2 {
		_, release, ok := s.admit(httptest.NewRecorder(), req, nil)
		if !ok {
			t.Fatalf("request %d of 2 was not admitted", i+1)
		}
		releases = append(releases, release)
	}
	admitted := make(chan func())
	go func() {
		_, r, ok := s.admit(httptest.NewRecorder(), req, nil)
		if ok {
			admitted <- r
		}
	}()
	for s.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	full := httptest.NewRecorder()
	if _, _, ok := s.admit(full, req, nil); ok || full.Code != http.StatusServiceUnavailable || full.Header().Get("Retry-After") == "" {
		t.Errorf("a full queue: admitted %v, %d, Retry-After %q", ok, full.Code, full.Header().Get("Retry-After"))
	}
	releases[0]()
	(<-admitted)()
	releases[1]()
	if s.Waiting() != 0 {
		t.Errorf("%d waiting after all ran", s.Waiting())
	}

	// A waiting client that goes away leaves the queue without an answer.
	for i := range 2 {
		_, releases[i], _ = s.admit(httptest.NewRecorder(), req, nil)
	}
	gone := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	ctx, cancel := context.WithCancel(gone.Context())
	done := make(chan bool)
	go func() {
		_, _, ok := s.admit(httptest.NewRecorder(), gone.WithContext(ctx), nil)
		done <- ok
	}()
	for s.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if <-done || s.Waiting() != 0 {
		t.Errorf("a client gone while waiting was admitted, or stayed in the queue (%d)", s.Waiting())
	}
	for _, r := range releases {
		r()
	}
}

// TestSessionByPrefix: a request takes the idle session whose cache holds the longest prefix
// of its prompt, the next turn of its conversation, whichever session ran last.
func TestSessionByPrefix(t *testing.T) {
	m, err := engine.Open("../models/testdata/tiny.gguf", engine.Options{ContextLength: 64, Parallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s := New(Options{Parallel: 3})
	if err := s.SetModel(m); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := httptest.NewRequest("POST", "/v1/completions", nil)
	chats := [][]int32{{1, 5, 6, 7}, {1, 9, 9}, {1, 2}}
	held := map[*engine.Session]int{}
	var releases []func()
	for i, p := range chats {
		sess, release, ok := s.admit(httptest.NewRecorder(), req, p)
		if !ok {
			t.Fatal("not admitted")
		}
		if _, err := sess.Generate(context.Background(), p, engine.GenerateOptions{MaxTokens: 2, Sampler: engine.SamplerOptions{Greedy: true}}); err != nil {
			t.Fatal(err)
		}
		held[sess] = i
		releases = append(releases, release)
	}
	for i := len(releases) - 1; i >= 0; i-- {
		releases[i]()
	}
	for i, p := range chats {
		next := append(append([]int32{}, p...), 3, 4)
		sess, release, ok := s.admit(httptest.NewRecorder(), req, next)
		if !ok {
			t.Fatal("not admitted")
		}
		if got := held[sess]; got != i {
			t.Errorf("chat %d's next turn took chat %d's session", i, got)
		}
		release()
	}
}
