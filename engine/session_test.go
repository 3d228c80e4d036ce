package engine_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

const tinyModel = "../models/testdata/tiny.gguf"

func openTiny(t *testing.T, opts engine.Options) *engine.Model {
	t.Helper()
	m, err := engine.Open(tinyModel, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestBadRequests(t *testing.T) {
	m := openTiny(t, engine.Options{ContextLength: 16})
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	long := make([]int32, 17)
	cases := []struct {
		name   string
		prompt []int32
		opts   engine.GenerateOptions
		want   string
	}{
		{"prompt longer than the context", long, engine.GenerateOptions{}, "does not fit the context of 16"},
		{"token out of range", []int32{1, 99999}, engine.GenerateOptions{}, "token 99999 at position 1 is outside the vocabulary"},
		{"negative token", []int32{-1}, engine.GenerateOptions{}, "outside the vocabulary"},
		{"empty prompt", nil, engine.GenerateOptions{}, "empty prompt"},
		{"negative max tokens", []int32{1}, engine.GenerateOptions{MaxTokens: -1}, "max tokens"},
		{"bad temperature", []int32{1}, engine.GenerateOptions{Sampler: engine.SamplerOptions{Temperature: -2}}, "temperature"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Generate(ctx, c.prompt, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := engine.Open(tinyModel, engine.Options{KVType: "q4"}); err == nil {
		t.Error("KV type q4 accepted")
	}
	if _, err := engine.Open(tinyModel, engine.Options{Threads: -1}); err == nil {
		t.Error("threads -1 accepted")
	}
	if _, err := engine.Open(tinyModel, engine.Options{Device: "cuda:0"}); err == nil {
		t.Error("an unavailable device was accepted")
	}
}

func TestContextLimitStopsGeneration(t *testing.T) {
	m := openTiny(t, engine.Options{ContextLength: 8})
	s, _ := m.NewSession()
	defer s.Close()
	res, err := s.Generate(context.Background(), []int32{1, 2, 3}, engine.GenerateOptions{Sampler: engine.SamplerOptions{Greedy: true}, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != engine.StopContext || len(res.Tokens) != 6 {
		t.Fatalf("reason %q after %d tokens, want %q after 6 (3 prompt + 5 evaluated + 1 sampled = 8 positions used)", res.Reason, len(res.Tokens), engine.StopContext)
	}
}

func TestPrefixReuseGivesTheSameTokens(t *testing.T) {
	m := openTiny(t, engine.Options{KVType: "f32"})
	opts := engine.GenerateOptions{MaxTokens: 8, Sampler: engine.SamplerOptions{Greedy: true}, IgnoreEOS: true}
	prompt := []int32{5, 6, 7, 8}
	fresh := func(p []int32) []int32 {
		s, _ := m.NewSession()
		defer s.Close()
		r, err := s.Generate(context.Background(), p, opts)
		if err != nil {
			t.Fatal(err)
		}
		return r.Tokens
	}
	s, _ := m.NewSession()
	defer s.Close()
	first, err := s.Generate(context.Background(), prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	// The second call extends the first conversation, so the cached prefix is reused.
	p2 := append(append(append([]int32(nil), prompt...), first.Tokens...), 9, 10)
	second, err := s.Generate(context.Background(), p2, opts)
	if err != nil {
		t.Fatal(err)
	}
	if want := fresh(p2); !equal(second.Tokens, want) {
		t.Fatalf("with the cached prefix %v, from scratch %v", second.Tokens, want)
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestConcurrentSessionsAndCancel(t *testing.T) {
	m := openTiny(t, engine.Options{Threads: 2})
	opts := engine.GenerateOptions{MaxTokens: 12, Sampler: engine.SamplerOptions{Greedy: true}, IgnoreEOS: true}
	s0, _ := m.NewSession()
	want, err := s0.Generate(context.Background(), []int32{1, 2, 3}, opts)
	s0.Close()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.NewSession()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			got, err := s.Generate(context.Background(), []int32{1, 2, 3}, opts)
			if err == nil && !equal(got.Tokens, want.Tokens) {
				err = errors.New("concurrent session diverged")
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	s, _ := m.NewSession()
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err = s.Generate(ctx, []int32{1, 2, 3}, engine.GenerateOptions{IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true},
		OnToken: func(engine.Token) error {
			n++
			if n == 3 {
				cancel()
			}
			return nil
		}})
	if !errors.Is(err, context.Canceled) || n != 3 {
		t.Fatalf("after cancelling at token 3: err %v, %d tokens", err, n)
	}
}

func TestClosedModel(t *testing.T) {
	m, err := engine.Open(tinyModel, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := m.NewSession()
	m.Close()
	if _, err := s.Generate(context.Background(), []int32{1}, engine.GenerateOptions{MaxTokens: 1}); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("generate on a closed model: %v, want ErrClosed", err)
	}
}

func TestPerplexityAndChat(t *testing.T) {
	m := openTiny(t, engine.Options{})
	r, err := m.Perplexity(context.Background(), "The quick brown fox jumps over the lazy dog. The quick brown fox.", 16)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tokens < 10 || r.Perplexity <= 1 || r.BitsPerByte <= 0 {
		t.Fatalf("perplexity result %+v", r)
	}
	if _, err := m.Perplexity(context.Background(), "The old \xffprince", 16); err == nil || !strings.Contains(err.Error(), "not valid UTF-8 at byte 8") {
		t.Errorf("text with an invalid byte: %v", err)
	}
	s, _ := m.NewSession()
	defer s.Close()
	res, err := s.Chat(context.Background(), []engine.Message{{Role: "user", Content: "hi"}}, engine.GenerateOptions{MaxTokens: 4, Sampler: engine.SamplerOptions{Temperature: 0.8, Seed: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if res.PromptTokens < 3 {
		t.Fatalf("chat prompt of %d tokens: the template was not applied", res.PromptTokens)
	}
}

func TestModelShape(t *testing.T) {
	m := openTiny(t, engine.Options{ContextLength: 64})
	info := m.Info()
	s, err := m.Shape(32)
	if err != nil {
		t.Fatal(err)
	}
	if s.MoELayers != len(info.MoELayers) || s.Experts != info.Experts || s.Used != info.ExpertsUsed {
		t.Errorf("shape %+v does not match %+v", s, info)
	}
	// Every byte of the file is an expert's or resident.
	if got, want := s.ExpertBytes*float64(info.Experts*len(info.MoELayers))+s.Resident, float64(info.ExpertBytes+info.NonExpertBytes); got < want {
		t.Errorf("experts + resident = %v bytes, the weights alone are %v", got, want)
	}
	// The slot holds the largest layer's expert (tiny.gguf's first layer keeps ffn_down in Q6_K).
	if mean := float64(info.ExpertBytes) / float64(info.Experts*len(info.MoELayers)); s.ExpertBytes < mean || s.ExpertBytes > 1.5*mean {
		t.Errorf("expert bytes %v, the mean expert has %v", s.ExpertBytes, mean)
	}
	if s.Attn.Bytes <= 0 || s.Router.Bytes <= 0 || s.Head.Bytes <= 0 || s.Shared.Bytes <= 0 {
		t.Errorf("costs missing: %+v", s)
	}
	if _, err := m.Shape(0); err == nil {
		t.Error("context fill 0: no error")
	}
}
