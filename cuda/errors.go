package cuda

import (
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/internal/dl"
	"github.com/ebitengine/purego"
)

// Result is a CUresult, the status every driver call returns.
type Result int32

// The results this package acts on (cuda.h's CUresult values).
const (
	Success           Result = 0
	ErrInvalidValue   Result = 1
	ErrOutOfMemory    Result = 2
	ErrNotInitialized Result = 3
	ErrNoDevice       Result = 100
	ErrInvalidDevice  Result = 101
	ErrInvalidPTX     Result = 218
	ErrNotFound       Result = 500
	ErrNotReady       Result = 600
	// A stream in capture was asked for what a graph cannot hold (a synchronisation, a
	// copy of pageable memory), and its capture is now invalid.
	ErrCaptureUnsupported Result = 900
	ErrCaptureInvalidated Result = 901
)

type errorSyms struct {
	getErrorName, getErrorString uintptr
}

func (s *errorSyms) table() []symbol {
	return []symbol{
		// CUresult cuGetErrorName(CUresult error, const char **pStr);
		{Name: "cuGetErrorName", Addr: &s.getErrorName},
		// CUresult cuGetErrorString(CUresult error, const char **pStr);
		{Name: "cuGetErrorString", Addr: &s.getErrorString},
	}
}

// Error is a driver call that failed: which call, its CUresult and the driver's name and
// description of it.
type Error struct {
	Call   string // the driver function, e.g. "cuMemAlloc_v2"
	Result Result
	Name   string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc   string // e.g. "out of memory"
	Log    string // the JIT's error log, for module loads
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, int32(e.Result))
	if e.Desc != "" && e.Desc != e.Name {
		s += ": " + e.Desc
	}
	if e.Log != "" {
		s += "\n" + e.Log
	}
	return s
}

// Is makes errors.Is(err, ErrOutOfMemory) and the like work on wrapped errors.
func (e *Error) Is(target error) bool {
	r, ok := target.(Result)
	return ok && r == e.Result
}

// Error lets a Result be the target of errors.Is.
func (r Result) Error() string { return fmt.Sprintf("CUresult %d", int32(r)) }

// newError names res with the driver's own strings.
func (d *Driver) newError(call string, res Result) *Error {
	e := &Error{Call: call, Result: res, Name: fmt.Sprintf("CUresult %d", int32(res))}
	var p unsafe.Pointer
	if d.getErrorName != 0 {
		if r, _, _ := purego.SyscallN(d.getErrorName, uintptr(res), uintptr(unsafe.Pointer(&p))); r == 0 && p != nil {
			e.Name = dl.GoString(p)
		}
	}
	p = nil
	if d.getErrorString != 0 {
		if r, _, _ := purego.SyscallN(d.getErrorString, uintptr(res), uintptr(unsafe.Pointer(&p))); r == 0 && p != nil {
			e.Desc = dl.GoString(p)
		}
	}
	return e
}
