package cuda

import (
	"fmt"

	"github.com/commit-run/commit-run/device"
)

// The bounds of the DeltaNet kernels (kernels/deltanet.cu): the convolution's taps, a
// head's values (a multiple of a warp), and the rows of a head's state a block of the
// recurrence runs (its warps).
const (
	deltaNetMaxTaps      = 8
	deltaNetMaxDim       = 256
	deltaNetRowsPerBlock = 4
)

// GatedDeltaNet implements device.Ops: the convolution with its state (deltanet_conv_f32),
// what the recurrence reads of each token, over the tokens in parallel (deltanet_prep_f32: q
// and k to unit length, in conv; beta's sigmoid and the decay, over beta and alpha), each
// value head's recurrence (deltanet_rec_f32, a warp per row of its state), and the gated
// norm (deltanet_norm_f32): four launches. z is left as it was.
func (g *GPU) GatedDeltaNet(l *device.DeltaNetLayer, st, snap *device.DeltaNetState, qkv, z, beta, alpha []float32, T int, conv, out []float32) {
	c := g.begin("DeltaNet")
	defer c.end()
	n, ch, hv, K := l.HeadDim, l.Channels(), l.VHeads, l.ConvK
	switch {
	case n <= 0 || n%32 != 0 || n > deltaNetMaxDim || K < 2 || K > deltaNetMaxTaps || l.KHeads <= 0 || hv <= 0:
		c.err = fmt.Errorf("a DeltaNet layer of heads of %d values and %d taps: the kernels take heads of a multiple of 32 up to %d values and 2 to %d taps",
			n, K, deltaNetMaxDim, deltaNetMaxTaps)
	case T < 1 || len(qkv) < T*ch || len(conv) < T*ch || len(z) < T*hv*n || len(out) < T*hv*n || len(beta) < T*hv || len(alpha) < T*hv:
		c.err = fmt.Errorf("%d tokens of %d channels: %d, %d, %d, %d, %d and %d floats", T, ch, len(qkv), len(conv), len(z), len(out), len(beta), len(alpha))
	case len(st.Conv) != (K-1)*ch || len(st.S) != hv*n*n || snap != nil && (len(snap.Conv) != len(st.Conv) || len(snap.S) != len(st.S)):
		c.err = fmt.Errorf("a DeltaNet state of %d and %d floats for %d channels and %d heads of %d", len(st.Conv), len(st.S), ch, hv, n)
	case len(l.Conv) != K*ch || len(l.DtBias) != hv || len(l.A) != hv || len(l.NormW) != n:
		c.err = fmt.Errorf("a DeltaNet layer's weights of %d, %d, %d and %d floats", len(l.Conv), len(l.DtBias), len(l.A), len(l.NormW))
	}
	if c.err != nil {
		return
	}
	var sc, ss DevicePtr
	if snap != nil {
		sc, ss = c.f(snap.Conv, "the convolution's snapshot"), c.f(snap.S, "the recurrent state's snapshot")
	}
	cp := c.f(conv[:T*ch], "the convolution")
	g.args.Reset().Ptr(c.f(qkv[:T*ch], "the q/k/v projection")).Ptr(cp).Ptr(c.f(st.Conv, "the convolution's state")).Ptr(sc).
		Ptr(c.f(l.Conv, "the convolution's weights")).Int(ch).Int(K).Int(T)
	c.launch("deltanet_conv_f32", Dim3{X: blocks(ch, 256)}, Dim3{X: 256})
	op, pb, pa := c.f(out[:T*hv*n], "the output"), c.f(beta[:T*hv], "beta"), c.f(alpha[:T*hv], "alpha")
	g.args.Reset().Ptr(cp).Ptr(pb).Ptr(pa).Ptr(c.f(l.DtBias, "the time step bias")).Ptr(c.f(l.A, "A")).
		Int(l.KHeads).Int(hv).Int(n).Int(T).Float(l.Eps)
	c.launch("deltanet_prep_f32", Dim3{X: T, Y: 2 * l.KHeads}, Dim3{X: 128})
	g.args.Reset().Ptr(cp).Ptr(pb).Ptr(pa).Ptr(c.f(st.S, "the recurrent state")).Ptr(ss).Ptr(op).Int(l.KHeads).Int(hv).Int(n).Int(T)
	c.launch("deltanet_rec_f32", Dim3{X: hv, Y: n / deltaNetRowsPerBlock}, Dim3{X: 128})
	g.args.Reset().Ptr(op).Ptr(c.f(z[:T*hv*n], "the gate")).Ptr(c.f(l.NormW, "the norm")).Ptr(c.f(l.NormB, "the norm's bias")).
		Int(n).Int(T * hv).Float(l.Eps)
	c.launch("deltanet_norm_f32", Dim3{X: T * hv}, Dim3{X: 128})
}
