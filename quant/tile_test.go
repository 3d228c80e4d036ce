package quant

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// The tile kernels against X86Rows's reference, one X86Dot kernel per output: every output
// must be the same float32, bit for bit.

// typesWith returns the types whose entry of a per-type kernel table (tiles, fastRows,
// quantRowFast) is set, and skips t, naming what, when none is on this machine/build.
func typesWith[E any](t testing.TB, table []E, set func(E) bool, what string) []Type {
	var out []Type
	for typ, e := range table {
		if set(e) {
			out = append(out, Type(typ))
		}
	}
	if len(out) == 0 {
		t.Skipf("no %s on this machine/build", what)
	}
	return out
}

// tileTypes returns the weight types this machine has tile kernels for.
func tileTypes(t testing.TB) []Type {
	return typesWith(t, tiles[:], func(tl *tile) bool { return tl != nil }, "tile kernels")
}

// tileProblem is a product to compute both ways: rows of random weights of typ (scales tamed
// unless raw) and T activation rows rounded to the dot type.
type tileProblem struct {
	typ             Type
	rows, cols, T   int
	batch, lo, hi   int
	w, x            []byte
	xrow            int
	raw             bool
	wantOut, gotOut []float32
}

func newTileProblem(r *rand.Rand, typ Type, rows, cols, T, batch, lo, hi int) *tileProblem {
	p := &tileProblem{typ: typ, rows: rows, cols: cols, T: T, batch: batch, lo: lo, hi: hi}
	rb, _ := typ.RowBytes(cols)
	p.w = simdRandomBytes(r, rows*rb)
	simdTameScales(typ, p.w, nil)
	p.xrow, _ = typ.DotType().RowBytes(cols)
	p.x = make([]byte, T*p.xrow)
	for t := 0; t < T; t++ {
		QuantizeRow(typ.DotType(), randomRow(r, cols, 1), p.x[t*p.xrow:(t+1)*p.xrow])
	}
	return p
}

// run computes the product with the tiles and with the reference, into outputs prefilled with
// a sentinel so that rows outside [lo, hi) must stay untouched.
func (p *tileProblem) run(s *TileScratch) {
	m := Matrix{Type: p.typ, Rows: p.rows, Cols: p.cols, Data: p.w}
	ldo := p.rows + 3
	p.wantOut = make([]float32, p.T*ldo)
	p.gotOut = make([]float32, p.T*ldo)
	for i := range p.wantOut {
		p.wantOut[i], p.gotOut[i] = -7, -7
	}
	x86RowsDotRef(m, p.lo, p.hi, p.x, p.xrow, p.T, p.batch, p.wantOut, ldo)
	X86Rows(m, p.lo, p.hi, p.x, p.xrow, p.T, p.batch, p.gotOut, ldo, s)
}

func (p *tileProblem) check(t *testing.T) {
	t.Helper()
	for i, want := range p.wantOut {
		got := p.gotOut[i]
		if math.Float32bits(got) != math.Float32bits(want) && !(want != want && got != got) {
			ldo := p.rows + 3
			t.Fatalf("%v %dx%d, T=%d batch=%d rows [%d,%d): out[token %d][row %d] = %v (%08x), want %v (%08x)",
				p.typ, p.rows, p.cols, p.T, p.batch, p.lo, p.hi, i/ldo, i%ldo, got, math.Float32bits(got), want, math.Float32bits(want))
		}
	}
}

func TestX86RowsTiles(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	var s TileScratch
	for _, typ := range tileTypes(t) {
		bs := typ.BlockSize()
		for _, shape := range []struct{ rows, cols int }{{8, bs}, {16, 2 * bs}, {40, 7 * bs}, {64, 16 * bs}, {21, 3 * bs}} {
			for _, T := range []int{1, 2, 3, 4, 5, 8, 13, 64, 65, 131} {
				for _, batch := range []int{1, T} {
					for _, rng := range [][2]int{{0, shape.rows}, {3, shape.rows - 2}, {8, shape.rows}, {0, 5}} {
						lo, hi := rng[0], min(rng[1], shape.rows)
						if lo > hi {
							continue
						}
						p := newTileProblem(r, typ, shape.rows, shape.cols, T, batch, lo, hi)
						p.run(&s)
						p.check(t)
					}
				}
			}
		}
	}
}

