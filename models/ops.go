package models

import (
	"math"

	"github.com/commit-run/commit-run/quant"
)

// RMSNorm writes x / sqrt(mean(x²) + eps) * w (+ b) to dst, summing in float64 as ggml does.
func RMSNorm(dst, x []float32, n Norm, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v) * float64(v)
	}
	scale := float32(1 / math.Sqrt(float64(float32(sum/float64(len(x)))+eps)))
	w := n.Weight
	if w == nil {
		for i, v := range x {
			dst[i] = v * scale
		}
		return
	}
	w = w[:len(x)]
	for i, v := range x {
		dst[i] = v * scale * w[i]
	}
	if n.Bias != nil {
		for i := range dst[:len(x)] {
			dst[i] += n.Bias[i]
		}
	}
}

// Softmax normalises x in place, subtracting the maximum first.
func Softmax(x []float32) {
	maxv := float32(math.Inf(-1))
	for _, v := range x {
		if v > maxv {
			maxv = v
		}
	}
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - maxv)))
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// SiLU returns x * sigmoid(x).
func SiLU(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// Sigmoid returns 1 / (1 + e^-x).
func Sigmoid(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }

// roundF16 rounds every value to the nearest float16, as a matmul against an F16 KV cache
// rounds its other operand.
func roundF16(x []float32) {
	for i, v := range x {
		x[i] = quant.FP16ToFP32(quant.FP32ToFP16(v))
	}
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// addTo adds src to dst element-wise.
func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}
