package predictor

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// Net is one predictor network. Hidden == 0: linear, W1 is Out x In, B1 len Out, W2/B2 nil.
// Hidden > 0: W1 Hidden x In, B1 Hidden, W2 Out x Hidden, B2 Out, with a ReLU between the
// layers. Row-major float32.
type Net struct {
	In, Hidden, Out int
	W1, B1, W2, B2  []float32
}

// Forward computes one row: out (len Out) from x (len In). scratch holds the hidden layer
// (len >= Hidden; nil is fine for a linear net). It allocates nothing. Lengths that do not
// fit the net are a programming error and panic.
func (n *Net) Forward(x, out []float32, scratch []float32) {
	if len(x) != n.In || len(out) != n.Out || len(scratch) < n.Hidden {
		panic(fmt.Sprintf("predictor: Net.Forward: x %d, out %d, scratch %d for a net %d -> %d -> %d",
			len(x), len(out), len(scratch), n.In, n.Hidden, n.Out))
	}
	if n.Hidden == 0 {
		affine(n.W1, n.B1, x, out)
		return
	}
	h := scratch[:n.Hidden]
	affine(n.W1, n.B1, x, h)
	for i, v := range h {
		h[i] = max(v, 0)
	}
	affine(n.W2, n.B2, h, out)
}

// affine sets out[r] = b[r] + w[r]·x for every row r of w.
func affine(w, b, x, out []float32) {
	in := len(x)
	for r := range out {
		out[r] = b[r] + dot(w[r*in:(r+1)*in], x)
	}
}

// dot keeps four partial sums: one running sum waits on the adder's latency every step,
// four keep it busy.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// Params is the number of weights and biases.
func (n *Net) Params() int { return len(n.W1) + len(n.B1) + len(n.W2) + len(n.B2) }

// check validates the net's shape and values: what Load and NewRouter promise the engine.
func (n *Net) check(in, out int, mayHide bool) error {
	if n.In != in || n.Out != out {
		return fmt.Errorf("shape %d -> %d, want %d -> %d", n.In, n.Out, in, out)
	}
	rows := out
	switch {
	case n.Hidden == 0:
		if n.W2 != nil || n.B2 != nil {
			return errors.New("linear net with a second layer")
		}
	case !mayHide:
		return fmt.Errorf("hidden %d: a same-token net is linear (hidden 0)", n.Hidden)
	case n.Hidden != 2*in:
		return fmt.Errorf("hidden %d: want 0 or %d (2 x embd)", n.Hidden, 2*in)
	default:
		rows = n.Hidden
		if len(n.W2) != out*n.Hidden || len(n.B2) != out {
			return fmt.Errorf("second layer has %d weights and %d biases, want %d and %d", len(n.W2), len(n.B2), out*n.Hidden, out)
		}
	}
	if len(n.W1) != rows*in || len(n.B1) != rows {
		return fmt.Errorf("first layer has %d weights and %d biases, want %d and %d", len(n.W1), len(n.B1), rows*in, rows)
	}
	for _, s := range [][]float32{n.W1, n.B1, n.W2, n.B2} {
		for i, v := range s {
			if !finite(v) {
				return fmt.Errorf("value %d is %v", i, v)
			}
		}
	}
	return nil
}

func (n *Net) clone() *Net {
	c := *n
	c.W1, c.B1 = cloneF(n.W1), cloneF(n.B1)
	c.W2, c.B2 = cloneF(n.W2), cloneF(n.B2)
	return &c
}

func cloneF(s []float32) []float32 {
	if s == nil {
		return nil
	}
	return append([]float32(nil), s...)
}

func finite(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }

// Router is a Commit Router: Nets[j] predicts, from MoE layer j's router input h(j), the
// router logits of MoE layer j+1 of the same token (a linear net), and the last net those of
// the next token's first MoE layer (a two-layer MLP).
type Router struct {
	ID   Identity
	Nets []*Net
	Info TrainInfo // how it was trained; zero for a router that never was

	scratch sync.Pool // *[]float32 of the widest hidden layer, for Predict
}

