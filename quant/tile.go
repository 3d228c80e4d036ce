package quant

import (
	"bytes"
	"fmt"
)

// Matrix products in tiles. X86Rows (and X86Product, the same prepared once for many ranges
// of rows) computes a block of rows of a product with the results of X86Dot's kernels
// (llama.cpp's x86 arithmetic, to the bit), but where the machine has a tile kernel for the
// weight type it computes eight rows against many activation rows at a time: every output
// sees the same float32 operations in the same order as X86Dot's kernel for it, while each
// weight block is decoded once for all the activation rows and each activation block is read
// once for eight weight rows. A product of one activation row takes a rows kernel (one call
// for all its rows) where there is one; elsewhere X86Dot's kernel runs per output, and that
// loop (x86RowsDotRef) is the reference every tile and rows kernel is tested against.

// tileRows is the number of weight rows a tile kernel computes: llama.cpp's repacked groups.
const tileRows = 8

// tileTokens bounds the activation rows of one tile call, so that its accumulators and the
// activation blocks it walks stay in the first cache levels.
const tileTokens = 64

// A tileKernel adds tileRows weight rows (from w, ldw bytes apart) times T activation rows
// (from x, ldx bytes apart, rounded to the weight's dot type) over nb blocks into acc, where
// activation row t's results end in acc[t*s+r] for the tile's accStride s; the rest of its
// s floats are the kernel's own. aux holds the per-block activation terms of the weight
// type's prep, block by block: aux[b*T+t] for block b of activation row t.
type tileKernel func(w []byte, ldw int, x []byte, ldx int, aux []int32, nb, T int, acc []float32)

// A tile is the tile kernels of one weight type and family of llama.cpp products.
type tile struct {
	gemv tileKernel // the activation rows llama.cpp multiplies one at a time
	gemm tileKernel // those it multiplies four at a time (nil: as gemv)
	// prep writes aux for T activation rows (xrow bytes apart) of nb blocks each (block by
	// block, as the kernels read it), and reports whether the kernels compute exactly what
	// the one-row kernels do on these activations (false: X86Rows takes the one-row
	// kernels); nil when the kernels need neither.
	prep func(x []byte, xrow, nb, T int, aux []int32) bool
	// minTokens is the fewest activation rows for which the tile beats the one-row kernels
	// (measured with BenchmarkX86Rows); fewer take the one-row kernels.
	minTokens int
	// repacked says that the kernels reproduce llama.cpp's repacked products, which it
	// takes for matrices of a multiple of 8 rows only; other tiles serve any matrix.
	repacked bool
	// accStride is the floats of acc per activation row (at least tileRows), zeroed before
	// the kernels run.
	accStride int
}

// tiles holds the machine's tile kernels by weight type, nil where there are none; an
// architecture file fills it once at start-up according to the CPU's features.
var tiles [len(types)]*tile

// TileScratch is the tile kernels' accumulators, reused from call to call. The zero value is
// ready; it is not safe for concurrent use.
type TileScratch struct {
	acc [tileTokens * maxAccStride]float32
}

// maxAccStride bounds the tiles' accStride.
const maxAccStride = 72

// X86Rows computes rows [lo, hi) of the product of w with T activation rows x (each rounded to
// w.Type.DotType() by QuantizeRow, xrow bytes apart) as llama.cpp's x86 backend computes them
// in a product over batch activation rows: out[t*ldo+o] = X86Dot(w.Type, w.Rows, batch, t)
// (w.Cols, w.Row(o), x row t), bit for bit. A batch of 1 takes every row one at a time, as
// llama.cpp's MUL_MAT_ID does for expert weights. It is an X86Product used once.
func X86Rows(w Matrix, lo, hi int, x []byte, xrow, T, batch int, out []float32, ldo int, s *TileScratch) {
	var p X86Product
	p.Prepare(w, x, xrow, T, batch)
	p.Rows(lo, hi, out, ldo, s)
}

// An X86Product is a matrix product of X86Rows prepared once for the ranges of rows it is
// split into (over threads): the activation terms its tile kernels need are computed by
// Prepare, and Rows, which may run concurrently, only reads them. The zero value is ready;
// Prepare reuses its memory.
type X86Product struct {
	w              Matrix
	x              []byte
	xrow, T, batch int
	tl             *tile // nil: the one-row kernels
	gemm           int   // activation rows [0, gemm) are multiplied four at a time
	aux            []int32
	exact          []bool // per chunk of tileTokens activation rows: whether the tiles are exact on it
	// xf is the activation rows widened to float32 where F16 weights take f16Multi's or
	// f16Gemm's kernels (empty otherwise): widened once per product rather than once per
	// weight row. gemm16 says which: tinyBLAS's order (f16Gemm) or ggml_vec_dot_f16's.
	xf     []float32
	gemm16 bool
}

