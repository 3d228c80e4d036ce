package offload

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkAssign measures one Assign on a full 1024-slot cache fed a decode-like stream:
// layers in turn, top-8 experts per layer drawn from a skewed (Zipf) popularity, on a
// Qwen3-30B-A3B shape (48 layers x 128 experts), so that hits, misses and evictions all occur.
func BenchmarkAssign(b *testing.B) {
	const layers, experts, topK, slots = 48, 128, 8, 1024
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.1, 4, experts-1)
	stream := make([]ExpertKey, 1<<16)
	for i := range stream {
		stream[i] = ExpertKey{Layer: (i / topK) % layers, Expert: int(zipf.Uint64())}
	}
	for _, ev := range []Eviction{LRU, LFU} {
		b.Run(ev.String(), func(b *testing.B) {
			c := mustCache(b, slots, ev)
			for _, k := range stream {
				c.Assign(k)
			}
			start := c.Stats()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, _, _, _, err := c.Assign(stream[i]); err != nil {
					b.Fatal(err)
				}
				i = (i + 1) & (len(stream) - 1)
			}
			s := c.Stats()
			hits, misses := s.Hits-start.Hits, s.Misses-start.Misses
			b.ReportMetric(float64(hits)/float64(hits+misses), "hit-ratio")
		})
	}
}
