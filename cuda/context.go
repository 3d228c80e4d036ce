package cuda

import (
	"fmt"
	"sync"
	"unsafe"
)

type contextSyms struct {
	primaryCtxRetain, primaryCtxRelease, ctxSetCurrent, ctxSynchronize, memGetInfo uintptr
}

func (s *contextSyms) table() []symbol {
	return []symbol{
		// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
		{Name: "cuDevicePrimaryCtxRetain", Addr: &s.primaryCtxRetain},
		// CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
		{Name: "cuDevicePrimaryCtxRelease_v2", Addr: &s.primaryCtxRelease},
		// CUresult cuCtxSetCurrent(CUcontext ctx);
		{Name: "cuCtxSetCurrent", Addr: &s.ctxSetCurrent},
		// CUresult cuCtxSynchronize(void);
		{Name: "cuCtxSynchronize", Addr: &s.ctxSynchronize},
		// CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
		{Name: "cuMemGetInfo_v2", Addr: &s.memGetInfo},
	}
}

// Context is a device's primary context, the one the CUDA runtime and other libraries
// (NCCL, cuBLAS) share, so that memory and streams made here work with theirs. Its methods
// make it current on the calling thread themselves; it is safe for concurrent use.
type Context struct {
	d    *Driver
	dev  Device
	h    uintptr
	once sync.Once
}

// Retain retains the device's primary context. Release it when done.
func (dev Device) Retain() (*Context, error) {
	var h uintptr
	if err := dev.d.call("cuDevicePrimaryCtxRetain", dev.d.primaryCtxRetain, uintptr(unsafe.Pointer(&h)), uintptr(dev.h)); err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", dev.ordinal, err)
	}
	return &Context{d: dev.d, dev: dev, h: h}, nil
}

// Device is the context's device.
func (c *Context) Device() Device { return c.dev }

// Driver is the driver the context belongs to.
func (c *Context) Driver() *Driver { return c.d }

// Release releases the primary context; it is destroyed when its last user releases it. The
// context's memory, streams and modules must not be used after.
func (c *Context) Release() error {
	var err error
	c.once.Do(func() {
		err = c.d.call("cuDevicePrimaryCtxRelease_v2", c.d.primaryCtxRelease, uintptr(c.dev.h))
	})
	return err
}

// do runs one call with the context current. It allocates the arguments' slice; the calls a
// token makes take do1 .. do11.
//
//go:uintptrescapes
func (c *Context) do(name string, fn uintptr, args ...uintptr) error {
	return c.doArgs(name, fn, args)
}

// doArgs is do on arguments whose pointers, if any, the caller keeps alive.
func (c *Context) doArgs(name string, fn uintptr, args []uintptr) error {
	if err := c.d.current(c.h); err != nil {
		return err
	}
	defer unlock()
	return c.d.callArgs(name, fn, args)
}

// do1 .. do11 are do for that many arguments, allocating nothing (argArrays). Their
// arguments may be Go pointers converted in the call expression, as do's.
//
//go:uintptrescapes
func (c *Context) do1(name string, fn, a1 uintptr) error {
	a := argArrays.Get().(*[maxCallArgs]uintptr)
	a[0] = a1
	err := c.doArgs(name, fn, a[:1])
	argArrays.Put(a)
	return err
}

//go:uintptrescapes
func (c *Context) do2(name string, fn, a1, a2 uintptr) error {
	a := argArrays.Get().(*[maxCallArgs]uintptr)
	a[0], a[1] = a1, a2
	err := c.doArgs(name, fn, a[:2])
	argArrays.Put(a)
	return err
}

//go:uintptrescapes
func (c *Context) do3(name string, fn, a1, a2, a3 uintptr) error {
	a := argArrays.Get().(*[maxCallArgs]uintptr)
	a[0], a[1], a[2] = a1, a2, a3
	err := c.doArgs(name, fn, a[:3])
	argArrays.Put(a)
	return err
}

//go:uintptrescapes
func (c *Context) do4(name string, fn, a1, a2, a3, a4 uintptr) error {
	a := argArrays.Get().(*[maxCallArgs]uintptr)
	a[0], a[1], a[2], a[3] = a1, a2, a3, a4
	err := c.doArgs(name, fn, a[:4])
	argArrays.Put(a)
	return err
}

//go:uintptrescapes
func (c *Context) do11(name string, fn, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11 uintptr) error {
	a := argArrays.Get().(*[maxCallArgs]uintptr)
	*a = [maxCallArgs]uintptr{a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11}
	err := c.doArgs(name, fn, a[:11])
	argArrays.Put(a)
	return err
}

// Synchronize blocks until all of the context's work is done, and reports the first
// asynchronous error a kernel or copy raised.
func (c *Context) Synchronize() error {
	return c.do("cuCtxSynchronize", c.d.ctxSynchronize)
}

// MemInfo reports the device's free and total memory as the driver sees it now.
func (c *Context) MemInfo() (free, total int64, err error) {
	var f, t uint64
	if err := c.do("cuMemGetInfo_v2", c.d.memGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}
