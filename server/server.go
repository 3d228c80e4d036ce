// Package server is commit-run's HTTP API over an engine model, and a chat page at / that
// uses it: OpenAI-compatible routes (POST /v1/chat/completions and /v1/completions, streamed
// as server-sent events or not; GET /v1/models and /v1/models/{id}), ollama-compatible ones
// (POST /api/chat and /api/generate, streamed as NDJSON or not; GET /api/tags, /api/ps,
// /api/version; POST /api/show), llama-server's POST /tokenize and /detokenize and GET /props,
// GET /experts (an offloading model's expert slots now), GET /health, which answers 503 until
// the model has loaded, and GET /metrics in Prometheus's format (requests, tokens, time to
// first token and per token, the queue, and an offloading model's expert cache).
//
// An answer cut short never looks whole: a stream ends with an error event (OpenAI's, or
// ollama's error line) and no [DONE] or done line, a whole answer is 503 (ErrShutdown) or 500.
//
// Up to Options.Parallel requests generate at once, each on one of as many engine sessions;
// with a model opened with engine.Options.Parallel their decode steps share forward passes
// (continuous batching). A request takes the idle session whose KV cache shares the longest
// prefix with its prompt, so that the next turn of a chat skips the prefill of what it
// shares. Beyond the running requests a bounded queue waits; when it is full a request gets
// 503 with Retry-After. A client that disconnects cancels its generation at once.
//
// Any model name a request gives is answered by the served model, as llama-server does, and
// the answer names the real one (Options.StrictModelName refuses other names, as ollama does).
//
// Safe by default: bound to loopback (Options.LocalOnly), requests whose Host header names
// another machine are refused (DNS rebinding); with an API key every route but /health and
// the page needs "Authorization: Bearer KEY"; request bodies are capped, and one that does not
// arrive within Options.BodyTimeout is answered 408; errors have OpenAI's JSON shape, and
// ollama's ({"error": "..."}) on /api/*; no web origin may read answers from a browser unless
// Options.CORSOrigins allows it.
package server

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/commit-run/commit-run/engine"
)

// Options configure a Server. The zero value serves without a key, on any Host header, with
// the default queue and body cap.
type Options struct {
	// ModelName is the id /v1/models lists and requests may name (default: the model file's
	// base name without .gguf).
	ModelName string
	// StrictModelName refuses requests that name another model (404); by default any name
	// is answered by the served model, as llama-server answers, since clients send their own
	// defaults (LangChain's "gpt-3.5-turbo").
	StrictModelName bool
	// APIKey, when set, is required as "Authorization: Bearer APIKey" on every route but
	// /health and the chat page at /, which holds nothing a key protects and sends the key
	// its user types with its requests (a browser cannot add it to a page's own load).
	APIKey string
	// Parallel is how many requests generate at once, each on its own session (0 or 1: one
	// at a time). Open the model with engine.Options.Parallel as large, so that their
	// decode steps share passes and an offload budget holds their KV caches.
	Parallel int
	// Queue is how many requests may wait beyond those running (0: DefaultQueue; negative:
	// none).
	Queue int
	// MaxBodyBytes caps a request body (0: DefaultMaxBody).
	MaxBodyBytes int64
	// BodyTimeout bounds how long a request body may take to arrive once its header has
	// (0: DefaultBodyTimeout): a client that sends a byte a second, or a Content-Length
	// whose bytes never come, gets 408 instead of holding a connection forever.
	BodyTimeout time.Duration
	// LocalOnly refuses requests whose Host header is not loopback: set it when listening on
	// a loopback address, so that a web page cannot reach the server through a DNS name
	// rebound to 127.0.0.1.
	LocalOnly bool
	// RefuseOverflow refuses a chat that has outgrown the context (400); by default its
	// oldest turns after the system prompt are dropped until it fits, as ollama does, and the
	// answer says how many (header X-Context-Trimmed, metric
	// commit_run_context_trimmed_messages_total).
	RefuseOverflow bool
	// CORSOrigins are the web origins ("https://app.example", or "*" for any) whose pages may
	// call the API from a browser; none by default, so a page elsewhere cannot read answers.
	CORSOrigins []string
}

