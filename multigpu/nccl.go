package multigpu

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/nccl"
)

// NCCLGroup is the transport of ranks on CUDA GPUs: NCCL moves the bytes between the devices,
// over NVLink, PCIe or the network as it finds them, with one communicator per GPU. Either
// every rank is a GPU of this process (NewNCCL: ncclCommInitAll), or this process holds one
// rank of a group of processes, on one or several machines (NewNCCLRank). A collective stages
// the caller's host buffers in device memory, exchanges them with grouped ncclSend/ncclRecv
// on the rank's own stream, and copies what arrived back.
//
// As with every Comm the ranks must agree on the sizes (each knows them from the schedule):
// NCCL matches a send with a receive by order, not by size, so a disagreement would corrupt
// or hang where the in-process transport reports it. Empty messages are not posted at all.
type NCCLGroup struct {
	lib  *nccl.Library
	n    int
	gpus []*cuda.GPU    // by rank; nil for the ranks of other processes
	id   *nccl.UniqueID // a group of processes: the id its communicators were made from

	mu      sync.Mutex
	comms   []*nccl.Comm // by rank, nil where gpus is
	aborted error
	ranks   []*ncclRank // by rank, nil where gpus is
}

// ncclRank is one GPU's end: its stream and staging memory.
type ncclRank struct {
	g      *NCCLGroup
	r      int
	stream *cuda.Stream
	buf    *cuda.DeviceBuffer
}

// ncclAlign keeps every message of a staging buffer at an aligned device address, where NCCL
// copies fastest.
const ncclAlign = 256

// NewNCCL makes a group of the GPUs, rank r on gpus[r]: one communicator each.
func NewNCCL(lib *nccl.Library, gpus []*cuda.GPU) (*NCCLGroup, error) {
	if lib == nil || len(gpus) == 0 {
		return nil, errors.New("NCCL group: no library or no GPUs")
	}
	seen := map[int]bool{}
	for _, g := range gpus {
		o := g.Info().Ordinal
		if seen[o] {
			// NCCL needs a device per rank; two ranks on one GPU would deadlock its kernels.
			return nil, fmt.Errorf("NCCL group: cuda:%d holds two ranks; NCCL wants one GPU per rank", o)
		}
		seen[o] = true
	}
	g := &NCCLGroup{lib: lib, n: len(gpus), gpus: gpus}
	if err := g.init(); err != nil {
		return nil, err
	}
	return g, g.streams()
}

// NewNCCLRank makes this process's end of a group of nranks processes: rank on gpu. Every
// process passes the id rank 0 made (Library.NewUniqueID, handed out by Rendezvous), and the
// call returns once all have joined.
func NewNCCLRank(lib *nccl.Library, gpu *cuda.GPU, id nccl.UniqueID, nranks, rank int) (*NCCLGroup, error) {
	if lib == nil || gpu == nil {
		return nil, errors.New("NCCL group: no library or no GPU")
	}
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("NCCL group: rank %d of %d", rank, nranks)
	}
	g := &NCCLGroup{lib: lib, n: nranks, gpus: make([]*cuda.GPU, nranks), id: &id}
	g.gpus[rank] = gpu
	if err := g.init(); err != nil {
		return nil, err
	}
	return g, g.streams()
}

// streams gives every local rank its stream; on failure the group is closed.
func (g *NCCLGroup) streams() error {
	g.ranks = make([]*ncclRank, g.n)
	for r, gpu := range g.gpus {
		if gpu == nil {
			continue
		}
		var s *cuda.Stream
		err := gpu.Context().Do(func() (err error) {
			s, err = gpu.Context().NewStream()
			return err
		})
		if err != nil {
			g.Close()
			return fmt.Errorf("NCCL group: rank %d on %s: %w", r, gpu.Name(), err)
		}
		g.ranks[r] = &ncclRank{g: g, r: r, stream: s}
	}
	return nil
}

