//go:build !purego

package quant

import "golang.org/x/sys/cpu"

// The AVX2 kernels are written by internal/asmgen (a module of its own, so that avo is not a
// dependency of commit-run). Regenerate them with
//
//	go generate -run asmgen ./quant
//
//go:generate go run -C ../internal/asmgen . -out ../../quant/vecdot_avx2_amd64.s -stubs ../../quant/vecdot_avx2_stubs_amd64.go -pkg quant

// hasAVX2 reports whether the CPU runs the AVX2 kernels: AVX2 integer ops, FMA for the
// accumulation and F16C for the fp16 scales.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C

func init() {
	if !hasAVX2 {
		return
	}
	vecDotFast[Q8_0] = avx2DotQ8_0
	vecDotFast[Q4_0] = avx2DotQ4_0
	vecDotFast[Q5_0] = avx2DotQ5_0
	vecDotFast[Q4_K] = avx2DotQ4K
	vecDotFast[Q6_K] = avx2DotQ6K
	installFast()
	fastRepackQ4_0 = avx2RepackQ4_0
	fastRepackQ4K = avx2RepackQ4K
	fastRepackGemmQ4K = avx2RepackGemmQ4K
}

// The wrappers slice the rows to whole blocks, which panics on a short row as the portable
// kernels do; the assembly then reads nothing outside them.

func avx2DotQ8_0(n int, w, x []byte) float32 {
	nb := n / 32
	return q8_0DotAVX2(w[:nb*34], x[:nb*34], nb)
}

func avx2DotQ4_0(n int, w, x []byte) float32 {
	nb := n / 32
	return q4_0DotAVX2(w[:nb*18], x[:nb*34], nb)
}

func avx2DotQ5_0(n int, w, x []byte) float32 {
	nb := n / 32
	return q5_0DotAVX2(w[:nb*22], x[:nb*34], nb)
}

func avx2DotQ4K(n int, w, x []byte) float32 {
	nb := n / 256
	return q4KDotAVX2(w[:nb*144], x[:nb*292], nb)
}

// avx2DotQ6K is llama.cpp's current AVX2 Q6_K kernel, which subtracts the quants' offset of
// 32 through the activation's bsums: it equals the portable kernel's integer sums for Q8_K
// rows whose bsums are the sums of their quants, as QuantizeRow makes them.
func avx2DotQ6K(n int, w, x []byte) float32 {
	nb := n / 256
	return q6KDotAVX2(w[:nb*210], x[:nb*292], nb)
}

func avx2RepackQ4_0(n int, w, x []byte) float32 {
	nb := n / 32
	return q4_0RepackAVX2(w[:nb*18], x[:nb*34], nb)
}

func avx2RepackQ4K(n int, w, x []byte) float32 {
	nb := n / 256
	return q4KRepackAVX2(w[:nb*144], x[:nb*292], nb)
}

func avx2RepackGemmQ4K(n int, w, x []byte) float32 {
	nb := n / 256
	return q4KRepackGemmAVX2(w[:nb*144], x[:nb*292], nb)
}
