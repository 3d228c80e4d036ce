package cuda

import (
	"errors"
	"strings"

	"github.com/commit-run/commit-run/quant"
)

// Decode products of quantized weights take integer dot products (kernels/mmvq.cu): their
// activation is quantized first (quantize_q8_f32), as the CPU reference quantizes it, into the
// GPU's scratch of quantized activations, once for every product of an operation that reads it
// (attention's Q, K and V; a layer's experts).

// mmvqKernels name the integer decode product of each quantized weight type.
var mmvqKernels = map[quant.Type]string{
	quant.Q4_0: "mmvq_q4_0", quant.Q4_1: "mmvq_q4_1", quant.Q5_0: "mmvq_q5_0", quant.Q5_1: "mmvq_q5_1", quant.Q8_0: "mmvq_q8_0",
	quant.IQ4_NL: "mmvq_iq4_nl", quant.Q2_K: "mmvq_q2_K", quant.Q3_K: "mmvq_q3_K", quant.Q4_K: "mmvq_q4_K",
	quant.Q5_K: "mmvq_q5_K", quant.Q6_K: "mmvq_q6_K", quant.MXFP4: "mmvq_mxfp4",
}

// mmvq1Kernels name each type's mmvq kernel for one token (mmvq1_<type>: the same ABI and
// arithmetic, a kernel with one token's registers), what a decoded token's products take.
var mmvq1Kernels = func() map[quant.Type]string {
	m := map[quant.Type]string{}
	for t, name := range mmvqKernels {
		m[t] = "mmvq1_" + strings.TrimPrefix(name, "mmvq_")
	}
	return m
}()

// mmqiKernels name the tensor-core prompt product (kernels/mmqi.cu) of each weight type that
// has one: every quantized type, the 32-value ones against Q8_0's or Q8_1's blocks, the K-quants
// against Q8_K's.
var mmqiKernels = map[quant.Type]string{
	quant.Q4_0: "mmqi_q4_0", quant.Q4_1: "mmqi_q4_1", quant.Q5_0: "mmqi_q5_0", quant.Q5_1: "mmqi_q5_1", quant.Q8_0: "mmqi_q8_0",
	quant.IQ4_NL: "mmqi_iq4_nl", quant.MXFP4: "mmqi_mxfp4", quant.Q2_K: "mmqi_q2_K", quant.Q3_K: "mmqi_q3_K",
	quant.Q4_K: "mmqi_q4_K", quant.Q5_K: "mmqi_q5_K", quant.Q6_K: "mmqi_q6_K",
}

// mmqiThreads is the block of an mmqi kernel: 4 warps over a tile of mmqRowsPerBlock rows by
// mmqTokensPerBlock tokens, as mmq's.
const mmqiThreads = 128

// q8 is an activation quantized for the integer products: its planes (mmvq.cu) in device
// memory; q 0 means not quantized (the float kernels' path).
type q8 struct{ q, d, s DevicePtr }

// q8Kind is quantize_q8_f32's kind for the activation of weights of type w, and whether w's
// products are integer ones.
func q8Kind(w quant.Type) (kind, block int, ok bool) {
	if _, ok := mmvqKernels[w]; !ok {
		return 0, 0, false
	}
	switch w.DotType() {
	case quant.Q8_0:
		return 0, 32, true
	case quant.Q8_1:
		return 1, 32, true
	case quant.Q8_K:
		return 2, 256, true
	}
	return 0, 0, false
}

// qscratch is the scratch the quantized activations go to. An operation takes its planes from
// its start up (off), so that its products read them before the next operation, later in
// stream order, writes them again. It only grows: a larger one is allocated beside, and the
// old one kept until Close, since a captured step may still read it.
type qscratch struct {
	p   DevicePtr
	n   int64
	old []DevicePtr
}

// take returns n bytes of the scratch at *off (16-byte aligned) and advances *off. The caller
// holds g.mu.
func (g *GPU) takeScratch(n int64, off *int64) (DevicePtr, error) {
	at := (*off + 15) &^ 15
	if at+n > g.qscr.n {
		size := max(2*(at+n), 1<<20)
		p, err := g.ctx.Alloc(size)
		if err != nil {
			return 0, err
		}
		if g.qscr.p != 0 {
			g.qscr.old = append(g.qscr.old, g.qscr.p)
		}
		g.qscr.p, g.qscr.n = p, size
		at = 0
	}
	*off = at + n
	return g.qscr.p.Add(at), nil
}

// quantizeLocked enqueues the quantization of rows rows of cols floats at x for products of
// weights of type w, and returns their planes: q 0 where w's products are float ones. The
// caller holds g.mu; g.args is overwritten.
func (g *GPU) quantizeLocked(x DevicePtr, rows, cols int, w quant.Type, off *int64) (q8, error) {
	kind, block, ok := q8Kind(w)
	if !ok || cols%block != 0 {
		return q8{}, nil
	}
	nb := int64(rows * cols / block)
	qp, err1 := g.takeScratch(int64(rows*cols), off)
	dp, err2 := g.takeScratch(4*nb, off)
	var sp DevicePtr
	var err3 error
	if kind == 1 {
		sp, err3 = g.takeScratch(4*nb, off)
	}
	if err := errors.Join(err1, err2, err3); err != nil {
		return q8{}, err
	}
	fn, err := g.function("quantize_q8_f32")
	if err != nil {
		return q8{}, err
	}
	g.args.Reset().Ptr(x).Ptr(qp).Ptr(dp).Ptr(sp).Int(cols).Int(rows).Int(kind)
	if err := g.launch(fn, Dim3{X: blocks(int(nb), 8)}, Dim3{X: 256}, &g.args); err != nil {
		return q8{}, err
	}
	g.launched(false)
	return q8{q: qp, d: dp, s: sp}, nil
}

// quantize is quantizeLocked within an operation, its failure the operation's; an input the
// operation quantized already for the same dot type is not quantized again.
func (c *opCall) quantize(x DevicePtr, rows, cols int, w quant.Type) q8 {
	if c.err != nil {
		return q8{}
	}
	dt := w.DotType()
	for _, q := range c.quants[:c.nq] {
		if q.x == x && q.rows == rows && q.cols == cols && q.dot == dt {
			return q.q
		}
	}
	var a q8
	if a, c.err = c.g.quantizeLocked(x, rows, cols, w, &c.qoff); c.err == nil && c.nq < len(c.quants) {
		c.quants[c.nq] = quantized{x: x, rows: rows, cols: cols, dot: dt, q: a}
		c.nq++
	}
	return a
}

// quantized is an input an operation quantized.
type quantized struct {
	x          DevicePtr
	rows, cols int
	dot        quant.Type
	q          q8
}

// function returns the kernel called name (kernelSet.Function), found once. The caller holds
// g.mu.
func (g *GPU) function(name string) (*Function, error) {
	if fn, ok := g.fns[name]; ok {
		return fn, nil
	}
	fn, err := g.mod.Function(name)
	if err != nil {
		return nil, err
	}
	g.fns[name] = fn
	return fn, nil
}
