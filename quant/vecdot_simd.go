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
