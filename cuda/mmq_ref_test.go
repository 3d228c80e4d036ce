package cuda

// Differential tests of the batched products of kernels/mmq.cu, as kernels_ref_test.go tests
// the other kernels: against the float64 product of quant.DequantizeRow's weights, with the
// rounding-error bound mmq.cu's comment derives, on shapes whose tiles are cut by the edges
// of the matrix and of the tokens; and against mmv on the same product.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/quant"
)

// mmqCols are the row lengths tested for a type: one step of the kernel's column loop
// (one block, or one 32-value piece of a K-quant's first block) and several. For the
// float types also a row of 7 (a partial step, activations read a float at a time) and
// one of 100 (16-byte activation loads, a partial last step).
func mmqCols(typ quant.Type) []int {
	switch typ.BlockSize() {
	case 1:
		return []int{32, 7, 100, 200}
	case 32:
		return []int{32, 160}
	default:
		return []int{256, 768}
	}
}

func mmqCases() []kernelCase {
	var cs []kernelCase
	add := func(c mmvCase) {
		cs = append(cs, kernelCase{mmqKernels[c.typ], c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMQ(t, k, c, r) }})
	}
	for _, typ := range mmvTypes {
		cols := mmqCols(typ)
		// Every row count against every token count on one step: tiles cut at 1, 63 and 1
		// past a tile (65) rows, a whole tile (64) and two with a short second one (130);
		// 9 and 17 tokens (mmv's territory just past mmqMinTokens), one whole tile and two.
		for _, rows := range []int{1, 63, 64, 65, 130} {
			for _, ntok := range []int{9, 17, 64, 100} {
				add(mmvCase{typ, rows, cols[0], ntok, ceilDiv(ntok, mmqTokensPerBlock), 0})
			}
		}
		// The other lengths on fewer shapes.
		for _, n := range cols[1:] {
			add(mmvCase{typ, 65, n, 17, 1, 0})
			add(mmvCase{typ, 130, n, 100, 2, 0})
		}
		// Matrices at whole-row offsets inside their allocation (odd ones: the 2-byte-aligned
		// layouts start at 2 mod 4); grid.y = 1 for 100 tokens (the block takes its second
		// token tile in a loop) and more blocks in grid.y than tiles.
		add(mmvCase{typ, 63, cols[len(cols)-1], 100, 1, 1})
		add(mmvCase{typ, 5, cols[0], 20, 3, 3})
		cs = append(cs,
			kernelCase{mmqKernels[typ], "same as mmv", func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMQvsMMV(t, k, typ, r) }},
			kernelCase{mmqKernels[typ], "any token count", func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMQTokens(t, k, typ, r) }})
		if _, _, ok := q8Kind(typ); ok {
			for _, c := range []mmvCase{{typ, 65, cols[len(cols)-1], 17, 1, 0}, {typ, 130, cols[0], 100, 2, 1}} {
				cs = append(cs, kernelCase{mmqKernels[typ], c.String() + ",quantized", func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMQQuantized(t, k, c, r) }})
			}
		}
	}
	return cs
}

// mmqTol is the bound mmq.cu promises on the error of an output, relative to sum |w*x| over
// its row: each product passes through at most 32 roundings in its step's chain of fused
// multiply-adds and one per step where the steps' sums are added, and the weights are
// DequantizeRow's to the bit. A single wrong or dropped weight would be off by about
// sum |w*x| / cols, which is hundreds of times more (gamma(32+24) is 3.3e-6; 1/768 is 1.3e-3).
func mmqTol(cols int) float64 { return gamma(32 + ceilDiv(cols, 32)) }

// mmqRef returns the float64 product of rows rows of w (from row off) with ntok tokens of x,
// and sum |w*x| of each output.
func mmqRef(w quant.Matrix, off, rows int, x []float32, ntok int) (want, abs []float64) {
	want, abs = make([]float64, ntok*rows), make([]float64, ntok*rows)
	row := make([]float32, w.Cols)
	for o := 0; o < rows; o++ {
		quant.DequantizeRow(w.Type, w.Row(off+o), row)
		for tk := 0; tk < ntok; tk++ {
			var s, a float64
			for j, v := range row {
				p := float64(v) * float64(x[tk*w.Cols+j])
				s += p
				a += math.Abs(p)
			}
			want[tk*rows+o], abs[tk*rows+o] = s, a
		}
	}
	return want, abs
}

// asQuantized is x quantized as type t and dequantized: the activation the CPU's and the
// integer products multiply.
func asQuantized(t quant.Type, x []float32, cols, ntok int) []float32 {
	b := quantizeRows(t, x, cols, ntok)
	rb, _ := t.RowBytes(cols)
	out := make([]float32, len(x))
	for tk := 0; tk < ntok; tk++ {
		quant.DequantizeRow(t, b[tk*rb:(tk+1)*rb], out[tk*cols:(tk+1)*cols])
	}
	return out
}

// mmqGuard is the floats after y that a launch must leave alone.
const mmqGuard = 64

