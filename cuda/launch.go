package cuda

import (
	"fmt"
	"math"
	"unsafe"
)

type launchSyms struct {
	launchKernel uintptr
}

func (s *launchSyms) table() []symbol {
	return []symbol{
		// CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
		//     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes,
		//     CUstream hStream, void **kernelParams, void **extra);
		{Name: "cuLaunchKernel", Addr: &s.launchKernel},
	}
}

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z int }

// maxArgs bounds a kernel's parameters; ours take 30 at most (rope_kv_f32).
const maxArgs = 32

// Args are a kernel's arguments in the order of its C parameters. Each is stored in its own
// 8-byte slot, low bytes first, which is how a 4-byte int or float parameter is read on the
// little-endian machines CUDA runs on. An Args can be reset and reused, so a launch on the
// hot path allocates nothing.
type Args struct {
	vals [maxArgs]uint64
	ptrs [maxArgs]unsafe.Pointer
	n    int
	err  error
}

// Reset empties the arguments for reuse.
func (a *Args) Reset() *Args { a.n, a.err = 0, nil; return a }

func (a *Args) put(v uint64) *Args {
	if a.n == maxArgs {
		a.err = fmt.Errorf("cuda: more than %d kernel arguments", maxArgs)
		return a
	}
	a.vals[a.n] = v
	a.n++
	return a
}

// Ptr appends a device pointer (a T* parameter).
func (a *Args) Ptr(p DevicePtr) *Args { return a.put(uint64(p)) }

// Int appends an int parameter.
func (a *Args) Int(v int) *Args {
	if v < math.MinInt32 || v > math.MaxInt32 {
		a.err = fmt.Errorf("cuda: kernel argument %d does not fit an int", v)
	}
	return a.put(uint64(uint32(int32(v))))
}

// Int64 appends a long long parameter.
func (a *Args) Int64(v int64) *Args { return a.put(uint64(v)) }

// Float appends a float parameter.
func (a *Args) Float(v float32) *Args { return a.put(uint64(math.Float32bits(v))) }

// Float64 appends a double parameter.
func (a *Args) Float64(v float64) *Args { return a.put(math.Float64bits(v)) }

// Len is the number of arguments appended.
func (a *Args) Len() int { return a.n }

// Launch enqueues f on the stream over grid blocks of block threads with shared bytes of
// dynamic shared memory.
func (s *Stream) Launch(f *Function, grid, block Dim3, shared int, a *Args) error {
	if a.err != nil {
		return fmt.Errorf("kernel %s: %w", f.Name, a.err)
	}
	grid, block = grid.norm(), block.norm()
	for i := 0; i < a.n; i++ {
		a.ptrs[i] = unsafe.Pointer(&a.vals[i])
	}
	// The pointer is converted in the call expression so that do11's uintptrescapes keeps a on
	// the heap: the parameter array holds pointers into a itself.
	err := s.c.do11("cuLaunchKernel", s.c.d.launchKernel, f.h,
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z), uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(shared), s.h, uintptr(unsafe.Pointer(&a.ptrs[0])), 0)
	if err != nil {
		return fmt.Errorf("kernel %s grid %v block %v: %w", f.Name, grid, block, err)
	}
	return nil
}

// norm treats unset dimensions as 1.
func (d Dim3) norm() Dim3 {
	return Dim3{max(d.X, 1), max(d.Y, 1), max(d.Z, 1)}
}