// init makes the communicators.
func (g *NCCLGroup) init() error {
	if g.id != nil {
		r := slices.IndexFunc(g.gpus, func(gpu *cuda.GPU) bool { return gpu != nil })
		var c *nccl.Comm
		err := g.gpus[r].Context().Do(func() (err error) {
			c, err = g.lib.InitRank(*g.id, g.n, r)
			return err
		})
		if err != nil {
			return fmt.Errorf("NCCL group of %d processes, rank %d on %s (NCCL %s): %w", g.n, r, g.gpus[r].Name(), g.lib.VersionString(), err)
		}
		g.comms = make([]*nccl.Comm, g.n)
		g.comms[r] = c
		return nil
	}
	devs := make([]int, len(g.gpus))
	for r, gpu := range g.gpus {
		devs[r] = gpu.Info().Ordinal
	}
	comms, err := g.lib.InitAll(devs)
	if err != nil {
		return fmt.Errorf("NCCL group of %d GPUs (NCCL %s): %w", len(devs), g.lib.VersionString(), err)
	}
	g.comms = comms
	return nil
}

// Comm is rank r's end of the group; nil for a rank of another process.
func (g *NCCLGroup) Comm(r int) Comm {
	if g.ranks[r] == nil {
		return nil
	}
	return g.ranks[r]
}

// Abort makes the collectives under way fail (ncclCommAbort on every communicator releases
// the ranks waiting for one that failed) and the later ones too, until Reset.
func (g *NCCLGroup) Abort(err error) {
	if err == nil {
		err = ErrAborted
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted != nil {
		return
	}
	g.aborted = err
	for _, c := range g.comms {
		if c != nil {
			c.Abort()
		}
	}
	g.comms = nil
}

// Reset makes new communicators after an Abort. No rank may be inside a collective. A group of
// processes cannot be re-formed this way: every process would have to agree on a new id.
func (g *NCCLGroup) Reset() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted == nil {
		return nil
	}
	if g.id != nil {
		return fmt.Errorf("a group of %d processes cannot be re-formed after an error (%v): start every process again", g.n, g.aborted)
	}
	if err := g.init(); err != nil {
		return err
	}
	g.aborted = nil
	return nil
}

// Close destroys the communicators and frees the ranks' streams and staging memory.
func (g *NCCLGroup) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for _, c := range g.comms {
		if c != nil {
			errs = append(errs, c.Destroy())
		}
	}
	g.comms = nil
	for _, rk := range g.ranks {
		if rk != nil {
			errs = append(errs, rk.buf.Free(), rk.stream.Destroy())
			rk.buf = nil
		}
	}
	g.ranks = nil
	return errors.Join(errs...)
}

// comm is rank r's communicator, or the error that aborted the group.
func (g *NCCLGroup) comm(r int) (*nccl.Comm, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted != nil {
		return nil, g.aborted
	}
	return g.comms[r], nil
}

func (rk *ncclRank) Rank() int { return rk.r }
func (rk *ncclRank) Size() int { return rk.g.n }

func (rk *ncclRank) AllToAll(send, recv [][]byte) error {
	g, me := rk.g, rk.r
	n := g.n
	gpu := g.gpus[me]
	fail := func(err error) error {
		err = fmt.Errorf("NCCL all-to-all on rank %d (%s): %w", me, gpu.Name(), err)
		g.Abort(err)
		return err
	}
	if len(send) != n || len(recv) != n {
		return fail(fmt.Errorf("%d send and %d receive buffers for %d ranks", len(send), len(recv), n))
	}
	if len(send[me]) != len(recv[me]) {
		return fail(fmt.Errorf("sends itself %d bytes and expects %d", len(send[me]), len(recv[me])))
	}
	comm, err := g.comm(me)
	if err != nil {
		return err
	}
	copy(recv[me], send[me])
	lay := newStagingLayout(send, recv, me)
	if lay.total == 0 {
		return nil
	}
	if err := rk.reserve(lay.total); err != nil {
		return fail(err)
	}
	err = gpu.Context().Do(func() error { return rk.exchange(comm, send, recv, lay) })
	if err != nil {
		if g.abortedBy() != nil {
			// Another rank failed first: report its error, not the abort it caused here.
			return g.abortedBy()
		}
		return fail(err)
	}
	return nil
}