// runMMQ launches c's kernel on weights dw (whole matrix; c.off rows in) and activations dx
// (or their quantized planes xq, when given), and returns y, after checking the kernel wrote
// nothing past it.
func runMMQ(t *testing.T, k *kernelEnv, c mmvCase, dw, dx DevicePtr, rb int, xq ...q8) []float32 {
	t.Helper()
	n := c.ntok * c.rows
	dy := k.alloc(t, 4*(n+mmqGuard))
	var a q8
	var qb int
	if len(xq) > 0 {
		a = xq[0]
		_, qb, _ = q8Kind(c.typ)
	}
	var args Args
	k.run(t, mmqKernels[c.typ], Dim3{X: ceilDiv(c.rows, mmqRowsPerBlock), Y: c.gridY}, Dim3{X: mmqThreads},
		args.Ptr(dw.Add(int64(c.off*rb))).Ptr(dx).Ptr(dy).Int(c.rows).Int(c.cols).Int(c.ntok).Ptr(a.q).Ptr(a.d).Ptr(a.s).Int(qb))
	y := k.getF32(t, dy, n+mmqGuard)
	for i, v := range y[n:] {
		if math.Float32bits(v) != 0xffffffff {
			t.Fatalf("y[%d], past the %d outputs, was written: %v", n+i, n, v)
		}
	}
	return y[:n]
}

// checkMMQ runs one product against the float64 product of quant.DequantizeRow's weights.
func checkMMQ(t *testing.T, k *kernelEnv, c mmvCase, r *rand.Rand) {
	t.Helper()
	w := randMatrix(t, c.typ, c.off+c.rows, c.cols, r)
	x := randF32(r, c.ntok*c.cols, 1)
	got := runMMQ(t, k, c, k.put(t, w.Data), k.putF32(t, x), w.RowBytes())
	want, abs := mmqRef(w, c.off, c.rows, x, c.ntok)
	g := mmqTol(c.cols)
	for i := range abs {
		abs[i] *= g
	}
	checkClose(t, "y", got, want, abs)
}

// checkMMQQuantized runs one product on the activation quantized (quantize_q8_f32), as the
// CPU reference multiplies it: against the float64 product with the quantized activation's
// values (Q4_1's and Q5_1's minimum times its s: minCorrection), mmq's bound and one
// rounding more for each value q*d.
func checkMMQQuantized(t *testing.T, k *kernelEnv, c mmvCase, r *rand.Rand) {
	t.Helper()
	w := randMatrix(t, c.typ, c.off+c.rows, c.cols, r)
	x := randF32(r, c.ntok*c.cols, 1)
	dx := k.putF32(t, x)
	got := runMMQ(t, k, c, k.put(t, w.Data), dx, w.RowBytes(), k.quantized(t, dx, c.ntok, c.cols, c.typ, true))
	want, abs := mmqRef(w, c.off, c.rows, asQuantized(c.typ.DotType(), x, c.cols, c.ntok), c.ntok)
	p := planesOf(c.typ.DotType(), quantizeRows(c.typ.DotType(), x, c.cols, c.ntok), c.cols, c.ntok)
	g := gamma(33 + ceilDiv(c.cols, 32))
	for i := range abs {
		abs[i] *= g
		want[i] += minCorrection(w, c.off+i%c.rows, p, i/c.rows)
	}
	checkClose(t, "y", got, want, abs)
}

// checkMMQvsMMV computes one product with mmq and with mmv: each within its bound of the
// exact product, so the two within the sum of the bounds (mmv's is in checkMMV).
func checkMMQvsMMV(t *testing.T, k *kernelEnv, typ quant.Type, r *rand.Rand) {
	cols := mmqCols(typ)
	c := mmvCase{typ: typ, rows: 70, cols: cols[len(cols)-1], ntok: 17, gridY: 1}
	w := randMatrix(t, typ, c.rows, c.cols, r)
	x := randF32(r, c.ntok*c.cols, 1)
	dw, dx := k.put(t, w.Data), k.putF32(t, x)
	got := runMMQ(t, k, c, dw, dx, w.RowBytes())

	dy := k.alloc(t, 4*c.ntok*c.rows)
	var args Args
	k.run(t, mmvKernels[typ], Dim3{X: ceilDiv(c.rows, mmvRowsPerBlock), Y: ceilDiv(c.ntok, mmvTokensPerBlock)}, Dim3{X: 32, Y: mmvRowsPerBlock},
		args.Ptr(dw).Ptr(dx).Ptr(dy).Int(c.rows).Int(c.cols).Int(c.ntok))
	mmv := k.getF32(t, dy, c.ntok*c.rows)

	_, abs := mmqRef(w, 0, c.rows, x, c.ntok)
	want, tol := make([]float64, len(abs)), make([]float64, len(abs))
	g := mmqTol(c.cols) + gamma(64+c.cols/32)
	for i, v := range mmv {
		want[i], tol[i] = float64(v), g*abs[i]
	}
	checkClose(t, "mmq's y against mmv's", got, want, tol)
}

