package models

import (
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// Backend is what the models compute with: a device's kernels, the forward pass's other
// operations (the device's own Ops, or HostOps), and memory for a pass's activations.
type Backend interface {
	device.Kernels
	device.Ops
	// Floats returns n floats of the pass's scratch memory, on the device that computes the
	// pass; their contents are undefined.
	Floats(n int) []float32
}

// FusedBackend is implemented by backends whose device computes runs of operations in one
// kernel each (device.Fused); Fused returns nil where it does not.
type FusedBackend interface {
	Fused() device.Fused
}

// fusedOf returns b's fused operations, or nil.
func fusedOf(b Backend) device.Fused {
	if f, ok := b.(FusedBackend); ok {
		return f.Fused()
	}
	return nil
}

// HostOps computes device.Ops on the host in the arithmetic of llama.cpp's CPU backend: the
// reference every device's Ops are tested against. K spreads attention over its threads.
type HostOps struct {
	K device.Kernels
}

var _ device.Ops = HostOps{}

// Embed implements device.Ops.
func (HostOps) Embed(dst []float32, w quant.Matrix, ids []int32) {
	d := w.Cols
	for t, id := range ids {
		quant.DequantizeRow(w.Type, w.Row(int(id)), dst[t*d:(t+1)*d])
	}
}

// RMSNorm implements device.Ops.
func (HostOps) RMSNorm(dst, x []float32, d int, w, b []float32, eps float32) {
	n := Norm{Weight: w, Bias: b}
	for t := 0; t < len(x)/d; t++ {
		RMSNorm(dst[t*d:(t+1)*d], x[t*d:(t+1)*d], n, eps)
	}
}

// RMSNormStrided implements device.Ops.
func (HostOps) RMSNormStrided(dst, x []float32, rows, d, dstStride, xStride int, w, b []float32, eps float32) {
	n := Norm{Weight: w, Bias: b}
	for r := 0; r < rows; r++ {
		RMSNorm(dst[r*dstStride:r*dstStride+d], x[r*xStride:r*xStride+d], n, eps)
	}
}

// Add implements device.Ops.
func (HostOps) Add(dst, src []float32) { AddTo(dst, src) }

// AddRows implements device.Ops.
func (HostOps) AddRows(x, bias []float32) {
	d := len(bias)
	for t := 0; t < len(x)/d; t++ {
		AddTo(x[t*d:(t+1)*d], bias)
	}
}

// SwiGLU implements device.Ops.
func (HostOps) SwiGLU(g, u []float32, d int) {
	for t := 0; t < len(g)/d; t++ {
		SwiGLU(g[t*d:(t+1)*d], g[t*d:(t+1)*d], u[t*d:(t+1)*d])
	}
}

// SwiGLUOAI implements device.Ops.
func (HostOps) SwiGLUOAI(g, u []float32, d int, alpha, limit float32) {
	SwiGLUOAI(g, g, u[:len(g)], alpha, limit)
}

// Rope implements device.Ops.
func (HostOps) Rope(x []float32, pos0, T, heads, headStride, tokStride int, r *device.RoPE) {
	var buf [256]float32 // the rotation of one position, on the stack for every common head
	cs := buf[:]
	if r.Dims > len(buf) {
		cs = make([]float32, r.Dims)
	}
	cs = cs[:r.Dims]
	for t := 0; t < T; t++ {
		ropeCache(r, pos0+t, cs)
		for h := 0; h < heads; h++ {
			ropeApply(r, x[t*tokStride+h*headStride:], cs)
		}
	}
}

// StoreKV implements device.Ops: keys in rows, values transposed (putV).
func (HostOps) StoreKV(c *device.KVLayer, pos0 int, k, v []float32) {
	putK(c, pos0, k[:len(k)/c.KDim*c.KDim])
	if v != nil {
		putV(c, pos0, v[:len(k)/c.KDim*c.VDim])
	}
}

// MatMulHeads implements device.Ops with the CPU's products (matVec: the kernel cpu.MatMul
// would take for row t of a product of T rows), one (token, head) pair per task: the
// matrices are small, so spreading the pairs over the threads beats spreading each product's
// rows.
func (o HostOps) MatMulHeads(w []quant.Matrix, x []float32, T int, out []float32, l *device.HeadLayout) {
	j := headsJobPool.Get().(*headsJob)
	j.w, j.x, j.out, j.T, j.l = w, x, out, T, *l
	o.K.Parallel(T*len(w), j.run)
	j.w, j.x, j.out = nil, nil, nil
	headsJobPool.Put(j)
}

// headsJob is one MatMulHeads call; jobs are pooled, their run bound once, so that a call
// allocates nothing.
type headsJob struct {
	w      []quant.Matrix
	x, out []float32
	T      int
	l      device.HeadLayout
	run    func(i int)
}

var headsJobPool = sync.Pool{New: func() any {
	j := new(headsJob)
	j.run = j.pair
	return j
}}

// pair computes (token, head) pair i.
func (j *headsJob) pair(i int) {
	H := len(j.w)
	t, h := i/H, i%H
	m := j.w[h]
	xo, oo := t*j.l.XTok+h*j.l.XHead, t*j.l.OutTok+h*j.l.OutHead
	matVec(m, j.x[xo:xo+m.Cols], j.out[oo:oo+m.Rows], j.T, t)
}

// Copy2D implements device.Ops.
func (HostOps) Copy2D(dst, src []float32, rows, cols, dstStride, srcStride int) {
	for r := 0; r < rows; r++ {
		copy(dst[r*dstStride:r*dstStride+cols], src[r*srcStride:r*srcStride+cols])
	}
}

// Gather implements device.Ops.
func (o HostOps) Gather(dst, src []float32, rows []int32, d int) {
	if len(rows)*d < gatherParallel || o.K == nil {
		for j, r := range rows {
			copy(dst[j*d:(j+1)*d], src[int(r)*d:(int(r)+1)*d])
		}
		return
	}
	// A prefill gathers each expert's tokens: a copy as large as the layer's input, which
	// one thread took 8% of a Q8_0 prefill to make.
	const chunk = 16
	o.K.Parallel((len(rows)+chunk-1)/chunk, func(c int) {
		for j := c * chunk; j < min((c+1)*chunk, len(rows)); j++ {
			r := int(rows[j])
			copy(dst[j*d:(j+1)*d], src[r*d:(r+1)*d])
		}
	})
}

// gatherParallel is the copy, in floats, from which Gather spreads over the threads; a
// decoded token's gathers stay on the caller (and allocate nothing).
const gatherParallel = 1 << 16

// Combine implements device.Ops.
func (HostOps) Combine(out, ys []float32, weights []float32, off []int32, d int) {
	for t := 0; t < len(out)/d; t++ {
		o := out[t*d : (t+1)*d]
		clear(o)
		for j := int(off[t]); j < int(off[t+1]); j++ {
			w, y := weights[j], ys[j*d:(j+1)*d]
			for i := range o {
				// ggml_mul then ggml_add: the conversion keeps the compiler from fusing them.
				o[i] += float32(w * y[i])
			}
		}
	}
}

// GatedAdd implements device.Ops.
func (HostOps) GatedAdd(out, sh, x, gate []float32, d int, sigmoid bool) {
	if sigmoid {
		gatedAdd(out, sh, x, gate, d, Sigmoid)
		return
	}
	// llama.cpp's qwen2moe graph computes the gate's sigmoid as silu(v)/v.
	gatedAdd(out, sh, x, gate, d, SiLUOverX)
}

// MulSigmoid implements device.Ops.
func (HostOps) MulSigmoid(x, gate []float32) {
	gate = gate[:len(x)]
	for i, g := range gate {
		x[i] *= Sigmoid(g)
	}
}

// gatedAdd adds to row t of out row t of sh times sigmoid(v), v = gate · row t of x as a
// one-row matrix product (ggml_vec_dot_f32), with the sigmoid as the graph computes it.
func gatedAdd(out, sh, x, gate []float32, d int, sigmoid func(float32) float32) {
	for t := 0; t < len(out)/d; t++ {
		g := sigmoid(quant.DotF32Vec(gate, x[t*d:(t+1)*d]))
		o, s := out[t*d:(t+1)*d], sh[t*d:(t+1)*d]
		for i := range o {
			o[i] += float32(g * s[i])
		}
	}
}

// Zero implements device.Ops.
func (HostOps) Zero(x []float32) { clear(x) }

// Read implements device.Ops.
func (HostOps) Read(dst, src []float32) { copy(dst, src) }

// Write implements device.Ops.
func (HostOps) Write(dst, src []float32) { copy(dst, src) }

// matVec is a single-threaded matrix-vector product in the matrix's stored type, with the
// vector rounded to the dot type as a ggml matmul would, and the kernel llama.cpp uses for
// activation row t of a batch of T; MatMulHeads calls it inside a parallel loop.
func matVec(m quant.Matrix, x, out []float32, T, t int) {
	dt := m.Type.DotType()
	n, _ := dt.RowBytes(m.Cols)
	b := rowBufPool.Get().(*[]byte)
	if cap(*b) < n {
		*b = make([]byte, n)
	}
	xq := (*b)[:n]
	quant.QuantizeRow(dt, x, xq)
	dot := quant.X86Dot(m.Type, m.Rows, T, t)
	for r := 0; r < m.Rows; r++ {
		out[r] = dot(m.Cols, m.Row(r), xq)
	}
	rowBufPool.Put(b)
}

// rowBufPool holds matVec's rows of activations in the dot type.
var rowBufPool = sync.Pool{New: func() any { return new([]byte) }}
