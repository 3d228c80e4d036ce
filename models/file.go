// Package models reads GGUF files and turns them into model descriptions the engine can run:
// hyper-parameters, weight handles into the memory-mapped file, and one small file per
// architecture that registers itself; Describe summarises a loaded model (Info: its shape,
// routing, parameters and bytes by tensor type). Models describe computation; they never
// decide where a tensor lives — the engine and package offload do.
package models

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"
	"syscall"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/quant"
)

// File is an opened GGUF file: its metadata, its tensors, and a read-only memory map of the
// whole file that the tensors' Data slices point into. Memory mapping (not copying) is what
// lets a file larger than RAM open, and it is how the host expert store sees expert weights.
type File struct {
	Path    string
	Size    int64
	KV      ggml.KV
	Tensors []*Tensor
	byName  map[string]*Tensor
	mapping []byte
}

// Open validates and memory-maps a GGUF file. Every tensor's type, shape and extent is checked
// here, so later code can slice Data without bounds surprises.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open model: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("open model %s: %w", path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("open model %s: is a directory", path)
	}
	size := st.Size()
	hdr, err := scanHeader(f, size)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	g, err := decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dataStart := alignUp(uint64(hdr.headerEnd), hdr.alignment)
	if g.Tensors().Offset != 0 && g.Tensors().Offset != dataStart {
		return nil, fmt.Errorf("%s: tensor data offset %d disagrees with header end %d", path, g.Tensors().Offset, dataStart)
	}
	mf := &File{Path: path, Size: size, KV: g.KV(), byName: map[string]*Tensor{}}
	for _, gt := range g.Tensors().Items() {
		t, err := newTensor(gt, dataStart, uint64(size), hdr.alignment)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if _, dup := mf.byName[t.Name]; dup {
			return nil, fmt.Errorf("%s: tensor %q appears twice", path, t.Name)
		}
		mf.byName[t.Name] = t
		mf.Tensors = append(mf.Tensors, t)
	}
	if size > 0 {
		mf.mapping, err = syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("memory-map %s: %w", path, err)
		}
	}
	for _, t := range mf.Tensors {
		t.Data = mf.mapping[t.start:t.end:t.end]
	}
	return mf, nil
}

// decode runs ollama's decoder, turning any panic on input it did not expect into an error:
// scanHeader has already bounded every length, so this is a last line of defence.
func decode(f *os.File) (g *ggml.GGML, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed GGUF: %v", r)
		}
	}()
	g, err = ggml.Decode(f, -1)
	if err != nil {
		return nil, fmt.Errorf("malformed GGUF: %w", err)
	}
	return g, nil
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

func newTensor(gt *ggml.Tensor, dataStart, fileSize, alignment uint64) (*Tensor, error) {
	typ := quant.Type(gt.Kind)
	if !typ.Known() || !typ.Weight() {
		return nil, fmt.Errorf("tensor %q has type %s, which commit-run does not support (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)", gt.Name, ggmlTypeName(gt.Kind))
	}
	if len(gt.Shape) == 0 || len(gt.Shape) > maxDims {
		return nil, fmt.Errorf("tensor %q has %d dimensions", gt.Name, len(gt.Shape))
	}
	t := &Tensor{Name: gt.Name, Type: typ}
	elems := uint64(1)
	for i, d := range gt.Shape {
		if d == 0 || d > math.MaxInt32 {
			return nil, fmt.Errorf("tensor %q: dimension %d is %d", gt.Name, i, d)
		}
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > 1<<50 {
			return nil, fmt.Errorf("tensor %q: shape %v is absurdly large", gt.Name, gt.Shape)
		}
		elems = lo
		t.Ne = append(t.Ne, int(d))
	}
	rowBytes, err := typ.RowBytes(t.Ne[0])
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", gt.Name, err)
	}
	nbytes := uint64(rowBytes) * (elems / uint64(t.Ne[0]))
	if gt.Offset%alignment != 0 {
		return nil, fmt.Errorf("tensor %q: data offset %d is not aligned to %d", gt.Name, gt.Offset, alignment)
	}
	start := dataStart + gt.Offset
	if start < dataStart || start > fileSize || nbytes > fileSize-start {
		return nil, fmt.Errorf("tensor %q: data [%d, %d) runs past the end of the file (%d bytes)", gt.Name, start, start+nbytes, fileSize)
	}
	t.start, t.end = int(start), int(start+nbytes)
	return t, nil
}