// TestX86RowsUsesTiles checks that the tiles, not the reference, compute what they can: a
// product whose tile kernel were never called would pass TestX86RowsTiles.
func TestX86RowsUsesTiles(t *testing.T) {
	for _, typ := range tileTypes(t) {
		saved := tiles[typ]
		calls := 0
		count := func(k tileKernel) tileKernel {
			if k == nil {
				return nil
			}
			return func(w []byte, ldw int, x []byte, ldx int, aux []int32, nb, T int, acc []float32) {
				calls++
				k(w, ldw, x, ldx, aux, nb, T, acc)
			}
		}
		tiles[typ] = &tile{gemv: count(saved.gemv), gemm: count(saved.gemm), prep: saved.prep, repacked: saved.repacked, accStride: saved.accStride, minTokens: saved.minTokens}
		p := newTileProblem(rand.New(rand.NewPCG(1, 2)), typ, 16, typ.BlockSize(), 5, 5, 0, 16)
		p.run(&TileScratch{})
		tiles[typ] = saved
		p.check(t)
		if calls == 0 {
			t.Errorf("%v: X86Rows called no tile kernel", typ)
		}
	}
}

// FuzzX86Rows compares the tiles with the reference on arbitrary weight and activation bytes.
func FuzzX86Rows(f *testing.F) {
	for i, b := range []byte{0x00, 0x80, 0x7f, 0xff, 0x88, 0x0f} {
		f.Add(uint8(i), uint8(3*i+1), uint8(i), bytesOf(b, 16*(144+292)))
	}
	f.Fuzz(func(t *testing.T, sel, tokens, batch uint8, data []byte) {
		types := tileTypes(t)
		typ := types[int(sel)%len(types)]
		T := 1 + int(tokens)%70
		b := 1
		if batch&1 != 0 {
			b = T
		}
		rb, xb := typ.BlockBytes(), typ.DotType().BlockBytes()
		// 8 or 16 rows, and as many blocks per row as the data allows for them and T rows.
		rows := 8 * (1 + int(sel>>7))
		nb := len(data) / (rows*rb + T*xb)
		if nb == 0 {
			return
		}
		w := append([]byte(nil), data[:rows*nb*rb]...)
		x := append([]byte(nil), data[rows*nb*rb:rows*nb*rb+T*nb*xb]...)
		if sel&0x40 != 0 {
			simdTameScales(typ, w, nil)
		}
		p := &tileProblem{typ: typ, rows: rows, cols: nb * typ.BlockSize(), T: T, batch: b, lo: 0, hi: rows,
			w: w, x: x, xrow: nb * xb, raw: true}
		p.run(&TileScratch{})
		p.check(t)
	})
}

// BenchmarkX86Rows compares the reference and the tiles on a 2048x2048 matrix of each type with
// a tile kernel, for a single activation row (decode) and for 64 (prefill).
func BenchmarkX86Rows(b *testing.B) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, typ := range tileTypes(b) {
		for _, T := range []int{1, 2, 3, 4, 16, 64} {
			p := newTileProblem(r, typ, 2048, 2048, T, T, 0, 2048)
			m := Matrix{Type: typ, Rows: p.rows, Cols: p.cols, Data: p.w}
			out := make([]float32, T*p.rows)
			var s TileScratch
			for _, v := range []struct {
				name string
				f    func()
			}{
				{"ref", func() { x86RowsDotRef(m, 0, p.rows, p.x, p.xrow, T, T, out, p.rows) }},
				{"tile", func() { X86Rows(m, 0, p.rows, p.x, p.xrow, T, T, out, p.rows, &s) }},
			} {
				b.Run(fmt.Sprintf("%v/T=%d/%s", typ, T, v.name), func(b *testing.B) {
					for b.Loop() {
						v.f()
					}
					macs := float64(p.rows) * float64(p.cols) * float64(T) * float64(b.N)
					b.ReportMetric(macs/b.Elapsed().Seconds()/1e9, "GMAC/s")
				})
			}
		}
	}
}