// NewRouter returns a router for id: linear nets for the same-token predictions and an MLP
// with hidden = 2 x Embd for the last (cross-token) one.
//
// init, when not nil, has one Experts x Embd matrix (row-major) per net: a warm start. A
// linear net starts as W = init[j], b = 0. The MLP starts as the exact same linear map:
// W1 = [I; -I], b1 = 0, W2 = [init | -init], b2 = 0, since relu(x) - relu(-x) = x; that
// identity is why a hidden layer twice the input wide can represent the linear predictor
// exactly, and training then only has to improve on it. init == nil, or init[j] == nil, draws
// that net at random from seed, as PyTorch's nn.Linear does (Kaiming-uniform: weights and
// biases uniform in ±1/sqrt(fan in)).
func NewRouter(id Identity, init [][]float32, seed uint64) (*Router, error) {
	if err := id.validate(); err != nil {
		return nil, fmt.Errorf("predictor: identity: %w", err)
	}
	m := len(id.MoELayers)
	if init != nil && len(init) != m {
		return nil, fmt.Errorf("predictor: warm start has %d matrices, want %d (one per MoE layer)", len(init), m)
	}
	e, d := id.Experts, id.Embd
	r := &Router{ID: id, Nets: make([]*Net, m)}
	r.ID.MoELayers = append([]int(nil), id.MoELayers...)
	for j := range r.Nets {
		var w []float32
		if init != nil {
			w = init[j]
		}
		if w != nil {
			if len(w) != e*d {
				return nil, fmt.Errorf("predictor: warm start %d has %d values, want %d x %d", j, len(w), e, d)
			}
			for i, v := range w {
				if !finite(v) {
					return nil, fmt.Errorf("predictor: warm start %d: value %d is %v", j, i, v)
				}
			}
		}
		rng := rand.New(rand.NewPCG(seed, streamInit+uint64(j)))
		n := &Net{In: d, Out: e}
		switch {
		case j < m-1 && w != nil:
			n.W1, n.B1 = cloneF(w), make([]float32, e)
		case j < m-1:
			n.W1, n.B1 = uniform(rng, e*d, d), uniform(rng, e, d)
		case w != nil:
			n.Hidden = 2 * d
			n.W1, n.B1 = make([]float32, 2*d*d), make([]float32, 2*d)
			for i := 0; i < d; i++ {
				n.W1[i*d+i] = 1
				n.W1[(d+i)*d+i] = -1
			}
			n.W2, n.B2 = make([]float32, e*2*d), make([]float32, e)
			for o := 0; o < e; o++ {
				row := n.W2[o*2*d : (o+1)*2*d]
				for i, v := range w[o*d : (o+1)*d] {
					row[i], row[d+i] = v, -v
				}
			}
		default:
			n.Hidden = 2 * d
			n.W1, n.B1 = uniform(rng, 2*d*d, d), uniform(rng, 2*d, d)
			n.W2, n.B2 = uniform(rng, e*2*d, 2*d), uniform(rng, e, 2*d)
		}
		r.Nets[j] = n
	}
	return r, nil
}

// PCG streams, so that initialisation, the split and the shuffles draw independent numbers
// from one seed.
const (
	streamInit    = 0x696e6974 << 16 // "init"; plus the net index
	streamSplit   = 0x73706c6974     // "split"
	streamShuffle = 0x73687566 << 16 // "shuf"; plus the net index
)

// uniform draws n values in ±1/sqrt(fanIn).
func uniform(rng *rand.Rand, n, fanIn int) []float32 {
	bound := 1 / math.Sqrt(float64(fanIn))
	s := make([]float32, n)
	for i := range s {
		s[i] = float32((2*rng.Float64() - 1) * bound)
	}
	return s
}

// Predict sets out (len Experts) to net j's predicted logits for router input h (len Embd).
// It is safe for concurrent use and allocates nothing once warm.
func (r *Router) Predict(j int, h []float32, out []float32) {
	n := r.Nets[j]
	if n.Hidden == 0 {
		n.Forward(h, out, nil)
		return
	}
	p, _ := r.scratch.Get().(*[]float32)
	if p == nil || len(*p) < n.Hidden {
		s := make([]float32, r.maxHidden())
		p = &s
	}
	n.Forward(h, out, *p)
	r.scratch.Put(p)
}

func (r *Router) maxHidden() int {
	h := 0
	for _, n := range r.Nets {
		h = max(h, n.Hidden)
	}
	return h
}

// Predicted returns the k experts net j predicts for h: the top k of its logits, highest
// first, ties to the lower index.
func (r *Router) Predicted(j int, h []float32, k int) []int {
	logits := make([]float32, r.Nets[j].Out)
	r.Predict(j, h, logits)
	return topK(logits, min(k, len(logits)), make([]int, 0, k))
}

// Params is the number of weights and biases of all nets.
func (r *Router) Params() int {
	n := 0
	for _, net := range r.Nets {
		n += net.Params()
	}
	return n
}

// Bytes is the size of all weights in f32: what the engine allocates on the device.
func (r *Router) Bytes() int64 {
	var n int64
	for _, net := range r.Nets {
		n += 4 * int64(net.Params())
	}
	return n
}

// topK appends to dst the indices of the k largest values, largest first, ties to the lower
// index. k selection passes are cheaper than a sort for the few experts a token uses.
func topK(v []float32, k int, dst []int) []int {
	start := len(dst)
	for len(dst)-start < k {
		best := -1
		for i, x := range v {
			if best >= 0 && !(x > v[best]) {
				continue
			}
			taken := false
			for _, t := range dst[start:] {
				if t == i {
					taken = true
					break
				}
			}
			if !taken {
				best = i
			}
		}
		dst = append(dst, best)
	}
	return dst
}

// overlap counts the values of a also in b; both are small sets of distinct experts.
func overlap(a []int, b []uint16) int {
	c := 0
	for _, x := range a {
		for _, y := range b {
			if x == int(y) {
				c++
				break
			}
		}
	}
	return c
}
