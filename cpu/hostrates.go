package cpu

import (
	"math"
	"time"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// MeasureHostRates times this machine's CPU device on a Q4_K 4096x4096 product, the work of
// an expert computed on the host: for one token, the weight bytes it streams per second, and
// from 16 tokens, the flops per second of each token after the first. Best of three each.
func MeasureHostRates() device.HostRates {
	w := hostBenchMatrix(4096, 4096)
	d := New(0)
	const T = 16
	x, out := make([]float32, T*w.Cols), make([]float32, T*w.Rows)
	best := func(T int) float64 {
		b := math.Inf(1)
		for i := 0; i < 3; i++ {
			start := time.Now()
			d.MatMulID(w, x[:T*w.Cols], T, out[:T*w.Rows])
			b = min(b, time.Since(start).Seconds())
		}
		return max(b, 1e-9)
	}
	one, many := best(1), best(T)
	// 16 tokens cannot take less than one, whatever the noise: at worst price the further
	// tokens as if each cost a hundredth of the first.
	further := max(many-one, (T-1)*one/100)
	return device.HostRates{Bandwidth: float64(len(w.Data)) / one, FLOPS: 2 * float64(w.Rows) * float64(w.Cols) * (T - 1) / further}
}

// hostBenchMatrix is a Q4_K matrix of fixed, varied values (cols a multiple of 256) for
// timing the host's products.
func hostBenchMatrix(rows, cols int) quant.Matrix {
	rb, _ := quant.Q4_K.RowBytes(cols)
	w := quant.Matrix{Type: quant.Q4_K, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
	src := make([]float32, cols)
	for r := 0; r < rows; r++ {
		for i := range src {
			src[i] = float32((r*31+i*17)%97-48) / 97
		}
		quant.QuantizeRow(quant.Q4_K, src, w.Data[r*rb:(r+1)*rb])
	}
	return w
}
