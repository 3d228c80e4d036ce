package models

import (
	"math"

	"github.com/commit-run/commit-run/quant"
)

// The element-wise functions below follow the float32 arithmetic of llama.cpp's x86 CPU build
// (AVX-512, as the golden fixtures were made): exp as ggml_v_expf, SiLU as ggml_v_silu, and the
// soft_max op's lane-wise sums. See quant/x86.go for why the last bits matter.

var fma32 = quant.FMA32

// expAVX512 is ggml_v_expf (AVX-512): a range reduction to 2^n * e^b and a degree-5 polynomial,
// flushing to 0 or +Inf outside about [-104, 88].
func expAVX512(x float32) float32 {
	const r = 0x1.8p23
	z := fma32(x, 0x1.715476p+0, r)
	n := z - r
	b := fma32(-n, 0x1.7f7d1cp-20, fma32(-n, 0x1.62e4p-1, x))
	u := b * b
	j := fma32(fma32(fma32(0x1.0e4020p-7, b, 0x1.573e2ep-5), u, fma32(0x1.555e66p-3, b, 0x1.fffdb6p-2)), u,
		fma32(0x1.ffffecp-1, b, 1))
	if abs32(n) > 192 {
		if n <= 0 {
			return 0
		}
		return float32(math.Inf(1))
	}
	if n != n {
		return n
	}
	// _mm512_scalef_ps: j * 2^floor(n), rounded once.
	return float32(math.Ldexp(float64(j), int(n)))
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// siluAVX512 is ggml_v_silu (AVX-512).
func siluAVX512(x float32) float32 { return x / (1 + expAVX512(0-x)) }

// siluScalar is ggml_silu_f32 (with glibc's expf), which handles what is left after the
// 16-wide vectors.
func siluScalar(x float32) float32 { return x / (1 + expf(-x)) }

// SwiGLU writes silu(g)*u to dst as ggml_vec_swiglu_f32: 16-wide vectors (swigluBlocks),
// then the scalar SiLU for the rest.
func SwiGLU(dst, g, u []float32) {
	n := len(g)
	u, dst = u[:n], dst[:n]
	nv := n &^ 15
	swigluBlocks(dst[:nv], g[:nv], u[:nv])
	for i := nv; i < n; i++ {
		dst[i] = siluScalar(g[i]) * u[i]
	}
}

// Softmax normalises x in place as ggml's soft_max op does on one row (without scale or mask):
// the exponentials of 16-wide vectors are summed lane-wise (_mm512_reduce_add_ps) and the
// vector sums accumulated in float64, the rest one by one; then every value is multiplied by
// the float32 of 1/sum.
func Softmax(x []float32) { softmax(x, false) }

// SoftmaxPadded is Softmax for an attention row that llama.cpp computes over the whole padded
// KV length: the masked positions after x are -Inf, so the last partial vector goes through the
// vector path with zeros in its unused lanes instead of through the scalar path.
func SoftmaxPadded(x []float32) { softmax(x, true) }

func softmax(x []float32, padded bool) {
	maxv := float32(math.Inf(-1))
	for _, v := range x {
		if v > maxv {
			maxv = v
		}
	}
	scaleBySum(x, softmaxExps(x, maxv, padded))
}

// softmaxSink is SoftmaxPadded of an attention row with a sink (gpt-oss): ggml's soft_max
// takes the larger of the row's maximum and the sink as the maximum, and adds the sink's
// exponential (glibc's expf, in float64) to the row's sum, so that the row sums to less than
// one.
func softmaxSink(x []float32, sink float32) {
	maxv := float32(math.Inf(-1))
	for _, v := range x {
		if v > maxv {
			maxv = v
		}
	}
	if !(maxv > sink) { // ggml's MAX(max, sink)
		maxv = sink
	}
	sum := softmaxExps(x, maxv, true)
	sum += float64(expf(sink - maxv))
	scaleBySum(x, sum)
}

// scaleBySum multiplies every value of x by the float32 of 1/sum.
func scaleBySum(x []float32, sum float64) {
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// softmaxExps replaces every value of x with its exponential less maxv and returns their sum,
// as ggml_vec_soft_max_f32 computes it.
func softmaxExps(x []float32, maxv float32, padded bool) float64 {
	n := len(x)
	nv := n &^ 15
	if padded {
		nv = n
	}
	var sum float64
	i := 0
	for ; i < nv; i += 16 {
		var lanes [16]float32
		for l := 0; l < 16 && i+l < n; l++ {
			e := expAVX512(x[i+l] - maxv)
			x[i+l] = e
			lanes[l] = e
		}
		sum += float64(quant.HSum16(&lanes))
	}
	for ; i < n; i++ {
		e := expf(x[i] - maxv)
		x[i] = e
		sum += float64(e)
	}
	return sum
}
