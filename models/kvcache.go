package models

import (
	"fmt"

	"github.com/commit-run/commit-run/quant"
)

// Attention is one layer's self-attention. Implementations are the attention families of the
// architectures (standard multi-head/GQA attention, DeepSeek's MLA).
type Attention interface {
	// CacheDims returns the key and value values stored per position in the KV cache.
	CacheDims() (k, v int)
	// Forward attends T tokens at positions pos0.. given their normalised hidden states x
	// (T rows of n_embd), appending their keys and values to c, and writes T rows of n_embd
	// to out.
	Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32)
}

// KVCache holds every layer's keys and values for the positions of one session.
type KVCache struct {
	Layers []LayerCache
	Size   int // positions
}

// LayerCache is one layer's part of the KV cache, in F32 or F16.
type LayerCache struct {
	KDim, VDim int
	F16        bool
	k, v       []float32
	k16, v16   []uint16
}

// NewKVCache allocates a cache of n positions for m.
func NewKVCache(m *Model, n int, f16 bool) (*KVCache, error) {
	if n <= 0 {
		return nil, fmt.Errorf("KV cache of %d positions", n)
	}
	kv := &KVCache{Size: n, Layers: make([]LayerCache, len(m.Layers))}
	for i, l := range m.Layers {
		kd, vd := l.Attn.CacheDims()
		lc := &kv.Layers[i]
		lc.KDim, lc.VDim, lc.F16 = kd, vd, f16
		if f16 {
			lc.k16, lc.v16 = make([]uint16, n*kd), make([]uint16, n*vd)
		} else {
			lc.k, lc.v = make([]float32, n*kd), make([]float32, n*vd)
		}
	}
	return kv, nil
}

// Bytes returns the memory the cache holds.
func (kv *KVCache) Bytes() int64 {
	var n int64
	for _, l := range kv.Layers {
		n += int64(len(l.k)+len(l.v))*4 + int64(len(l.k16)+len(l.v16))*2
	}
	return n
}

func put(f16 bool, dst32 []float32, dst16 []uint16, off int, src []float32) {
	if f16 {
		d := dst16[off : off+len(src)]
		for i, v := range src {
			d[i] = quant.FP32ToFP16(v)
		}
		return
	}
	copy(dst32[off:], src)
}

func get(f16 bool, src32 []float32, src16 []uint16, off int, dst []float32) {
	if f16 {
		s := src16[off : off+len(dst)]
		for i, v := range s {
			dst[i] = quant.FP16ToFP32(v)
		}
		return
	}
	copy(dst, src32[off:off+len(dst)])
}

// PutK stores a key row (KDim values) for pos.
func (c *LayerCache) PutK(pos int, k []float32) { put(c.F16, c.k, c.k16, pos*c.KDim, k) }

// PutV stores a value row (VDim values) for pos.
func (c *LayerCache) PutV(pos int, v []float32) { put(c.F16, c.v, c.v16, pos*c.VDim, v) }

// K reads key values [from, from+len(dst)) of position pos.
func (c *LayerCache) K(pos, from int, dst []float32) { get(c.F16, c.k, c.k16, pos*c.KDim+from, dst) }

// V reads value values [from, from+len(dst)) of position pos.
func (c *LayerCache) V(pos, from int, dst []float32) { get(c.F16, c.v, c.v16, pos*c.VDim+from, dst) }