// ErrShutdown is the cause to cancel requests' contexts with (http.Server.BaseContext, with
// context.WithCancelCause) when the server stops: answers cut then say so, and whole answers
// are 503, which a client may retry elsewhere.
var ErrShutdown = errors.New("the server is shutting down")

// failure says how a generation that ended in err is told to its client: the status of a
// whole answer, and the message of a streamed one's error event. An answer cut short must
// never look complete (openai-node takes a stream that just ends for a whole answer).
func failure(r *http.Request, err error) (status int, msg string) {
	if r.Context().Err() == nil {
		return http.StatusInternalServerError, err.Error()
	}
	if cause := context.Cause(r.Context()); errors.Is(cause, ErrShutdown) {
		return http.StatusServiceUnavailable, ErrShutdown.Error() + ": the answer was cut short"
	}
	// The client went away, or its request was cancelled: nobody may read this.
	return http.StatusServiceUnavailable, "the generation was cancelled before its end"
}

// Defaults of Options.
const (
	DefaultQueue       = 16
	DefaultMaxBody     = 8 << 20
	DefaultBodyTimeout = 10 * time.Second
)

// Server serves one model. Its methods are safe for concurrent use.
type Server struct {
	opts     Options
	mu       sync.Mutex // guards model, sessions and name until ready, and idle
	model    *engine.Model
	sessions []*engine.Session
	idle     []*engine.Session // those no request holds
	name     string
	ready    atomic.Bool
	// run admits the requests that generate, one token each; waiting counts those queued.
	run     chan struct{}
	waiting atomic.Int64
	created int64 // the model's "created" time in /v1/models
	met     *metrics
	// maxTokenBytes bounds the bytes of text a token stands for (engine.Model.MaxTokenBytes).
	maxTokenBytes int
}

// New returns a server with no model yet: /health says 503 and the API routes too, until
// SetModel.
func New(o Options) *Server {
	if o.Queue == 0 {
		o.Queue = DefaultQueue
	}
	o.Queue = max(o.Queue, 0)
	o.Parallel = max(o.Parallel, 1)
	o.MaxBodyBytes = cmp.Or(o.MaxBodyBytes, DefaultMaxBody)
	o.BodyTimeout = cmp.Or(o.BodyTimeout, DefaultBodyTimeout)
	s := &Server{opts: o, run: make(chan struct{}, o.Parallel), created: time.Now().Unix()}
	s.met = newMetrics(s)
	return s
}

// SetModel makes the server serve m, which it then owns the sessions of (Options.Parallel);
// it is called once, when the model has loaded.
func (s *Server) SetModel(m *engine.Model) error {
	var sessions []*engine.Session
	for i := range s.opts.Parallel {
		sess, err := m.NewSession()
		if err != nil {
			for _, o := range sessions {
				o.Close()
			}
			return fmt.Errorf("server: session %d of %d: %w", i+1, s.opts.Parallel, err)
		}
		sessions = append(sessions, sess)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.model != nil {
		for _, o := range sessions {
			o.Close()
		}
		return errors.New("server: a model is served already")
	}
	s.model, s.sessions, s.idle = m, sessions, slices.Clone(sessions)
	s.maxTokenBytes = max(m.MaxTokenBytes(), 1)
	s.met.offloading(m)
	s.met.batching(m)
	s.name = s.opts.ModelName
	if s.name == "" {
		s.name = strings.TrimSuffix(filepath.Base(m.Info().Path), ".gguf")
	}
	s.ready.Store(true)
	return nil
}

// Close gives back the sessions; the model stays its owner's.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ready.Store(false)
	var errs []error
	for _, o := range s.sessions {
		errs = append(errs, o.Close())
	}
	s.sessions, s.idle = nil, nil
	return errors.Join(errs...)
}

