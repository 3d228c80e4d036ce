package nccl

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/commit-run/commit-run/internal/dl"
	"github.com/ebitengine/purego"
)

// ErrNoLibrary reports that no NCCL library could be loaded: none is installed, or not one
// this binding can use.
var ErrNoLibrary = errors.New("no NCCL library found")

// DefaultLibraries are the names Load tries, in order, when it is given no path: the
// versioned soname first, as NVIDIA's packages install it.
var DefaultLibraries = []string{"libnccl.so.2", "libnccl.so"}

// symbol binds one C function of the library to a field holding its address (Optional: an
// older library may lack it; callers check the address).
type symbol = dl.Symbol

// Library is a loaded NCCL library with the addresses of the calls this package binds. Each
// file of the package binds one API area and lists its symbols beside their C prototypes. A
// Library is read-only after Load and safe for concurrent use.
type Library struct {
	path    string
	handle  uintptr
	version int

	librarySyms
	errorSyms
	commSyms
	p2pSyms
}

type librarySyms struct {
	getVersion uintptr
}

func (s *librarySyms) table() []symbol {
	return []symbol{
		// ncclResult_t ncclGetVersion(int *version);
		{Name: "ncclGetVersion", Addr: &s.getVersion},
	}
}

// Load opens the NCCL library at path (or, when path is empty, the first of DefaultLibraries
// the dynamic loader finds), binds its calls and reads its version. Without a library, or
// with one that lacks a required call, the error wraps ErrNoLibrary.
func Load(path string) (*Library, error) {
	names := DefaultLibraries
	if path != "" {
		names = []string{path}
	}
	handle, path, err := dl.Open(names)
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNoLibrary, err)
	}
	l := &Library{path: path, handle: handle}
	if missing := dl.Bind(handle, l.librarySyms.table(), l.errorSyms.table(), l.commSyms.table(), l.p2pSyms.table()); missing != "" {
		return nil, fmt.Errorf("%w: %s has no %s: it is not NCCL, or an NCCL older than 2.7", ErrNoLibrary, path, missing)
	}
	var v int32
	if err := l.call("ncclGetVersion", 0, l.getVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		purego.Dlclose(handle)
		return nil, err
	}
	l.version = int(v)
	return l, nil
}

// Path is the library Load opened.
func (l *Library) Path() string { return l.path }

// Version is the library's version as ncclGetVersion reports it, NCCL_VERSION_CODE:
// 10000*major + 100*minor + patch, e.g. 22304 for 2.23.4 (1000*major + 100*minor + patch
// before 2.9).
func (l *Library) Version() int { return l.version }

// VersionString is the version as "major.minor.patch", e.g. "2.23.4".
func (l *Library) VersionString() string {
	v := l.version
	if v >= 10000 {
		return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, v%1000/100, v%100)
}

// loaded refuses calls on a nil Library, so that a caller's missing Load is an error, not a
// panic.
func (l *Library) loaded(call string) error {
	if l == nil {
		return argError(call, "no NCCL library loaded")
	}
	return nil
}

// call calls a bound function and turns its ncclResult_t into an error naming the call, with
// the library's last error message about comm (0 when no communicator is at hand).
//
// The goroutine stays on its OS thread from the call to reading that message, since a
// message without a communicator is the calling thread's (a nested lock leaves a caller's
// own LockOSThread in force). The uintptr arguments may be Go pointers converted in the call
// expression: the directive keeps what they point to alive and on the heap until the call
// returns.
//
//go:uintptrescapes
func (l *Library) call(name string, comm, fn uintptr, args ...uintptr) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, _, _ := purego.SyscallN(fn, args...)
	if res := Result(int32(r)); res != Success {
		return l.newError(name, res, comm)
	}
	return nil
}
