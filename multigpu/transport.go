package multigpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/commit-run/commit-run/device"
)

// Comm is one rank's end of a group of devices that move tokens between them. Every rank of
// the group calls the collectives in the same order with matching sizes (SPMD), as NCCL
// requires; a rank that fails aborts the group so that the others do not wait forever.
type Comm interface {
	// Rank is this end's index in the group, Size the number of ranks.
	Rank() int
	Size() int
	// AllToAll sends send[j] to rank j and receives what rank j sends this rank into
	// recv[j], whose length the caller sets: every rank knows the sizes from the schedule it
	// planned. send[Rank()] reaches recv[Rank()] too. Buffers may be reused once it returns.
	AllToAll(send, recv [][]byte) error
}

// AllGather sends mine to every rank and returns what each sent, sizes[j] bytes from rank j.
func AllGather(c Comm, mine []byte, sizes []int) ([][]byte, error) {
	n := c.Size()
	if len(sizes) != n {
		return nil, fmt.Errorf("all-gather: %d sizes for %d ranks", len(sizes), n)
	}
	send, recv := make([][]byte, n), make([][]byte, n)
	for j := range send {
		send[j], recv[j] = mine, make([]byte, sizes[j])
	}
	if err := c.AllToAll(send, recv); err != nil {
		return nil, err
	}
	return recv, nil
}

// AllGatherInt gathers one integer from every rank: the sizes of a following exchange.
func AllGatherInt(c Comm, v int64) ([]int64, error) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	sizes := make([]int, c.Size())
	for j := range sizes {
		sizes[j] = 8
	}
	got, err := AllGather(c, b[:], sizes)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(got))
	for j, g := range got {
		out[j] = int64(binary.LittleEndian.Uint64(g))
	}
	return out, nil
}

// ErrAborted is what the collectives of an aborted group return when the rank that aborted
// it gave no error of its own.
var ErrAborted = errors.New("multigpu: the group was aborted")

// LocalGroup is the in-process transport: the ranks are goroutines of one process sharing
// memory, and a collective is a copy between their buffers.
type LocalGroup struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	arrived int
	gen     uint64
	err     error
	sends   [][][]byte // each rank's send buffers in the collective under way
}

// NewLocal makes an in-process group of n ranks.
func NewLocal(n int) (*LocalGroup, error) {
	if n < 1 || n > 1<<16 {
		return nil, fmt.Errorf("in-process group of %d ranks: want 1 to %d", n, 1<<16)
	}
	g := &LocalGroup{n: n, sends: make([][][]byte, n)}
	g.cond = sync.NewCond(&g.mu)
	return g, nil
}

// Comm is rank r's end of the group.
func (g *LocalGroup) Comm(r int) Comm { return localComm{g, r} }

// Abort makes every collective waiting or started later fail with err (ErrAborted if nil)
// until Reset: a rank that cannot go on releases the others.
func (g *LocalGroup) Abort(err error) {
	if err == nil {
		err = ErrAborted
	}
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	g.cond.Broadcast()
	g.mu.Unlock()
}

// Reset readies an aborted group for new collectives. No rank may be inside one.
func (g *LocalGroup) Reset() {
	g.mu.Lock()
	g.err, g.arrived = nil, 0
	g.gen++
	clear(g.sends)
	g.mu.Unlock()
}

// barrier returns when every rank has called it, or with the group's error once aborted.
func (g *LocalGroup) barrier() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	gen := g.gen
	if g.arrived++; g.arrived == g.n {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return nil
	}
	for gen == g.gen && g.err == nil {
		g.cond.Wait()
	}
	if gen == g.gen {
		return g.err
	}
	return nil
}

type localComm struct {
	g *LocalGroup
	r int
}

func (c localComm) Rank() int { return c.r }
func (c localComm) Size() int { return c.g.n }

func (c localComm) AllToAll(send, recv [][]byte) error {
	g := c.g
	if len(send) != g.n || len(recv) != g.n {
		err := fmt.Errorf("all-to-all on rank %d: %d send and %d receive buffers for %d ranks", c.r, len(send), len(recv), g.n)
		g.Abort(err)
		return err
	}
	g.mu.Lock()
	g.sends[c.r] = send
	g.mu.Unlock()
	// Everyone's buffers are posted; copy what is ours, then wait until everyone has, so
	// that no sender reuses a buffer still being read.
	if err := g.barrier(); err != nil {
		return err
	}
	g.mu.Lock()
	var bad error
	for j := range recv {
		src := g.sends[j][c.r]
		if len(src) != len(recv[j]) {
			bad = fmt.Errorf("all-to-all: rank %d sends %d bytes to rank %d, which expects %d", j, len(src), c.r, len(recv[j]))
			break
		}
	}
	g.mu.Unlock()
	if bad != nil {
		g.Abort(bad)
		return bad
	}
	for j := range recv {
		copy(recv[j], g.sends[j][c.r])
	}
	return g.barrier()
}

// Link is a modelled interconnect: every device's rate in bytes/s and the fixed cost of a
// collective.
type Link struct {
	Bandwidth, Latency float64
}

// Check validates a link.
func (l Link) Check() error {
	if !(l.Bandwidth > 0) || math.IsInf(l.Bandwidth, 0) || !(l.Latency >= 0) || math.IsInf(l.Latency, 0) {
		return fmt.Errorf("link of %v bytes/s and %v s latency: want a positive rate and a latency of 0 or more", l.Bandwidth, l.Latency)
	}
	return nil
}

// Modelled wraps a rank's transport so that its collectives take the modelled link's time
// on the device's virtual clock: a collective starts when the last rank is ready and lasts
// the latency plus the busiest device's bytes (sent or received, the larger) over the
// bandwidth, as Cluster.Time prices an all-to-all. The ranks agree on that time by
// exchanging their ready times and byte counts first.
func Modelled(c Comm, dev device.Linker, l Link) (Comm, error) {
	if err := l.Check(); err != nil {
		return nil, err
	}
	return &modelled{Comm: c, dev: dev, link: l}, nil
}

type modelled struct {
	Comm
	dev  device.Linker
	link Link
}

func (m *modelled) AllToAll(send, recv [][]byte) error {
	me := m.Rank()
	var out, in int
	for j := range send {
		if j != me {
			out += len(send[j])
		}
	}
	for j := range recv {
		if j != me {
			in += len(recv[j])
		}
	}
	var hdr [16]byte
	binary.LittleEndian.PutUint64(hdr[:8], math.Float64bits(m.dev.Ready()))
	binary.LittleEndian.PutUint64(hdr[8:], uint64(max(out, in)))
	sizes := make([]int, m.Size())
	for j := range sizes {
		sizes[j] = len(hdr)
	}
	all, err := AllGather(m.Comm, hdr[:], sizes)
	if err != nil {
		return err
	}
	var start float64
	var busiest uint64
	for _, h := range all {
		start = max(start, math.Float64frombits(binary.LittleEndian.Uint64(h[:8])))
		busiest = max(busiest, binary.LittleEndian.Uint64(h[8:]))
	}
	if err := m.Comm.AllToAll(send, recv); err != nil {
		return err
	}
	m.dev.Transfer(start, start+m.link.Latency+float64(busiest)/m.link.Bandwidth)
	return nil
}
