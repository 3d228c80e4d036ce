//go:build !purego

package models

import (
	"math"
	"sync"

	"golang.org/x/sys/cpu"

	"github.com/commit-run/commit-run/device"
)

// The AVX2 kernels of attn_kernels.go are written by internal/asmgen (its "attn" set).
// Regenerate them with
//
//	go generate -run asmgen ./models
//
//go:generate go run -C ../internal/asmgen . -set attn -out ../../models/attn_avx2_amd64.s -stubs ../../models/attn_avx2_stubs_amd64.go -pkg models

// attnAVX2 reports whether the CPU runs the kernels: AVX2 for the integer work of the
// exponential, FMA for the fused multiply-adds and F16C for the F16 cache.
var attnAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C

func init() {
	if attnAVX2 {
		useAttnAVX2()
	}
}

// useAttnAVX2 puts the assembly kernels into attn_kernels.go's variables. The wrappers check
// the bounds the assembly relies on (a slice expression panics as the Go kernels would) and
// leave to the Go kernels what the assembly does not cover.
func useAttnAVX2() {
	dotsF32 = dotsF32AVX2
	dotsF16 = dotsF16AVX2
	softmaxBlocks = softmaxBlocksAVX2
	expBlocks = func(x []float32, n int) { attnExpAVX2(x[:n], x[:n]) } // lane by lane: in place is safe
	dotsMultiF32 = (&multiKernels[float32]{
		fixed: [2][10]multiKernel[float32]{
			{1: attnDots2x1AVX2, 2: attnDots2x2AVX2, 3: attnDots2x3AVX2, 4: attnDots2x4AVX2, 9: attnDots2x9AVX2},
			{1: attnDots3x1AVX2, 2: attnDots3x2AVX2, 3: attnDots3x3AVX2, 4: attnDots3x4AVX2, 9: attnDots3x9AVX2},
		},
		general: [2]multiKernelSteps[float32]{attnDots2AVX2, attnDots3AVX2},
		one:     dotsF32AVX2,
	}).dots
	dotsMultiF16 = (&multiKernels[uint16]{
		fixed: [2][10]multiKernel[uint16]{
			{1: attnDots2x1F16AVX2, 2: attnDots2x2F16AVX2, 3: attnDots2x3F16AVX2, 4: attnDots2x4F16AVX2, 9: attnDots2x9F16AVX2},
			{1: attnDots3x1F16AVX2, 2: attnDots3x2F16AVX2, 3: attnDots3x3F16AVX2, 4: attnDots3x4F16AVX2, 9: attnDots3x9F16AVX2},
		},
		general: [2]multiKernelSteps[uint16]{attnDots2F16AVX2, attnDots3F16AVX2},
		one:     dotsF16AVX2,
	}).dots
	wsumVec = func(out, w, v []float32, stride, n int) {
		attnWSumVecAVX2(wsumCheck(out, w, v, stride, n, 64))
	}
	wsumLanes = func(out, w, v []float32, stride, n int) {
		attnWSumLanesAVX2(wsumCheck(out, w, v, stride, n, 16))
	}
	wsumVecF16 = func(out, w []float32, v []uint16, stride, n int) {
		attnWSumVecF16AVX2(wsumCheck(out, w, v, stride, n, 64))
	}
	wsumLanesF16 = func(out, w []float32, v []uint16, stride, n int) {
		attnWSumLanesF16AVX2(wsumCheck(out, w, v, stride, n, 16))
	}
	wsumRows = rowsOr(attnWSumRowsAVX2, wsumRowsGo)
	wsumRows16 = rowsOr(attnWSumRows16AVX2, wsumRows16Go)
	wsumRowsF16 = rowsOr(attnWSumRowsF16AVX2, wsumRowsF16Go)
	wsumRows16F16 = rowsOr(attnWSumRows16F16AVX2, wsumRows16F16Go)
	wsumRowsMulti = (&rowsMulti[float32]{
		k2:  [2]rowsMultiKernel[float32]{attnWSumRowsx2AVX2, attnWSumRows16x2AVX2},
		k3:  [2]rowsMultiKernel[float32]{attnWSumRowsx3AVX2, attnWSumRows16x3AVX2},
		one: [2]func(out, w []float32, v []float32, stride, n int, acc []float32){wsumRows, wsumRows16},
	}).sums
	wsumRowsMultiF16 = (&rowsMulti[uint16]{
		k2:  [2]rowsMultiKernel[uint16]{attnWSumRowsx2F16AVX2, attnWSumRows16x2F16AVX2},
		k3:  [2]rowsMultiKernel[uint16]{attnWSumRowsx3F16AVX2, attnWSumRows16x3F16AVX2},
		one: [2]func(out, w []float32, v []uint16, stride, n int, acc []float32){wsumRowsF16, wsumRows16F16},
	}).sums
	swigluBlocks = swigluBlocksAVX2
	siluBlocks = siluBlocksAVX2
	roundF16 = roundF16AVX2
	toF16 = toF16AVX2
	deltaStep = deltaStepAVX2Rows
	convolveOut = convolveOutAVX2
}

