package nccl

import "fmt"

// DataType is an ncclDataType_t, the type of the elements a call moves.
type DataType int32

// The data types of nccl.h (Int8 is also ncclChar).
const (
	Int8     DataType = 0
	Uint8    DataType = 1
	Int32    DataType = 2
	Uint32   DataType = 3
	Int64    DataType = 4
	Uint64   DataType = 5
	Float16  DataType = 6
	Float32  DataType = 7
	Float64  DataType = 8
	BFloat16 DataType = 9
)

var dataTypes = [...]struct {
	name string
	size int
}{
	{"ncclInt8", 1}, {"ncclUint8", 1}, {"ncclInt32", 4}, {"ncclUint32", 4}, {"ncclInt64", 8},
	{"ncclUint64", 8}, {"ncclFloat16", 2}, {"ncclFloat32", 4}, {"ncclFloat64", 8}, {"ncclBfloat16", 2},
}

// Size is the size of one element in bytes; 0 for a type this package does not know.
func (t DataType) Size() int {
	if t >= 0 && int(t) < len(dataTypes) {
		return dataTypes[t].size
	}
	return 0
}

// String is the type's name in nccl.h, e.g. "ncclFloat16".
func (t DataType) String() string {
	if t >= 0 && int(t) < len(dataTypes) {
		return dataTypes[t].name
	}
	return fmt.Sprintf("ncclDataType(%d)", int32(t))
}

type p2pSyms struct {
	groupStart, groupEnd, send, recv uintptr
}

func (s *p2pSyms) table() []symbol {
	return []symbol{
		// ncclResult_t ncclGroupStart(void);
		{Name: "ncclGroupStart", Addr: &s.groupStart},
		// ncclResult_t ncclGroupEnd(void);
		{Name: "ncclGroupEnd", Addr: &s.groupEnd},
		// ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
		//     int peer, ncclComm_t comm, cudaStream_t stream);
		{Name: "ncclSend", Addr: &s.send},
		// ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
		//     int peer, ncclComm_t comm, cudaStream_t stream);
		{Name: "ncclRecv", Addr: &s.recv},
	}
}

// GroupStart opens a group: the sends and receives up to the matching GroupEnd are posted
// together, so that a rank may send to and receive from all its peers without deadlock.
// Groups nest; the outermost GroupEnd runs them. The group belongs to the calling OS
// thread: see the threading rule in the package comment.
func (l *Library) GroupStart() error {
	if err := l.loaded("ncclGroupStart"); err != nil {
		return err
	}
	return l.call("ncclGroupStart", 0, l.groupStart)
}

// GroupEnd closes a group and, at the outermost, launches its operations on their streams.
// A failure of any operation of the group is reported here.
func (l *Library) GroupEnd() error {
	if err := l.loaded("ncclGroupEnd"); err != nil {
		return err
	}
	return l.call("ncclGroupEnd", 0, l.groupEnd)
}

// Send sends count elements of type dt at the device address buf to rank peer, on the
// CUDA stream (a CUstream handle; 0 for the default stream). The peer posts the matching
// Recv with the same count and type. Inside a group it only posts the send.
func (c *Comm) Send(buf uintptr, count int, dt DataType, peer int, stream uintptr) error {
	const call = "ncclSend"
	if err := c.checkP2P(call, buf, count, dt, peer); err != nil {
		return err
	}
	return c.l.call(call, c.h, c.l.send, buf, uintptr(count), uintptr(dt), uintptr(peer), c.h, stream)
}

// Recv receives count elements of type dt from rank peer into the device address buf, on
// the CUDA stream, matching the peer's Send.
func (c *Comm) Recv(buf uintptr, count int, dt DataType, peer int, stream uintptr) error {
	const call = "ncclRecv"
	if err := c.checkP2P(call, buf, count, dt, peer); err != nil {
		return err
	}
	return c.l.call(call, c.h, c.l.recv, buf, uintptr(count), uintptr(dt), uintptr(peer), c.h, stream)
}

// checkP2P refuses what NCCL would refuse, or crash on, before calling it.
func (c *Comm) checkP2P(call string, buf uintptr, count int, dt DataType, peer int) error {
	if err := c.check(call); err != nil {
		return err
	}
	switch {
	case count < 0:
		return argError(call, "negative count %d", count)
	case dt.Size() == 0:
		return argError(call, "unknown data type %d", int32(dt))
	case peer < 0 || peer >= c.n:
		return argError(call, "peer %d is not a rank of the communicator's %d", peer, c.n)
	case buf == 0 && count > 0:
		return argError(call, "NULL buffer for %d elements", count)
	}
	return nil
}