// f16Multi holds, where the machine has them, the kernels of F16 rows against 1 to 3
// activation rows widened to float32 (f16Multi[k-1] takes k), each output as X86Dot's F16
// kernel for a row alone computes it; widenF16 widens fp16 values as they do. An architecture
// file fills them once at start-up.
var (
	f16Multi [3]func(w []byte, ldw int, x []float32, ldx int, n int, rows int, out []float32, ldo int)
	widenF16 func(x []byte, out []float32, n int)
)

// f16Gemm holds, where the machine has them, the kernels of tinyBLAS's F16 products (X86Dot's
// choice for a product of two or more activation rows over a multiple of 4 weight rows, rows
// of a multiple of 16 values) over 1 or 2 weight rows (f16Gemm[R-1]) against 1 to 3 activation
// rows widened to float32 (f16Gemm[R-1][N-1]).
var f16Gemm [2][3]func(w []byte, ldw int, x []float32, ldx int, n int, rows int, out []float32, ldo int)

// Prepare sets the product up; see X86Rows.
func (p *X86Product) Prepare(w Matrix, x []byte, xrow, T, batch int) {
	if T < 0 || T > 0 && batch < 1 {
		panic(fmt.Sprintf("quant: X86Product: %d activation rows of a batch of %d", T, batch))
	}
	p.w, p.x, p.xrow, p.T, p.batch = w, x, xrow, T, batch
	p.xf = p.xf[:0]
	if w.Type == F16 && widenF16 != nil && T > 0 {
		// X86Dot's choice: tinyBLAS where it takes the product, ggml_vec_dot_f16 elsewhere
		// (also tinyBLAS's own fallback for rows not a multiple of 16 values).
		p.gemm16 = batch >= 2 && w.Rows%4 == 0 && w.Cols%16 == 0
		p.tl = nil
		n := w.Cols
		if cap(p.xf) < T*n {
			p.xf = make([]float32, T*n)
		}
		p.xf = p.xf[:T*n]
		for t := range T {
			widenF16(x[t*xrow:t*xrow+2*n], p.xf[t*n:(t+1)*n], n)
		}
		return
	}
	p.tl = x86Tile(w.Type, w.Rows)
	if p.tl != nil && T < p.tl.minTokens {
		p.tl = nil
	}
	if p.tl == nil {
		return
	}
	p.gemm = 0
	if p.tl.gemm != nil {
		p.gemm = batch - batch%4
	}
	if p.tl.prep == nil {
		return
	}
	nb := w.Cols / w.Type.BlockSize()
	if cap(p.aux) < T*nb {
		p.aux = make([]int32, T*nb)
	}
	p.aux = p.aux[:T*nb]
	p.exact = p.exact[:0]
	for t0 := 0; t0 < T; t0 += tileTokens {
		n, split := p.chunk(t0)
		xs := x[t0*xrow : (t0+n)*xrow]
		a := p.aux[t0*nb : (t0+n)*nb]
		ok := p.tl.prep(xs[:split*xrow], xrow, nb, split, a[:split*nb]) && p.tl.prep(xs[split*xrow:], xrow, nb, n-split, a[split*nb:])
		p.exact = append(p.exact, ok)
	}
}

// chunk returns the activation rows of the chunk from t0 and how many of them the gemm
// kernel takes (the first ones).
func (p *X86Product) chunk(t0 int) (n, split int) {
	n = min(p.T-t0, tileTokens)
	return n, min(max(p.gemm-t0, 0), n)
}

