//go:build !purego

package models

import (
	"math"

	"golang.org/x/sys/cpu"
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
	dotsMultiF32 = dotsMultiF32AVX2
	dotsMultiF16 = dotsMultiF16AVX2
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
	wsumRows = func(out, w, v []float32, stride, n int, acc []float32) {
		if !rowsCheck(out, w, v, stride, n, acc) {
			wsumRowsGo(out, w, v, stride, n, acc)
			return
		}
		attnWSumRowsAVX2(out, w, v, stride, n, acc)
	}
	wsumRows16 = func(out, w, v []float32, stride, n int, acc []float32) {
		if !rowsCheck(out, w, v, stride, n, acc) {
			wsumRows16Go(out, w, v, stride, n, acc)
			return
		}
		attnWSumRows16AVX2(out, w, v, stride, n, acc)
	}
	wsumRowsF16 = func(out, w []float32, v []uint16, stride, n int, acc []float32) {
		if !rowsCheck(out, w, v, stride, n, acc) {
			wsumRowsF16Go(out, w, v, stride, n, acc)
			return
		}
		attnWSumRowsF16AVX2(out, w, v, stride, n, acc)
	}
	wsumRows16F16 = func(out, w []float32, v []uint16, stride, n int, acc []float32) {
		if !rowsCheck(out, w, v, stride, n, acc) {
			wsumRows16F16Go(out, w, v, stride, n, acc)
			return
		}
		attnWSumRows16F16AVX2(out, w, v, stride, n, acc)
	}
	wsumRowsMulti = func(out []float32, ostride int, w []float32, wstride int, v []float32, stride, n, nq, dv int, batched bool, acc []float32) {
		k2, k3, f := attnWSumRowsx2AVX2, attnWSumRowsx3AVX2, wsumRows
		if batched {
			k2, k3, f = attnWSumRows16x2AVX2, attnWSumRows16x3AVX2, wsumRows16
		}
		if !rowsMultiCall(k2, k3, out, ostride, w, wstride, v, stride, n, nq, dv, acc) {
			for i := 0; i < nq; i++ {
				f(out[i*ostride:][:dv], w[i*wstride:], v, stride, n, acc)
			}
		}
	}
	wsumRowsMultiF16 = func(out []float32, ostride int, w []float32, wstride int, v []uint16, stride, n, nq, dv int, batched bool, acc []float32) {
		k2, k3, f := attnWSumRowsx2F16AVX2, attnWSumRowsx3F16AVX2, wsumRowsF16
		if batched {
			k2, k3, f = attnWSumRows16x2F16AVX2, attnWSumRows16x3F16AVX2, wsumRows16F16
		}
		if !rowsMultiCall(k2, k3, out, ostride, w, wstride, v, stride, n, nq, dv, acc) {
			for i := 0; i < nq; i++ {
				f(out[i*ostride:][:dv], w[i*wstride:], v, stride, n, acc)
			}
		}
	}
	swigluBlocks = swigluBlocksAVX2
	roundF16 = roundF16AVX2
	toF16 = toF16AVX2
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

// dotsMultiF32AVX2 and dotsMultiF16AVX2 take two or three queries of a multiple of 64 values
// to the kernels that share the keys, with the steps of 64 unrolled for the common head
// sizes; anything else goes to the one-query kernel.
func dotsMultiF32AVX2(out []float32, ostride int, q []float32, qstride, nq, dk int, k []float32, stride, n int, scale float32) {
	if n == 0 || nq == 0 {
		return
	}
	if !dotsMultiCheck(out, ostride, q, qstride, nq, dk, len(k), stride, n) {
		for i := 0; i < nq; i++ {
			dotsF32AVX2(out[i*ostride:][:n], q[i*qstride:][:dk], k, stride, scale)
		}
		return
	}
	if nq == 2 {
		switch dk {
		case 64:
			attnDots2x1AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 128:
			attnDots2x2AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 192:
			attnDots2x3AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 256:
			attnDots2x4AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 576:
			attnDots2x9AVX2(out, ostride, q, qstride, k, stride, n, scale)
		default:
			attnDots2AVX2(out, ostride, q, qstride, k, stride, n, dk/64, scale)
		}
		return
	}
	switch dk {
	case 64:
		attnDots3x1AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 128:
		attnDots3x2AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 192:
		attnDots3x3AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 256:
		attnDots3x4AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 576:
		attnDots3x9AVX2(out, ostride, q, qstride, k, stride, n, scale)
	default:
		attnDots3AVX2(out, ostride, q, qstride, k, stride, n, dk/64, scale)
	}
}

func dotsMultiF16AVX2(out []float32, ostride int, q []float32, qstride, nq, dk int, k []uint16, stride, n int, scale float32) {
	if n == 0 || nq == 0 {
		return
	}
	if !dotsMultiCheck(out, ostride, q, qstride, nq, dk, len(k), stride, n) {
		for i := 0; i < nq; i++ {
			dotsF16AVX2(out[i*ostride:][:n], q[i*qstride:][:dk], k, stride, scale)
		}
		return
	}
	if nq == 2 {
		switch dk {
		case 64:
			attnDots2x1F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 128:
			attnDots2x2F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 192:
			attnDots2x3F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 256:
			attnDots2x4F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
		case 576:
			attnDots2x9F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
		default:
			attnDots2F16AVX2(out, ostride, q, qstride, k, stride, n, dk/64, scale)
		}
		return
	}
	switch dk {
	case 64:
		attnDots3x1F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 128:
		attnDots3x2F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 192:
		attnDots3x3F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 256:
		attnDots3x4F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
	case 576:
		attnDots3x9F16AVX2(out, ostride, q, qstride, k, stride, n, scale)
	default:
		attnDots3F16AVX2(out, ostride, q, qstride, k, stride, n, dk/64, scale)
	}
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

// rowsMultiCall runs the shared-value kernel for two or three queries (k2, k3) after checking
// what it reads and writes, and reports whether it did: it takes whole tiles of 32 values.
func rowsMultiCall[E float32 | uint16](
	k2, k3 func(out []float32, ostride int, w []float32, wstride int, v []E, stride, n, dv int, acc []float32),
	out []float32, ostride int, w []float32, wstride int, v []E, stride, n, nq, dv int, acc []float32) bool {
	if nq < 2 || nq > 3 || dv%32 != 0 || dv == 0 || n == 0 || len(acc) < 64*96 {
		return false
	}
	_ = out[(nq-1)*ostride+dv-1]
	_ = w[(nq-1)*wstride+n-1]
	_ = v[(n-1)*stride+dv-1]
	if nq == 2 {
		k2(out, ostride, w, wstride, v, stride, n, dv, acc)
	} else {
		k3(out, ostride, w, wstride, v, stride, n, dv, acc)
	}
	return true
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
