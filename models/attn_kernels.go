package models

import (
	"math"

	"github.com/commit-run/commit-run/quant"
)

// The kernels of the host's attention, SwiGLU and DeltaNet recurrence. Each variable starts as
// its plain-Go reference, which is also the fallback (purego builds, other architectures, CPUs
// without AVX2, FMA and F16C); attn_amd64.go replaces them at start-up with assembly that
// computes the same bits (NaN payloads aside), which attn_kernels_test.go checks against these.
var (
	// dotsF32 and dotsF16 write the scores of one head: out[p] = quant.DotF32Vec(row p of k,
	// q) * scale for p < len(out), row p being the len(q) keys at k[p*stride:] (F16 keys
	// widened to float32).
	dotsF32 = dotsF32Go
	dotsF16 = dotsF16Go

	// dotsMultiF32 and dotsMultiF16 are dotsF32 and dotsF16 for nq <= 3 queries of dk values
	// at q[i*qstride:] against the same n rows, query i's scores to out[i*ostride:][:n]:
	// the keys are read once for all of them.
	dotsMultiF32 = dotsMultiF32Go
	dotsMultiF16 = dotsMultiF16Go

	// softmaxBlocks is SoftmaxPadded of x[:n]; x has room for n rounded up to a multiple of 16,
	// and what it holds after n is undefined afterwards.
	softmaxBlocks = softmaxBlocksGo

	// expBlocks replaces x[:n] (n a multiple of 8) with expAVX512 of each value.
	expBlocks = expBlocksGo

	// The weighted sums of the values, out[d] = sum over the n positions p of w[p] times
	// value d of position p, in the order of a dot product along the positions padded with
	// zero weights: quant.DotF32Vec's (Vec, Rows: one token, padded to 64 positions) or
	// quant.DotF32Lanes16's (Lanes, Rows16: a token of a batch, padded to 16). w has room
	// for the padding, with zeros from n on.
	//
	// wsumVec* and wsumLanes* read a transposed value cache: value d of position p is
	// v[d*stride+p]. They read (but ignore) v's values up to the padding, which must lie
	// inside v.
	wsumVec      = wsumVecGo
	wsumLanes    = wsumLanesGo
	wsumVecF16   = wsumVecF16Go
	wsumLanesF16 = wsumLanesF16Go
	// wsumRows* read rows: value d of position p is v[p*stride+d] (MLA, whose values are the
	// first values of its key rows); acc is scratch of 64*64 floats.
	wsumRows      = wsumRowsGo
	wsumRows16    = wsumRows16Go
	wsumRowsF16   = wsumRowsF16Go
	wsumRows16F16 = wsumRows16F16Go

	// wsumRowsMulti and wsumRowsMultiF16 are the wsumRows* kernels (16 lanes if batched, else
	// 64) for nq <= 3 queries with the same n positions and weights at w[i*wstride:], over the
	// same rows, query i's dv sums to out[i*ostride:]: the values are read once for all of
	// them. acc is scratch of 64*96 floats.
	wsumRowsMulti    = wsumRowsMultiGo
	wsumRowsMultiF16 = wsumRowsMultiF16Go

	// swigluBlocks writes siluAVX512(g[i]) * u[i] to dst[i] for i < len(dst), a multiple of
	// 16 (the vector part of SwiGLU); dst may be g. siluBlocks writes siluAVX512(x[i]) (the
	// vector part of SiLU: DeltaNet's convolution and gate); dst may be x.
	swigluBlocks = swigluBlocksGo
	siluBlocks   = siluBlocksGo

	// roundF16 rounds every value of x to the nearest float16 in place, as a matmul against
	// an F16 KV cache rounds its other operand, and toF16 writes src to dst as float16 (the
	// F16 cache's keys and values).
	roundF16 = roundF16Go
	toF16    = toF16Go

	// deltaStep moves a DeltaNet head's state m (a row of len(k) values for each of the len(v)
	// rows, its transposed columns) by one token: each row decays (times decay, rounded once),
	// then adds k times (v[r] - its dot with k) * beta (each value quant.FMA32), and out[r]
	// gets its dot with q times scale; the dot products are quant.DotF32Vec's (ggml's
	// gated_delta_net on the CPU, row by row).
	deltaStep = deltaStepGo

	// convolveOut writes the causal convolution of a DeltaNet layer's T rows of qkv, after
	// the state's last ConvK-1 rows, to conv (deltanet.go's convolve, whose sums it is).
	convolveOut = convolveOutGo
)