// Rows computes rows [lo, hi) of the product into out (activation row t's at out[t*ldo:]).
func (p *X86Product) Rows(lo, hi int, out []float32, ldo int, s *TileScratch) {
	w, x, xrow, T := p.w, p.x, p.xrow, p.T
	if lo < 0 || hi > w.Rows || lo > hi {
		panic(fmt.Sprintf("quant: X86Product.Rows: rows [%d,%d) of %d", lo, hi, w.Rows))
	}
	tl := p.tl
	if len(p.xf) > 0 {
		if p.gemm16 {
			p.f16GemmRows(lo, hi, out, ldo)
		} else {
			p.f16Rows(lo, hi, out, ldo)
		}
		return
	}
	if tl == nil {
		x86RowsDot(w, lo, hi, x, xrow, T, p.batch, out, ldo)
		return
	}
	// Tiles start at multiples of 8, as llama.cpp's groups do; rows outside whole tiles
	// take the one-row kernels, which compute the same.
	tlo := min((lo+tileRows-1)/tileRows*tileRows, hi)
	thi := max(hi/tileRows*tileRows, tlo)
	x86RowsDot(w, lo, tlo, x, xrow, T, p.batch, out, ldo)
	x86RowsDot(w, thi, hi, x, xrow, T, p.batch, out, ldo)
	if tlo == thi {
		return
	}
	nb := w.Cols / w.Type.BlockSize()
	rb := w.RowBytes()
	for c, t0 := 0, 0; t0 < T; c, t0 = c+1, t0+tileTokens {
		n, split := p.chunk(t0)
		xs := x[t0*xrow : (t0+n)*xrow]
		var auxGemm, auxGemv []int32
		if tl.prep != nil {
			if !p.exact[c] {
				x86RowsDot(w, tlo, thi, xs, xrow, n, p.batch, out[t0*ldo:], ldo)
				continue
			}
			a := p.aux[t0*nb : (t0+n)*nb]
			auxGemm, auxGemv = a[:split*nb], a[split*nb:]
		}
		as := tl.accStride
		for r := tlo; r < thi; r += tileRows {
			acc := s.acc[:n*as]
			clear(acc)
			wr := w.Data[r*rb : (r+tileRows)*rb]
			if split > 0 {
				tl.gemm(wr, rb, xs, xrow, auxGemm, nb, split, acc)
			}
			if split < n {
				tl.gemv(wr, rb, xs[split*xrow:], xrow, auxGemv, nb, n-split, acc[split*as:])
			}
			for t := 0; t < n; t++ {
				// An array assignment: eight floats, not a call to memmove.
				*(*[tileRows]float32)(out[(t0+t)*ldo+r:]) = *(*[tileRows]float32)(acc[t*as:])
			}
		}
	}
}

// f16Rows is Rows for F16 weights through f16Multi: three activation rows a call, or two
// where a single row would be left (its kernel runs at the conversions' rate, the others at
// the multiply-adds').
func (p *X86Product) f16Rows(lo, hi int, out []float32, ldo int) {
	if lo == hi {
		return
	}
	w, n := p.w, p.w.Cols
	rb := w.RowBytes()
	for t0, k := 0, 0; t0 < p.T; t0 += k {
		switch k = p.T - t0; k {
		case 1, 2, 3:
		case 4:
			k = 2
		default:
			k = 3
		}
		// The slices end where the kernel stops reading and writing, so that a bad shape
		// panics here rather than reading past them.
		f16Multi[k-1](w.Data[lo*rb:(hi-1)*rb+2*n], rb, p.xf[t0*n:(t0+k)*n], n, n, hi-lo,
			out[t0*ldo+lo:(t0+k-1)*ldo+hi], ldo)
	}
}

// f16GemmRows is Rows for F16 weights in tinyBLAS's order through f16Gemm: two weight rows
// and three activation rows a call where they are left, over blocks of f16GemmBlock weight
// rows that stay in the caches while every activation row goes past them.
func (p *X86Product) f16GemmRows(lo, hi int, out []float32, ldo int) {
	w, n := p.w, p.w.Cols
	rb := w.RowBytes()
	for r0 := lo; r0 < hi; r0 += f16GemmBlock {
		r1 := min(r0+f16GemmBlock, hi)
		pair := r0 + (r1-r0)&^1
		for t0, k := 0, 0; t0 < p.T; t0 += k {
			k = min(p.T-t0, 3)
			xs := p.xf[t0*n : (t0+k)*n]
			if pair > r0 {
				f16Gemm[1][k-1](w.Data[r0*rb:(pair-1)*rb+2*n], rb, xs, n, n, pair-r0, out[t0*ldo+r0:(t0+k-1)*ldo+pair], ldo)
			}
			if pair < r1 {
				f16Gemm[0][k-1](w.Data[pair*rb:pair*rb+2*n], rb, xs, n, n, 1, out[t0*ldo+pair:(t0+k-1)*ldo+r1], ldo)
			}
		}
	}
}

// f16GemmBlock is the weight rows f16GemmRows takes past every activation row at a time: 64
// KiB of a 2048-wide matrix, in the second cache level.
const f16GemmBlock = 16

// A rowsKernel is a one-row kernel over rows consecutive weight rows (ldw bytes apart) of
// nb blocks against the one activation row x: out[r] is row r's product.
type rowsKernel func(w []byte, ldw int, x []byte, nb, rows int, out []float32)

