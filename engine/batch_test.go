package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// TestBatchedSequencesMatchAlone decodes several prompts at once with continuous batching and
// checks that each sequence's greedy tokens, and their log-probabilities to the bit, equal
// those of its prompt decoded alone, on every
// golden and bundled model (standard and MLA attention), on the CPU and on a simulated GPU
// with the experts offloaded, and that the steps did share passes.
func TestBatchedSequencesMatchAlone(t *testing.T) {
	fxs, err := fixture.LoadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	type model struct{ name, path string }
	var ms []model
	for _, fx := range fxs {
		ms = append(ms, model{fx.Name, goldenModel(t, fx)})
	}
	ms = append(ms, model{"bundled qwen2moe", "../models/testdata/tinymoe-qwen2moe.gguf"}, model{"bundled mixtral", "../models/testdata/tinymoe-mixtral.gguf"})
	prompts := [][]int32{{1, 2, 3}, {5, 9, 14, 3, 7, 2}, {11}, {4, 4, 8, 15, 16, 23, 42}}
	const n = 12
	for _, mm := range ms {
		info, err := engine.Inspect(mm.path)
		if err != nil {
			t.Fatal(err)
		}
		confs := []engine.Options{{Device: "cpu"}}
		if info.Experts > 0 {
			for _, pol := range []offload.Policy{offload.OnDemand, offload.CPUMiss, offload.Hot} {
				confs = append(confs, engine.Options{Device: "sim:rtx2080ti", Offload: &engine.OffloadOptions{Policy: pol}})
			}
		}
		for _, o := range confs {
			name := mm.name + "/" + o.Device
			if o.Offload != nil {
				name += "/" + o.Offload.Policy.String()
			}
			t.Run(name, func(t *testing.T) {
				o.Threads, o.ContextLength = 2, 64
				if o.Offload != nil {
					// A budget of about half the experts, beside four KV caches.
					o.Parallel = len(prompts)
					st := offloadProbe(t, mm.path, o)
					all := int64(info.Experts * len(info.MoELayers))
					o.Offload.GPUMem = st.Resident + max(all/2, int64(2*info.ExpertsUsed))*st.SlotBytes
				}
				checkBatched(t, mm.path, o, prompts, n)
			})
		}
	}
}

// checkBatched decodes n greedy tokens after each prompt alone, then all at once with
// continuous batching, and checks that each sequence's tokens and their log-probabilities
// (with the top 5) are the same to the bit, and that the steps did share passes. It returns
// the batched model's GPU figures (if on a GPU) and its batching's.
func checkBatched(t *testing.T, path string, o engine.Options, prompts [][]int32, n int) (engine.GPUStats, engine.BatchStats) {
	t.Helper()
	o.Parallel = 1
	want := make([]engine.Result, len(prompts))
	alone := openOpts(t, path, o)
	for i, p := range prompts {
		want[i] = greedy(t, alone, p, n)
	}
	alone.Close()

	o.Parallel = len(prompts)
	m := openOpts(t, path, o)
	defer m.Close()
	got := make([]engine.Result, len(prompts))
	errs := make([]error, len(prompts))
	// The sequences wait for each other at every token, so that their decode steps overlap
	// however fast the model is and however the goroutines are scheduled.
	var wg sync.WaitGroup
	step := newLockstep(len(prompts))
	for i, p := range prompts {
		wg.Go(func() {
			s, err := m.NewSession()
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			got[i], errs[i] = s.Generate(context.Background(), p, engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true},
				Logprobs: true, TopLogprobs: 5, OnToken: func(engine.Token) error { step.wait(); return nil }})
		})
	}
	wg.Wait()
	for i := range prompts {
		if errs[i] != nil {
			t.Fatalf("sequence %d: %v", i, errs[i])
		}
		if !slices.Equal(got[i].Tokens, want[i].Tokens) {
			t.Errorf("sequence %d batched: %v, alone: %v", i, got[i].Tokens, want[i].Tokens)
		} else if !slices.EqualFunc(got[i].Logprobs, want[i].Logprobs, sameLogprob) {
			t.Errorf("sequence %d: the same tokens, but other log-probabilities batched than alone", i)
		}
	}
	st, ok := m.BatchStats()
	if !ok || st.Rows <= st.Passes {
		t.Errorf("batch stats %+v (on: %v): no step shared a pass", st, ok)
	}
	gpu, _ := m.GPUStats()
	return gpu, st
}