func deltaStepGo(m, k, q, v, out []float32, decay, beta, scale float32) {
	n := len(k)
	_ = m[:len(v)*n]
	for r := range v {
		row := m[r*n : (r+1)*n]
		scaleF32Go(row, decay)
		madF32Go(row, k, (v[r]-quant.DotF32Vec(row, k))*beta)
		out[r] = quant.DotF32Vec(row, q) * scale
	}
}

// scaleF32Go multiplies every value of x by s, each product rounded once (ggml_vec_scale_f32).
func scaleF32Go(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}

// madF32Go adds k times d to m, each value quant.FMA32 (ggml_vec_mad_f32).
func madF32Go(m, k []float32, d float32) {
	m = m[:len(k)]
	dd := float64(d)
	for i := range m {
		// quant.FMA32 with its common case inlined: the float64 product is exact, and the
		// sum rounds to float32 as once unless it lies halfway.
		if v := float64(k[i])*dd + float64(m[i]); uint32(math.Float64bits(v))<<3 != 1<<31 {
			m[i] = float32(v)
		} else {
			m[i] = fma32(k[i], d, m[i])
		}
	}
}

func dotsF32Go(out, q, k []float32, stride int, scale float32) {
	for p := range out {
		out[p] = quant.DotF32Vec(k[p*stride:p*stride+len(q)], q) * scale
	}
}

func dotsF16Go(out, q []float32, k []uint16, stride int, scale float32) {
	for p := range out {
		out[p] = dotF16Vec(k[p*stride:p*stride+len(q)], q) * scale
	}
}

func dotsMultiF32Go(out []float32, ostride int, q []float32, qstride, nq, dk int, k []float32, stride, n int, scale float32) {
	for i := 0; i < nq; i++ {
		dotsF32Go(out[i*ostride:][:n], q[i*qstride:][:dk], k, stride, scale)
	}
}

func dotsMultiF16Go(out []float32, ostride int, q []float32, qstride, nq, dk int, k []uint16, stride, n int, scale float32) {
	for i := 0; i < nq; i++ {
		dotsF16Go(out[i*ostride:][:n], q[i*qstride:][:dk], k, stride, scale)
	}
}

// dotF16Vec is quant.DotF32Vec of k (widened) and q, the way package quant computes it:
// four 16-lane fused accumulators over steps of 64, folded 0+2, 1+3, 0+1 and reduced; then
// the rest's products rounded and added one by one up to a multiple of 8, the last fused.
func dotF16Vec(k []uint16, q []float32) float32 {
	k = k[:len(q)]
	var acc [4][16]float32
	n := len(q)
	np := n &^ 63
	for i := 0; i < np; i++ {
		a := &acc[(i>>4)&3][i&15]
		*a = fma32(quant.FP16ToFP32(k[i]), q[i], *a)
	}
	sum := foldHSum(&acc)
	i := np
	for r8 := np + (n-np)&^7; i < r8; i++ {
		sum += float32(quant.FP16ToFP32(k[i]) * q[i])
	}
	for ; i < n; i++ {
		sum = fma32(quant.FP16ToFP32(k[i]), q[i], sum)
	}
	return sum
}

// foldHSum ends ggml_vec_dot_f32: accumulators 0+2 and 1+3, then 0+1, reduced as
// _mm512_reduce_add_ps.
func foldHSum(acc *[4][16]float32) float32 {
	for r := 0; r < 16; r++ {
		acc[0][r] += acc[2][r]
		acc[1][r] += acc[3][r]
	}
	for r := 0; r < 16; r++ {
		acc[0][r] += acc[1][r]
	}
	return quant.HSum16(&acc[0])
}

func softmaxBlocksGo(x []float32, n int) { softmax(x[:n], true) }

func expBlocksGo(x []float32, n int) {
	for i, v := range x[:n] {
		x[i] = expAVX512(v)
	}
}

