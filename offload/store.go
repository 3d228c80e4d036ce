package offload

import (
	"fmt"
	"slices"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// ExpertWeights are one routed expert's three matrices, as the SwiGLU block reads them.
type ExpertWeights struct {
	Gate, Up, Down quant.Matrix
}

// Bytes is the size of the expert's weights.
func (w ExpertWeights) Bytes() int64 {
	return int64(len(w.Gate.Data) + len(w.Up.Data) + len(w.Down.Data))
}

// regionAlign aligns each matrix inside an expert's region. Device kernels read rows with wide
// loads, and 256 bytes is what cudaMalloc guarantees for its own allocations, so a slot buffer
// filled by one contiguous copy keeps every matrix as aligned as a separate allocation would be.
const regionAlign = 256

// Layout is where an expert's matrices sit inside its region: the same for every expert of a
// layer, since the three tensors hold all experts in one type each.
type Layout struct {
	Gate, Up, Down matrixSpan
	Bytes          int64 // region size, padding included
}

type matrixSpan struct {
	Type       quant.Type
	Rows, Cols int
	Off, Len   int64
}

func (s matrixSpan) view(region []byte) quant.Matrix {
	return quant.Matrix{Type: s.Type, Rows: s.Rows, Cols: s.Cols, Data: region[s.Off : s.Off+s.Len : s.Off+s.Len]}
}

// View reads a region laid out by l (in the store, or a device slot it was copied into) as
// the expert's matrices.
func (l *Layout) View(region []byte) ExpertWeights {
	return ExpertWeights{Gate: l.Gate.view(region), Up: l.Up.view(region), Down: l.Down.view(region)}
}

// Store is the host side of offloading: every routed expert of a model in one contiguous
// region of host memory (gate, up and down rows as in the file, quantized as in the file), so
// that loading an expert onto the device is a single copy into a slot, and the whole store can
// be pinned (registered with the driver) at once.
type Store struct {
	layers   map[int]*layerStore // by block index
	order    []int               // MoE block indices, ascending
	buf      []byte
	slot     int64 // the largest region: the size of a device slot
	zeroCopy bool
	reserved bool      // buf is address space that nothing backs (StoreOptions.Reserved)
	views    fileViews // zero-copy mode only
}

type layerStore struct {
	layout  Layout
	experts int
	off     int64 // of expert 0 in buf
}

// StoreOptions configure NewStore.
type StoreOptions struct {
	// Alloc provides the host memory the experts are copied into (a device can return pinned
	// memory here); nil uses the Go heap. It must return exactly n bytes.
	Alloc func(n int64) ([]byte, error)
	// ZeroCopy serves experts straight from the model file's memory map instead of copying
	// them, for devices that read host memory anyway (cpu, sim). Alloc is then unused.
	ZeroCopy bool
	// Reserved makes the store address space that nothing backs, with nothing copied into it
	// (models.VirtualAlloc): the store of a timing-only run, whose copies move no bytes but
	// have their sizes. Close gives it back.
	Reserved bool
}

// NewStore gathers the routed experts of m. Layers without routed experts (dense layers,
// DeepSeek's leading ones) are not in the store: their weights stay resident.
func NewStore(m *models.Model, opts StoreOptions) (*Store, error) {
	s := &Store{layers: map[int]*layerStore{}, zeroCopy: opts.ZeroCopy}
	var total int64
	for i := range m.Layers {
		moe := m.Layers[i].MoE
		if moe == nil {
			continue
		}
		l, err := layoutOf(moe)
		if err != nil {
			return nil, fmt.Errorf("expert store: layer %d: %w", i, err)
		}
		s.layers[i] = &layerStore{layout: l, experts: moe.Experts, off: total}
		s.order = append(s.order, i)
		s.slot = max(s.slot, l.Bytes)
		total += l.Bytes * int64(moe.Experts)
	}
	if len(s.order) == 0 {
		return nil, fmt.Errorf("expert store: the model has no routed experts")
	}
	if opts.ZeroCopy {
		return s, s.linkFile(m)
	}
	alloc := opts.Alloc
	if opts.Reserved {
		alloc = func(n int64) ([]byte, error) { return models.VirtualAlloc(n, "the expert store") }
	} else if alloc == nil {
		alloc = func(n int64) ([]byte, error) { return make([]byte, n), nil }
	}
	buf, err := alloc(total)
	if err != nil {
		return nil, fmt.Errorf("expert store: allocate %d bytes of host memory: %w", total, err)
	}
	if int64(len(buf)) != total {
		return nil, fmt.Errorf("expert store: allocator returned %d bytes, asked for %d", len(buf), total)
	}
	s.buf = buf
	if opts.Reserved {
		s.reserved = true
		return s, nil
	}
	for _, i := range s.order {
		ls, moe := s.layers[i], m.Layers[i].MoE
		for e := 0; e < moe.Experts; e++ {
			region := buf[ls.off+int64(e)*ls.layout.Bytes : ls.off+int64(e+1)*ls.layout.Bytes]
			copy(region[ls.layout.Gate.Off:], moe.GateExps.Expert(e).Data)
			copy(region[ls.layout.Up.Off:], moe.UpExps.Expert(e).Data)
			copy(region[ls.layout.Down.Off:], moe.DownExps.Expert(e).Data)
		}
	}
	return s, nil
}

// fileViews keeps, in zero-copy mode, the experts' matrices as views of the memory map.
type fileViews map[ExpertKey]ExpertWeights

func (s *Store) linkFile(m *models.Model) error {
	views := fileViews{}
	for _, i := range s.order {
		moe := m.Layers[i].MoE
		for e := 0; e < moe.Experts; e++ {
			views[ExpertKey{i, e}] = ExpertWeights{Gate: moe.GateExps.Expert(e), Up: moe.UpExps.Expert(e), Down: moe.DownExps.Expert(e)}
		}
	}
	s.views = views
	return nil
}

func layoutOf(moe *models.MoE) (Layout, error) {
	var l Layout
	spans := []*matrixSpan{&l.Gate, &l.Up, &l.Down}
	for j, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
		if t == nil || t.Experts() != moe.Experts {
			return Layout{}, fmt.Errorf("expert tensors do not hold %d experts", moe.Experts)
		}
		m := t.Expert(0)
		*spans[j] = matrixSpan{Type: m.Type, Rows: m.Rows, Cols: m.Cols, Off: l.Bytes, Len: int64(len(m.Data))}
		l.Bytes += (int64(len(m.Data)) + regionAlign - 1) / regionAlign * regionAlign
	}
	return l, nil
}

