package server

import (
	_ "embed"
	"net/http"
)

// chatPage is the chat page at /: one file, embedded, fetching nothing from elsewhere. It
// keeps conversations in the browser, streams replies from /v1/chat/completions as markdown
// (stoppable), and shows the server's figures: its timings, the context's fill and trimming,
// and with offloading the expert cache (the stream's commit_run field and GET /experts).
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
