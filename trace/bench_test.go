package trace

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// The benchmarks use the Qwen3-30B-A3B shape with f16 inputs and logits (223,504 bytes a
// token), what the Commit Router trainer records; MB/s is of trace bytes.

func BenchmarkWrite(b *testing.B) {
	h := qwen3Header()
	toks := genTokens(rand.New(rand.NewPCG(51, 52)), h, 8)
	w, err := NewWriter(io.Discard, h)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(w.lay.tokenSize))
	i := 0
	for b.Loop() {
		if err := w.Write(toks[i%len(toks)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkRead(b *testing.B) {
	h := qwen3Header()
	toks := genTokens(rand.New(rand.NewPCG(53, 54)), h, 8)
	for len(toks) < 64 {
		toks = append(toks, toks[:8]...)
	}
	data := writeTrace(b, h, toks)
	for _, reuse := range []bool{false, true} {
		name := "Next"
		if reuse {
			name = "NextInto"
		}
		b.Run(name, func(b *testing.B) {
			var r *Reader
			var tok Token
			size, n := 0, 0
			for b.Loop() {
				if r == nil || r.left == 0 && r.tokens == int64(len(toks)) {
					var err error
					if r, err = NewReader(bytes.NewReader(data)); err != nil {
						b.Fatal(err)
					}
					size = r.lay.tokenSize
				}
				var err error
				if reuse {
					err = r.NextInto(&tok)
				} else {
					_, err = r.Next()
				}
				if err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.SetBytes(int64(size))
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
