package predictor

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/commit-run/commit-run/trace"
)

// DataOptions select the tokens of a trace that LoadDataset keeps.
type DataOptions struct {
	MaxTokens  int  // keep at most this many tokens; 0 = all
	DecodeOnly bool // keep only decode tokens: CommitMoE predicts during decode
}

// Dataset holds the training pairs of every net of a Commit Router, read from a routing
// trace. Token t's router inputs h(j), router logits and chosen experts are stored once per
// MoE layer; the pairs are views of them:
//
//   - net j < M-1 (same token): h(j) of token t -> logits and experts of MoE layer j+1 of
//     token t, for every token;
//   - net M-1 (cross token): h(M-1) of token t -> logits and experts of MoE layer 0 of token
//     t+1, for every kept token t whose successor in the trace is the same sequence's next
//     position (so never across a prompt boundary, and with DecodeOnly never from the last
//     prompt token to the first decode token, whose first layer the engine routes itself).
//
// Inputs stay in the trace's precision: an f16 trace costs half the memory of an f32 one,
// which is what makes a real model's trace (30 layers x 4096 wide) fit. Everything is kept
// in blocks of rows, so growing never copies what was read.
type Dataset struct {
	h          trace.Header
	m, e, k, d int
	half       bool
	n          int // tokens
	in16       []column[uint16]
	in32       []column[float32]
	logits     []column[float32]
	experts    []column[uint16]
	succ       []int32 // cross-token pairs: token t -> t+1
	decode     int
}

// blockRows is the number of rows per storage block.
const blockRows = 1024

// column is a growable table of rows of equal width, stored in fixed blocks.
type column[T any] struct {
	width  int
	blocks [][]T
	n      int
}

// next returns the storage of a new row.
func (c *column[T]) next() []T {
	i := c.n % blockRows
	if i == 0 {
		c.blocks = append(c.blocks, make([]T, blockRows*c.width))
	}
	c.n++
	return c.blocks[len(c.blocks)-1][i*c.width : (i+1)*c.width : (i+1)*c.width]
}

func (c *column[T]) row(t int) []T {
	i := t % blockRows
	return c.blocks[t/blockRows][i*c.width : (i+1)*c.width : (i+1)*c.width]
}

// Errors LoadDataset reports for traces that cannot train a router; the caller adds the path.
var (
	ErrNoInputs = errors.New("trace has no router inputs: record it with `commit-run predictor collect`")
	ErrNoLogits = errors.New("trace has no router logits: record it with `commit-run predictor collect`")
	ErrNoTokens = errors.New("trace has no tokens")
)

// LoadDataset streams the tokens of r into a Dataset, one token at a time. The trace must
// store router inputs and logits. A trace that ends early (errors.Is(err,
// trace.ErrTruncated)) returns the dataset of every token read so far together with the
// error, so the caller can decide to go on with it; any other error returns no dataset.
func LoadDataset(r *trace.Reader, o DataOptions) (*Dataset, error) {
	h := r.Header()
	switch {
	case h.Inputs == trace.InputsNone || h.Inputs == "":
		return nil, ErrNoInputs
	case !h.Logits:
		return nil, ErrNoLogits
	case o.MaxTokens < 0:
		return nil, fmt.Errorf("max tokens %d: want 0 (all) or more", o.MaxTokens)
	}
	ds := &Dataset{h: h, m: len(h.MoELayers), e: h.Experts, k: h.Used, d: h.Embd, half: h.Inputs == trace.InputsF16}
	for range ds.m {
		if ds.half {
			ds.in16 = append(ds.in16, column[uint16]{width: ds.d})
		} else {
			ds.in32 = append(ds.in32, column[float32]{width: ds.d})
		}
		ds.logits = append(ds.logits, column[float32]{width: ds.e})
		ds.experts = append(ds.experts, column[uint16]{width: ds.k})
	}
	var (
		tok      trace.Token
		prev     bool // the previous token read was kept
		seq, pos int  // and was here
		rerr     error
	)
	for o.MaxTokens == 0 || ds.n < o.MaxTokens {
		if err := r.NextInto(&tok); err != nil {
			if err != io.EOF {
				rerr = err
			}
			break
		}
		if o.DecodeOnly && !tok.Decode {
			prev = false
			continue
		}
		if ds.n == math.MaxInt32 {
			return nil, fmt.Errorf("trace has more than %d tokens: pass a token limit", math.MaxInt32)
		}
		if prev && tok.Seq == seq && tok.Pos == pos+1 {
			ds.succ = append(ds.succ, int32(ds.n-1))
		}
		ds.add(&tok)
		prev, seq, pos = true, tok.Seq, tok.Pos
	}
	switch {
	case rerr != nil && (!errors.Is(rerr, trace.ErrTruncated) || ds.n == 0):
		return nil, rerr
	case ds.n == 0:
		return nil, ErrNoTokens
	case ds.m == 1 && len(ds.succ) == 0:
		return nil, fmt.Errorf("trace has no pairs of consecutive tokens (%d tokens), and a model with one MoE layer only predicts across tokens", ds.n)
	}
	return ds, rerr
}

