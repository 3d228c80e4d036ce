package cuda

import (
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// The Ops that DeepSeek's MLA attention adds to those of ops.go: a norm over strided rows,
// strided copies, and the per-head products with k_b and v_b (kernels/mla.cu).

// maxGridY is the largest grid.y (and grid.z) of a launch.
const maxGridY = 65535

// span2D returns the floats that rows rows of cols floats, stride floats apart, reach.
func span2D(rows, cols, stride int) int {
	if rows <= 0 {
		return 0
	}
	return (rows-1)*stride + cols
}

// RMSNormStrided implements device.Ops.
func (g *GPU) RMSNormStrided(dst, x []float32, rows, d, dstStride, xStride int, w, b []float32, eps float32) {
	if rows <= 0 {
		return
	}
	c := g.begin("RMSNorm")
	defer c.end()
	if d <= 0 || dstStride < 0 || xStride < 0 || len(x) < span2D(rows, d, xStride) || len(dst) < span2D(rows, d, dstStride) ||
		w != nil && len(w) < d || b != nil && len(b) < d {
		c.err = fmt.Errorf("%d rows of %d values, strides %d and %d, over %d and %d floats (weight %d, bias %d)",
			rows, d, xStride, dstStride, len(x), len(dst), len(w), len(b))
		return
	}
	dp, xp := c.f(dst, "the output"), c.f(x, "the input")
	wp, bp := c.f(w, "the norm's weight"), c.f(b, "the norm's bias")
	g.args.Reset().Ptr(dp).Ptr(xp).Ptr(wp).Ptr(bp).Int(d).Float(eps).Int(dstStride).Int(xStride)
	c.launch("rms_norm_strided_f32", Dim3{X: rows}, Dim3{X: 256})
}

// Copy2D implements device.Ops.
func (g *GPU) Copy2D(dst, src []float32, rows, cols, dstStride, srcStride int) {
	if rows <= 0 || cols <= 0 {
		return
	}
	c := g.begin("copy")
	defer c.end()
	if dstStride < 0 || srcStride < 0 || len(src) < span2D(rows, cols, srcStride) || len(dst) < span2D(rows, cols, dstStride) {
		c.err = fmt.Errorf("%d rows of %d values, strides %d and %d, over %d and %d floats", rows, cols, srcStride, dstStride, len(src), len(dst))
		return
	}
	dp, sp := c.f(dst, "the destination"), c.f(src, "the source")
	g.args.Reset().Ptr(dp).Ptr(sp).Int(rows).Int(cols).Int(dstStride).Int(srcStride)
	// Both loops of the kernel stride over the grid, which can so be capped.
	c.launch("copy2d_f32", Dim3{X: min(blocks(cols, 256), 64), Y: min(rows, maxGridY)}, Dim3{X: 256})
}

// MatMulHeads implements device.Ops with the mmv_heads kernel of the weights' type: one
// launch for the heads when their matrices are evenly spaced in device memory (the heads of
// one tensor), else one per head.
func (g *GPU) MatMulHeads(w []quant.Matrix, x []float32, T int, out []float32, l *device.HeadLayout) {
	if len(w) == 0 || T <= 0 {
		return
	}
	c := g.begin("per-head products")
	defer c.end()
	w0 := w[0]
	name, ok := mmvKernels[w0.Type]
	if !ok {
		c.err = fmt.Errorf("no kernel for %s weights", w0.Type)
		return
	}
	H := len(w)
	for h, m := range w {
		if m.Type != w0.Type || m.Rows != w0.Rows || m.Cols != w0.Cols || len(m.Data) < m.Rows*m.RowBytes() {
			c.err = fmt.Errorf("head %d's weights are %s %dx%d (%d bytes), head 0's %s %dx%d", h, m.Type, m.Rows, m.Cols,
				len(m.Data), w0.Type, w0.Rows, w0.Cols)
			return
		}
	}
	// The last (token, head) reaches the furthest: the layout's strides are not negative.
	if l.XTok < 0 || l.XHead < 0 || l.OutTok < 0 || l.OutHead < 0 ||
		len(x) < (T-1)*l.XTok+(H-1)*l.XHead+w0.Cols || len(out) < (T-1)*l.OutTok+(H-1)*l.OutHead+w0.Rows {
		c.err = fmt.Errorf("%d tokens of %d heads (%dx%d) with layout %+v over %d input and %d output floats",
			T, H, w0.Rows, w0.Cols, *l, len(x), len(out))
		return
	}
	xp, op := c.f(x, "the input"), c.f(out, "the output")
	wp := make([]DevicePtr, H)
	for h, m := range w {
		wp[h] = c.ptr(m.Data, "the weights")
	}
	if c.err != nil {
		return
	}
	var step int64 // bytes from one head's matrix to the next's (wrapping arithmetic)
	if H > 1 {
		step = int64(wp[1] - wp[0])
	}
	even := H <= maxGridY
	for h := range wp {
		even = even && wp[h] == wp[0].Add(int64(h)*step)
	}
	kernel := "mmv_heads_" + strings.TrimPrefix(name, "mmv_")
	grid := Dim3{X: blocks(w0.Rows, mmvRowsPerBlock), Y: min(blocks(T, mmvTokensPerBlock), maxGridY), Z: H}
	launch := func(w DevicePtr, wHead int64, x, out DevicePtr, heads int) {
		grid.Z = heads
		g.args.Reset().Ptr(w).Ptr(x).Ptr(out).Int(w0.Rows).Int(w0.Cols).Int(T).Int64(wHead).
			Int(l.XTok).Int(l.XHead).Int(l.OutTok).Int(l.OutHead)
		c.launch(kernel, grid, Dim3{X: 32, Y: mmvRowsPerBlock})
	}
	if even {
		launch(wp[0], step, xp, op, H)
		return
	}
	for h := range w {
		launch(wp[h], 0, xp.Add(4*int64(h*l.XHead)), op.Add(4*int64(h*l.OutHead)), 1)
	}
}
