package models

import (
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/device"
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

// Seq is one sequence's rows in a pass that attends several sequences (continuous batching):
// T tokens at positions Pos0.., whose keys and values go to Cache.
type Seq struct {
	Cache   *LayerCache
	T, Pos0 int
}

// SeqAttention is implemented by attentions that attend several sequences' rows in one call,
// each over its own cache: the projections read their weights once for every row, and only
// the attention proper runs per sequence. Each row's numbers are those Forward gives it in a
// pass of its sequence alone. Attentions without it take one Forward per sequence.
type SeqAttention interface {
	Attention
	// ForwardSeqs is Forward over x's rows, seqs[0]'s first, then seqs[1]'s, and so on.
	ForwardSeqs(b Backend, seqs []Seq, x []float32, out []float32)
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

// LayerCache is one layer's part of the KV cache, in F32 or F16, laid out by the Ops that
// use it (see device.KVLayer; the host's: putK, putV).
type LayerCache struct {
	device.KVLayer
	// Rec is the state of a recurrent layer (Recurrent), which keeps no keys or values;
	// nil for the others. It lives in the cache's memory, as the keys and values do.
	Rec *RecState
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
		lc := &kv.Layers[i]
		if r, ok := l.Attn.(Recurrent); ok {
			conv, state := r.StateDims()
			rs, err := newRecState(conv, state, alloc, fmt.Sprintf("layer %d", i))
			if err != nil {
				return nil, err
			}
			lc.Rec = rs
			continue
		}
		kd, vd := l.Attn.CacheDims()
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

// Bytes returns the memory the cache holds: keys, values and recurrent states, not the
// states' snapshots (made as passes need them, up to MaxSnapshots a state).
func (kv *KVCache) Bytes() int64 {
	var n int64
	for _, l := range kv.Layers {
		n += int64(len(l.K)+len(l.V))*4 + int64(len(l.K16)+len(l.V16))*2
		if l.Rec != nil {
			n += int64(len(l.Rec.Conv)+len(l.Rec.S)) * 4
		}
	}
	return n
}

// kvPositions is the number of positions c holds.
func kvPositions(c *device.KVLayer) int {
	if c.F16 {
		return len(c.K16) / c.KDim
	}
	return len(c.K) / c.KDim
}

// putK stores the key rows of len(k)/KDim tokens from position pos0 on.
func putK(c *device.KVLayer, pos0 int, k []float32) {
	off := pos0 * c.KDim
	if c.F16 {
		toF16(c.K16[off:off+len(k)], k)
		return
	}
	copy(c.K[off:off+len(k)], k)
}

// putV stores the values of len(v)/VDim tokens from position pos0 on, transposed: value j
// of position p is at j*kvPositions(c)+p, so that attention reads each value's positions in
// order (llama.cpp's V cache without flash attention). Tokens go eight at a time, so that
// each value's row gets eight consecutive positions per write, from rows converted to F16
// beforehand with an F16 cache.
func putV(c *device.KVLayer, pos0 int, v []float32) {
	T, size, d := len(v)/c.VDim, kvPositions(c), c.VDim
	if !c.F16 {
		for t0 := 0; t0 < T; t0 += 8 {
			blk := v[t0*d : min(t0+8, T)*d]
			nt := len(blk) / d
			for j := 0; j < d; j++ {
				row := c.V[j*size+pos0+t0:][:nt]
				for t := range row {
					row[t] = blk[t*d+j]
				}
			}
		}
		return
	}
	s := attnScratchPool.Get().(*attnScratch)
	h := grow(&s.row16, min(T, 8)*d)
	for t0 := 0; t0 < T; t0 += 8 {
		blk := v[t0*d : min(t0+8, T)*d]
		nt := len(blk) / d
		toF16(h, blk)
		for j := 0; j < d; j++ {
			row := c.V16[j*size+pos0+t0:][:nt]
			for t := range row {
				row[t] = h[t*d+j]
			}
		}
	}
	attnScratchPool.Put(s)
}
