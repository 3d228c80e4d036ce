package models

import (
	"math/rand/v2"
	"testing"

	"github.com/commit-run/commit-run/device"
)

// BenchmarkDeltaNetRecurrence times the recurrence in one layer of Qwen3.5/3.6-35B-A3B's shape
// (32 value heads over 16 key heads, heads of 128), on one thread: the state's decay, delta
// rule and read-out, without the projections, for a decoded token and for a prompt's pass of
// 256 tokens (microseconds a token either way).
func BenchmarkDeltaNetRecurrence(b *testing.B) {
	for _, T := range []int{1, 256} {
		name := "decode"
		if T > 1 {
			name = "prompt"
		}
		b.Run(name, func(b *testing.B) {
			d := &DeltaNet{DeltaNetLayer: device.DeltaNetLayer{KHeads: 16, VHeads: 32, HeadDim: 128, ConvK: 4}}
			conv, state := d.StateDims()
			st, err := newRecState(conv, state, HostAlloc, "layer 0")
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for i := range st.S {
				st.S[i] = float32(r.NormFloat64() * 0.1)
			}
			rows := make([]float32, T*d.Channels())
			for i := range rows {
				rows[i] = float32(r.NormFloat64() * 0.1)
			}
			beta, g, out := make([]float32, T*d.VHeads), make([]float32, T*d.VHeads), make([]float32, T*d.VHeads*d.HeadDim)
			for h := range beta {
				beta[h], g[h] = 0.5, -0.1
			}
			j := &deltaJob{l: &d.DeltaNetLayer, st: &st.DeltaNetState, conv: rows, beta: beta, g: g, out: out, T: T}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for h := 0; h < d.VHeads; h++ {
					j.head(h)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*T), "us/layer-token")
		})
	}
}

// BenchmarkDeltaNetConvolution times the causal convolution of one layer of Qwen3.5/3.6's shape
// (8192 channels of 4 taps) with its state's move, on one thread, for a decoded token and a
// prompt's pass of 256 tokens (microseconds a token either way).
func BenchmarkDeltaNetConvolution(b *testing.B) {
	for _, T := range []int{1, 256} {
		name := "decode"
		if T > 1 {
			name = "prompt"
		}
		b.Run(name, func(b *testing.B) {
			l := &device.DeltaNetLayer{KHeads: 16, VHeads: 32, HeadDim: 128, ConvK: 4}
			ch := l.Channels()
			r := rand.New(rand.NewPCG(3, 4))
			rnd := func(n int) []float32 {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				return x
			}
			l.Conv = rnd(ch * l.ConvK)
			st := &device.DeltaNetState{Conv: rnd(ch * (l.ConvK - 1))}
			qkv, conv := rnd(T*ch), make([]float32, T*ch)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				convolve(l, st, nil, qkv, conv, T)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N*T), "us/layer-token")
		})
	}
}