// convMinTokens is the pass from which convolveOutAVX2 takes the tap-major assembly: it
// transposes the layer's taps once per pass, which shorter passes would not repay.
const convMinTokens = 8

// convScratch holds convolveOutAVX2's taps by tap and its first rows of inputs.
var convScratch = sync.Pool{New: func() any { return new([]float32) }}

// convolveOutAVX2 computes a pass's 4-tap convolution tap-major, eight channels at a time
// (deltaConv4AVX2): the taps transposed into rows, and the first K-1 outputs' inputs (the
// state's rows, transposed, then qkv's first rows) gathered beside them. A decoded token
// gathers its taps and inputs where they lie instead (deltaConv4TokenAVX2). Other tap counts,
// channel counts that are not a multiple of 8 and passes of 2 to convMinTokens-1 tokens take
// the Go loop.
func convolveOutAVX2(l *device.DeltaNetLayer, state, qkv, conv []float32, T int) {
	ch, K := l.Channels(), l.ConvK
	if K == 4 && ch%8 == 0 && T == 1 {
		deltaConv4TokenAVX2(conv[:ch], state[:3*ch], qkv[:ch], l.Conv[:4*ch])
		return
	}
	if K != 4 || ch%8 != 0 || T < convMinTokens {
		convolveOutGo(l, state, qkv, conv, T)
		return
	}
	_, _, _, _ = l.Conv[K*ch-1], state[(K-1)*ch-1], qkv[T*ch-1], conv[T*ch-1]
	bp := convScratch.Get().(*[]float32)
	if need := (K + 2*(K-1)) * ch; cap(*bp) < need {
		*bp = make([]float32, need)
	}
	taps, head := (*bp)[:K*ch], (*bp)[K*ch:(K+2*(K-1))*ch]
	for c := 0; c < ch; c++ {
		for k := 0; k < K; k++ {
			taps[k*ch+c] = l.Conv[c*K+k]
		}
		for j := 0; j < K-1; j++ {
			head[j*ch+c] = state[c*(K-1)+j]
		}
	}
	copy(head[(K-1)*ch:], qkv[:(K-1)*ch])
	for t := 0; t < K-1; t++ {
		deltaConv4AVX2(conv[t*ch:(t+1)*ch], head[t*ch:(t+K)*ch], taps)
	}
	for t := K - 1; t < T; t++ {
		deltaConv4AVX2(conv[t*ch:(t+1)*ch], qkv[(t-K+1)*ch:(t+1)*ch], taps)
	}
	convScratch.Put(bp)
}

// deltaStepAVX2Rows takes heads of a multiple of 64 values (Qwen3.5's 128) to the assembly,
// others to the Go loop.
func deltaStepAVX2Rows(m, k, q, v, out []float32, decay, beta, scale float32) {
	if len(k) == 0 || len(k)%64 != 0 {
		deltaStepGo(m, k, q, v, out, decay, beta, scale)
		return
	}
	_, _, _ = m[:len(v)*len(k)], q[:len(k)], out[:len(v)]
	deltaStepAVX2(m, k, q, v, out, decay, beta, scale)
}

func dotsF32AVX2(out, q, k []float32, stride int, scale float32) {
	if len(out) == 0 {
		return
	}
	_ = k[(len(out)-1)*stride+len(q)-1]
	attnDotsAVX2(out, q, k, stride, scale)
}

func dotsF16AVX2(out, q []float32, k []uint16, stride int, scale float32) {
	if len(out) == 0 {
		return
	}
	_ = k[(len(out)-1)*stride+len(q)-1]
	attnDotsF16AVX2(out, q, k, stride, scale)
}

// multiKernels are the shared-key score kernels of one cache element type: for two or three
// queries (index nq-2) of a multiple of 64 values, fixed[nq-2][dk/64] has the steps of 64
// unrolled for the common head sizes (nil elsewhere) and general takes any; one scores a
// query alone, which takes what they do not.
type multiKernels[K float32 | uint16] struct {
	fixed   [2][10]multiKernel[K]
	general [2]multiKernelSteps[K]
	one     func(out, q []float32, k []K, stride int, scale float32)
}

type multiKernel[K float32 | uint16] func(out []float32, ostride int, q []float32, qstride int, k []K, stride, n int, scale float32)

type multiKernelSteps[K float32 | uint16] func(out []float32, ostride int, q []float32, qstride int, k []K, stride, n, steps int, scale float32)

// dots is dotsMultiF32/dotsMultiF16 with the kernels of m.
func (m *multiKernels[K]) dots(out []float32, ostride int, q []float32, qstride, nq, dk int, k []K, stride, n int, scale float32) {
	if n == 0 || nq == 0 {
		return
	}
	if !dotsMultiCheck(out, ostride, q, qstride, nq, dk, len(k), stride, n) {
		for i := 0; i < nq; i++ {
			m.one(out[i*ostride:][:n], q[i*qstride:][:dk], k, stride, scale)
		}
		return
	}
	if steps := dk / 64; steps < len(m.fixed[nq-2]) && m.fixed[nq-2][steps] != nil {
		m.fixed[nq-2][steps](out, ostride, q, qstride, k, stride, n, scale)
		return
	}
	m.general[nq-2](out, ostride, q, qstride, k, stride, n, dk/64, scale)
}

