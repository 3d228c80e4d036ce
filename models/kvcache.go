package models

import (
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/device"
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

// OnDevice is implemented by attentions whose Forward computes with the backend's Ops alone,
// so that a device with Ops can run it in its own memory. An attention without it would read
// and write activations on the host, and so would need them, and its cache, in host memory.
type OnDevice interface {
	Attention
	OnDevice()
}

// KVCache holds every layer's keys and values for the positions of one session.
type KVCache struct {
	Layers []LayerCache
	Size   int // positions
}

// LayerCache is one layer's part of the KV cache, in F32 or F16.
type LayerCache struct {
	device.KVLayer
}

// Alloc returns n bytes for what; NewKVCache takes it so that the engine decides where a
// cache lives.
type Alloc func(n int64, what string) ([]byte, error)

// HostAlloc allocates in host memory.
func HostAlloc(n int64, _ string) ([]byte, error) { return make([]byte, n), nil }

// NewKVCache allocates a cache of n positions for m with alloc.
func NewKVCache(m *Model, n int, f16 bool, alloc Alloc) (*KVCache, error) {
	if n <= 0 {
		return nil, fmt.Errorf("KV cache of %d positions", n)
	}
	kv := &KVCache{Size: n, Layers: make([]LayerCache, len(m.Layers))}
	for i, l := range m.Layers {
		kd, vd := l.Attn.CacheDims()
		lc := &kv.Layers[i]
		lc.KDim, lc.VDim, lc.F16 = kd, vd, f16
		elem := int64(4)
		if f16 {
			elem = 2
		}
		var kb, vb []byte
		var err error
		if kb, err = alloc(int64(n*kd)*elem, fmt.Sprintf("layer %d's key cache", i)); err != nil {
			return nil, err
		}
		if vd > 0 {
			if vb, err = alloc(int64(n*vd)*elem, fmt.Sprintf("layer %d's value cache", i)); err != nil {
				return nil, err
			}
		}
		if f16 {
			lc.K16, lc.V16 = bytesAs[uint16](kb), bytesAs[uint16](vb)
		} else {
			lc.K, lc.V = bytesAs[float32](kb), bytesAs[float32](vb)
		}
	}
	return kv, nil
}

// bytesAs views b (aligned, as every allocation is) as values of type T.
func bytesAs[T float32 | uint16](b []byte) []T {
	if len(b) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

// Bytes returns the memory the cache holds.
func (kv *KVCache) Bytes() int64 {
	var n int64
	for _, l := range kv.Layers {
		n += int64(len(l.K)+len(l.V))*4 + int64(len(l.K16)+len(l.V16))*2
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

// putK stores a key row (KDim values) for pos.
func putK(c *device.KVLayer, pos int, k []float32) { put(c.F16, c.K, c.K16, pos*c.KDim, k) }

// putV stores a value row (VDim values) for pos.
func putV(c *device.KVLayer, pos int, v []float32) { put(c.F16, c.V, c.V16, pos*c.VDim, v) }

// rowK reads key values [from, from+len(dst)) of position pos.
func rowK(c *device.KVLayer, pos, from int, dst []float32) {
	get(c.F16, c.K, c.K16, pos*c.KDim+from, dst)
}

// rowV reads value values [from, from+len(dst)) of position pos.
func rowV(c *device.KVLayer, pos, from int, dst []float32) {
	get(c.F16, c.V, c.V16, pos*c.VDim+from, dst)
}
