package models

import "math"

// RMSNorm writes x / sqrt(mean(x²) + eps) * w (+ b) to dst in ggml's arithmetic: the squares
// are float32 products summed in float64, and the scale is 1.0f/sqrtf(mean + eps) in float32.
// Matching it to the bit matters: the normalised rows are then rounded to 8-bit blocks, where
// a last-bit difference can move a block's scale across a float16 rounding boundary.
func RMSNorm(dst, x []float32, n Norm, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	// The square root of a float32 taken in float64 and rounded back is the correctly rounded
	// float32 square root (sqrtf).
	scale := 1 / float32(math.Sqrt(float64(float32(sum/float64(len(x)))+eps)))
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

// Sigmoid returns 1 / (1 + e^-x) as ggml_vec_sigmoid_f32 computes it.
func Sigmoid(x float32) float32 { return 1 / (1 + expf(-x)) }

// SiLUOverX returns silu(x)/x, the sigmoid as llama.cpp's qwen2moe graph computes the shared
// expert's gate (ggml_silu then ggml_div on one value).
func SiLUOverX(x float32) float32 { return siluScalar(x) / x }

// AddTo adds src to dst element-wise (the residual connections).
func AddTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}

// SwiGLUOAI writes gpt-oss's gated activation of g and u to dst (which may be g), as ggml's
// swiglu_oai computes it on the CPU, one value at a time with glibc's expf:
// x = min(g, limit), y = clamp(u, -limit, limit), dst = x / (1 + e^(alpha * -x)) * (y + 1).
func SwiGLUOAI(dst, g, u []float32, alpha, limit float32) {
	g, u = g[:len(dst)], u[:len(dst)]
	for i := range dst {
		x := g[i]
		if limit < x { // std::min(x, limit)
			x = limit
		}
		y := u[i]
		if y < -limit { // std::clamp(y, -limit, limit)
			y = -limit
		} else if limit < y {
			y = limit
		}
		dst[i] = x / (1 + expf(alpha*(-x))) * (y + 1)
	}
}