// Layers returns the block indices of the MoE layers, ascending.
func (s *Store) Layers() []int { return slices.Clone(s.order) }

// Experts is the number of routed experts of MoE layer layer (0 if it has none).
func (s *Store) Experts(layer int) int {
	if ls := s.layers[layer]; ls != nil {
		return ls.experts
	}
	return 0
}

// SlotBytes is the size of one device slot: the largest expert region.
func (s *Store) SlotBytes() int64 { return s.slot }

// Bytes is the host memory the store holds (0 in zero-copy mode).
func (s *Store) Bytes() int64 { return int64(len(s.buf)) }

// Layout is the region layout of layer's experts.
func (s *Store) Layout(layer int) (*Layout, error) {
	ls := s.layers[layer]
	if ls == nil {
		return nil, fmt.Errorf("expert store: layer %d has no routed experts", layer)
	}
	return &ls.layout, nil
}

// Close gives back a Reserved store's address space; the store is unusable afterwards.
func (s *Store) Close() {
	if s.reserved {
		models.VirtualFree(s.buf)
		s.buf, s.reserved = nil, false
	}
}

// Region is the host bytes of expert k, ready for one copy into a slot. In zero-copy mode
// there is no single region and Region returns nil.
func (s *Store) Region(k ExpertKey) ([]byte, error) {
	ls, err := s.check(k)
	if err != nil || s.zeroCopy {
		return nil, err
	}
	off := ls.off + int64(k.Expert)*ls.layout.Bytes
	return s.buf[off : off+ls.layout.Bytes : off+ls.layout.Bytes], nil
}

// Expert is expert k's weights in host memory.
func (s *Store) Expert(k ExpertKey) (ExpertWeights, error) {
	ls, err := s.check(k)
	if err != nil {
		return ExpertWeights{}, err
	}
	if s.zeroCopy {
		return s.views[k], nil
	}
	r, _ := s.Region(k)
	return ls.layout.View(r), nil
}

func (s *Store) check(k ExpertKey) (*layerStore, error) {
	ls := s.layers[k.Layer]
	if ls == nil {
		return nil, fmt.Errorf("expert store: %v: layer %d has no routed experts", k, k.Layer)
	}
	if k.Expert < 0 || k.Expert >= ls.experts {
		return nil, fmt.Errorf("expert store: %v: layer %d has %d experts", k, k.Layer, ls.experts)
	}
	return ls, nil
}