// BenchmarkX86RowsF16 compares, for F16 products taken row by row (a decode batch's, and a
// single token's), f16VecAVX2 once per output with both operands widened in the loop
// ("rows") and the kernels of up to three activation rows widened once ("multi"), on the
// bundled model's shapes: 128 columns, 128 rows (an expert) and 2048 (the output head); then
// a prompt's products.
func BenchmarkX86RowsF16(b *testing.B) {
	if widenF16 == nil {
		b.Skip("no F16 multi-row kernels on this machine")
	}
	r := rand.New(rand.NewPCG(45, 46))
	for _, rows := range []int{128, 2048} {
		for _, T := range []int{1, 2, 4} {
			p := newTileProblem(r, F16, rows, 128, T, 1, 0, rows)
			m := Matrix{Type: F16, Rows: rows, Cols: 128, Data: p.w}
			out := make([]float32, T*rows)
			var s TileScratch
			for _, v := range []struct {
				name string
				f    func()
			}{
				{"rows", func() { x86RowsDot(m, 0, rows, p.x, p.xrow, T, 1, out, rows) }},
				{"multi", func() { X86Rows(m, 0, rows, p.x, p.xrow, T, 1, out, rows, &s) }},
			} {
				b.Run(fmt.Sprintf("rows=%d/T=%d/%s", rows, T, v.name), func(b *testing.B) {
					for b.Loop() {
						v.f()
					}
					macs := float64(rows) * 128 * float64(T) * float64(b.N)
					b.ReportMetric(macs/b.Elapsed().Seconds()/1e9, "GMAC/s")
				})
			}
		}
	}
	// A prompt's products (batch T): tinyBLAS's kernel per output ("ref") against the tiles
	// of two weight rows and three activation rows, on a 2048x2048 matrix.
	for _, T := range []int{16, 64} {
		p := newTileProblem(r, F16, 2048, 2048, T, T, 0, 2048)
		m := Matrix{Type: F16, Rows: 2048, Cols: 2048, Data: p.w}
		out := make([]float32, T*2048)
		var s TileScratch
		for _, v := range []struct {
			name string
			f    func()
		}{
			{"ref", func() { x86RowsDotRef(m, 0, 2048, p.x, p.xrow, T, T, out, 2048) }},
			{"tiles", func() { X86Rows(m, 0, 2048, p.x, p.xrow, T, T, out, 2048, &s) }},
		} {
			b.Run(fmt.Sprintf("prompt/T=%d/%s", T, v.name), func(b *testing.B) {
				for b.Loop() {
					v.f()
				}
				macs := float64(2048) * 2048 * float64(T) * float64(b.N)
				b.ReportMetric(macs/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// BenchmarkX86RowsStream is BenchmarkX86Rows for one activation row over the rows of a 1 GiB
// matrix, larger than the caches, as a decoded token streams its weights from memory: the
// tiles against the one-row kernels (both prefetch), in GB/s of weights.
func BenchmarkX86RowsStream(b *testing.B) {
	if streamRows == nil {
		streamRows = simdRandomBytes(rand.New(rand.NewPCG(25, 26)), 1<<30)
	}
	r := rand.New(rand.NewPCG(43, 44))
	for _, typ := range tileTypes(b) {
		rb, _ := typ.RowBytes(2048)
		rows := len(streamRows) / rb / 8 * 8
		m := Matrix{Type: typ, Rows: rows, Cols: 2048, Data: streamRows[:rows*rb]}
		simdTameScales(typ, m.Data, nil)
		xrow, _ := typ.DotType().RowBytes(2048)
		x := make([]byte, xrow)
		QuantizeRow(typ.DotType(), randomRow(r, 2048, 1), x)
		out := make([]float32, rows)
		var s TileScratch
		for _, v := range []struct {
			name string
			f    func()
		}{
			{"ref", func() { x86RowsDotRef(m, 0, rows, x, xrow, 1, 1, out, rows) }},
			{"rows", func() { x86RowsDot(m, 0, rows, x, xrow, 1, 1, out, rows) }},
			{"tile", func() { X86Rows(m, 0, rows, x, xrow, 1, 1, out, rows, &s) }},
		} {
			// The tile even where a single row takes the one-row kernels.
			saved := *tiles[typ]
			tiles[typ].minTokens = 1
			defer func() { *tiles[typ] = saved }()
			b.Run(fmt.Sprintf("%v/%s", typ, v.name), func(b *testing.B) {
				b.SetBytes(int64(len(m.Data)))
				for b.Loop() {
					v.f()
				}
			})
		}
	}
}

// rowsTypes returns the weight types this machine has rows kernels for, F16's being the
// kernels of widened activations (f16Multi, f16Gemm).
func rowsTypes(t testing.TB) []Type {
	types := typesWith(t, fastRows[:], func(ks [2]rowsKernel) bool { return ks[0] != nil || ks[1] != nil }, "rows kernels")
	if widenF16 != nil {
		types = append(types, F16)
	}
	return types
}

// TestX86RowsOneRow holds the products of one activation row (the rows kernels, or the Q4_0
// tile) to the reference for every type with a rows kernel, for matrices llama.cpp repacks
// (multiples of 8 rows) and matrices it does not, and for ranges of rows off the tiles.
func TestX86RowsOneRow(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	var s TileScratch
	for _, typ := range rowsTypes(t) {
		bs := typ.BlockSize()
		for _, shape := range []struct{ rows, cols int }{{5, bs}, {8, 2 * bs}, {21, 3 * bs}, {40, 7 * bs}} {
			for _, rng := range [][2]int{{0, shape.rows}, {3, shape.rows - 2}, {1, 2}} {
				p := newTileProblem(r, typ, shape.rows, shape.cols, 1, 1, rng[0], rng[1])
				p.run(&s)
				p.check(t)
			}
		}
	}
}

// TestX86RowsRowByRow holds products of several activation rows taken row by row (batch 1, a
// decode batch's), which run the rows kernels once per activation row where no tile takes
// them, to the reference.
func TestX86RowsRowByRow(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	var s TileScratch
	for _, typ := range rowsTypes(t) {
		bs := typ.BlockSize()
		wide := 5 * bs
		if bs == 1 {
			wide = 130 // a float type: past two of the kernels' steps of 64, and a tail
		}
		for _, shape := range []struct{ rows, cols int }{{5, bs}, {8, 2 * bs}, {21, 3 * bs}, {16, wide}} {
			for _, T := range []int{2, 3, 5} {
				for _, rng := range [][2]int{{0, shape.rows}, {3, shape.rows - 2}, {1, 2}} {
					p := newTileProblem(r, typ, shape.rows, shape.cols, T, 1, rng[0], rng[1])
					p.run(&s)
					p.check(t)
				}
			}
		}
	}
}

// FuzzX86RowsOneRow compares the rows kernels with the reference on arbitrary bytes, for one
// to five activation rows taken row by row (F16's also taken together).
func FuzzX86RowsOneRow(f *testing.F) {
	for i, b := range []byte{0x00, 0x80, 0x7f, 0xff, 0x88, 0x0f} {
		f.Add(uint8(i), uint8(3*i+1), bytesOf(b, 9*(210+292)))
	}
	f.Fuzz(func(t *testing.T, sel, rowsSel uint8, data []byte) {
		types := rowsTypes(t)
		typ := types[int(sel)%len(types)]
		rows := 1 + int(rowsSel)%17
		T := 1 + int(rowsSel>>5)%5 // taken row by row, as a decode batch's products
		rb, xb := typ.BlockBytes(), typ.DotType().BlockBytes()
		nb := len(data) / (rows*rb + T*xb)
		if nb == 0 {
			return
		}
		w := append([]byte(nil), data[:rows*nb*rb]...)
		x := append([]byte(nil), data[rows*nb*rb:rows*nb*rb+T*nb*xb]...)
		if sel&0x80 != 0 {
			simdTameScales(typ, w, nil)
		}
		batch := 1
		if typ == F16 && sel&0x40 != 0 {
			batch = T // taken together, as a prompt's: tinyBLAS's order where X86Dot takes it
		}
		p := &tileProblem{typ: typ, rows: rows, cols: nb * typ.BlockSize(), T: T, batch: batch, lo: 0, hi: rows,
			w: w, x: x, xrow: nb * xb, raw: true}
		p.run(&TileScratch{})
		p.check(t)
	})
}

// TestX86RowsF16 holds F16 products of several activation rows taken together (batch T, a
// prompt's: tinyBLAS's order where X86Dot takes it, ggml_vec_dot_f16's for other shapes) to
// the reference, over ranges that split the kernels' pairs of rows and groups of three
// activation rows.
func TestX86RowsF16(t *testing.T) {
	if widenF16 == nil {
		t.Skip("no F16 kernels of widened activations on this machine")
	}
	r := rand.New(rand.NewPCG(65, 66))
	var s TileScratch
	for _, shape := range []struct{ rows, cols int }{{8, 16}, {12, 128}, {40, 64}, {21, 128}, {16, 130}, {36, 48}} {
		for _, T := range []int{1, 2, 3, 4, 5, 7} {
			for _, batch := range []int{1, T} {
				for _, rng := range [][2]int{{0, shape.rows}, {3, shape.rows - 2}, {1, 2}, {5, shape.rows}} {
					p := newTileProblem(r, F16, shape.rows, shape.cols, T, batch, rng[0], rng[1])
					p.run(&s)
					p.check(t)
				}
			}
		}
	}
}
