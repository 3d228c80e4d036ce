//go:build !purego

package quant

import "golang.org/x/sys/cpu"

// The AVX2 kernels are written by internal/asmgen (a module of its own, so that avo is not a
// dependency of commit-run). Regenerate them with
//
//	go generate -run asmgen ./quant
//
//go:generate go run -C ../internal/asmgen . -set vecdot -out ../../quant/vecdot_avx2_amd64.s -stubs ../../quant/vecdot_avx2_stubs_amd64.go -pkg quant

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
	fastX86Q4_1 = avx2DotQ4_1
	fastX86Q5_1 = avx2DotQ5_1
	fastX86IQ4NL = avx2LanesIQ4NL
	fastX86VecIQ4NL = avx2VecIQ4NL
	fastX86RepackIQ4NL = avx2RepackIQ4NL
	fastX86VecMXFP4 = avx2VecMXFP4
	fastX86RepackMXFP4 = avx2RepackMXFP4
	fastX86Q5K = avx2DotQ5K
	fastX86Q3K = avx2DotQ3K
	fastX86Q2K = avx2DotQ2K
	fastX86RepackQ2K = avx2RepackQ2K
	fastX86RepackGemmQ2K = avx2RepackGemmQ2K
	fastX86F32Vec = avx2F32Vec
	fastX86F32Gemm = avx2F32Gemm
	fastX86F16Vec = avx2F16Vec
	fastX86F16Gemm = avx2F16Gemm
	fastX86BF16Vec = avx2BF16Vec
	fastX86BF16Gemm = avx2BF16Gemm
	f16Multi = [3]func(w []byte, ldw int, x []float32, ldx int, n int, rows int, out []float32, ldo int){
		f16x1AVX2Rows, f16x2AVX2Rows, f16x3AVX2Rows}
	widenF16 = widenF16AVX2
	f16Gemm = [2][3]func(w []byte, ldw int, x []float32, ldx int, n int, rows int, out []float32, ldo int){
		{f16g1x1AVX2Rows, f16g1x2AVX2Rows, f16g1x3AVX2Rows},
		{f16g2x1AVX2Rows, f16g2x2AVX2Rows, f16g2x3AVX2Rows},
	}
	// The kernels of a product of one activation row (batch 1) over many weight rows, by
	// type and by whether llama.cpp repacks the matrix: fastX86's choice for batch 1.
	for _, k := range []struct {
		t             Type
		plain, repack rowsKernel
	}{
		{Q8_0, q8_0DotAVX2Rows, q8_0DotAVX2Rows},
		{Q5_0, q5_0DotAVX2Rows, q5_0DotAVX2Rows},
		{Q6_K, q6KDotAVX2Rows, q6KDotAVX2Rows},
		{Q4_0, q4_0DotAVX2Rows, q4_0RepackAVX2Rows},
		{Q4_K, q4KDotAVX2Rows, q4KRepackAVX2Rows},
		{Q4_1, q4_1DotAVX2Rows, q4_1DotAVX2Rows},
		{Q5_1, q5_1DotAVX2Rows, q5_1DotAVX2Rows},
		{IQ4_NL, iq4nlVecAVX2Rows, iq4nlRepackAVX2Rows},
		{MXFP4, mxfp4VecAVX2Rows, mxfp4RepackAVX2Rows},
		{Q5_K, q5KDotAVX2Rows, q5KDotAVX2Rows},
		{Q3_K, q3KDotAVX2Rows, q3KDotAVX2Rows},
		{Q2_K, q2KDotAVX2Rows, q2KRepackAVX2Rows},
	} {
		fastRows[k.t] = [2]rowsKernel{k.plain, k.repack}
	}
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

func avx2DotQ4_1(n int, w, x []byte) float32 {
	nb := n / 32
	return q4_1DotAVX2(w[:nb*20], x[:nb*36], nb)
}

func avx2DotQ5_1(n int, w, x []byte) float32 {
	nb := n / 32
	return q5_1DotAVX2(w[:nb*24], x[:nb*36], nb)
}

func avx2LanesIQ4NL(n int, w, x []byte) float32 {
	nb := n / 32
	return iq4nlLanesAVX2(w[:nb*18], x[:nb*34], nb)
}

func avx2VecIQ4NL(n int, w, x []byte) float32 {
	nb := n / 32
	return iq4nlVecAVX2(w[:nb*18], x[:nb*34], nb)
}

func avx2RepackIQ4NL(n int, w, x []byte) float32 {
	nb := n / 32
	return iq4nlRepackAVX2(w[:nb*18], x[:nb*34], nb)
}

func avx2VecMXFP4(n int, w, x []byte) float32 {
	nb := n / 32
	return mxfp4VecAVX2(w[:nb*17], x[:nb*34], nb)
}

func avx2RepackMXFP4(n int, w, x []byte) float32 {
	nb := n / 32
	return mxfp4RepackAVX2(w[:nb*17], x[:nb*34], nb)
}

func avx2DotQ5K(n int, w, x []byte) float32 {
	nb := n / 256
	return q5KDotAVX2(w[:nb*176], x[:nb*292], nb)
}

func avx2DotQ3K(n int, w, x []byte) float32 {
	nb := n / 256
	return q3KDotAVX2(w[:nb*110], x[:nb*292], nb)
}

func avx2DotQ2K(n int, w, x []byte) float32 {
	nb := n / 256
	return q2KDotAVX2(w[:nb*84], x[:nb*292], nb)
}

func avx2RepackQ2K(n int, w, x []byte) float32 {
	nb := n / 256
	return q2KRepackAVX2(w[:nb*84], x[:nb*292], nb)
}

func avx2RepackGemmQ2K(n int, w, x []byte) float32 {
	nb := n / 256
	return q2KRepackGemmAVX2(w[:nb*84], x[:nb*292], nb)
}

// The float kernels take n elements; the Gemm ones fall back to the Vec ones where n is not a
// multiple of their step, as x86F32Gemm, x86F16Gemm and x86BF16Gemm do.

func avx2F32Vec(n int, w, x []byte) float32 { return f32VecAVX2(w[:4*n], x[:4*n], n) }

func avx2F32Gemm(n int, w, x []byte) float32 {
	if n%16 != 0 {
		return avx2F32Vec(n, w, x)
	}
	return f32GemmAVX2(w[:4*n], x[:4*n], n)
}

func avx2F16Vec(n int, w, x []byte) float32 { return f16VecAVX2(w[:2*n], x[:2*n], n) }

func avx2F16Gemm(n int, w, x []byte) float32 {
	if n%16 != 0 {
		return avx2F16Vec(n, w, x)
	}
	return f16GemmAVX2(w[:2*n], x[:2*n], n)
}

func avx2BF16Vec(n int, w, x []byte) float32 { return bf16VecAVX2(w[:2*n], x[:2*n], n) }

func avx2BF16Gemm(n int, w, x []byte) float32 {
	if n%32 != 0 {
		return avx2BF16Vec(n, w, x)
	}
	return bf16GemmAVX2(w[:2*n], x[:2*n], n)
}