// Handler returns the server's routes behind its checks (Host header, API key, body cap).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	routes := []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"GET", "/{$}", s.page},
		{"GET", "/health", s.health},
		{"GET", "/metrics", s.met.handler().ServeHTTP},
		{"GET", "/v1/models", s.models},
		{"GET", "/v1/models/{id...}", s.model1},
		{"POST", "/v1/chat/completions", s.chatCompletions},
		{"POST", "/v1/completions", s.completions},
		{"POST", "/api/chat", s.ollamaChat},
		{"POST", "/api/generate", s.ollamaGenerateRoute},
		{"GET", "/api/tags", s.ollamaTags},
		{"POST", "/api/show", s.ollamaShow},
		{"GET", "/api/ps", s.ollamaPs},
		{"GET", "/api/version", s.ollamaVersion},
		{"POST", "/tokenize", s.tokenize},
		{"POST", "/detokenize", s.detokenize},
		{"GET", "/props", s.props},
		{"GET", "/experts", s.experts},
	}
	for _, rt := range routes {
		mux.HandleFunc(rt.method+" "+rt.path, rt.h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		for _, rt := range routes {
			if rt.path == r.URL.Path || rt.path == "/{$}" && r.URL.Path == "/" {
				w.Header().Set("Allow", rt.method)
				refuse(w, r, http.StatusMethodNotAllowed, "invalid_request_error", fmt.Sprintf("%s %s: this route takes %s", r.Method, r.URL.Path, rt.method), "")
				return
			}
		}
		refuse(w, r, http.StatusNotFound, "not_found_error", fmt.Sprintf("no route %s %s", r.Method, r.URL.Path), "")
	})
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w := &statusWriter{ResponseWriter: rw}
		route := "refused"
		defer func() { s.met.count(route, w) }()
		if s.opts.LocalOnly && !localHost(r.Host) {
			refuse(w, r, http.StatusForbidden, "permission_error",
				fmt.Sprintf("Host %q is not this machine: the server listens on loopback and answers only requests addressed to it (localhost, 127.0.0.1, [::1])", r.Host), "")
			return
		}
		if s.cors(w, r) {
			return // a preflight, answered
		}
		// /health and the chat page hold nothing a key protects; the page sends the key the
		// user types with its requests, which a browser cannot add to a page's own load.
		if s.opts.APIKey != "" && r.URL.Path != "/health" && r.URL.Path != "/" && !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="commit-run"`)
			refuse(w, r, http.StatusUnauthorized, "invalid_request_error", "missing or wrong API key: send Authorization: Bearer KEY", "invalid_api_key")
			return
		}
		r.Body = s.bodyDeadline(w, r)
		r.Body = http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes)
		mux.ServeHTTP(w, r)
		route = cmp.Or(r.Pattern, "unmatched")
	})
}

// refuse answers a request the server refuses before any route runs, in the error shape its
// client reads: ollama's on /api/*, whose clients print OpenAI's as [object Object].
func refuse(w http.ResponseWriter, r *http.Request, status int, typ, msg, code string) {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		ollamaError(w, status, "%s", msg)
		return
	}
	writeError(w, status, typ, msg, code)
}

// bodyDeadline bounds the time r's body may take to arrive (Options.BodyTimeout). The
// deadline is the connection's, so it is lifted once the whole body has been read: a streamed
// answer must not trip it, and net/http watches the connection for a client that goes away
// with reads under the same deadline. A body that fails keeps it, since net/http reads what
// is left of an unread body before it answers, which must not wait for bytes that never come.
func (s *Server) bodyDeadline(w http.ResponseWriter, r *http.Request) io.ReadCloser {
	if r.Body == nil || r.Body == http.NoBody {
		return r.Body
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(s.opts.BodyTimeout)) != nil {
		return r.Body // a connection without deadlines (a test recorder): nothing to lift
	}
	return &deadlineBody{ReadCloser: r.Body, lift: func() { rc.SetReadDeadline(time.Time{}) }}
}

// deadlineBody lifts the body's read deadline once the body has been read to its end.
type deadlineBody struct {
	io.ReadCloser
	lift func()
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && b.lift != nil {
		b.lift()
		b.lift = nil
	}
	return n, err
}

// cors lets the pages of the allowed origins read the answers, and answers their browsers'
// preflight requests (which carry no key) itself: then it returns true.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || !slices.ContainsFunc(s.opts.CORSOrigins, func(o string) bool { return o == "*" || strings.EqualFold(o, origin) }) {
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", origin)
	h.Add("Vary", "Origin")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// authorized says whether r carries the API key: "Authorization: Bearer KEY", the scheme's
// name matched case-insensitively as RFC 6750 (through RFC 9110) allows.
func (s *Server) authorized(r *http.Request) bool {
	scheme, key, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(key)), []byte(s.opts.APIKey)) == 1
}

// localHost says whether a Host header names the loopback interface.
func localHost(host string) bool {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = host // no port
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if !s.ready.Load() {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "loading model"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{
		{"id": s.name, "object": "model", "created": s.created, "owned_by": "commit-run"},
	}})
}

// model1 is GET /v1/models/{id}: the served model, under any id unless StrictModelName (the
// answer names the real one).
func (s *Server) model1(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	if id := r.PathValue("id"); !s.serves(id) {
		writeError(w, http.StatusNotFound, "invalid_request_error", fmt.Sprintf("model %q is not served here; this server serves %q (GET /v1/models)", id, s.name), "model_not_found")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": s.name, "object": "model", "created": s.created, "owned_by": "commit-run"})
}

// serves says whether a request naming model name is answered: any name ("" included)
// unless StrictModelName, then the served name, or ollama's name:latest of it.
func (s *Server) serves(name string) bool {
	return !s.opts.StrictModelName || name == "" || name == s.name || name == s.name+":latest"
}

// loaded answers 503 and returns false while the model loads.
func (s *Server) loaded(w http.ResponseWriter) bool {
	if s.ready.Load() {
		return true
	}
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "server_error", "the model is still loading", "")
	return false
}

// admit waits for the request's turn to generate, within the queue's bound, and returns the
// session it generates on: the idle one whose cache shares the longest prefix with prompt.
// release gives it back. A full queue, or a client gone while waiting, ends the request with
// an answer.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, prompt []int32) (sess *engine.Session, release func(), ok bool) {
	select {
	case s.run <- struct{}{}:
		return s.take(prompt)
	default:
	}
	if s.waiting.Add(1) > int64(s.opts.Queue) {
		s.waiting.Add(-1)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "server_error",
			fmt.Sprintf("busy: %d running and %d waiting; try again shortly", s.opts.Parallel, s.opts.Queue), "")
		return nil, nil, false
	}
	defer s.waiting.Add(-1)
	select {
	case s.run <- struct{}{}:
		return s.take(prompt)
	case <-r.Context().Done():
		return nil, nil, false // nobody is left to answer
	}
}

// take hands an admitted request its session.
func (s *Server) take(prompt []int32) (*engine.Session, func(), bool) {
	s.mu.Lock()
	best, n := 0, -1
	for i, o := range s.idle {
		if k := o.Shared(prompt); k > n {
			best, n = i, k
		}
	}
	sess := s.idle[best]
	s.idle = slices.Delete(s.idle, best, best+1)
	s.mu.Unlock()
	// The handlers release the session as soon as its generation ends, before the answer's
	// last bytes, so that a client that sends its next request on reading them finds it
	// free; and again, harmlessly, when they return.
	return sess, sync.OnceFunc(func() {
		s.mu.Lock()
		s.idle = append(s.idle, sess)
		s.mu.Unlock()
		<-s.run
	}), true
}

// Waiting is how many requests wait for their turn now.
func (s *Server) Waiting() int { return int(s.waiting.Load()) }

// apiError is OpenAI's error body.
type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, typ, msg, code string) {
	(&reqError{status: status, typ: typ, msg: msg, code: code}).write(w)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
