package cuda

import "unsafe"

const streamNonBlocking = 0x1 // CU_STREAM_NON_BLOCKING: no implicit order with stream 0

type streamSyms struct {
	streamCreate, streamDestroy, streamSynchronize, streamWaitEvent uintptr
}

func (s *streamSyms) table() []symbol {
	return []symbol{
		// CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
		{Name: "cuStreamCreate", Addr: &s.streamCreate},
		// CUresult cuStreamDestroy_v2(CUstream hStream);
		{Name: "cuStreamDestroy_v2", Addr: &s.streamDestroy},
		// CUresult cuStreamSynchronize(CUstream hStream);
		{Name: "cuStreamSynchronize", Addr: &s.streamSynchronize},
		// CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
		{Name: "cuStreamWaitEvent", Addr: &s.streamWaitEvent},
	}
}

// Stream is an in-order queue of work on the device, a CUstream. The streams made here do
// not synchronise with the legacy default stream, so the copy stream and the compute stream
// overlap.
type Stream struct {
	c *Context
	h uintptr
}

// NewStream creates a stream in the context.
func (c *Context) NewStream() (*Stream, error) {
	var h uintptr
	if err := c.do("cuStreamCreate", c.d.streamCreate, uintptr(unsafe.Pointer(&h)), streamNonBlocking); err != nil {
		return nil, err
	}
	return &Stream{c: c, h: h}, nil
}

// Destroy releases the stream once its work is done.
func (s *Stream) Destroy() error {
	if s.h == 0 {
		return nil
	}
	err := s.c.do("cuStreamDestroy_v2", s.c.d.streamDestroy, s.h)
	s.h = 0
	return err
}

// Synchronize blocks until the stream's work is done.
func (s *Stream) Synchronize() error {
	return s.c.do1("cuStreamSynchronize", s.c.d.streamSynchronize, s.h)
}

// Wait makes the stream's later work wait for ev (recorded on any stream of the context).
func (s *Stream) Wait(ev *Event) error {
	return s.c.do3("cuStreamWaitEvent", s.c.d.streamWaitEvent, s.h, ev.h, 0)
}
