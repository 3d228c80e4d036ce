package models

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkDeltaNetRecurrence times the recurrence of one decoded token in one layer of
// Qwen3.5/3.6-35B-A3B's shape (32 value heads over 16 key heads, heads of 128), on one
// thread: the state's decay, delta rule and read-out, without the projections.
func BenchmarkDeltaNetRecurrence(b *testing.B) {
	d := &DeltaNet{KHeads: 16, VHeads: 32, HeadDim: 128, ConvK: 4}
	conv, state := d.StateDims()
	st := newRecState(conv, state)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range st.S {
		st.S[i] = float32(r.NormFloat64() * 0.1)
	}
	row := make([]float32, d.channels())
	for i := range row {
		row[i] = float32(r.NormFloat64() * 0.1)
	}
	beta, g, out := make([]float32, d.VHeads), make([]float32, d.VHeads), make([]float32, d.VHeads*d.HeadDim)
	for h := range beta {
		beta[h], g[h] = 0.5, -0.1
	}
	j := &deltaJob{d: d, st: st, conv: row, beta: beta, g: g, out: out, T: 1}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for h := 0; h < d.VHeads; h++ {
			j.head(h)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "us/layer-token")
}