// TestCUDABatchedSequencesMatchAlone is TestBatchedSequencesMatchAlone on cuda:0 (the fake
// driver, or -gpu=system): the bundled models with their weights on the GPU and with the
// experts offloaded on demand. Not cpu-miss or hot: there the host computes some experts,
// chosen by the timing of the copies, with its own kernels, which round otherwise than the
// card's, so that a sequence's numbers are not the same from run to run even alone.
func TestCUDABatchedSequencesMatchAlone(t *testing.T) {
	lib := engine.GPUForTests(t)
	prompts := [][]int32{{1, 2, 3}, {5, 9, 14, 3, 7, 2}, {11}, {4, 4, 8, 15, 16, 23, 42}}
	for _, path := range []string{bundledQwen, bundledMixtral} {
		for _, pol := range []offload.Policy{-1, offload.OnDemand} {
			o := engine.Options{Threads: 2, ContextLength: 64, Device: "cuda:0", CUDALibrary: lib}
			name := path
			if pol >= 0 {
				o.Offload = &engine.OffloadOptions{Policy: pol}
				o.Parallel = len(prompts)
				st := offloadProbe(t, path, o)
				info, err := engine.Inspect(path)
				if err != nil {
					t.Fatal(err)
				}
				o.Offload.GPUMem = st.Resident + int64(info.Experts*len(info.MoELayers)/2)*st.SlotBytes
				name += "/" + pol.String()
			}
			t.Run(name, func(t *testing.T) {
				gpu, st := checkBatched(t, path, o, prompts, 8)
				// With the model on the card every pass, a prompt's of a few tokens or a
				// batch of decode steps, is routed on the device (the fused kernels, a row's
				// experts as entries of their own): it reads back its logits and nothing else.
				if pol < 0 && gpu.Reads > st.Passes+int64(len(prompts)) {
					t.Errorf("%d read-backs for %d prompts and %d batched passes: want one a pass", gpu.Reads, len(prompts), st.Passes)
				}
				t.Logf("%d read-backs for %d prompts and %d batched passes (%d rows)", gpu.Reads, len(prompts), st.Passes, st.Rows)
			})
		}
	}
}

// lockstep is a barrier for n goroutines, used again and again.
type lockstep struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n, here int
	round   int
}

func newLockstep(n int) *lockstep {
	l := &lockstep{n: n}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// wait returns once all n goroutines have called it in this round.
func (l *lockstep) wait() {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.round
	l.here++
	if l.here == l.n {
		l.here, l.round = 0, l.round+1
		l.cond.Broadcast()
		return
	}
	for r == l.round {
		l.cond.Wait()
	}
}

func openOpts(t *testing.T, path string, o engine.Options) *engine.Model {
	t.Helper()
	m, err := engine.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// greedy decodes n tokens after prompt, with the log-probabilities of each and its top 5.
func greedy(t *testing.T, m *engine.Model, prompt []int32, n int) engine.Result {
	t.Helper()
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}, Logprobs: true, TopLogprobs: 5})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// sameLogprob says whether two tokens' log-probabilities are equal to the bit.
func sameLogprob(a, b engine.Logprob) bool {
	return a.ID == b.ID && math.Float32bits(a.Logprob) == math.Float32bits(b.Logprob) &&
		slices.EqualFunc(a.Top, b.Top, func(x, y engine.TokenLogprob) bool {
			return x.ID == y.ID && math.Float32bits(x.Logprob) == math.Float32bits(y.Logprob)
		})
}

