package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestQueue: beyond the running request, Queue requests wait their turn and the next gets 503
// with Retry-After; a waiting client that goes away leaves the queue.
func TestQueue(t *testing.T) {
	s := New(Options{Queue: 1})
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	release, ok := s.admit(httptest.NewRecorder(), req)
	if !ok {
		t.Fatal("the first request was not admitted")
	}
	admitted := make(chan func())
	go func() {
		r, ok := s.admit(httptest.NewRecorder(), req)
		if ok {
			admitted <- r
		}
	}()
	for s.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	full := httptest.NewRecorder()
	if _, ok := s.admit(full, req); ok || full.Code != http.StatusServiceUnavailable || full.Header().Get("Retry-After") == "" {
		t.Errorf("a full queue: admitted %v, %d, Retry-After %q", ok, full.Code, full.Header().Get("Retry-After"))
	}
	release()
	(<-admitted)()
	if s.Waiting() != 0 {
		t.Errorf("%d waiting after both ran", s.Waiting())
	}

	// A waiting client that goes away leaves the queue without an answer.
	release, _ = s.admit(httptest.NewRecorder(), req)
	defer release()
	gone := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	ctx, cancel := context.WithCancel(gone.Context())
	done := make(chan bool)
	go func() {
		_, ok := s.admit(httptest.NewRecorder(), gone.WithContext(ctx))
		done <- ok
	}()
	for s.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if <-done || s.Waiting() != 0 {
		t.Errorf("a client gone while waiting was admitted, or stayed in the queue (%d)", s.Waiting())
	}
}
