package cpu

import (
	"fmt"
	"math"
	"testing"
)

// BenchmarkHostMatMulBatch times the host's product of an expert-sized Q4_K matrix at several
// batch sizes: how a host kernel's cost grows with its tokens, which device.HostRates model as
// the weights read once plus each further token's arithmetic (MeasureHostRates measures both).
func BenchmarkHostMatMulBatch(b *testing.B) {
	w := hostBenchMatrix(2048, 4096)
	d := New(0)
	for _, T := range []int{1, 2, 4, 8, 16, 32} {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			x, out := make([]float32, T*w.Cols), make([]float32, T*w.Rows)
			for b.Loop() {
				d.MatMulID(w, x, T, out)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/product")
		})
	}
}

// MeasureHostRates gives rates the GPU planners accept, whatever this machine's speed.
func TestMeasureHostRates(t *testing.T) {
	r := MeasureHostRates()
	if !(r.Bandwidth > 0) || !(r.FLOPS > 0) || math.IsInf(r.Bandwidth, 0) || math.IsInf(r.FLOPS, 0) || r.Overhead != 0 {
		t.Fatalf("measured %+v: want positive, finite rates and the default overhead", r)
	}
	if _, err := r.WithDefaults(); err != nil {
		t.Error(err)
	}
	t.Logf("%.1f GB/s for one token, %.0f GFLOP/s for each further token", r.Bandwidth/1e9, r.FLOPS/1e9)
}
