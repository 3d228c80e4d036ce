package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/commit-run/commit-run/internal/dl"
	"github.com/ebitengine/purego"
)

// ErrNoDriver reports that no CUDA driver library could be loaded: the machine has no NVIDIA
// driver, or not one this binary can use.
var ErrNoDriver = errors.New("no CUDA driver found")

// DefaultLibraries are the names Load tries, in order, when it is given no path: the
// driver's versioned soname first, as the NVIDIA installer guarantees it.
var DefaultLibraries = []string{"libcuda.so.1", "libcuda.so"}

// symbol binds one C function of the driver to a field holding its address (Optional: a
// newer or older driver may lack it; callers check the address).
type symbol = dl.Symbol

// Driver is the loaded CUDA driver library, libcuda, with the addresses of the calls this
// package binds. Each file of the package binds one API area and lists its symbols beside
// their C prototypes. A Driver is safe for concurrent use.
type Driver struct {
	path    string
	handle  uintptr
	version int

	initSyms
	errorSyms
	deviceSyms
	contextSyms
	memorySyms
	streamSyms
	eventSyms
	moduleSyms
	launchSyms
	graphSyms
}

// Load opens the CUDA driver library at path (or, when path is empty, the first of
// DefaultLibraries the dynamic loader finds), binds its calls and initialises it with cuInit.
// Without a driver the error wraps ErrNoDriver.
func Load(path string) (*Driver, error) {
	names := DefaultLibraries
	if path != "" {
		names = []string{path}
	}
	handle, path, err := dl.Open(names)
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNoDriver, err)
	}
	d := &Driver{path: path, handle: handle}
	if missing := dl.Bind(handle, d.initSyms.table(), d.errorSyms.table(), d.deviceSyms.table(), d.contextSyms.table(),
		d.memorySyms.table(), d.streamSyms.table(), d.eventSyms.table(), d.moduleSyms.table(), d.launchSyms.table(), d.graphSyms.table()); missing != "" {
		return nil, fmt.Errorf("%w: %s has no %s: the driver is too old or not NVIDIA's", ErrNoDriver, path, missing)
	}
	if err := d.init(); err != nil {
		purego.Dlclose(handle)
		return nil, err
	}
	return d, nil
}

// Path is the library Load opened.
func (d *Driver) Path() string { return d.path }

// Version is the driver's CUDA version as cuDriverGetVersion reports it: 1000*major +
// 10*minor, e.g. 13000 for CUDA 13.0.
func (d *Driver) Version() int { return d.version }

// call calls a bound driver function and turns its CUresult into an error naming the call.
// The uintptr arguments may be Go pointers converted in the call expression: the directive
// keeps what they point to alive and on the heap until the call returns. The arguments'
// slice is made on the heap for each call; the calls of a token (launches, copies, events)
// take Context.do1 .. do11, which allocate nothing.
//
//go:uintptrescapes
func (d *Driver) call(name string, fn uintptr, args ...uintptr) error {
	return d.callArgs(name, fn, args)
}

// callArgs is call on arguments whose pointers, if any, the caller keeps alive (its own
// uintptrescapes parameters).
func (d *Driver) callArgs(name string, fn uintptr, args []uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	if res := Result(int32(r)); res != Success {
		return d.newError(name, res)
	}
	return nil
}

// argArrays hold the arguments of the calls that allocate nothing: purego.SyscallN's
// parameters escape, so that arguments in a new slice, or in one on the stack, would be
// allocated on the heap at every call.
var argArrays = sync.Pool{New: func() any { return new([maxCallArgs]uintptr) }}

// maxCallArgs is the most arguments of a driver call (cuLaunchKernel's 11).
const maxCallArgs = 11

// current makes ctx the calling thread's context and locks the goroutine to the thread until
// unlock is called. Every call that works in a context goes through it: Go moves goroutines
// between threads, and a CUDA context is current per thread.
func (d *Driver) current(ctx uintptr) error {
	runtime.LockOSThread()
	a := argArrays.Get().(*[maxCallArgs]uintptr)
	a[0] = ctx
	err := d.callArgs("cuCtxSetCurrent", d.ctxSetCurrent, a[:1])
	argArrays.Put(a)
	if err != nil {
		runtime.UnlockOSThread()
	}
	return err
}

// unlock ends what current began.
func unlock() { runtime.UnlockOSThread() }