// fastRows holds, by weight type, the rows kernels of a product of one activation row: [0]
// for matrices llama.cpp does not repack, [1] for those it does (a multiple of 8 rows); an
// architecture file fills it once at start-up. A decoded token's products are all of one
// activation row, and a call per weight row cost a tenth of decoding.
var fastRows [len(types)][2]rowsKernel

// x86RowsDot is X86Rows without the tiles: one kernel call per activation row where the
// machine has a rows kernel and every row takes the one-row kernels (a single row, or a
// product row by row, batch 1, as a decode batch's are), one X86Dot kernel call per output
// elsewhere.
func x86RowsDot(w Matrix, lo, hi int, x []byte, xrow, T, batch int, out []float32, ldo int) {
	if (T == 1 || batch == 1) && lo < hi && int(w.Type) < len(fastRows) {
		repacked := 0
		if repackedRows(w.Rows) {
			repacked = 1
		}
		if k := fastRows[w.Type][repacked]; k != nil {
			rb := w.RowBytes()
			nb := w.Cols / w.Type.BlockSize()
			for t := range T {
				k(w.Data[lo*rb:hi*rb], rb, x[t*xrow:(t+1)*xrow], nb, hi-lo, out[t*ldo+lo:t*ldo+hi])
			}
			return
		}
	}
	x86RowsDotRef(w, lo, hi, x, xrow, T, batch, out, ldo)
}

// x86RowsDotRef is X86Rows one X86Dot kernel call per output: the reference of the tile and
// rows kernels.
func x86RowsDotRef(w Matrix, lo, hi int, x []byte, xrow, T, batch int, out []float32, ldo int) {
	if lo >= hi || T == 0 {
		return
	}
	// X86Dot's choice depends on the activation row only through whether it lies in the
	// groups of four that llama.cpp's repacked GEMM takes, [0, gemm).
	gemm := batch - batch%4
	kGemm, kGemv := X86Dot(w.Type, w.Rows, batch, 0), X86Dot(w.Type, w.Rows, batch, batch-1)
	rb := w.RowBytes()
	for o := lo; o < hi; o++ {
		row := w.Data[o*rb : (o+1)*rb]
		for t := 0; t < T; t++ {
			k := kGemv
			if t < gemm {
				k = kGemm
			}
			out[t*ldo+o] = k(w.Cols, row, x[t*xrow:(t+1)*xrow])
		}
	}
}

// x86Tile returns the tile kernels of a weight type, or nil where the machine has none or
// llama.cpp does not repack a matrix of that many rows.
func x86Tile(t Type, rows int) *tile {
	if int(t) >= len(tiles) || tiles[t] == nil || tiles[t].repacked && !repackedRows(rows) {
		return nil
	}
	return tiles[t]
}

// prepQ4_0 writes 8 times the sum of each Q8_0 block's quants: the offset of Q4_0's quants
// times the activations.
func prepQ4_0(x []byte, xrow, nb, T int, aux []int32) bool {
	for t := 0; t < T; t++ {
		row := x[t*xrow:]
		for b := 0; b < nb; b++ {
			blk := (*[34]byte)(row[b*34:])
			var s int32
			for _, v := range blk[2:] {
				s += int32(int8(v))
			}
			aux[b*T+t] = 8 * s
		}
	}
	return true
}

// prepMXFP4 writes 12 times the sum of each Q8_0 block's quants: the offset the MXFP4 tile adds
// to its codebook values (to multiply them as unsigned bytes) times the activations.
func prepMXFP4(x []byte, xrow, nb, T int, aux []int32) bool {
	for t := 0; t < T; t++ {
		row := x[t*xrow:]
		for b := 0; b < nb; b++ {
			blk := (*[34]byte)(row[b*34:])
			var s int32
			for _, v := range blk[2:] {
				s += int32(int8(v))
			}
			aux[b*T+t] = 12 * s
		}
	}
	return true
}

// prepQ8_0 reports whether no activation quant is -128, for which the Q8_0 tile's
// VPSIGNB would overflow.
func prepQ8_0(x []byte, xrow, nb, T int, _ []int32) bool {
	for t := 0; t < T; t++ {
		row := x[t*xrow : t*xrow+nb*34]
		for i := 0; ; {
			k := bytes.IndexByte(row[i:], 0x80)
			if k < 0 {
				break
			}
			if (i+k)%34 >= 2 { // a quant, not a scale byte
				return false
			}
			i += k + 1
		}
	}
	return true
}
