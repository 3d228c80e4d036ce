//go:build !purego

package quant

//go:generate go run -C ../internal/asmgen . -set tile -out ../../quant/tile_avx2_amd64.s -stubs ../../quant/tile_avx2_stubs_amd64.go -pkg quant

func init() {
	if !hasAVX2 {
		return
	}
	tiles[Q4_0] = &tile{gemv: q4_0Tile8AVX2, prep: prepQ4_0}
}
