package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/server"
)

// scrape reads /metrics with Prometheus's own text parser.
func scrape(t *testing.T, url, key string) map[string]*dto.MetricFamily {
	t.Helper()
	r := get(t, url+"/metrics", key)
	if r.status != 200 {
		t.Fatalf("metrics: %d %s", r.status, r.body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(r.body))
	if err != nil {
		t.Fatalf("metrics do not parse: %v\n%s", err, r.body)
	}
	return fams
}

// TestMetrics: after requests, /metrics counts them by route and status, the prompt and
// generated tokens, times the first token and the later ones, shows the queue, the batched
// decode steps, and on an offloading model the expert cache's figures; it needs the API key
// like the API.
func TestMetrics(t *testing.T) {
	m, err := engine.Open(bundled, engine.Options{Threads: 2, KVType: "f32", ContextLength: 128, Parallel: 2,
		Offload: &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: 40 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	url := serve(t, m, server.Options{APIKey: "k", Parallel: 2})
	c := client(url, "k")
	chat := openai.ChatCompletionNewParams{Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}, MaxTokens: openai.Int(6)}
	got, err := c.Chat.Completions.New(context.Background(), chat)
	if err != nil {
		t.Fatal(err)
	}
	c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{}) // a 400
	if r := get(t, url+"/metrics", ""); r.status != 401 {
		t.Errorf("metrics without the key: %d", r.status)
	}
	fams := scrape(t, url, "k")
	value := func(name string, labels ...string) float64 {
		f := fams[name]
		if f == nil {
			t.Errorf("no metric %s", name)
			return -1
		}
	next:
		for _, mt := range f.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range mt.Label {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue next
				}
			}
			switch {
			case mt.Counter != nil:
				return mt.Counter.GetValue()
			case mt.Gauge != nil:
				return mt.Gauge.GetValue()
			case mt.Histogram != nil:
				return float64(mt.Histogram.GetSampleCount())
			}
		}
		t.Errorf("metric %s has no series %v", name, labels)
		return -1
	}
	tokens := float64(got.Usage.CompletionTokens)
	for _, c := range []struct {
		name   string
		labels []string
		ok     func(float64) bool
	}{
		{"commit_run_requests_total", []string{"route", "POST /v1/chat/completions", "code", "200"}, func(v float64) bool { return v == 1 }},
		{"commit_run_requests_total", []string{"route", "POST /v1/chat/completions", "code", "400"}, func(v float64) bool { return v == 1 }},
		{"commit_run_requests_total", []string{"route", "refused", "code", "401"}, func(v float64) bool { return v == 1 }},
		{"commit_run_prompt_tokens_total", nil, func(v float64) bool { return v == float64(got.Usage.PromptTokens) }},
		{"commit_run_generated_tokens_total", nil, func(v float64) bool { return v == tokens }},
		{"commit_run_time_to_first_token_seconds", nil, func(v float64) bool { return v == 1 }},
		{"commit_run_time_per_token_seconds", nil, func(v float64) bool { return v == tokens-1 }},
		{"commit_run_queue_depth", nil, func(v float64) bool { return v == 0 }},
		{"commit_run_expert_hits_total", nil, func(v float64) bool { return v > 0 }},
		{"commit_run_expert_misses_total", nil, func(v float64) bool { return v >= 0 }},
		{"commit_run_expert_cache_hit_ratio", nil, func(v float64) bool { return v > 0 && v <= 1 }},
		{"commit_run_expert_bytes_copied_total", nil, func(v float64) bool { return v > 0 }},
		{"commit_run_experts_on_host_total", nil, func(v float64) bool { return v == 0 }},
		{"commit_run_expert_slots", nil, func(v float64) bool { return v > 0 }},
		// One request alone: each of its decode steps is a pass of one row.
		{"commit_run_decode_steps_total", nil, func(v float64) bool { return v == tokens-1 }},
		{"commit_run_decode_step_rows_total", nil, func(v float64) bool { return v == tokens-1 }},
	} {
		if v := value(c.name, c.labels...); !c.ok(v) {
			t.Errorf("%s%v = %v", c.name, c.labels, v)
		}
	}
}
