package cuda

import "errors"

// What libraries that work beside the engine on a GPU's device (NCCL) need of it: the
// context to make current, and the raw handles they enqueue on.

// Context is the GPU's context (the device's primary context, which the CUDA runtime of a
// library such as NCCL shares).
func (g *GPU) Context() *Context { return g.ctx }

// Handle is the CUstream, for a library that enqueues work on the stream.
func (s *Stream) Handle() uintptr { return s.h }

// Do runs fn on a locked OS thread with the context current. Calls into another library that
// keep state per thread (NCCL's group calls) or that work on the current device go inside
// one Do.
func (c *Context) Do(fn func() error) error {
	if err := c.d.current(c.h); err != nil {
		return err
	}
	defer unlock()
	return fn()
}

// DeviceBuffer is device memory that is not mapped into the host's address space: a staging
// area that another library reads and writes (NCCL's send and receive buffers). Its size
// counts against the GPU's budget.
type DeviceBuffer struct {
	g    *GPU
	Ptr  DevicePtr
	Size int64
}

// DeviceBuffer allocates n bytes of device memory against the budget; what names it in an
// out-of-memory error.
func (g *GPU) DeviceBuffer(n int64, what string) (*DeviceBuffer, error) {
	if n <= 0 {
		return nil, errors.New("cuda: a device buffer of no bytes")
	}
	if err := g.mem.Alloc(n, what); err != nil {
		return nil, err
	}
	p, err := g.ctx.Alloc(n)
	if err != nil {
		g.mem.Free(n)
		return nil, err
	}
	return &DeviceBuffer{g: g, Ptr: p, Size: n}, nil
}

// Free returns the buffer's memory to the device and the budget.
func (b *DeviceBuffer) Free() error {
	if b == nil || b.Ptr == 0 {
		return nil
	}
	err := b.g.ctx.Free(b.Ptr)
	b.g.mem.Free(b.Size)
	b.Ptr, b.Size = 0, 0
	return err
}
