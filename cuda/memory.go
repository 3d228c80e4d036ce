package cuda

import (
	"fmt"
	"unsafe"
)

// DevicePtr is an address in device memory, a CUdeviceptr.
type DevicePtr uint64

// Add offsets p by n bytes.
func (p DevicePtr) Add(n int64) DevicePtr { return p + DevicePtr(n) }

// Flags of cuMemHostAlloc and cuMemHostRegister.
const (
	hostAllocPortable    = 0x01 // CU_MEMHOSTALLOC_PORTABLE: pinned for every context
	hostRegisterPortable = 0x01 // CU_MEMHOSTREGISTER_PORTABLE
	hostRegisterReadOnly = 0x08 // CU_MEMHOSTREGISTER_READ_ONLY: the GPU only reads it
)

type memorySyms struct {
	memAlloc, memFree, memHostAlloc, memFreeHost, memHostRegister, memHostUnregister uintptr
	memcpyHtoDAsync, memcpyDtoHAsync, memcpyDtoDAsync, memsetD8Async                 uintptr
}

func (s *memorySyms) table() []symbol {
	return []symbol{
		// CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
		{Name: "cuMemAlloc_v2", Addr: &s.memAlloc},
		// CUresult cuMemFree_v2(CUdeviceptr dptr);
		{Name: "cuMemFree_v2", Addr: &s.memFree},
		// CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
		{Name: "cuMemHostAlloc", Addr: &s.memHostAlloc},
		// CUresult cuMemFreeHost(void *p);
		{Name: "cuMemFreeHost", Addr: &s.memFreeHost},
		// CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
		{Name: "cuMemHostRegister_v2", Addr: &s.memHostRegister},
		// CUresult cuMemHostUnregister(void *p);
		{Name: "cuMemHostUnregister", Addr: &s.memHostUnregister},
		// CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
		{Name: "cuMemcpyHtoDAsync_v2", Addr: &s.memcpyHtoDAsync},
		// CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
		{Name: "cuMemcpyDtoHAsync_v2", Addr: &s.memcpyDtoHAsync},
		// CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
		{Name: "cuMemcpyDtoDAsync_v2", Addr: &s.memcpyDtoDAsync},
		// CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
		{Name: "cuMemsetD8Async", Addr: &s.memsetD8Async},
	}
}

// Alloc allocates n bytes of device memory.
func (c *Context) Alloc(n int64) (DevicePtr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("cuda:%d: allocation of %d bytes", c.dev.ordinal, n)
	}
	var p uint64
	if err := c.do("cuMemAlloc_v2", c.d.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n)); err != nil {
		return 0, fmt.Errorf("cuda:%d: allocating %d bytes: %w", c.dev.ordinal, n, err)
	}
	return DevicePtr(p), nil
}

// Free frees memory from Alloc.
func (c *Context) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	return c.do("cuMemFree_v2", c.d.memFree, uintptr(p))
}

// HostBuffer is page-locked (pinned) host memory from the driver: copies from it run at the
// link's full speed and truly asynchronously. Its bytes stay valid until Free.
type HostBuffer struct {
	c     *Context
	p     unsafe.Pointer
	Bytes []byte
}

// HostAlloc allocates n bytes of pinned host memory, usable by every context.
func (c *Context) HostAlloc(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cuda: pinned host allocation of %d bytes", n)
	}
	var p unsafe.Pointer
	if err := c.do("cuMemHostAlloc", c.d.memHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(n), hostAllocPortable); err != nil {
		return nil, fmt.Errorf("pinning %d bytes of host memory: %w", n, err)
	}
	return &HostBuffer{c: c, p: p, Bytes: unsafe.Slice((*byte)(p), n)}, nil
}

// Free returns the buffer to the driver. Its Bytes must not be used after.
func (b *HostBuffer) Free() error {
	if b.p == nil {
		return nil
	}
	err := b.c.do("cuMemFreeHost", b.c.d.memFreeHost, uintptr(b.p))
	b.p, b.Bytes = nil, nil
	return err
}

// Registration is host memory the driver has page-locked in place (cuMemHostRegister), such
// as the memory-mapped expert weights of a model file.
type Registration struct {
	c *Context
	p unsafe.Pointer
}

// Register page-locks b in place so that copies from it are asynchronous and at full speed.
// readOnly registers memory the GPU only reads, which read-only mappings (a model file
// mapped PROT_READ) require. b must stay mapped until Unregister.
func (c *Context) Register(b []byte, readOnly bool) (*Registration, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("cuda: registering an empty host range")
	}
	flags := uintptr(hostRegisterPortable)
	if readOnly {
		flags |= hostRegisterReadOnly
	}
	p := unsafe.Pointer(&b[0])
	if err := c.do("cuMemHostRegister_v2", c.d.memHostRegister, uintptr(p), uintptr(len(b)), flags); err != nil {
		return nil, fmt.Errorf("pinning %d bytes of host memory in place: %w", len(b), err)
	}
	return &Registration{c: c, p: p}, nil
}

// Unregister undoes Register.
func (r *Registration) Unregister() error {
	if r.p == nil {
		return nil
	}
	err := r.c.do("cuMemHostUnregister", r.c.d.memHostUnregister, uintptr(r.p))
	r.p = nil
	return err
}

// CopyHtoD enqueues a copy of src to device memory dst on the stream. With pinned src the
// call returns at once and src must stay unchanged until the copy is done (an event recorded
// after it has happened); with pageable src the driver stages it before returning.
func (s *Stream) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return s.c.do4("cuMemcpyHtoDAsync_v2", s.c.d.memcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), s.h)
}

// CopyDtoH enqueues a copy of device memory src to host dst on the stream. dst holds the
// bytes once the stream has reached the copy (Synchronize, or an event recorded after it).
func (s *Stream) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return s.c.do4("cuMemcpyDtoHAsync_v2", s.c.d.memcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), s.h)
}

// CopyDtoD enqueues a copy of n bytes between device addresses on the stream.
func (s *Stream) CopyDtoD(dst, src DevicePtr, n int64) error {
	if n <= 0 {
		return nil
	}
	return s.c.do4("cuMemcpyDtoDAsync_v2", s.c.d.memcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), s.h)
}

// Memset enqueues setting n bytes at p to v on the stream.
func (s *Stream) Memset(p DevicePtr, v byte, n int64) error {
	if n <= 0 {
		return nil
	}
	return s.c.do4("cuMemsetD8Async", s.c.d.memsetD8Async, uintptr(p), uintptr(v), uintptr(n), s.h)
}
