package cuda

import (
	"errors"
	"unsafe"
)

// Flags of cuEventCreate.
const (
	eventDisableTiming = 0x2 // CU_EVENT_DISABLE_TIMING: cheaper events for ordering only
)

type eventSyms struct {
	eventCreate, eventDestroy, eventRecord, eventSynchronize, eventQuery, eventElapsedTime uintptr
}

func (s *eventSyms) table() []symbol {
	return []symbol{
		// CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
		{Name: "cuEventCreate", Addr: &s.eventCreate},
		// CUresult cuEventDestroy_v2(CUevent hEvent);
		{Name: "cuEventDestroy_v2", Addr: &s.eventDestroy},
		// CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
		{Name: "cuEventRecord", Addr: &s.eventRecord},
		// CUresult cuEventSynchronize(CUevent hEvent);
		{Name: "cuEventSynchronize", Addr: &s.eventSynchronize},
		// CUresult cuEventQuery(CUevent hEvent);
		{Name: "cuEventQuery", Addr: &s.eventQuery},
		// CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
		{Name: "cuEventElapsedTime", Addr: &s.eventElapsedTime},
	}
}

// Event marks a point in a stream's work, a CUevent.
type Event struct {
	c *Context
	h uintptr
}

// NewEvent creates an event; timing events can measure the time between two of them.
func (c *Context) NewEvent(timing bool) (*Event, error) {
	var flags uintptr
	if !timing {
		flags = eventDisableTiming
	}
	var h uintptr
	if err := c.do("cuEventCreate", c.d.eventCreate, uintptr(unsafe.Pointer(&h)), flags); err != nil {
		return nil, err
	}
	return &Event{c: c, h: h}, nil
}

// Destroy releases the event.
func (e *Event) Destroy() error {
	if e.h == 0 {
		return nil
	}
	err := e.c.do("cuEventDestroy_v2", e.c.d.eventDestroy, e.h)
	e.h = 0
	return err
}

// Record captures the work enqueued on s so far: the event happens when it is done.
func (e *Event) Record(s *Stream) error {
	return e.c.do2("cuEventRecord", e.c.d.eventRecord, e.h, s.h)
}

// Synchronize blocks the host until the event has happened.
func (e *Event) Synchronize() error {
	return e.c.do1("cuEventSynchronize", e.c.d.eventSynchronize, e.h)
}

// Done says whether the event has happened, without blocking.
func (e *Event) Done() (bool, error) {
	err := e.c.do1("cuEventQuery", e.c.d.eventQuery, e.h)
	if errors.Is(err, ErrNotReady) {
		return false, nil
	}
	return err == nil, err
}

// Elapsed is the time in seconds from start to end, both timing events that have happened.
func Elapsed(start, end *Event) (float64, error) {
	var ms float32
	if err := start.c.do3("cuEventElapsedTime", start.c.d.eventElapsedTime, uintptr(unsafe.Pointer(&ms)), start.h, end.h); err != nil {
		return 0, err
	}
	return float64(ms) / 1e3, nil
}