// ExpInPlace replaces every value of x with its exponential as ggml's vectorised expf
// computes it (an ulp or two from e**x, 0 below -88), eight lanes at a time where the CPU
// has AVX2: a sampler's weights over a vocabulary of 150 thousand tokens cost a millisecond
// a token through a scalar exp.
func ExpInPlace(x []float32) {
	n := len(x) &^ 7
	expBlocks(x, n)
	for i := n; i < len(x); i++ {
		x[i] = expAVX512(x[i])
	}
}

func wsumVecGo(out, w, v []float32, stride, n int)   { wsumGo(out, w, v, nil, stride, 1, n, 64) }
func wsumLanesGo(out, w, v []float32, stride, n int) { wsumGo(out, w, v, nil, stride, 1, n, 16) }
func wsumVecF16Go(out, w []float32, v []uint16, stride, n int) {
	wsumGo(out, w, nil, v, stride, 1, n, 64)
}
func wsumLanesF16Go(out, w []float32, v []uint16, stride, n int) {
	wsumGo(out, w, nil, v, stride, 1, n, 16)
}
func wsumRowsGo(out, w, v []float32, stride, n int, _ []float32) {
	wsumGo(out, w, v, nil, 1, stride, n, 64)
}
func wsumRows16Go(out, w, v []float32, stride, n int, _ []float32) {
	wsumGo(out, w, v, nil, 1, stride, n, 16)
}
func wsumRowsF16Go(out, w []float32, v []uint16, stride, n int, _ []float32) {
	wsumGo(out, w, nil, v, 1, stride, n, 64)
}
func wsumRows16F16Go(out, w []float32, v []uint16, stride, n int, _ []float32) {
	wsumGo(out, w, nil, v, 1, stride, n, 16)
}

// wsumGo is every weighted sum: value d of position p is v32 or v16 at d*ds+p*ps, and
// lanes (64 or 16) chooses the order, DotF32Vec's or DotF32Lanes16's over the positions
// padded to a multiple of lanes, whose padding multiplies zero weights by zero values.
func wsumGo(out, w, v32 []float32, v16 []uint16, ds, ps, n, lanes int) {
	pad := (n + lanes - 1) &^ (lanes - 1)
	for d := range out {
		var acc [4][16]float32
		for p := 0; p < pad; p++ {
			var x, y float32
			if p < n {
				y = w[p]
				if v16 != nil {
					x = quant.FP16ToFP32(v16[d*ds+p*ps])
				} else {
					x = v32[d*ds+p*ps]
				}
			}
			l := p & (lanes - 1)
			a := &acc[l>>4][l&15]
			*a = fma32(x, y, *a)
		}
		if lanes == 64 {
			out[d] = foldHSum(&acc)
		} else {
			out[d] = quant.HSum16(&acc[0])
		}
	}
}

func wsumRowsMultiGo(out []float32, ostride int, w []float32, wstride int, v []float32, stride, n, nq, dv int, batched bool, acc []float32) {
	f := wsumRowsGo
	if batched {
		f = wsumRows16Go
	}
	for i := 0; i < nq; i++ {
		f(out[i*ostride:][:dv], w[i*wstride:], v, stride, n, acc)
	}
}

func wsumRowsMultiF16Go(out []float32, ostride int, w []float32, wstride int, v []uint16, stride, n, nq, dv int, batched bool, acc []float32) {
	f := wsumRowsF16Go
	if batched {
		f = wsumRows16F16Go
	}
	for i := 0; i < nq; i++ {
		f(out[i*ostride:][:dv], w[i*wstride:], v, stride, n, acc)
	}
}

func siluBlocksGo(dst, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] = siluAVX512(x[i])
	}
}

func swigluBlocksGo(dst, g, u []float32) {
	g, u = g[:len(dst)], u[:len(dst)]
	for i := range dst {
		dst[i] = siluAVX512(g[i]) * u[i]
	}
}

func roundF16Go(x []float32) {
	for i, v := range x {
		x[i] = quant.FP16ToFP32(quant.FP32ToFP16(v))
	}
}

func toF16Go(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = quant.FP32ToFP16(v)
	}
}
