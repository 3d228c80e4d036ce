package models

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// Limits on what a GGUF header may declare. ollama's decoder trusts the lengths it reads and
// allocates them, so a corrupt header could ask for terabytes and kill the process with an
// out-of-memory error that no recover can catch. We walk the header first with these bounds
// and against the real file size, and only then hand the file to the decoder.
const (
	maxTensors    = 1 << 20
	maxKVs        = 1 << 16
	maxDims       = 4
	maxStringLen  = 1 << 26 // a chat template or a merge is far smaller
	maxArrayCount = 1 << 28
)

// headerSummary is what the bounds-checking walk learns on the way.
type headerSummary struct {
	version   uint32
	nTensors  uint64
	nKV       uint64
	headerEnd int64 // offset just after the last tensor info
	alignment uint64
}

// scanHeader walks a GGUF header with every length checked against size and the limits
// above. It returns a descriptive error for the first thing out of bounds.
func scanHeader(r io.ReaderAt, size int64) (*headerSummary, error) {
	s := &scanner{r: r, size: size}
	magic := s.bytes(4)
	if s.err != nil {
		return nil, fmt.Errorf("reading magic: %w", s.err)
	}
	if string(magic) != "GGUF" {
		return nil, fmt.Errorf("not a GGUF file: magic %q, want \"GGUF\"", magic)
	}
	h := &headerSummary{alignment: 32}
	h.version = s.u32()
	if s.err == nil && (h.version < 2 || h.version > 3) {
		return nil, fmt.Errorf("unsupported GGUF version %d (want 2 or 3)", h.version)
	}
	h.nTensors = s.u64()
	h.nKV = s.u64()
	if s.err != nil {
		return nil, fmt.Errorf("reading header counts: %w", s.err)
	}
	if h.nTensors > maxTensors {
		return nil, fmt.Errorf("header declares %d tensors (limit %d)", h.nTensors, maxTensors)
	}
	if h.nKV > maxKVs {
		return nil, fmt.Errorf("header declares %d metadata keys (limit %d)", h.nKV, maxKVs)
	}
	for i := uint64(0); i < h.nKV; i++ {
		key := s.str()
		if s.err != nil {
			return nil, fmt.Errorf("metadata key %d: %w", i, s.err)
		}
		typ := s.u32()
		if key == "general.alignment" && typ == ggufU32 {
			h.alignment = uint64(s.u32())
			if h.alignment == 0 || h.alignment&(h.alignment-1) != 0 {
				return nil, fmt.Errorf("general.alignment %d is not a power of two", h.alignment)
			}
		} else {
			s.value(typ, 0)
		}
		if s.err != nil {
			return nil, fmt.Errorf("metadata %q: %w", key, s.err)
		}
	}
	for i := uint64(0); i < h.nTensors; i++ {
		name := s.str()
		nd := s.u32()
		if s.err != nil {
			return nil, fmt.Errorf("tensor info %d: %w", i, s.err)
		}
		if nd == 0 || nd > maxDims {
			return nil, fmt.Errorf("tensor %q has %d dimensions (want 1 to %d)", name, nd, maxDims)
		}
		for d := uint32(0); d < nd; d++ {
			s.u64()
		}
		s.u32() // type, checked after decoding
		s.u64() // offset, checked after decoding
		if s.err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, s.err)
		}
	}
	h.headerEnd = s.off
	return h, nil
}

const (
	ggufU8 uint32 = iota
	ggufI8
	ggufU16
	ggufI16
	ggufU32
	ggufI32
	ggufF32
	ggufBool
	ggufString
	ggufArray
	ggufU64
	ggufI64
	ggufF64
)

var errTruncated = errors.New("file ends inside the header (truncated?)")

type scanner struct {
	r    io.ReaderAt
	size int64
	off  int64
	err  error
	buf  [8]byte
}

func (s *scanner) need(n uint64) bool {
	if s.err != nil {
		return false
	}
	if n > uint64(s.size-s.off) {
		s.err = errTruncated
		return false
	}
	return true
}

func (s *scanner) bytes(n int) []byte {
	if !s.need(uint64(n)) {
		return nil
	}
	b := make([]byte, n)
	if _, err := s.r.ReadAt(b, s.off); err != nil {
		s.err = err
		return nil
	}
	s.off += int64(n)
	return b
}

func (s *scanner) fixed(n int) []byte {
	if !s.need(uint64(n)) {
		return s.buf[:n]
	}
	if _, err := s.r.ReadAt(s.buf[:n], s.off); err != nil {
		s.err = err
	}
	s.off += int64(n)
	return s.buf[:n]
}

func (s *scanner) u32() uint32 { return binary.LittleEndian.Uint32(s.fixed(4)) }
func (s *scanner) u64() uint64 { return binary.LittleEndian.Uint64(s.fixed(8)) }

func (s *scanner) skip(n uint64) {
	if s.need(n) {
		s.off += int64(n)
	}
}

func (s *scanner) str() string {
	n := s.u64()
	if s.err != nil {
		return ""
	}
	if n > maxStringLen {
		s.err = fmt.Errorf("string of %d bytes (limit %d)", n, maxStringLen)
		return ""
	}
	return string(s.bytes(int(n)))
}

var scalarSize = map[uint32]uint64{
	ggufU8: 1, ggufI8: 1, ggufBool: 1, ggufU16: 2, ggufI16: 2, ggufU32: 4, ggufI32: 4,
	ggufF32: 4, ggufU64: 8, ggufI64: 8, ggufF64: 8,
}

func (s *scanner) value(typ uint32, depth int) {
	if sz, ok := scalarSize[typ]; ok {
		s.skip(sz)
		return
	}
	switch typ {
	case ggufString:
		n := s.u64()
		if s.err == nil && n > maxStringLen {
			s.err = fmt.Errorf("string of %d bytes (limit %d)", n, maxStringLen)
			return
		}
		s.skip(n)
	case ggufArray:
		if depth > 0 {
			s.err = errors.New("nested arrays are not supported")
			return
		}
		et := s.u32()
		n := s.u64()
		if s.err != nil {
			return
		}
		if n > maxArrayCount {
			s.err = fmt.Errorf("array of %d elements (limit %d)", n, maxArrayCount)
			return
		}
		if sz, ok := scalarSize[et]; ok {
			if n > math.MaxUint64/sz {
				s.err = fmt.Errorf("array of %d elements overflows", n)
				return
			}
			s.skip(n * sz)
			return
		}
		if et != ggufString {
			s.err = fmt.Errorf("array of unknown element type %d", et)
			return
		}
		for i := uint64(0); i < n && s.err == nil; i++ {
			s.value(ggufString, depth+1)
		}
	default:
		s.err = fmt.Errorf("unknown value type %d", typ)
	}
}
