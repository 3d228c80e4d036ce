package cuda

// Differential tests of kernels/mla.cu's mmv_heads kernels (see kernels_ref_test.go for the
// harness).

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// mmvHeadsCase is one launch of mmv_heads: heads matrices of rows x cols, gap rows apart in
// their allocation, applied to ntok tokens on grid.y = gridY. Each head's input row is
// followed by xPad floats and each token's heads by 4 more (so x_head = cols + xPad and
// x_tok = heads*x_head + 4), after xOff floats at the start of x; each output row by yPad
// floats and each token's by 2 (y_head = rows + yPad, y_tok = heads*y_head + 2).
type mmvHeadsCase struct {
	typ                                 quant.Type
	heads, rows, cols, ntok, gridY, gap int
	xPad, xOff, yPad                    int
}

func (c mmvHeadsCase) String() string {
	return fmt.Sprintf("heads=%d,rows=%d,cols=%d,ntok=%d,grid.y=%d,gap=%d,x_pad=%d,x_off=%d,y_pad=%d",
		c.heads, c.rows, c.cols, c.ntok, c.gridY, c.gap, c.xPad, c.xOff, c.yPad)
}

func (c mmvHeadsCase) strides() (xHead, xTok, yHead, yTok int) {
	xHead, yHead = c.cols+c.xPad, c.rows+c.yPad
	return xHead, c.heads*xHead + 4, yHead, c.heads*yHead + 2
}

// vector reports whether the kernel takes mmv's vector path: every input row 16-byte
// aligned, and for the float types whole vectors of columns.
func (c mmvHeadsCase) vector() bool {
	xHead, xTok, _, _ := c.strides()
	ok := c.xOff%4 == 0 && xHead%4 == 0 && xTok%4 == 0
	if c.typ.BlockSize() == 1 {
		qk := map[quant.Type]int{quant.F32: 8, quant.F16: 16, quant.BF16: 16}[c.typ]
		ok = ok && c.cols%qk == 0
	}
	return ok
}

func mmvHeadsCases() []kernelCase {
	var cs []kernelCase
	for _, typ := range mmvTypes {
		name := "mmv_heads_" + strings.TrimPrefix(mmvKernels[typ], "mmv_")
		cols := mmvCols(typ)
		first, mid, last := cols[0], cols[len(cols)/2], cols[len(cols)-1]
		for _, c := range []mmvHeadsCase{
			// Heads packed as one tensor's, inputs and outputs packed; one token (decode).
			{heads: 3, rows: 5, cols: first, ntok: 1, gridY: 1},
			// MLA's shapes: k_b (rank rows of nope columns) and v_b (head_v rows of rank
			// columns) of 4 heads over rows that hold every head (q, the latent output).
			{heads: 4, rows: 128, cols: first, ntok: 3, gridY: 1, xPad: 16, yPad: 16},
			{heads: 4, rows: 32, cols: mid, ntok: 2, gridY: 1, yPad: 32},
			// Matrices apart in memory, more tokens than one pass takes, several grid rows.
			{heads: 2, rows: 37, cols: mid, ntok: 9, gridY: 1, gap: 1, xPad: 4, yPad: 3},
			{heads: 3, rows: 6, cols: last, ntok: 17, gridY: 3, gap: 2, xPad: 8, yPad: 1},
			// Unaligned rows: the slow path (and the float types' odd widths).
			{heads: 3, rows: 5, cols: first, ntok: 3, gridY: 1, xPad: 1, xOff: 1},
			{heads: 2, rows: 9, cols: last, ntok: 10, gridY: 2, gap: 1, xPad: 2, xOff: 3, yPad: 2},
		} {
			c.typ = typ
			cs = append(cs, kernelCase{name, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMVHeads(t, k, name, c, r) }})
		}
	}
	return cs
}