// stagingLayout places the messages of an all-to-all in the rank's staging buffer: every
// peer's outgoing message, then every incoming one, each at an aligned offset.
type stagingLayout struct {
	sendOff, recvOff []int64 // by peer; unused for the rank itself
	total            int64
}

func newStagingLayout(send, recv [][]byte, me int) stagingLayout {
	n := len(send)
	lay := stagingLayout{sendOff: make([]int64, n), recvOff: make([]int64, n)}
	for j := range n {
		if j != me {
			lay.sendOff[j] = lay.total
			lay.total += roundUp(int64(len(send[j])), ncclAlign)
		}
	}
	for j := range n {
		if j != me {
			lay.recvOff[j] = lay.total
			lay.total += roundUp(int64(len(recv[j])), ncclAlign)
		}
	}
	return lay
}

// reserve grows the staging buffer to hold total bytes (1 MiB at least); one large enough is
// kept, so that a run's repeated all-to-alls allocate device memory once.
func (rk *ncclRank) reserve(total int64) error {
	if rk.buf != nil && rk.buf.Size >= total {
		return nil
	}
	if err := rk.buf.Free(); err != nil {
		return err
	}
	rk.buf = nil
	buf, err := rk.g.gpus[rk.r].DeviceBuffer(max(total, 1<<20), "NCCL's staging buffers")
	if err != nil {
		return err
	}
	rk.buf = buf
	return nil
}

// exchange runs the all-to-all on the rank's stream, in its GPU's context: the outgoing
// messages up to the staging buffer, the grouped sends and receives, the incoming ones back.
func (rk *ncclRank) exchange(comm *nccl.Comm, send, recv [][]byte, lay stagingLayout) error {
	me, base, s := rk.r, rk.buf.Ptr, rk.stream
	for j := range send {
		if j != me {
			if err := s.CopyHtoD(base.Add(lay.sendOff[j]), send[j]); err != nil {
				return err
			}
		}
	}
	if err := rk.sendRecv(comm, send, recv, lay); err != nil {
		return err
	}
	for j := range recv {
		if j != me {
			if err := s.CopyDtoH(recv[j], base.Add(lay.recvOff[j])); err != nil {
				return err
			}
		}
	}
	if err := s.Synchronize(); err != nil {
		return errors.Join(err, comm.AsyncError())
	}
	return comm.AsyncError()
}

// sendRecv posts every non-empty message to and from the peers as one NCCL group, so that
// NCCL can run them at once without the ranks' orders deadlocking each other.
func (rk *ncclRank) sendRecv(comm *nccl.Comm, send, recv [][]byte, lay stagingLayout) error {
	g, me, base, s := rk.g, rk.r, rk.buf.Ptr, rk.stream
	if err := g.lib.GroupStart(); err != nil {
		return err
	}
	var errs []error
	for j := range send {
		if j == me {
			continue
		}
		if k := len(send[j]); k > 0 {
			errs = append(errs, comm.Send(uintptr(base.Add(lay.sendOff[j])), k, nccl.Uint8, j, s.Handle()))
		}
		if k := len(recv[j]); k > 0 {
			errs = append(errs, comm.Recv(uintptr(base.Add(lay.recvOff[j])), k, nccl.Uint8, j, s.Handle()))
		}
	}
	// The group is closed even when a call in it failed, or this thread's NCCL state
	// would stay inside it.
	errs = append(errs, g.lib.GroupEnd())
	return errors.Join(errs...)
}

// abortedBy is the error the group was aborted with, if it was.
func (g *NCCLGroup) abortedBy() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.aborted
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }
