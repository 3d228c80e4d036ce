package nccl

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

type commSyms struct {
	getUniqueID, commInitAll, commInitRankScalable, commDestroy, commAbort, commGetAsyncError,
	commCount, commUserRank, commCuDevice uintptr
}

func (s *commSyms) table() []symbol {
	return []symbol{
		// ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
		{Name: "ncclGetUniqueId", Addr: &s.getUniqueID},
		// ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
		{Name: "ncclCommInitAll", Addr: &s.commInitAll},
		// ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank,
		//     int nId, ncclUniqueId *commIds, ncclConfig_t *config);  (NCCL 2.23 and newer)
		// Bound instead of ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int), whose id is a
		// 128-byte struct passed by value: on the stack, which purego.SyscallN cannot fill.
		{Name: "ncclCommInitRankScalable", Addr: &s.commInitRankScalable, Optional: true},
		// ncclResult_t ncclCommDestroy(ncclComm_t comm);
		{Name: "ncclCommDestroy", Addr: &s.commDestroy},
		// ncclResult_t ncclCommAbort(ncclComm_t comm);
		{Name: "ncclCommAbort", Addr: &s.commAbort},
		// ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
		{Name: "ncclCommGetAsyncError", Addr: &s.commGetAsyncError},
		// ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
		{Name: "ncclCommCount", Addr: &s.commCount},
		// ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
		{Name: "ncclCommUserRank", Addr: &s.commUserRank},
		// ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
		{Name: "ncclCommCuDevice", Addr: &s.commCuDevice},
	}
}

// UniqueID is an ncclUniqueId: the rendezvous every rank of a communicator passes to
// InitRank. One rank makes it with NewUniqueID and hands it to the others.
type UniqueID [128]byte

// NewUniqueID makes a fresh id for a new communicator.
func (l *Library) NewUniqueID() (UniqueID, error) {
	var id UniqueID
	if err := l.loaded("ncclGetUniqueId"); err != nil {
		return id, err
	}
	err := l.call("ncclGetUniqueId", 0, l.getUniqueID, uintptr(unsafe.Pointer(&id[0])))
	return id, err
}

// Comm is one rank's communicator, an ncclComm_t. Its rank count is read once, at creation,
// so that Send and Recv check their peer without a call. Destroy or Abort it when done; it
// must not be used after.
type Comm struct {
	l    *Library
	h    uintptr
	n    int
	gone atomic.Bool // destroyed or aborted
}

// check refuses calls on a nil, destroyed or aborted communicator before NCCL sees them.
func (c *Comm) check(call string) error {
	if c == nil || c.h == 0 {
		return argError(call, "nil communicator")
	}
	if c.gone.Load() {
		return argError(call, "the communicator was destroyed or aborted")
	}
	return nil
}

// Library is the library the communicator belongs to, whose GroupStart and GroupEnd group
// its calls.
func (c *Comm) Library() *Library {
	if c == nil {
		return nil
	}
	return c.l
}

// InitAll makes one communicator per listed CUDA device ordinal, all in this process; the
// communicator of devices[i] is rank i.
func (l *Library) InitAll(devices []int) ([]*Comm, error) {
	const call = "ncclCommInitAll"
	if err := l.loaded(call); err != nil {
		return nil, err
	}
	if len(devices) == 0 {
		return nil, argError(call, "no devices")
	}
	devs := make([]int32, len(devices))
	for i, d := range devices {
		if d < 0 || d > 1<<30 {
			return nil, argError(call, "device %d is not a CUDA device ordinal", d)
		}
		devs[i] = int32(d)
	}
	hs := make([]uintptr, len(devices))
	if err := l.call(call, 0, l.commInitAll, uintptr(unsafe.Pointer(&hs[0])), uintptr(len(devs)), uintptr(unsafe.Pointer(&devs[0]))); err != nil {
		return nil, err
	}
	comms := make([]*Comm, len(hs))
	for i, h := range hs {
		c, err := l.newComm(h)
		if err != nil {
			for _, h := range hs {
				l.call("ncclCommDestroy", h, l.commDestroy, h)
			}
			return nil, fmt.Errorf("%s: device %d: %w", call, devices[i], err)
		}
		comms[i] = c
	}
	return comms, nil
}

// InitRank makes the communicator of one rank of nranks that meet at id, in this process or
// across processes. It blocks until every rank has called it, so each rank calls it from its
// own goroutine, with its CUDA device current. It needs NCCL 2.23 or newer
// (ncclCommInitRankScalable).
func (l *Library) InitRank(id UniqueID, nranks, rank int) (*Comm, error) {
	const call = "ncclCommInitRankScalable"
	if err := l.loaded(call); err != nil {
		return nil, err
	}
	if l.commInitRankScalable == 0 {
		return nil, fmt.Errorf("nccl: InitRank: %s (NCCL %s) has no %s: communicators of several threads or processes need NCCL 2.23 or newer",
			l.path, l.VersionString(), call)
	}
	if nranks < 1 || nranks > 1<<30 {
		return nil, argError(call, "%d ranks", nranks)
	}
	if rank < 0 || rank >= nranks {
		return nil, argError(call, "rank %d is not in 0..%d", rank, nranks-1)
	}
	var h uintptr
	// nId = 1 id; config NULL: a blocking communicator with NCCL's defaults.
	if err := l.call(call, 0, l.commInitRankScalable, uintptr(unsafe.Pointer(&h)), uintptr(nranks), uintptr(rank), 1,
		uintptr(unsafe.Pointer(&id[0])), 0); err != nil {
		return nil, err
	}
	c, err := l.newComm(h)
	if err != nil {
		l.call("ncclCommDestroy", h, l.commDestroy, h)
		return nil, err
	}
	return c, nil
}

func (l *Library) newComm(h uintptr) (*Comm, error) {
	if h == 0 {
		return nil, errors.New("NCCL made a NULL communicator")
	}
	c := &Comm{l: l, h: h}
	n, err := c.Count()
	if err != nil {
		return nil, err
	}
	c.n = n
	return c, nil
}

// Destroy frees the communicator once its operations are done. Later calls on it fail;
// a second Destroy (or Abort) does nothing.
func (c *Comm) Destroy() error {
	if err := c.check("ncclCommDestroy"); err != nil {
		return ignoreGone(c, err)
	}
	if !c.gone.CompareAndSwap(false, true) {
		return nil
	}
	// No comm for the last error: the call may have freed it.
	return c.l.call("ncclCommDestroy", 0, c.l.commDestroy, c.h)
}

// Abort frees the communicator and stops its operations under way: the ranks blocked on it
// return errors. It may be called from any goroutine, also while this rank's own goroutine
// waits in GroupEnd.
func (c *Comm) Abort() error {
	if err := c.check("ncclCommAbort"); err != nil {
		return ignoreGone(c, err)
	}
	if !c.gone.CompareAndSwap(false, true) {
		return nil
	}
	return c.l.call("ncclCommAbort", 0, c.l.commAbort, c.h) // no comm for the last error: freed
}

// ignoreGone makes Destroy and Abort of a communicator already gone no error.
func ignoreGone(c *Comm, err error) error {
	if c != nil && c.h != 0 {
		return nil
	}
	return err
}

// AsyncError reports an error the communicator met after its calls returned (a peer's
// abort, a network failure), as an *Error of call ncclCommGetAsyncError; nil while none,
// also while an operation is in progress.
func (c *Comm) AsyncError() error {
	const call = "ncclCommGetAsyncError"
	if err := c.check(call); err != nil {
		return err
	}
	var r int32
	if err := c.l.call(call, c.h, c.l.commGetAsyncError, c.h, uintptr(unsafe.Pointer(&r))); err != nil {
		return err
	}
	if res := Result(r); res != Success && res != InProgress {
		return c.l.newError(call, res, c.h)
	}
	return nil
}

// Count is the number of ranks in the communicator.
func (c *Comm) Count() (int, error) {
	return c.query("ncclCommCount", func(s *commSyms) uintptr { return s.commCount })
}

// Rank is the communicator's rank, 0..Count()-1.
func (c *Comm) Rank() (int, error) {
	return c.query("ncclCommUserRank", func(s *commSyms) uintptr { return s.commUserRank })
}

// Device is the CUDA device ordinal of the communicator.
func (c *Comm) Device() (int, error) {
	return c.query("ncclCommCuDevice", func(s *commSyms) uintptr { return s.commCuDevice })
}

// query reads one int of the communicator; fn picks the call once c is known not to be nil.
func (c *Comm) query(call string, fn func(*commSyms) uintptr) (int, error) {
	if err := c.check(call); err != nil {
		return 0, err
	}
	var v int32
	if err := c.l.call(call, c.h, fn(&c.l.commSyms), c.h, uintptr(unsafe.Pointer(&v))); err != nil {
		return 0, err
	}
	return int(v), nil
}
