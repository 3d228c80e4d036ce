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
	// Win says which positions a sliding-window layer's ring (KVLayer.Ring) holds; nil for
	// the layers that hold every position.
	Win *Ring
}

// Alloc returns n bytes for what; NewKVCache takes it so that the engine decides where a
// cache lives.
type Alloc func(n int64, what string) ([]byte, error)

// HostAlloc allocates in host memory.
func HostAlloc(n int64, _ string) ([]byte, error) { return make([]byte, n), nil }

// KVOptions says what a KV cache holds.
type KVOptions struct {
	// Positions is the context length.
	Positions int
	// MaxPass bounds the tokens of one sequence in a pass. A sliding-window layer whose window
	// and passes fit a ring of fewer slots than Positions keeps that ring (RingPeriod); 0
	// keeps every position of every layer.
	MaxPass int
	// F16 stores keys and values as IEEE halves rather than floats.
	F16 bool
}

// layout returns the positions layer attention a keeps and its ring's period (0: none).
func (o KVOptions) layout(a Attention) (positions, ring int) {
	if r := RingPeriod(SlidingWindow(a), o.Positions, o.MaxPass); r > 0 {
		return 2 * r, r
	}
	return o.Positions, 0
}

// elem is the bytes of a cached value.
func (o KVOptions) elem() int64 {
	if o.F16 {
		return 2
	}
	return 4
}

// NewKVCache allocates a cache for m with alloc.
func NewKVCache(m *Model, o KVOptions, alloc Alloc) (*KVCache, error) {
	if o.Positions <= 0 {
		return nil, fmt.Errorf("KV cache of %d positions", o.Positions)
	}
	if o.MaxPass < 0 {
		return nil, fmt.Errorf("KV cache for passes of %d tokens", o.MaxPass)
	}
	kv := &KVCache{Size: o.Positions, Layers: make([]LayerCache, len(m.Layers))}
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
		n, ring := o.layout(l.Attn)
		lc.KDim, lc.VDim, lc.F16, lc.Ring = kd, vd, o.F16, ring
		var kb, vb []byte
		var err error
		if kb, err = alloc(int64(n*kd)*o.elem(), fmt.Sprintf("layer %d's key cache", i)); err != nil {
			return nil, err
		}
		if vd > 0 {
			if vb, err = alloc(int64(n*vd)*o.elem(), fmt.Sprintf("layer %d's value cache", i)); err != nil {
				return nil, err
			}
		}
		if o.F16 {
			lc.K16, lc.V16 = bytesAs[uint16](kb), bytesAs[uint16](vb)
		} else {
			lc.K, lc.V = bytesAs[float32](kb), bytesAs[float32](vb)
		}
		if ring > 0 {
			lc.Win = &Ring{Window: SlidingWindow(l.Attn), MaxPass: o.MaxPass, alloc: alloc, what: fmt.Sprintf("layer %d", i)}
		}
	}
	return kv, nil
}

// CacheBytes is the memory NewKVCache(m, o, ...) takes, with snaps snapshots of each
// recurrent state and each ring beside it (MaxSnapshots at most), as the engine reserves
// them where passes run in a device's memory.
func CacheBytes(m *Model, o KVOptions, snaps int) int64 {
	states := int64(1 + min(max(snaps, 0), MaxSnapshots))
	var n int64
	for _, l := range m.Layers {
		if r, ok := l.Attn.(Recurrent); ok {
			// A recurrent layer's state instead, whatever the context.
			conv, state := r.StateDims()
			n += states * int64(conv+state) * 4
			continue
		}
		kd, vd := l.Attn.CacheDims()
		pos, ring := o.layout(l.Attn)
		b := int64(kd+vd) * int64(pos) * o.elem()
		if ring > 0 {
			b *= states
		}
		n += b
	}
	return n
}

// Buffers returns every allocation of the cache (keys, values, recurrent states, rings'
// and states' snapshots), for its owner to give back.
func (kv *KVCache) Buffers() [][]byte {
	var bufs [][]byte
	for i := range kv.Layers {
		l := &kv.Layers[i]
		for _, b := range [][]byte{bytesOf(l.K), bytesOf(l.V), bytesOf(l.K16), bytesOf(l.V16)} {
			if len(b) > 0 {
				bufs = append(bufs, b)
			}
		}
		if l.Rec != nil {
			bufs = append(bufs, l.Rec.bufs...)
		}
		if l.Win != nil {
			bufs = append(bufs, l.Win.bufs...)
		}
	}
	return bufs
}

// bytesOf views a slice of values as its bytes.
func bytesOf[T float32 | uint16](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
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

// kvPositions is the number of slots c has: its positions, or twice a ring's period.
func kvPositions(c *device.KVLayer) int {
	if c.F16 {
		return len(c.K16) / c.KDim
	}
	return len(c.K) / c.KDim
}

// ringRun returns the slot of position p and how many of the n positions from p on follow
// it in consecutive slots: all of them, or those before a ring wraps.
func ringRun(c *device.KVLayer, p, n int) (slot, run int) {
	if c.Ring <= 0 {
		return p, n
	}
	slot = p % c.Ring
	return slot, min(n, c.Ring-slot)
}

// putK stores the key rows of len(k)/KDim tokens from position pos0 on: a ring's at both of
// their slots (device.KVLayer).
func putK(c *device.KVLayer, pos0 int, k []float32) { putRuns(c, pos0, c.KDim, k, putKAt) }

// putRuns stores the rows of dim values of len(x)/dim tokens from position pos0 on with put
// (putKAt, putVAt), in runs of consecutive slots: a ring's at both of their slots.
func putRuns(c *device.KVLayer, pos0, dim int, x []float32, put func(*device.KVLayer, int, []float32)) {
	T := len(x) / dim
	for t := 0; t < T; {
		slot, n := ringRun(c, pos0+t, T-t)
		rows := x[t*dim : (t+n)*dim]
		put(c, slot, rows)
		if c.Ring > 0 {
			put(c, slot+c.Ring, rows)
		}
		t += n
	}
}

// putKAt stores key rows from slot slot on.
func putKAt(c *device.KVLayer, slot int, k []float32) {
	off := slot * c.KDim
	if c.F16 {
		toF16(c.K16[off:off+len(k)], k)
		return
	}
	copy(c.K[off:off+len(k)], k)
}

// putV stores the values of len(v)/VDim tokens from position pos0 on, transposed: value j
// of the position at slot s is at j*kvPositions(c)+s, so that attention reads each value's
// positions in order (llama.cpp's V cache without flash attention); a ring's at both of
// their slots.
func putV(c *device.KVLayer, pos0 int, v []float32) { putRuns(c, pos0, c.VDim, v, putVAt) }

// putVAt stores values transposed from slot slot on. Tokens go eight at a time, so that
// each value's row gets eight consecutive positions per write, from rows converted to F16
// beforehand with an F16 cache.
func putVAt(c *device.KVLayer, slot int, v []float32) {
	T, size, d := len(v)/c.VDim, kvPositions(c), c.VDim
	if !c.F16 {
		for t0 := 0; t0 < T; t0 += 8 {
			blk := v[t0*d : min(t0+8, T)*d]
			nt := len(blk) / d
			for j := 0; j < d; j++ {
				row := c.V[j*size+slot+t0:][:nt]
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
			row := c.V16[j*size+slot+t0:][:nt]
			for t := range row {
				row[t] = h[t*d+j]
			}
		}
	}
	attnScratchPool.Put(s)
}