// TestParallelReservesKVCaches checks that an offload budget keeps room for the KV caches of
// Options.Parallel sequences before it sizes the expert slots, and says so when it cannot.
func TestParallelReservesKVCaches(t *testing.T) {
	info, err := engine.Inspect(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	base := engine.Options{ContextLength: 64, Offload: &engine.OffloadOptions{Policy: offload.OnDemand}}
	one := offloadProbe(t, tinyModel, base)
	base.Parallel = 3
	three := offloadProbe(t, tinyModel, base)
	kv := (three.Resident - one.Resident) / 2
	if kv <= 0 {
		t.Fatalf("3 parallel sequences reserve %d bytes, 1 sequence %d", three.Resident, one.Resident)
	}
	need := three.Resident + int64(info.ExpertsUsed)*three.SlotBytes
	o := base
	o.Offload = &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: need - 1}
	if _, err := engine.Open(tinyModel, o); err == nil || !strings.Contains(err.Error(), "KV caches of 3 parallel sequences") ||
		!strings.Contains(err.Error(), fmt.Sprintf("at least %d bytes", need)) {
		t.Errorf("budget %d for 3 sequences: %v", need-1, err)
	}
	o.Offload.GPUMem = need
	m := openOpts(t, tinyModel, o)
	defer m.Close()
	var ss []*engine.Session
	for i := range 3 {
		s, err := m.NewSession()
		if err != nil {
			t.Fatalf("session %d of 3: %v", i+1, err)
		}
		ss = append(ss, s)
	}
	if _, err := m.NewSession(); err == nil {
		t.Error("a fourth session fit a budget sized for 3")
	}
	for _, s := range ss {
		s.Close()
	}
	if !m.Batches() {
		t.Error("3 parallel sequences, no Commit Router: Batches says no")
	}
	// Under commit the Commit Router predicts one token's experts: each sequence decodes on
	// its own, and the model says so.
	cm, err := engine.Open("../models/testdata/tinymoe-qwen2moe.gguf", engine.Options{Parallel: 2, ContextLength: 64, Device: "sim:rtx4090",
		Offload: &engine.OffloadOptions{Policy: offload.Commit, GPUMem: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Batches() {
		t.Error("under commit, Batches says yes")
	}
	cm.Close()
	for _, p := range []int{-1, engine.MaxParallel + 1} {
		if _, err := engine.Open(tinyModel, engine.Options{Parallel: p}); err == nil || !strings.Contains(err.Error(), "parallel") {
			t.Errorf("parallel %d: %v", p, err)
		}
	}
}

// TestBatchedCancelAndClose cancels one of several batched sequences, which leaves the batch
// while the others go on, then closes the model under the others: they end with ErrClosed,
// nothing hangs and the batcher's goroutine is gone.
func TestBatchedCancelAndClose(t *testing.T) {
	m, err := engine.Open("../models/testdata/tinymoe-qwen2moe.gguf", engine.Options{Threads: 2, ContextLength: 2048, Parallel: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	counts := make([]int, 3)
	var wg sync.WaitGroup
	started := make(chan struct{}, 3)
	for i := range 3 {
		wg.Go(func() {
			s, err := m.NewSession()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			c := context.Background()
			if i == 0 {
				c = ctx
			}
			_, err = s.Generate(c, []int32{1, 2, 3}, engine.GenerateOptions{IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true},
				OnToken: func(engine.Token) error {
					counts[i]++
					if counts[i] == 5 {
						started <- struct{}{}
					}
					if i == 0 && counts[i] == 8 {
						cancel()
					}
					return nil
				}})
			errs <- err
		})
	}
	for range 3 {
		<-started
	}
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled sequence ended with %v", err)
	}
	m.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, engine.ErrClosed) && err != nil {
			t.Errorf("a sequence decoding when the model closed ended with %v", err)
		}
	}
	if counts[0] != 8 {
		t.Errorf("the cancelled sequence took %d tokens, want 8", counts[0])
	}
}

// TestBatchedOffloadCopiesLess decodes four sequences at once on a simulated GPU whose slots
// hold under half of the bundled model's experts, and checks that the expert bytes copied per
// decoded token fall below those of the same sequences decoded one after another: each
// expert a batch shares is copied once for all its sequences, and a batch that goes through
// more experts than the slots hold does not let LRU evict what its next step wants
// (offloader.scanning).
func TestBatchedOffloadCopiesLess(t *testing.T) {
	const path = "../models/testdata/tinymoe-qwen2moe.gguf"
	prompts := [][]int32{{1, 2, 3}, {5, 9, 14, 3, 7, 2}, {11}, {4, 4, 8, 15, 16, 23, 42}}
	const n = 24
	o := engine.Options{Threads: 2, ContextLength: 64, Device: "sim:rtx2080ti", Parallel: len(prompts),
		Offload: &engine.OffloadOptions{Policy: offload.OnDemand}}
	st := offloadProbe(t, path, o)
	o.Offload.GPUMem = st.Resident + 28*st.SlotBytes // of 64 experts
	perToken := func(batched bool) float64 {
		m := openOpts(t, path, o)
		defer m.Close()
		var copied int64
		var wg sync.WaitGroup
		step := newLockstep(len(prompts))
		for _, p := range prompts {
			run := func() {
				s, err := m.NewSession()
				if err != nil {
					t.Error(err)
					return
				}
				defer s.Close()
				var before engine.OffloadStats
				first := true
				_, err = s.Generate(context.Background(), p, engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true},
					OnToken: func(engine.Token) error {
						if batched {
							step.wait()
						}
						if first { // the decode steps only, after every prompt
							first = false
							if batched {
								step.wait()
							}
							before, _ = m.Offload()
						}
						return nil
					}})
				if err != nil {
					t.Error(err)
				}
				after, _ := m.Offload()
				if batched {
					step.wait()
				}
				if !batched || p[0] == prompts[0][0] {
					copied += after.BytesCopied - before.BytesCopied
				}
			}
			if batched {
				wg.Go(run)
			} else {
				run()
			}
		}
		wg.Wait()
		return float64(copied) / float64(len(prompts)*(n-1))
	}
	alone, batched := perToken(false), perToken(true)
	t.Logf("expert bytes copied per decoded token: %.0f alone, %.0f four at once", alone, batched)
	if !(batched < 0.9*alone) {
		t.Errorf("four sequences at once copied %.0f bytes per decoded token, one at a time %.0f: want at least 10%% fewer", batched, alone)
	}
}