// dotsMultiCheck checks what the shared-key kernels read and write, and reports whether
// they take the shape: two or three queries of a multiple of 64 values.
func dotsMultiCheck(out []float32, ostride int, q []float32, qstride, nq, dk, klen, stride, n int) bool {
	_ = out[(nq-1)*ostride+n-1]
	_ = q[(nq-1)*qstride+dk-1]
	if (n-1)*stride+dk > klen {
		panic("models: keys out of range")
	}
	return (nq == 2 || nq == 3) && dk%64 == 0 && dk > 0
}

// softmaxBlocksAVX2 pads x[:n] with -Inf to a multiple of 16: their exponentials are the
// zeros of the padded lanes, as in ggml's soft_max over the padded KV length.
func softmaxBlocksAVX2(x []float32, n int) {
	m := (n + 15) &^ 15
	if m == 0 {
		return
	}
	x = x[:m]
	for i := n; i < m; i++ {
		x[i] = float32(math.Inf(-1))
	}
	attnSoftmaxAVX2(x)
}

// wsumCheck checks what the weighted sums over a transposed cache read: the weights and
// every row's values up to the padding.
func wsumCheck[E float32 | uint16](out, w []float32, v []E, stride, n, lanes int) ([]float32, []float32, []E, int, int) {
	pad := (n + lanes - 1) &^ (lanes - 1)
	if len(out) > 0 && pad > 0 {
		_ = w[pad-1]
		_ = v[(len(out)-1)*stride+pad-1]
	}
	return out, w, v, stride, n
}

// rowsCheck checks what the lane-major weighted sums read, and reports whether the assembly
// covers the shape (whole tiles of 64 values).
func rowsCheck[E float32 | uint16](out, w []float32, v []E, stride, n int, acc []float32) bool {
	if len(out)%64 != 0 || len(acc) < 64*64 {
		return false
	}
	if len(out) > 0 && n > 0 {
		_ = w[n-1]
		_ = v[(n-1)*stride+len(out)-1]
	}
	return true
}

// rowsOr is the lane-major weighted sum k where it covers the shape, goFn elsewhere.
func rowsOr[E float32 | uint16](k, goFn func(out, w []float32, v []E, stride, n int, acc []float32)) func(out, w []float32, v []E, stride, n int, acc []float32) {
	return func(out, w []float32, v []E, stride, n int, acc []float32) {
		if !rowsCheck(out, w, v, stride, n, acc) {
			goFn(out, w, v, stride, n, acc)
			return
		}
		k(out, w, v, stride, n, acc)
	}
}

type rowsMultiKernel[E float32 | uint16] func(out []float32, ostride int, w []float32, wstride int, v []E, stride, n, dv int, acc []float32)

// rowsMulti are the shared-value weighted sums of one cache element type for two (k2) and
// three (k3) queries, which take whole tiles of 32 values, and one for a query alone; index
// 1 of each is the 16-lane (batched) order, 0 the 64-lane one.
type rowsMulti[E float32 | uint16] struct {
	k2, k3 [2]rowsMultiKernel[E]
	one    [2]func(out, w []float32, v []E, stride, n int, acc []float32)
}

// sums is wsumRowsMulti/wsumRowsMultiF16 with the kernels of m, after checking what they
// read and write.
func (m *rowsMulti[E]) sums(out []float32, ostride int, w []float32, wstride int, v []E, stride, n, nq, dv int, batched bool, acc []float32) {
	b := 0
	if batched {
		b = 1
	}
	if nq < 2 || nq > 3 || dv%32 != 0 || dv == 0 || n == 0 || len(acc) < 64*96 {
		for i := 0; i < nq; i++ {
			m.one[b](out[i*ostride:][:dv], w[i*wstride:], v, stride, n, acc)
		}
		return
	}
	_ = out[(nq-1)*ostride+dv-1]
	_ = w[(nq-1)*wstride+n-1]
	_ = v[(n-1)*stride+dv-1]
	if nq == 2 {
		m.k2[b](out, ostride, w, wstride, v, stride, n, dv, acc)
	} else {
		m.k3[b](out, ostride, w, wstride, v, stride, n, dv, acc)
	}
}

func siluBlocksAVX2(dst, x []float32) {
	n := len(dst) &^ 7
	if n > 0 {
		attnSiLUAVX2(dst[:n], x[:n])
	}
	siluBlocksGo(dst[n:], x[n:len(dst)])
}

func swigluBlocksAVX2(dst, g, u []float32) {
	n := len(dst) &^ 7
	if n > 0 {
		attnSwiGLUAVX2(dst[:n], g[:n], u[:n])
	}
	swigluBlocksGo(dst[n:], g[n:], u[n:])
}

func roundF16AVX2(x []float32) {
	n := len(x) &^ 7
	attnRoundF16AVX2(x[:n])
	roundF16Go(x[n:])
}

func toF16AVX2(dst []uint16, src []float32) {
	n := len(src) &^ 7
	attnToF16AVX2(dst[:n], src[:n])
	toF16Go(dst[n:], src[n:])
}
