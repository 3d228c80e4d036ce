package trace

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Token is the routing of one token through every MoE layer.
type Token struct {
	Seq    int   // sequence index: prompt or text window
	Pos    int   // position in the sequence
	ID     int32 // token id
	Decode bool  // false for a prompt (prefill) token
	// Layers has one entry per MoE layer, in the header's MoELayers order.
	Layers []LayerRoute
}

// LayerRoute is one MoE layer's routing of one token.
type LayerRoute struct {
	Layer   int       // block index
	Experts []int     // chosen experts, top-k order
	Weights []float32 // their mixing weights
	Logits  []float32 // router logits, len Header.Experts; empty unless Header.Logits
	Input   []float32 // router input h(i), len Header.Embd; empty when Header.Inputs is none
}

const flagDecode = 1

// put encodes t into dst (len tokenSize), checking it against the header on the way. On
// error dst holds garbage, which is harmless: the writer only counts a record once put
// succeeds. seen is scratch of (experts+63)/64 zero words and is zero again on return.
func (l *layout) put(dst []byte, t *Token, seen []uint64) error {
	if t == nil {
		return fmt.Errorf("nil token")
	}
	if t.Seq < 0 || int64(t.Seq) > math.MaxUint32 {
		return fmt.Errorf("seq %d: want 0..%d", t.Seq, uint32(math.MaxUint32))
	}
	if t.Pos < 0 || int64(t.Pos) > math.MaxUint32 {
		return fmt.Errorf("pos %d: want 0..%d", t.Pos, uint32(math.MaxUint32))
	}
	if len(t.Layers) != len(l.moe) {
		return fmt.Errorf("%d layers, want %d (the header's MoE layers)", len(t.Layers), len(l.moe))
	}
	le := binary.LittleEndian
	le.PutUint32(dst[0:], uint32(t.Seq))
	le.PutUint32(dst[4:], uint32(t.Pos))
	le.PutUint32(dst[8:], uint32(t.ID))
	var flags uint32
	if t.Decode {
		flags |= flagDecode
	}
	le.PutUint32(dst[12:], flags)
	off := 16
	for j := range t.Layers {
		if err := l.putLayer(dst[off:off+l.layerBytes], &t.Layers[j], l.moe[j], seen); err != nil {
			return fmt.Errorf("layer %d: %w", t.Layers[j].Layer, err)
		}
		off += l.layerBytes
	}
	return nil
}

func (l *layout) putLayer(dst []byte, lr *LayerRoute, want int, seen []uint64) error {
	if lr.Layer != want {
		return fmt.Errorf("out of order: want layer %d here (the header's MoE layers, in order)", want)
	}
	if len(lr.Experts) != l.used {
		return fmt.Errorf("%d experts, want %d (used)", len(lr.Experts), l.used)
	}
	if len(lr.Weights) != l.used {
		return fmt.Errorf("%d weights, want %d (used)", len(lr.Weights), l.used)
	}
	le := binary.LittleEndian
	for i, e := range lr.Experts {
		if e < 0 || e >= l.experts {
			return fmt.Errorf("expert %d (rank %d) out of range 0..%d", e, i, l.experts-1)
		}
		le.PutUint16(dst[2*i:], uint16(e))
	}
	if e, dup := duplicate(lr.Experts, seen); dup {
		return fmt.Errorf("expert %d chosen twice", e)
	}
	off := 2 * l.used
	if err := putF32(dst[off:off+4*l.used], lr.Weights, "weight"); err != nil {
		return err
	}
	off += 4 * l.used
	if l.logits {
		if len(lr.Logits) != l.experts {
			return fmt.Errorf("%d logits, want %d (experts)", len(lr.Logits), l.experts)
		}
		if err := putF32(dst[off:off+4*l.experts], lr.Logits, "logit"); err != nil {
			return err
		}
		off += 4 * l.experts
	} else if len(lr.Logits) != 0 {
		// Data the header does not declare would be dropped without a word: a recorder bug.
		return fmt.Errorf("%d logits, but the header stores none", len(lr.Logits))
	}
	switch {
	case l.inputWidth == 0:
		if len(lr.Input) != 0 {
			return fmt.Errorf("input of %d values, but the header stores none", len(lr.Input))
		}
	case len(lr.Input) != l.embd:
		return fmt.Errorf("input of %d values, want %d (embd)", len(lr.Input), l.embd)
	case l.inputWidth == 2:
		return putF16(dst[off:off+2*l.embd], lr.Input)
	default:
		return putF32(dst[off:off+4*l.embd], lr.Input, "input")
	}
	return nil
}

// duplicate reports an expert that occurs twice in ids (all within range), using the bit
// set seen, which it leaves zero.
func duplicate(ids []int, seen []uint64) (int, bool) {
	dup, found := 0, false
	set := ids
	for i, e := range ids {
		w, b := e>>6, uint64(1)<<(e&63)
		if seen[w]&b != 0 {
			dup, found, set = e, true, ids[:i]
			break
		}
		seen[w] |= b
	}
	for _, e := range set {
		seen[e>>6] &^= 1 << (e & 63)
	}
	return dup, found
}

func putF32(dst []byte, src []float32, what string) error {
	dst = dst[:4*len(src)]
	for i, v := range src {
		if !finite(v) {
			return fmt.Errorf("%s[%d] = %v: not finite", what, i, v)
		}
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
	return nil
}

func putF16(dst []byte, src []float32) error {
	dst = dst[:2*len(src)]
	for i, v := range src {
		h := toF16(v)
		if !finite16(h) {
			if finite(v) {
				return fmt.Errorf("input[%d] = %v: overflows f16 (store f32 inputs)", i, v)
			}
			return fmt.Errorf("input[%d] = %v: not finite", i, v)
		}
		binary.LittleEndian.PutUint16(dst[2*i:], h)
	}
	return nil
}
