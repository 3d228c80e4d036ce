//go:build !purego

package quant

//go:generate go run -C ../internal/asmgen . -set tile -out ../../quant/tile_avx2_amd64.s -stubs ../../quant/tile_avx2_stubs_amd64.go -pkg quant

// q4KAccStride is the floats per activation row of the Q4_K tiles' accumulators (see
// internal/asmgen's q4KTile).
const q4KAccStride = 32

// q5KAccStride is the Q5_K tile's (internal/asmgen's q5KTile).
const q5KAccStride = 72

func init() {
	if !hasAVX2 {
		return
	}
	tiles[Q4_0] = &tile{gemv: q4_0Tile8AVX2, prep: prepQ4_0, repacked: true, accStride: 8}
	tiles[Q8_0] = &tile{gemv: q8_0Tile8AVX2, prep: prepQ8_0, accStride: 64, minTokens: 2}
	tiles[Q6_K] = &tile{gemv: q6KTile8AVX2, accStride: 64, minTokens: 2}
	tiles[Q5_K] = &tile{gemv: q5KTile8AVX2, accStride: q5KAccStride, minTokens: 2}
	tiles[Q4_K] = &tile{gemv: q4KTile8AVX2, gemm: q4KTile8GemmAVX2, repacked: true, accStride: q4KAccStride, minTokens: 2}
	tiles[MXFP4] = &tile{gemv: mxfp4Tile8AVX2, prep: prepMXFP4, repacked: true, accStride: 8}
}
