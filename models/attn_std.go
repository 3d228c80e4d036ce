package models

import (
	"math"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// QKNorm says where an architecture normalises queries and keys before RoPE.
type QKNorm int

// The q/k normalisations of our architectures.
const (
	QKNormNone    QKNorm = iota
	QKNormPerHead        // Qwen3: RMSNorm over each head's vector
	QKNormFull           // OLMoE: RMSNorm over the whole projection
)

// StdAttention is multi-head attention with grouped KV heads, optional biases and q/k norms,
// and RoPE: llama, Mixtral, Qwen2/3(-MoE) and OLMoE use it.
type StdAttention struct {
	Q, K, V, O             quant.Matrix
	BQ, BK, BV, BO         []float32
	QNorm, KNorm           Norm
	QKNorm                 QKNorm
	Heads, HeadsKV, HeadDK int
	HeadDV                 int
	Scale                  float32
	Eps                    float32
	Rope                   *Rope
	// Window, when not 0, limits each query to the last Window positions (sliding-window
	// layers); Sinks, when not nil, is a logit per head that only the softmax's denominator
	// sees (gpt-oss).
	Window int
	Sinks  []float32
	// OutGate: Q's rows hold per head HeadDK query values then HeadDK gate values, and the
	// attention's output is multiplied by the gate's sigmoid before O (Qwen3.5's full
	// attention layers).
	OutGate bool

	// qkNorm is QKNorm's norms as RopeKV takes them, made once (qkNormOnce) so that a pass
	// hands the device a pointer without allocating.
	qkNorm     *device.QKNorm
	qkNormOnce sync.Once
}

// norms returns the q/k norms as device.Fused.RopeKV takes them, nil for none.
func (a *StdAttention) norms() *device.QKNorm {
	a.qkNormOnce.Do(func() {
		var n device.QKNorm
		switch a.QKNorm {
		case QKNormFull:
			n.QDim, n.KDim = a.Heads*a.HeadDK, a.HeadsKV*a.HeadDK
		case QKNormPerHead:
			n.QDim, n.KDim = a.HeadDK, a.HeadDK
		default:
			return
		}
		n.QWeight, n.QBias, n.KWeight, n.KBias, n.Eps = a.QNorm.Weight, a.QNorm.Bias, a.KNorm.Weight, a.KNorm.Bias, a.Eps
		a.qkNorm = &n
	})
	return a.qkNorm
}

// CacheDims implements Attention.
func (a *StdAttention) CacheDims() (int, int) { return a.HeadsKV * a.HeadDK, a.HeadsKV * a.HeadDV }

// OnDevice implements OnDevice: Forward uses the backend's Ops alone.
func (a *StdAttention) OnDevice() {}

// Forward implements Attention.
func (a *StdAttention) Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32) {
	a.ForwardSeqs(b, []Seq{{Cache: c, T: T, Pos0: pos0}}, x, out)
}

// ForwardSeqs implements SeqAttention: the projections, biases and q/k norms go over every
// row at once, since each row's numbers do not depend on the others; RoPE, the cache and the
// attention go sequence by sequence.
func (a *StdAttention) ForwardSeqs(b Backend, seqs []Seq, x []float32, out []float32) {
	T := 0
	for _, s := range seqs {
		T += s.T
	}
	qd, kd, vd := a.Heads*a.HeadDK, a.HeadsKV*a.HeadDK, a.HeadsKV*a.HeadDV
	q, k, v := b.Floats(T*qd), b.Floats(T*kd), b.Floats(T*vd)
	f := fusedOf(b)
	var gate []float32
	if a.OutGate {
		gate = a.gatedQ(b, x, T, q)
		b.MatMul(a.K, x, T, k)
		b.MatMul(a.V, x, T, v)
	} else if f != nil {
		f.Products(x, T, [3]device.Product{{W: a.Q, Out: q, Bias: a.BQ}, {W: a.K, Out: k, Bias: a.BK}, {W: a.V, Out: v, Bias: a.BV}})
	} else {
		b.MatMul(a.Q, x, T, q)
		b.MatMul(a.K, x, T, k)
		b.MatMul(a.V, x, T, v)
		addBias(b, q, a.BQ)
		addBias(b, k, a.BK)
		addBias(b, v, a.BV)
	}
	norm := a.norms()
	if norm != nil && f == nil { // else with RoPE, in one kernel
		b.RMSNorm(q, q, norm.QDim, norm.QWeight, norm.QBias, norm.Eps)
		b.RMSNorm(k, k, norm.KDim, norm.KWeight, norm.KBias, norm.Eps)
	}
	rp := a.Rope.Params()
	ctx := b.Floats(T * a.Heads * a.HeadDV)
	cd := a.Heads * a.HeadDV
	shape := device.AttnShape{
		Heads: a.Heads, KVHeads: a.HeadsKV, DK: a.HeadDK, DV: a.HeadDV,
		KHeadStride: a.HeadDK, VHeadStride: a.HeadDV, Scale: a.Scale,
		Window: a.Window, Sinks: a.Sinks,
	}
	r := 0
	for _, s := range seqs {
		qs, ks, vs := q[r*qd:(r+s.T)*qd], k[r*kd:(r+s.T)*kd], v[r*vd:(r+s.T)*vd]
		if f != nil {
			f.RopeKV(qs, ks, vs, &s.Cache.KVLayer, s.Pos0, s.T, &shape, rp, norm)
		} else {
			b.Rope(qs, s.Pos0, s.T, a.Heads, a.HeadDK, qd, rp)
			b.Rope(ks, s.Pos0, s.T, a.HeadsKV, a.HeadDK, kd, rp)
			b.StoreKV(&s.Cache.KVLayer, s.Pos0, ks, vs)
		}
		if w := s.Cache.Win; w != nil {
			w.wrote(b, &s.Cache.KVLayer, s.Pos0, s.T)
		}
		b.Attend(ctx[r*cd:(r+s.T)*cd], qs, &s.Cache.KVLayer, s.Pos0, s.T, &shape)
		r += s.T
	}
	if gate != nil {
		b.MulSigmoid(ctx, gate)
	}
	b.MatMul(a.O, ctx, T, out)
	addBias(b, out, a.BO)
}

