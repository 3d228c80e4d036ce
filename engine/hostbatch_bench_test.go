package engine

import (
	"fmt"
	"testing"

	"github.com/commit-run/commit-run/cpu"
)

// BenchmarkHostMatMulBatch times the host's product of an expert-sized Q4_K matrix at several
// batch sizes: how a host kernel's cost grows with its tokens, which cpu-miss's hostPlan
// prices as one pass over the weights per token.
func BenchmarkHostMatMulBatch(b *testing.B) {
	w := hostBenchMatrix(2048, 4096)
	d := cpu.New(0)
	for _, T := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			x, out := make([]float32, T*w.Cols), make([]float32, T*w.Rows)
			for b.Loop() {
				d.MatMulID(w, x, T, out)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/product")
		})
	}
}
