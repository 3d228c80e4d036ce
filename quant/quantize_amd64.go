//go:build !purego

package quant

//go:generate go run -C ../internal/asmgen . -set quantize -out ../../quant/quantize_avx2_amd64.s -stubs ../../quant/quantize_avx2_stubs_amd64.go -pkg quant

func init() {
	if !hasAVX2 {
		return
	}
	quantRowFast[Q8_0] = func(src []float32, dst []byte) { quantQ8_0AVX2(src, dst[:len(src)/32*34], len(src)/32) }
	quantRowFast[Q8_K] = func(src []float32, dst []byte) { quantQ8KAVX2(src, dst[:len(src)/256*292], len(src)/256) }
	quantRowFast[F16] = func(src []float32, dst []byte) { quantF16AVX2(src, dst[:2*len(src)], len(src)) }
	for t, f := range quantRowFast {
		if f != nil {
			quantRow[t] = f
		}
	}
}