// checkMMQTokens checks mmq.cu's promise that an output depends only on its row and token:
// the first tokens of a product come out the same, bit for bit, from a launch with fewer
// tokens on another grid.
func checkMMQTokens(t *testing.T, k *kernelEnv, typ quant.Type, r *rand.Rand) {
	c := mmvCase{typ: typ, rows: 65, cols: mmqCols(typ)[0], ntok: 100, gridY: 2}
	w := randMatrix(t, typ, c.rows, c.cols, r)
	x := randF32(r, c.ntok*c.cols, 1)
	dw, dx := k.put(t, w.Data), k.putF32(t, x)
	all := runMMQ(t, k, c, dw, dx, w.RowBytes())
	c.ntok, c.gridY = 9, 3
	few := runMMQ(t, k, c, dw, dx, w.RowBytes())
	checkBits(t, "y of 9 tokens against the first 9 of 100", few, all[:len(few)])
}

// FuzzMMQ checks mmq on shapes from the fuzzer: a type, rows, a number of blocks of columns
// (any count for the float types), tokens (any count: the kernel does not need more than
// mmv's), grid.y, and a seed for the values and the offset of the matrix in whole rows.
func FuzzMMQ(f *testing.F) {
	for i := range mmvTypes {
		f.Add(uint8(i), uint8(60+i), uint8(i), uint8(8+5*i), uint8(i), uint64(i))
	}
	f.Add(uint8(0), uint8(129), uint8(38), uint8(129), uint8(0), uint64(99)) // F32, 130 rows, 39 columns, 130 tokens
	k := openKernels(f)
	f.Fuzz(func(t *testing.T, typ, rows, blocks, ntok, gy uint8, seed uint64) {
		c := mmvCase{typ: mmvTypes[int(typ)%len(mmvTypes)], rows: 1 + int(rows)%150, ntok: 1 + int(ntok)%140,
			gridY: 1 + int(gy)%3, off: int(seed % 3)}
		c.cols = fuzzCols(c.typ, blocks)
		t.Log(mmqKernels[c.typ], c)
		checkMMQ(t, k, c, rand.New(rand.NewPCG(seed, 3)))
	})
}

// TestGPUMatMulPrefill checks GPU.MatMul's choice of kernel: mmv up to mmqMinTokens-1
// tokens, mmq from there (counted in GPUStats.MMQLaunches), with host activations (through
// the staging buffers) and with activations in device buffers, as the engine's prefill has
// them; every result within its kernel's bound of the exact product.
func TestGPUMatMulPrefill(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	r := rand.New(rand.NewPCG(7, 8))
	var mats []quant.Matrix
	for _, m := range []struct {
		typ        quant.Type
		rows, cols int
	}{{quant.Q4_K, 70, 512}, {quant.Q8_0, 130, 64}, {quant.F32, 65, 33}} {
		w := randMatrix(t, m.typ, m.rows, m.cols, r)
		if err := g.Upload(w.Data, m.typ.String()); err != nil {
			t.Fatal(err)
		}
		mats = append(mats, w)
	}
	// deviceFloats returns n floats of a device buffer.
	deviceFloats := func(n int) []float32 {
		b, err := g.Buffer(int64(4*n), "activations")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Release(b) })
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)
	}
	launches, mmqs := int64(0), int64(0)
	for _, w := range mats {
		for _, T := range []int{mmqMinTokens - 1, mmqMinTokens, 40} {
			for _, onDevice := range []bool{false, true} {
				x := randF32(r, T*w.Cols, 1)
				got := make([]float32, T*w.Rows)
				if onDevice {
					dx, dy := deviceFloats(len(x)), deviceFloats(len(got))
					g.Write(dx, x)
					g.MatMul(w, dx, T, dy)
					g.Read(got, dy)
				} else {
					g.MatMul(w, x, T, got)
				}
				launches++
				tol := gamma(64 + w.Cols/32) // mmv's bound (checkMMV)
				ref := x
				_, quantized := mmvqKernels[w.Type]
				if quantized {
					// The activation quantized, as the CPU quantizes it, then the product: two
					// launches.
					launches++
					ref = asQuantized(w.Type.DotType(), x, w.Cols, T)
					tol *= 4 // checkMMVQ's bound
				}
				if T >= mmqMinTokens {
					mmqs++
					tol = gamma(33 + ceilDiv(w.Cols, 32)) // checkMMQQuantized's (mmqTol's without quantization)
				}
				want, abs := mmqRef(w, 0, w.Rows, ref, T)
				for i := range abs {
					abs[i] *= tol
				}
				checkClose(t, fmt.Sprintf("%s T=%d on device %v: y", w.Type, T, onDevice), got, want, abs)
				if s := g.Stats(); s.Launches != launches || s.MMQLaunches != mmqs || s.HostFallbacks != 0 {
					t.Fatalf("%s T=%d on device %v: %+v, want %d launches, %d of mmq", w.Type, T, onDevice, s, launches, mmqs)
				}
			}
		}
	}
	if err := g.Err(); err != nil {
		t.Error(err)
	}
}
