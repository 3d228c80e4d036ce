package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// randomMatrix returns rows x cols weights of typ, quantized from random values.
func randomMatrix(r *rand.Rand, typ quant.Type, rows, cols int) quant.Matrix {
	rb, err := typ.RowBytes(cols)
	if err != nil {
		panic(err)
	}
	m := quant.Matrix{Type: typ, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
	row := make([]float32, cols)
	for o := 0; o < rows; o++ {
		for i := range row {
			row[i] = float32(r.NormFloat64()) * 0.05
		}
		quant.QuantizeRow(typ, row, m.Row(o))
	}
	return m
}

func randomActivations(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// wantMatMul is MatMul by definition: each output is X86Dot's kernel on the quantized rows.
func wantMatMul(w quant.Matrix, x []float32, T, batch int) []float32 {
	dt := w.Type.DotType()
	xrow, _ := dt.RowBytes(w.Cols)
	xq := make([]byte, xrow)
	out := make([]float32, T*w.Rows)
	for t := 0; t < T; t++ {
		quant.QuantizeRow(dt, x[t*w.Cols:(t+1)*w.Cols], xq)
		i := t
		if batch == 1 {
			i = 0
		}
		k := quant.X86Dot(w.Type, w.Rows, batch, i)
		for o := 0; o < w.Rows; o++ {
			out[t*w.Rows+o] = k(w.Cols, w.Row(o), xq)
		}
	}
	return out
}

// TestMatMul holds MatMul and MatMulID to llama.cpp's kernels, output by output, for every
// weight type, thread count and a range of shapes: row counts that are and are not multiples
// of the tiles' 8, and activation row counts across the tiles' groups of 4 and chunks of 64.
func TestMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	types := []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1,
		quant.Q8_0, quant.IQ4_NL, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K}
	for _, typ := range types {
		cols := 2 * typ.BlockSize()
		if typ.BlockSize() == 1 {
			cols = 64
		}
		for _, rows := range []int{5, 8, 24, 36} {
			w := randomMatrix(r, typ, rows, cols)
			for _, T := range []int{1, 2, 4, 7, 67} {
				x := randomActivations(r, T*cols)
				for _, threads := range []int{1, 2, 3} {
					// The device's kernels, and Serial's, which compute on the caller alone.
					for _, k := range []struct {
						name string
						k    interface {
							MatMul(quant.Matrix, []float32, int, []float32)
							MatMulID(quant.Matrix, []float32, int, []float32)
						}
					}{{"spread", New(threads)}, {"serial", New(threads).Serial()}} {
						for _, id := range []bool{false, true} {
							name := fmt.Sprintf("%v/%dx%d/T=%d/threads=%d/%s/id=%v", typ, rows, cols, T, threads, k.name, id)
							got := make([]float32, T*rows)
							batch := T
							if id {
								k.k.MatMulID(w, x, T, got)
								batch = 1
							} else {
								k.k.MatMul(w, x, T, got)
							}
							want := wantMatMul(w, x, T, batch)
							for i := range want {
								if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
									t.Fatalf("%s: out[%d][%d] = %v, want %v", name, i/rows, i%rows, got[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestParallel checks that every index runs exactly once, from one caller, from several at
// once (the pool is busy: goroutines of their own), and from inside a region.
func TestParallel(t *testing.T) {
	d := New(3)
	check := func(n int) {
		hits := make([]atomic.Int32, n)
		d.Parallel(n, func(i int) { hits[i].Add(1) })
		for i := range hits {
			if h := hits[i].Load(); h != 1 {
				t.Errorf("n=%d: index %d ran %d times", n, i, h)
			}
		}
	}
	for _, n := range []int{0, 1, 2, 3, 4, 17, 1000} {
		check(n)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Go(func() {
			for i := 0; i < 50; i++ {
				check(1 + i%9)
			}
		})
	}
	wg.Wait()
	var inner atomic.Int32
	d.Parallel(4, func(int) {
		d.Parallel(5, func(int) { inner.Add(1) })
	})
	if n := inner.Load(); n != 20 {
		t.Errorf("nested regions ran %d inner calls, want 20", n)
	}
}

// rangeFunc is a ranger for the tests.
type rangeFunc func(lo, hi int)

func (f rangeFunc) runRange(lo, hi int) { f(lo, hi) }

// TestParallelRangeAlign checks that ranges start at multiples of the alignment and cover
// [0, n) when n is not one.
func TestParallelRangeAlign(t *testing.T) {
	d := New(2)
	for _, n := range []int{1, 7, 8, 9, 15, 16, 17, 460, 2049} {
		var mu sync.Mutex
		covered := make([]int, n)
		d.parallelRange(n, 8, rangeFunc(func(lo, hi int) {
			mu.Lock()
			defer mu.Unlock()
			if lo%8 != 0 {
				t.Errorf("n=%d: range [%d,%d) not aligned", n, lo, hi)
			}
			for i := lo; i < hi; i++ {
				covered[i]++
			}
		}))
		for i, c := range covered {
			if c != 1 {
				t.Fatalf("n=%d: row %d covered %d times", n, i, c)
			}
		}
	}
}

// TestMatMulAllocs checks that a decode-sized product allocates nothing once warm.
func TestMatMulAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(3, 4))
	d := New(2)
	w := randomMatrix(r, quant.Q4_0, 64, 256)
	x := randomActivations(r, 256)
	out := make([]float32, 64)
	d.MatMul(w, x, 1, out)
	if n := testing.AllocsPerRun(100, func() { d.MatMulID(w, x, 1, out) }); n != 0 {
		t.Errorf("MatMulID of one row allocates %v times per call", n)
	}
	var sum atomic.Int64
	fn := func(i int) { sum.Add(int64(i)) }
	if n := testing.AllocsPerRun(100, func() { d.Parallel(16, fn) }); n != 0 {
		t.Errorf("Parallel allocates %v times per call", n)
	}
}

// TestMatMulEmpty checks that a product of no activation rows does nothing, as the
// expert-parallel path asks of a rank with no tokens.
func TestMatMulEmpty(t *testing.T) {
	d := New(2)
	w := randomMatrix(rand.New(rand.NewPCG(7, 8)), quant.Q4_0, 16, 64)
	d.MatMul(w, nil, 0, nil)
	d.MatMulID(w, nil, 0, nil)
}

// BenchmarkMatMul times a 2048x2048 product of each benchmark type for one activation row
// (decode) and for a batch of 128 (prefill), on the device's default threads.
func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	d := New(0)
	for _, typ := range []quant.Type{quant.Q4_0, quant.Q8_0, quant.Q4_K, quant.Q6_K} {
		w := randomMatrix(r, typ, 2048, 2048)
		for _, T := range []int{1, 128} {
			x := randomActivations(r, T*2048)
			out := make([]float32, T*2048)
			b.Run(fmt.Sprintf("%v/T=%d", typ, T), func(b *testing.B) {
				for b.Loop() {
					d.MatMul(w, x, T, out)
				}
				b.ReportMetric(float64(T)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
				b.ReportMetric(2048*2048*float64(T)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// TestMatMulIDs holds several products computed in one region to the same products taken
// one by one with MatMulID, to the bit, whatever the threads: types with and without tiles,
// row counts that split the region's chunks inside products, and a product of no rows.
func TestMatMulIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	shapes := []struct {
		typ        quant.Type
		rows, cols int
		T          int
	}{
		{quant.Q4_K, 24, 256, 1}, {quant.F16, 13, 64, 3}, {quant.Q8_0, 40, 64, 2}, {quant.Q6_K, 8, 256, 0},
		{quant.F16, 36, 128, 1}, {quant.Q4_0, 16, 64, 5},
	}
	for _, threads := range []int{1, 2, 3} {
		d := New(threads)
		var ps []Product
		var want [][]float32
		for _, s := range shapes {
			w := randomMatrix(r, s.typ, s.rows, s.cols)
			x := randomActivations(r, max(s.T, 1)*s.cols)[:s.T*s.cols]
			ps = append(ps, Product{W: w, X: x, T: s.T, Out: make([]float32, s.T*s.rows)})
			wo := make([]float32, s.T*s.rows)
			d.MatMulID(w, x, s.T, wo)
			want = append(want, wo)
		}
		d.MatMulIDs(ps)
		for i, p := range ps {
			for k := range want[i] {
				if math.Float32bits(p.Out[k]) != math.Float32bits(want[i][k]) {
					t.Fatalf("threads=%d: product %d (%v %dx%d, T=%d): out[%d] = %v, want %v", threads, i, p.W.Type, p.W.Rows, p.W.Cols, p.T, k, p.Out[k], want[i][k])
				}
			}
		}
	}
}