// checkMMVHeads runs one launch against the float64 products of quant.DequantizeRow's
// weights, with checkMMV's tolerance: the vector path is mmv's arithmetic, and the slow path
// rounds no more often (a 32-value chain of fused multiply-adds per piece, a piece per lane
// step, the warp's butterfly; the pieces decode exactly as DequantizeRow). The floats between
// the outputs must keep the 0xff fill (NaN). Where the kernel takes the vector path, each
// head's result must also be mmv_<type>'s on that head's packed rows, to the bit, as mla.cu
// promises.
func checkMMVHeads(t *testing.T, k *kernelEnv, name string, c mmvHeadsCase, r *rand.Rand) {
	xHead, xTok, yHead, yTok := c.strides()
	per := c.rows + c.gap
	w := randMatrix(t, c.typ, c.heads*per, c.cols, r)
	rb := w.RowBytes()
	x := randF32(r, c.xOff+c.ntok*xTok, 1)
	ny := c.ntok * yTok
	dw, dx, dy := k.put(t, w.Data), k.putF32(t, x), k.alloc(t, 4*ny)
	var args Args
	k.run(t, name, Dim3{X: ceilDiv(c.rows, mmvRowsPerBlock), Y: c.gridY, Z: c.heads}, Dim3{X: 32, Y: mmvRowsPerBlock},
		args.Ptr(dw).Ptr(dx.Add(4*int64(c.xOff))).Ptr(dy).Int(c.rows).Int(c.cols).Int(c.ntok).Int64(int64(per*rb)).
			Int(xTok).Int(xHead).Int(yTok).Int(yHead))
	got := k.getF32(t, dy, ny)

	xin := func(h, tk int) []float32 {
		o := c.xOff + tk*xTok + h*xHead
		return x[o : o+c.cols]
	}
	g := gamma(64 + c.cols/32)
	want, tol := make([]float64, ny), make([]float64, ny)
	written := make([]bool, ny)
	row := make([]float32, c.cols)
	for h := 0; h < c.heads; h++ {
		for o := 0; o < c.rows; o++ {
			quant.DequantizeRow(c.typ, w.Row(h*per+o), row)
			for tk := 0; tk < c.ntok; tk++ {
				var s, a float64
				for j, v := range xin(h, tk) {
					p := float64(row[j]) * float64(v)
					s += p
					a += math.Abs(p)
				}
				i := tk*yTok + h*yHead + o
				want[i], tol[i], written[i] = s, g*a, true
			}
		}
	}
	for i := range got {
		if !written[i] && got[i] == got[i] {
			t.Fatalf("y[%d] = %v: the kernel wrote between the outputs", i, got[i])
		}
		if !written[i] {
			want[i], tol[i] = 0, 0
			got[i] = 0
		}
	}
	checkClose(t, "y", got, want, tol)
	if !c.vector() {
		return
	}
	for h := 0; h < c.heads; h++ {
		packed := make([]float32, 0, c.ntok*c.cols)
		for tk := 0; tk < c.ntok; tk++ {
			packed = append(packed, xin(h, tk)...)
		}
		px, py := k.putF32(t, packed), k.alloc(t, 4*c.ntok*c.rows)
		var a Args
		k.run(t, mmvKernels[c.typ], Dim3{X: ceilDiv(c.rows, mmvRowsPerBlock), Y: 1}, Dim3{X: 32, Y: mmvRowsPerBlock},
			a.Ptr(dw.Add(int64(h*per*rb))).Ptr(px).Ptr(py).Int(c.rows).Int(c.cols).Int(c.ntok))
		ref := k.getF32(t, py, c.ntok*c.rows)
		head := make([]float32, 0, len(ref))
		for tk := 0; tk < c.ntok; tk++ {
			o := tk*yTok + h*yHead
			head = append(head, got[o:o+c.rows]...)
		}
		checkBits(t, fmt.Sprintf("head %d against %s", h, mmvKernels[c.typ]), head, ref)
	}
}
