package server

import (
	_ "embed"
	"net/http"
)

// chatPage is the chat page at /: one file, embedded, fetching nothing from elsewhere. It
// streams replies from /v1/chat/completions and draws each reply's tokens/s and, with
// offloading, its expert cache hit rate (the commit_run field of the stream's chunks).
//
//go:embed chat.html
var chatPage []byte

func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	// Its own script and style only; it talks to this server alone.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	w.Write(chatPage)
}