// gatedQ projects x to queries and gates (OutGate), writes the queries to q and returns the
// gates, head by head as llama.cpp's views of the joint projection take them.
func (a *StdAttention) gatedQ(b Backend, x []float32, T int, q []float32) []float32 {
	hd, qd := a.HeadDK, a.Heads*a.HeadDK
	qg, gate := b.Floats(2*T*qd), b.Floats(T*qd)
	b.MatMul(a.Q, x, T, qg)
	addBias(b, qg, a.BQ)
	b.Copy2D(q, qg, T*a.Heads, hd, hd, 2*hd)
	b.Copy2D(gate, qg[hd:], T*a.Heads, hd, hd, 2*hd)
	return gate
}

// attendValues writes the attention of group g's queries (heads of KV head kvh) to their
// outputs, given their probabilities (query i's at w[i*ws:]): the weighted sums of the
// values, a matrix product over the positions in llama.cpp's attention without flash
// attention (tinyBLAS when a batch of tokens is evaluated, ggml_vec_dot_f32 for one token)
// along the rows of the transposed value cache. s is the calling worker's scratch.
//
// The sums go query by query: sharing the values between the queries of a group, as the
// scores share the keys, measured no faster (their loop is bound by loads, not by widening
// the values).
//
// The sums start at position from (query i's probability of position p at w[i*ws+p-from]),
// a multiple of 64 before which every weight is zero (a sliding window's): each lane of the
// sums then adds the same products in the same order, less leading zeros, which change no
// sum. The positions from from on are consecutive slots of the cache, a ring's included.
func attendValues(s *attnScratch, c *device.KVLayer, g *attnGroup, w []float32, ws, kvh int, a *device.AttnShape, batched bool, from int) {
	size := kvPositions(c)
	off := kvh*a.VHeadStride*size + c.RingSlot(from)
	for i := 0; i < g.nq; i++ {
		wi, n := w[i*ws:(i+1)*ws], g.n[i]-from
		switch {
		case c.F16 && batched:
			wsumTransposed(wsumLanesF16, g.out[i], wi, c.V16[off:], size, n, true, &s.row16)
		case c.F16:
			wsumTransposed(wsumVecF16, g.out[i], wi, c.V16[off:], size, n, false, &s.row16)
		case batched:
			wsumTransposed(wsumLanes, g.out[i], wi, c.V[off:], size, n, true, &s.row32)
		default:
			wsumTransposed(wsumVec, g.out[i], wi, c.V[off:], size, n, false, &s.row32)
		}
	}
}

// wsumTransposed is the weighted sum f over rows of a transposed value cache, whose padded
// tails the kernels read: a row whose padding would run past the end of v (the last values
// of a nearly full cache) is copied, padded, into row first.
func wsumTransposed[E float32 | uint16](f func(out, w []float32, v []E, stride, n int), out, w []float32, v []E, stride, n int, batched bool, row *[]E) {
	pad := (n + 63) &^ 63
	if batched {
		pad = (n + 15) &^ 15
	}
	safe := safeRows(len(out), len(v), stride, pad)
	f(out[:safe], w, v, stride, n)
	for d := safe; d < len(out); d++ {
		r := grow(row, pad)
		copy(r, v[d*stride:d*stride+n])
		clear(r[n:])
		f(out[d:d+1], w, r, pad, n)
	}
}

// safeRows returns how many of rows rows of stride values from the start of n values have
// room for a padded length of pad values each.
func safeRows(rows, n, stride, pad int) int {
	if rows == 0 || (rows-1)*stride+pad <= n {
		return rows
	}
	if n < pad {
		return 0
	}
	return min(rows, (n-pad)/stride+1)
}

// addBias adds bias, when there is one, to every row of x.
func addBias(b Backend, x, bias []float32) {
	if bias != nil {
		b.AddRows(x, bias)
	}
}

// defaultScale is 1/sqrt(head size) (1.0f/sqrtf in float32, as llama.cpp), unless the file
// sets attention.scale.
func defaultScale(r *kvReader, headDim int) float32 {
	if s := r.float(".attention.scale", 0); s != 0 {
		return s
	}
	return 1 / float32(math.Sqrt(float64(headDim)))
}
