package engine_test

import (
	"fmt"
	"testing"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/quant"
)

// BenchmarkHostMatMulBatch times the host's product of an expert-sized Q4_K matrix at several
// batch sizes: how a host kernel's cost grows with its tokens, which cpu-miss's hostPlan
// prices as one pass over the weights per token.
func BenchmarkHostMatMulBatch(b *testing.B) {
	const rows, cols = 2048, 4096
	rb, err := quant.Q4_K.RowBytes(cols)
	if err != nil {
		b.Fatal(err)
	}
	w := quant.Matrix{Type: quant.Q4_K, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
	src := make([]float32, cols)
	for r := 0; r < rows; r++ {
		for i := range src {
			src[i] = float32((r*31+i*17)%97-48) / 97
		}
		quant.QuantizeRow(quant.Q4_K, src, w.Data[r*rb:(r+1)*rb])
	}
	d := cpu.New(0)
	for _, T := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			x, out := make([]float32, T*cols), make([]float32, T*rows)
			for b.Loop() {
				d.MatMulID(w, x, T, out)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/product")
		})
	}
}