func (ds *Dataset) add(t *trace.Token) {
	for j := range t.Layers {
		l := &t.Layers[j]
		if ds.half {
			row := ds.in16[j].next()
			for i, v := range l.Input {
				row[i] = toHalf(v)
			}
		} else {
			copy(ds.in32[j].next(), l.Input)
		}
		copy(ds.logits[j].next(), l.Logits)
		ex := ds.experts[j].next()
		for i, e := range l.Experts {
			ex[i] = uint16(e)
		}
	}
	if t.Decode {
		ds.decode++
	}
	ds.n++
}

// Header is the header of the trace the dataset was read from.
func (ds *Dataset) Header() trace.Header {
	h := ds.h
	h.MoELayers = append([]int(nil), h.MoELayers...)
	return h
}

// Tokens is the number of tokens kept.
func (ds *Dataset) Tokens() int { return ds.n }

// DecodeTokens is how many of the tokens kept are decode tokens.
func (ds *Dataset) DecodeTokens() int { return ds.decode }

// Nets is the number of nets a router for the trace has: one per MoE layer.
func (ds *Dataset) Nets() int { return ds.m }

// Samples is the number of training pairs of net j.
func (ds *Dataset) Samples(j int) int {
	if j == ds.m-1 {
		return len(ds.succ)
	}
	return ds.n
}

// source returns the token whose input is sample i of net j, and the token and MoE layer
// whose routing is its target.
func (ds *Dataset) source(j, i int) (from, to, layer int) {
	if j == ds.m-1 {
		t := int(ds.succ[i])
		return t, t + 1, 0
	}
	return i, i, j + 1
}

// input writes sample i of net j's router input to dst (len Embd).
func (ds *Dataset) input(j, i int, dst []float32) {
	from, _, _ := ds.source(j, i)
	if ds.half {
		for c, h := range ds.in16[j].row(from) {
			dst[c] = fromHalf(h)
		}
		return
	}
	copy(dst, ds.in32[j].row(from))
}

// target returns sample i of net j's target logits and true experts.
func (ds *Dataset) target(j, i int) (logits []float32, experts []uint16) {
	_, to, l := ds.source(j, i)
	return ds.logits[l].row(to), ds.experts[l].row(to)
}

// split assigns every token to validation (true) or training: a permutation of the tokens
// drawn from PCG(seed, "split") puts its first round(frac x tokens) tokens in validation.
// A pair belongs to the split of its input token, so every net uses the same split and a
// token's h(j) is never trained on by one net while validating another.
func (ds *Dataset) split(frac float64, seed uint64) []bool {
	val := make([]bool, ds.n)
	perm := rand.New(rand.NewPCG(seed, streamSplit)).Perm(ds.n)
	for _, t := range perm[:int(math.Round(frac*float64(ds.n)))] {
		val[t] = true
	}
	return val
}

// samples lists net j's samples in validation (want true) or training, in sample order.
func (ds *Dataset) samples(j int, val []bool, want bool) []int32 {
	var s []int32
	for i := range ds.Samples(j) {
		if from, _, _ := ds.source(j, i); val[from] == want {
			s = append(s, int32(i))
		}
	}
	return s
}

// toHalf converts to IEEE binary16, rounding to nearest even. Inputs read from an f16 trace
// come back exactly.
func toHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case b&0x7fffffff == 0:
		return sign
	case b&0x7f800000 == 0x7f800000: // inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp >= 31:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint(14 - exp)
		r, rem, half := mant>>shift, mant&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || rem == half && r&1 == 1 {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && r&1 == 1 {
		r++ // a carry into the exponent is the right answer, up to infinity
	}
	return sign | uint16(r)
}

// fromHalf converts IEEE binary16 to float32 (exactly).
func fromHalf(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		f := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			f = -f
		}
		return f
	case 31:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}
