package engine_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

// BenchmarkDecode decodes tokens of the bundled Qwen1.5-MoE-style model on the CPU (greedy,
// after a 4-token prompt), 32 per op, and reports tokens/s and the heap allocations of a
// decoded token. The matrix products, attention and the thread pool allocate nothing; what
// remains is the engine's routing and bookkeeping around them (with the prompt pass's share).
func BenchmarkDecode(b *testing.B) {
	for _, threads := range []int{1, 2} {
		b.Run(map[int]string{1: "threads=1", 2: "threads=2"}[threads], func(b *testing.B) {
			m, err := engine.Open("../models/testdata/tinymoe-qwen2moe.gguf", engine.Options{Threads: threads})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			s, err := m.NewSession()
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			const n = 32
			opts := engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}
			prompt := []int32{1, 2, 3, 4}
			ctx := context.Background()
			if _, err := s.Generate(ctx, prompt, opts); err != nil { // warm the pools
				b.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.Generate(ctx, prompt, opts); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			runtime.ReadMemStats(&after)
			tokens := float64(n) * float64(b.N)
			b.ReportMetric(tokens/b.Elapsed().Seconds(), "tokens/s")
			b.ReportMetric(float64(after.Mallocs-before.Mallocs)/tokens, "allocs/token")
		})
	}
}

// batchModel is the model BenchmarkBatchedDecode decodes: the bundled one, or a larger file
// whose weights do not fit the caches (-batch-model /tmp/olmoe-q4k.gguf, from cmd/synth).
var batchModel = flag.String("batch-model", "../models/testdata/tinymoe-qwen2moe.gguf", "the GGUF file BenchmarkBatchedDecode decodes")

// BenchmarkBatchedDecode decodes 32 greedy tokens in each of 1, 2 and 4 sessions at once on
// the bundled model (or -batch-model) with continuous batching (Options.Parallel 4), two
// threads, and reports the tokens/s of all the sessions together and the mean rows of a step:
// the engine's side of the server's load benchmark (tools/bench/serveload), without HTTP or
// sampling costs.
func BenchmarkBatchedDecode(b *testing.B) {
	for _, seqs := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("sequences=%d", seqs), func(b *testing.B) {
			m, err := engine.Open(*batchModel, engine.Options{Threads: 2, Parallel: 4})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			ss := make([]*engine.Session, seqs)
			for i := range ss {
				if ss[i], err = m.NewSession(); err != nil {
					b.Fatal(err)
				}
				defer ss[i].Close()
			}
			const n = 32
			opts := engine.GenerateOptions{MaxTokens: n, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}
			ctx := context.Background()
			// Warm the pools and fault the mapped weights in (llama-batched-bench warms up too).
			if _, err := ss[0].Generate(ctx, []int32{1, 2, 3, 4}, opts); err != nil {
				b.Fatal(err)
			}
			st0, _ := m.BatchStats()
			b.ResetTimer()
			for b.Loop() {
				var wg sync.WaitGroup
				for i, s := range ss {
					wg.Go(func() {
						if _, err := s.Generate(ctx, []int32{1, 2, 3, int32(4 + i)}, opts); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
			b.ReportMetric(float64(n*seqs*b.N)/b.Elapsed().Seconds(), "tokens/s")
			if st, ok := m.BatchStats(); ok && st.Passes > st0.Passes {
				b.ReportMetric(float64(st.Rows-st0.Rows)/float64(st.Passes-st0.Passes), "seqs/step")
			}
		})
	}
}