func ggmlTypeName(kind uint32) string {
	if quant.Type(kind).Known() {
		return quant.Type(kind).String()
	}
	return fmt.Sprintf("%s (ggml type %d)", ggml.TensorType(kind).String(), kind)
}

// Close unmaps the file. Tensor data must not be used afterwards.
func (f *File) Close() error {
	if f.mapping == nil {
		return nil
	}
	m := f.mapping
	f.mapping = nil
	for _, t := range f.Tensors {
		t.Data = nil
	}
	return syscall.Munmap(m)
}

// Tensor returns the named tensor or nil.
func (f *File) Tensor(name string) *Tensor { return f.byName[name] }

// Architecture returns general.architecture.
func (f *File) Architecture() string { return f.KV.String("general.architecture") }

// TensorNames returns the names sorted, for messages and inspection.
func (f *File) TensorNames() []string {
	names := make([]string, 0, len(f.Tensors))
	for _, t := range f.Tensors {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	return names
}

// ErrUnknownArchitecture is returned (wrapped) for a general.architecture nobody registered.
var ErrUnknownArchitecture = errors.New("unknown architecture")

// TensorInfo describes a tensor of a File built from metadata: its name, type and ggml shape
// (the row length first).
type TensorInfo struct {
	Name  string
	Type  quant.Type
	Shape []uint64
}

// virtualAlignment places the tensors of a virtual file as GGUF's default alignment does.
const virtualAlignment = 32

// NewVirtualFile is a File of metadata kv and tensors ts whose data is address space
// reserved with VirtualAlloc: a model of a public shape that nothing computes with (the
// engine's timing-only runs), however large. Its weights read as zeros and are never backed
// by memory; name stands in for the path in messages. The tensors are checked as Open checks
// a file's.
func NewVirtualFile(name string, kv ggml.KV, ts []TensorInfo) (*File, error) {
	var size uint64
	gts := make([]*ggml.Tensor, len(ts))
	for i, t := range ts {
		gts[i] = &ggml.Tensor{Name: t.Name, Kind: uint32(t.Type), Offset: size, Shape: t.Shape}
		if !t.Type.Known() || t.Type.BlockSize() == 0 || len(t.Shape) == 0 {
			continue // newTensor says what is wrong
		}
		n := uint64(t.Type.BlockBytes())
		for j, d := range t.Shape {
			if j == 0 {
				d /= uint64(t.Type.BlockSize())
			}
			hi, lo := bits.Mul64(n, d)
			if hi != 0 || lo > 1<<50 {
				return nil, fmt.Errorf("%s: tensor %q: shape %v is absurdly large", name, t.Name, t.Shape)
			}
			n = lo
		}
		size = alignUp(size+n, virtualAlignment)
	}
	mf := &File{Path: name, Size: int64(size), KV: kv, byName: map[string]*Tensor{}}
	for _, gt := range gts {
		t, err := newTensor(gt, 0, size, virtualAlignment)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if _, dup := mf.byName[t.Name]; dup {
			return nil, fmt.Errorf("%s: tensor %q appears twice", name, t.Name)
		}
		mf.byName[t.Name] = t
		mf.Tensors = append(mf.Tensors, t)
	}
	data, err := VirtualAlloc(int64(size), name+"'s weights")
	if err != nil {
		return nil, err
	}
	mf.mapping = data
	for _, t := range mf.Tensors {
		t.Data = mf.mapping[t.start:t.end:t.end]
	}
	return mf, nil
}
