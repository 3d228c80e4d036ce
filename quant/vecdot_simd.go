package quant

// SIMD kernels. An architecture file (vecdot_amd64.go) may, once at start-up and according to
// the CPU's features, put faster kernels into vecDot in place of the portable ones of
// vecdot.go. Each fast kernel computes exactly the integer block sums of the portable one and
// differs from it only in the order of the float32 accumulation (the order of llama.cpp's
// SIMD kernels); the tests in vecdot_simd_test.go check every one against the portable kernel.

// vecDotRef holds the portable kernels. Package-level variables are initialized before any
// init function runs, so this is a copy of vecDot as vecdot.go declares it.
var vecDotRef = vecDot

// vecDotFast holds, for each weight type, the fast kernel that init put into vecDot, or nil.
var vecDotFast [len(vecDot)]func(n int, w, x []byte) float32

// installFast puts the fast kernels into vecDot.
func installFast() {
	for t, f := range vecDotFast {
		if f != nil {
			vecDot[t] = f
		}
	}
}

// Fast kernels in the float order of one row of llama.cpp's repacked products (the 8-row
// interleaved GEMV and GEMM its x86 backend uses for Q4_0 and Q4_K matrices whose row count
// is a multiple of 8), or nil where the machine has none. They are not VecDot kernels (VecDot
// sums in the order of ggml_vec_dot_*), but what quant.X86Dot's repacked cases compute:
//
//	fastRepackQ4_0     per block, one fused multiply-add of its integer sum
//	fastRepackQ4K      per super-block, one of the scaled sum and one of the min term,
//	                   in two accumulators subtracted at the end (ggml_gemv_q4_K_8x8_q8_K)
//	fastRepackGemmQ4K  the same per 64-element pair of sub-blocks (ggml_gemm_q4_K_8x8_q8_K)
var fastRepackQ4_0, fastRepackQ4K, fastRepackGemmQ4K func(n int, w, x []byte) float32

// Fast kernels of quant.X86Dot's Go kernels (x86.go) for the products that VecDot has no fast
// kernel for, or nil where the machine has none. Each computes what its Go kernel computes, to
// the bit (integer sums exact for any bytes, the same float32 operations in the same order):
//
//	fastX86Q4_1  x86LanesQ4_1 (ggml_vec_dot_q4_1_q8_1)
//	fastX86Q5_1  x86LanesQ5_1 (ggml_vec_dot_q5_1_q8_1)
//	fastX86IQ4NL, fastX86VecIQ4NL, fastX86RepackIQ4NL
//	             x86LanesIQ4NL (tinyBLAS), x86VecIQ4NL (ggml_vec_dot_iq4_nl_q8_0),
//	             x86RepackIQ4NL (the repacked GEMV/GEMM)
//	fastX86VecMXFP4, fastX86RepackMXFP4
//	             x86VecMXFP4 (ggml_vec_dot_mxfp4_q8_0), x86RepackMXFP4 (the repacked GEMV/GEMM)
//	fastX86Q5K   x86Q5K (ggml_vec_dot_q5_K_q8_K)
//	fastX86Q3K   x86Q3K (ggml_vec_dot_q3_K_q8_K)
//	fastX86Q2K, fastX86RepackQ2K, fastX86RepackGemmQ2K
//	             x86Q2K (ggml_vec_dot_q2_K_q8_K), x86RepackQ2K (ggml_gemv_q2_K_8x8_q8_K),
//	             x86RepackGemmQ2K (ggml_gemm_q2_K_8x8_q8_K)
//	fastX86F32Vec, fastX86F32Gemm, fastX86F16Vec, fastX86F16Gemm, fastX86BF16Vec, fastX86BF16Gemm
//	             x86F32Vec ... x86BF16Gemm: the AVX-512 arithmetic of llama.cpp's zen4 build
//	             (ggml_vec_dot_f32/f16/bf16 and tinyBLAS), each 16-lane accumulator kept in two
//	             AVX2 registers; VDPBF16PS emulated with its zero-exponent rules
var fastX86Q4_1, fastX86Q5_1 func(n int, w, x []byte) float32

var fastX86IQ4NL, fastX86VecIQ4NL, fastX86RepackIQ4NL func(n int, w, x []byte) float32

var fastX86VecMXFP4, fastX86RepackMXFP4 func(n int, w, x []byte) float32

var fastX86Q5K, fastX86Q3K func(n int, w, x []byte) float32

var fastX86Q2K, fastX86RepackQ2K, fastX86RepackGemmQ2K func(n int, w, x []byte) float32

var fastX86F32Vec, fastX86F32Gemm, fastX86F16Vec, fastX86F16Gemm, fastX86BF16Vec, fastX86BF16Gemm func(n int, w, x []byte) float32
