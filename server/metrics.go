package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/commit-run/commit-run/engine"
)

// metrics are what GET /metrics reports, in a registry of the server's own (two servers in
// one process do not share counters).
type metrics struct {
	reg       *prometheus.Registry
	requests  *prometheus.CounterVec
	prompt    prometheus.Counter
	generated prometheus.Counter
	ttft      prometheus.Histogram
	perToken  prometheus.Histogram
	trimmed   prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "commit_run_requests_total",
			Help: "HTTP requests answered, by route and status code."}, []string{"route", "code"}),
		prompt: prometheus.NewCounter(prometheus.CounterOpts{Name: "commit_run_prompt_tokens_total",
			Help: "Prompt tokens of the generation requests."}),
		generated: prometheus.NewCounter(prometheus.CounterOpts{Name: "commit_run_generated_tokens_total",
			Help: "Tokens generated."}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "commit_run_time_to_first_token_seconds",
			Help:    "From a generation request's arrival to its first generated token, queueing included.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		perToken: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "commit_run_time_per_token_seconds",
			Help:    "Between consecutive generated tokens of a request.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		trimmed: prometheus.NewCounter(prometheus.CounterOpts{Name: "commit_run_context_trimmed_messages_total",
			Help: "Oldest chat messages dropped so that a conversation fits the context."}),
	}
	reg.MustRegister(m.requests, m.prompt, m.generated, m.ttft, m.perToken, m.trimmed,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "commit_run_queue_depth",
			Help: "Requests waiting for their turn to generate."}, func() float64 { return float64(s.Waiting()) }))
	return m
}

// batching registers continuous batching's figures of model m, when it batches.
func (m *metrics) batching(model *engine.Model) {
	if _, ok := model.BatchStats(); !ok {
		return
	}
	stat := func(f func(engine.BatchStats) int64) func() float64 {
		return func() float64 {
			st, _ := model.BatchStats()
			return float64(f(st))
		}
	}
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "commit_run_decode_steps_total",
			Help: "Forward passes of batched decode steps."}, stat(func(s engine.BatchStats) int64 { return s.Passes })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "commit_run_decode_step_rows_total",
			Help: "Tokens the batched decode steps evaluated, one per sequence: over the steps, the mean batch."}, stat(func(s engine.BatchStats) int64 { return s.Rows })))
}

// offloading registers the offloader's figures of model m, when it offloads.
func (m *metrics) offloading(model *engine.Model) {
	if _, ok := model.Offload(); !ok {
		return
	}
	stat := func(f func(engine.OffloadStats) float64) func() float64 {
		return func() float64 {
			st, _ := model.Offload()
			return f(st)
		}
	}
	counter := func(name, help string, f func(engine.OffloadStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, stat(f))
	}
	gauge := func(name, help string, f func(engine.OffloadStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, stat(f))
	}
	m.reg.MustRegister(
		counter("commit_run_expert_hits_total", "Experts found in a device slot when needed.", func(s engine.OffloadStats) float64 { return float64(s.Hits) }),
		counter("commit_run_expert_misses_total", "Experts not in a slot when needed: copied in, or computed by the host.", func(s engine.OffloadStats) float64 { return float64(s.Misses) }),
		gauge("commit_run_expert_cache_hit_ratio", "Hits over hits and misses since the model opened.", func(s engine.OffloadStats) float64 {
			return ratio(s.Hits, s.Hits+s.Misses)
		}),
		counter("commit_run_expert_bytes_copied_total", "Expert bytes copied into device slots.", func(s engine.OffloadStats) float64 { return float64(s.BytesCopied) }),
		counter("commit_run_experts_prefetched_total", "Experts copied ahead of their layer.", func(s engine.OffloadStats) float64 { return float64(s.Prefetched) }),
		counter("commit_run_experts_on_host_total", "Experts the host computed from host memory.", func(s engine.OffloadStats) float64 { return float64(s.OnCPU) }),
		gauge("commit_run_expert_prediction_accuracy", "Share of the experts predicted for a single-token pass that the router chose.", func(s engine.OffloadStats) float64 {
			return ratio(s.Correct, s.Predicted)
		}),
		gauge("commit_run_expert_slots", "Device slots for experts.", func(s engine.OffloadStats) float64 { return float64(s.Slots) }),
	)
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets streamed answers through the wrapper.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection (the body's read deadline).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// count records a request once it is answered; route is the pattern that served it.
func (m *metrics) count(route string, w *statusWriter) {
	m.requests.WithLabelValues(route, strconv.Itoa(max(w.code, http.StatusOK))).Inc()
}

// timer observes a generation's first token and the gaps between the later ones.
type timer struct {
	m     *metrics
	start time.Time
	last  time.Time
}

func (t *timer) token() {
	now := time.Now()
	if t.last.IsZero() {
		t.m.ttft.Observe(now.Sub(t.start).Seconds())
	} else {
		t.m.perToken.Observe(now.Sub(t.last).Seconds())
	}
	t.last = now
	t.m.generated.Inc()
}