// TestBatchJoinsPromptly starts two sequences at once, as two requests arriving together,
// and needs their decode steps to share passes: the second's prompt runs between two steps
// and it joins the next. The batcher's goroutine and the first session readied each other in
// turn, which the Go scheduler lets keep their thread for a time slice (10 ms), and the second
// session waited on that thread's queue meanwhile: its steps shared a pass about one time in
// ten (BenchmarkBatchedDecode: 1.1 sequences a step of two).
func TestBatchJoinsPromptly(t *testing.T) {
	m, err := engine.Open("../models/testdata/tinymoe-qwen2moe.gguf", engine.Options{Threads: 2, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var ss [2]*engine.Session
	for i := range ss {
		if ss[i], err = m.NewSession(); err != nil {
			t.Fatal(err)
		}
		defer ss[i].Close()
	}
	opts := engine.GenerateOptions{MaxTokens: 48, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}
	// rowsAStep runs three rounds of the two sequences and returns their mean rows a step.
	rowsAStep := func(try int) (float64, int64) {
		before, _ := m.BatchStats()
		for round := range 3 {
			var wg sync.WaitGroup
			for i, s := range ss {
				wg.Go(func() {
					if _, err := s.Generate(context.Background(), []int32{1, 2, int32(3 + 2*round + i + 8*try)}, opts); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
		}
		st, _ := m.BatchStats()
		return float64(st.Rows-before.Rows) / float64(st.Passes-before.Passes), st.Passes - before.Passes
	}
	// Alone on the machine this gives 1.97-1.99 rows a step; the scheduling it guards
	// against gave 1.06-1.54 in every try, never 1.7. A test binary beside it on two busy
	// cores can hold the second session off its thread past a step's grace (1.52 was seen
	// once), so the best of three tries counts: the fault fails every try, the load one at a
	// time.
	var got []string
	for try := range 3 {
		mean, passes := rowsAStep(try)
		t.Logf("try %d: %.2f rows a step (%d steps)", try, mean, passes)
		if mean >= 1.7 {
			return
		}
		got = append(got, fmt.Sprintf("%.2f (%d steps)", mean, passes))
	}
	t.Errorf("two sequences started together decoded %s rows a step in three tries, want nearly 2", strings.Join(got, ", "))
}
