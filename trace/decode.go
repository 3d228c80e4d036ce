package trace

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/commit-run/commit-run/quant"
)

// get decodes the record src (len tokenSize) into t, reusing t's slices when they have the
// shape of this trace. The checksum already vouches for the bytes, so what fails here was
// written wrong, by a buggy or foreign writer; the reader reports it as corruption all the
// same. seen is scratch as for put.
func (l *layout) get(src []byte, t *Token, seen []uint64) error {
	le := binary.LittleEndian
	flags := le.Uint32(src[12:])
	if flags&^flagDecode != 0 {
		return fmt.Errorf("unknown flags %#x", flags)
	}
	l.shape(t)
	t.Seq = int(le.Uint32(src[0:]))
	t.Pos = int(le.Uint32(src[4:]))
	t.ID = int32(le.Uint32(src[8:]))
	t.Decode = flags&flagDecode != 0
	off := 16
	for j := range t.Layers {
		if err := l.getLayer(src[off:off+l.layerBytes], &t.Layers[j], seen); err != nil {
			return fmt.Errorf("layer %d: %w", l.moe[j], err)
		}
		off += l.layerBytes
	}
	return nil
}

func (l *layout) getLayer(src []byte, lr *LayerRoute, seen []uint64) error {
	le := binary.LittleEndian
	for i := range lr.Experts {
		e := int(le.Uint16(src[2*i:]))
		if e >= l.experts {
			return fmt.Errorf("expert %d (rank %d) out of range 0..%d", e, i, l.experts-1)
		}
		lr.Experts[i] = e
	}
	if e, dup := duplicate(lr.Experts, seen); dup {
		return fmt.Errorf("expert %d chosen twice", e)
	}
	off := 2 * l.used
	if err := getF32(lr.Weights, src[off:], "weight"); err != nil {
		return err
	}
	off += 4 * l.used
	if l.logits {
		if err := getF32(lr.Logits, src[off:], "logit"); err != nil {
			return err
		}
		off += 4 * l.experts
	}
	switch l.inputWidth {
	case 2:
		src := src[off : off+2*len(lr.Input)]
		for i := range lr.Input {
			h := le.Uint16(src[2*i:])
			if !finite16(h) {
				return fmt.Errorf("input[%d]: f16 %#04x is not finite", i, h)
			}
			lr.Input[i] = quant.FP16ToFP32(h)
		}
	case 4:
		return getF32(lr.Input, src[off:], "input")
	}
	return nil
}

func getF32(dst []float32, src []byte, what string) error {
	src = src[:4*len(dst)]
	for i := range dst {
		v := math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		if !finite(v) {
			return fmt.Errorf("%s[%d] = %v: not finite", what, i, v)
		}
		dst[i] = v
	}
	return nil
}

// shape gives t one LayerRoute per MoE layer with slices of the trace's lengths. A token
// already decoded from this trace keeps its storage; anything else gets fresh storage cut
// from two arrays, so a new token costs three allocations however many layers it has.
func (l *layout) shape(t *Token) {
	if l.fits(t) {
		return
	}
	m, k := len(l.moe), l.used
	per := k // float32 values per layer
	if l.logits {
		per += l.experts
	}
	if l.inputWidth > 0 {
		per += l.embd
	}
	ids := make([]int, m*k)
	fs := make([]float32, m*per)
	t.Layers = make([]LayerRoute, m)
	for j := range t.Layers {
		lr := &t.Layers[j]
		lr.Layer = l.moe[j]
		lr.Experts, ids = ids[:k:k], ids[k:]
		lr.Weights, fs = fs[:k:k], fs[k:]
		if l.logits {
			lr.Logits, fs = fs[:l.experts:l.experts], fs[l.experts:]
		}
		if l.inputWidth > 0 {
			lr.Input, fs = fs[:l.embd:l.embd], fs[l.embd:]
		}
	}
}

// fits reports whether t already has this trace's shape, and fixes the layer indices,
// which a caller may have changed, so that reuse never returns stale ones.
func (l *layout) fits(t *Token) bool {
	if len(t.Layers) != len(l.moe) {
		return false
	}
	want := func(s []float32, on bool, n int) bool {
		if !on {
			return s == nil
		}
		return len(s) == n
	}
	for j := range t.Layers {
		lr := &t.Layers[j]
		if len(lr.Experts) != l.used || len(lr.Weights) != l.used ||
			!want(lr.Logits, l.logits, l.experts) || !want(lr.Input, l.inputWidth > 0, l.embd) {
			return false
		}
	}
	for j := range t.Layers {
		t.Layers[j].Layer = l.moe[j]
	}
	return true
}
