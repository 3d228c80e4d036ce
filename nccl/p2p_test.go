package nccl

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// The exchanges below pass Go memory ([]byte) as "device pointers". That is valid for the fake
// library only, which takes device pointers for host addresses and memcpys between them; a
// real NCCL needs CUDA device memory. The buffers are heap objects (they are shared with the
// goroutines, so they escape), which Go's collector never moves, and they stay referenced
// until every GroupEnd that reads or writes them has returned.

var raceEnabled bool // set by race_test.go

// addr is the address of b's first byte, or NULL for an empty b.
func addr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

// within runs f and fails the test if it has not returned after d: a hang is a failure, not
// a test binary killed by its timeout.
func within(t *testing.T, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("still running after %v", d)
	}
}

// plan is an all-to-all exchange: in each round, rank src sends counts[round][src][dst]
// elements of types[round] to rank dst.
type plan struct {
	n      int
	types  []DataType
	counts [][][]int
	max    int // bytes of the largest message
}

func newPlan(n, rounds int, seed uint64) *plan {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	all := []DataType{Uint8, Int8, Int32, Float16, BFloat16, Float32, Int64, Float64}
	p := &plan{n: n}
	for r := 0; r < rounds; r++ {
		dt := all[rng.IntN(len(all))]
		p.types = append(p.types, dt)
		counts := make([][]int, n)
		for src := range counts {
			counts[src] = make([]int, n)
			for dst := range counts[src] {
				if rng.IntN(5) > 0 { // else an empty message
					counts[src][dst] = 1 + rng.IntN(700)
				}
				p.max = max(p.max, counts[src][dst]*dt.Size())
			}
		}
		p.counts = append(p.counts, counts)
	}
	p.counts[0][0][n-1] = 0 // at least one empty message, to the last rank
	return p
}

// pattern is byte i of the message from src to dst in a round: every message differs.
func pattern(round, src, dst, i int) byte {
	return byte(i*131 + i>>8 + round*17 + src*29 + dst*53)
}

// buffers are the messages of an exchange: send[src][dst] and recv[dst][src]. Rank r only
// touches send[r] and recv[r], so the ranks' goroutines share no Go memory.
type buffers struct{ send, recv [][][]byte }

func newBuffers(p *plan) *buffers {
	b := &buffers{send: make([][][]byte, p.n), recv: make([][][]byte, p.n)}
	for r := 0; r < p.n; r++ {
		b.send[r], b.recv[r] = make([][]byte, p.n), make([][]byte, p.n)
		for q := 0; q < p.n; q++ {
			b.send[r][q], b.recv[r][q] = make([]byte, p.max), make([]byte, p.max)
		}
	}
	return b
}

// fill writes rank's messages of the round.
func (b *buffers) fill(p *plan, round, rank int) {
	for dst := 0; dst < p.n; dst++ {
		m := b.send[rank][dst][:p.counts[round][rank][dst]*p.types[round].Size()]
		for i := range m {
			m[i] = pattern(round, rank, dst, i)
		}
		clear(b.recv[rank][dst]) // so a message not delivered is seen
	}
}

// post posts rank's sends and receives of the round, in the caller's group.
func (b *buffers) post(p *plan, round int, c *Comm, rank int) error {
	dt := p.types[round]
	for dst := 0; dst < p.n; dst++ {
		n, buf := p.counts[round][rank][dst], b.send[rank][dst]
		if n == 0 {
			buf = nil // NULL, as NCCL allows for no elements
		}
		if err := c.Send(addr(buf), n, dt, dst, 0); err != nil {
			return err
		}
	}
	for src := 0; src < p.n; src++ {
		n, buf := p.counts[round][src][rank], b.recv[rank][src]
		if n == 0 {
			buf = nil
		}
		if err := c.Recv(addr(buf), n, dt, src, 0); err != nil {
			return err
		}
	}
	return nil
}

// check verifies every byte rank received in the round.
func (b *buffers) check(p *plan, round, rank int) error {
	for src := 0; src < p.n; src++ {
		m := b.recv[rank][src][:p.counts[round][src][rank]*p.types[round].Size()]
		for i, v := range m {
			if want := pattern(round, src, rank, i); v != want {
				return fmt.Errorf("round %d: rank %d, byte %d of %d from rank %d is %#x, want %#x", round, rank, i, len(m), src, v, want)
			}
		}
	}
	return nil
}

// group runs post in a group on the calling (locked) thread; the group is closed even when a
// call in it fails, so the thread's group state stays sound.
func group(l *Library, post func() error) error {
	if err := l.GroupStart(); err != nil {
		return err
	}
	err := post()
	return errors.Join(err, l.GroupEnd())
}

// exchangePerRank runs the plan with one goroutine, locked to its thread, per rank.
func exchangePerRank(t *testing.T, l *Library, comms []*Comm, p *plan) {
	t.Helper()
	b := newBuffers(p)
	var wg sync.WaitGroup
	errs := make([]error, p.n)
	for rank, c := range comms {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			for round := range p.types {
				b.fill(p, round, rank)
				err := group(l, func() error { return b.post(p, round, c, rank) })
				if err != nil {
					err = fmt.Errorf("round %d: rank %d: %w", round, rank, err)
				} else {
					err = b.check(p, round, rank)
				}
				if err != nil {
					// A rank that stops must abort, or its peers wait for it in vain.
					errs[rank] = errors.Join(err, c.Abort())
					return
				}
			}
		})
	}
	wg.Wait()
	runtime.KeepAlive(b)
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
}

// exchangeOneThread runs the plan from one thread driving every communicator in one group
// per round, as a process does with the communicators of InitAll.
func exchangeOneThread(t *testing.T, l *Library, comms []*Comm, p *plan) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b := newBuffers(p)
	for round := range p.types {
		for rank := range comms {
			b.fill(p, round, rank)
		}
		err := group(l, func() error {
			for rank, c := range comms {
				if err := b.post(p, round, c, rank); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("round %d: %v", round, err) // not Fatal: this runs off the test's goroutine
			return
		}
		for rank := range comms {
			if err := b.check(p, round, rank); err != nil {
				t.Error(err)
				return
			}
		}
	}
	runtime.KeepAlive(b)
}

func destroyAll(t *testing.T, comms []*Comm) {
	t.Helper()
	for _, c := range comms {
		if err := c.Destroy(); err != nil {
			t.Error(err)
		}
	}
}

func TestAllToAll(t *testing.T) {
	l := fakeLibrary(t)
	for _, n := range []int{1, 2, 3, 4, 8} {
		for _, mode := range []struct {
			name string
			run  func(*testing.T, *Library, []*Comm, *plan)
		}{
			{"goroutine per rank", exchangePerRank},
			{"one thread", exchangeOneThread},
		} {
			t.Run(fmt.Sprintf("%d ranks/%s", n, mode.name), func(t *testing.T) {
				devices := make([]int, n)
				for i := range devices {
					devices[i] = i
				}
				comms, err := l.InitAll(devices)
				if err != nil {
					t.Fatal(err)
				}
				defer destroyAll(t, comms)
				within(t, time.Minute, func() { mode.run(t, l, comms, newPlan(n, 20, 1)) })
			})
		}
	}
}

// initRanks makes a communicator of nranks ranks with InitRank, one goroutine per rank, as
// processes would.
func initRanks(l *Library, nranks int) ([]*Comm, error) {
	id, err := l.NewUniqueID()
	if err != nil {
		return nil, err
	}
	comms := make([]*Comm, nranks)
	errs := make([]error, nranks)
	var wg sync.WaitGroup
	for rank := range comms {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			comms[rank], errs[rank] = l.InitRank(id, nranks, rank)
		})
	}
	wg.Wait()
	return comms, errors.Join(errs...)
}

func TestInitRank(t *testing.T) {
	l := fakeLibrary(t)
	for _, tc := range []struct{ cliques, ranks int }{{1, 4}, {2, 3}} {
		t.Run(fmt.Sprintf("%dx%d", tc.cliques, tc.ranks), func(t *testing.T) {
			// Several cliques form at once, each finding its own ranks by its id.
			var wg sync.WaitGroup
			for k := 0; k < tc.cliques; k++ {
				wg.Go(func() {
					comms, err := initRanks(l, tc.ranks)
					if err != nil {
						t.Error(err)
						return
					}
					defer destroyAll(t, comms)
					for rank, c := range comms {
						if r, err := c.Rank(); err != nil || r != rank {
							t.Errorf("rank %d: Rank = %d, %v", rank, r, err)
						}
					}
					exchangePerRank(t, l, comms, newPlan(tc.ranks, 5, uint64(k)))
				})
			}
			within(t, time.Minute, wg.Wait)
		})
	}
}

func TestInitRankTimeout(t *testing.T) {
	l := fakeLibrary(t)
	t.Setenv("FAKENCCL_INIT_TIMEOUT_MS", "100")
	id, err := l.NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.InitRank(id, 2, 1) // rank 0 never comes
	var e *Error
	if !errors.As(err, &e) || e.Result != SystemError || !strings.Contains(e.Detail, "1 of 2 ranks joined") {
		t.Errorf("InitRank alone = %v, want a timeout", err)
	}
}

// TestSizeMismatch checks that a receive that does not match its send fails every rank of
// the exchange, with the call and NCCL's message, instead of hanging them.
func TestSizeMismatch(t *testing.T) {
	l := fakeLibrary(t)
	type msg struct {
		peer, count int
		dt          DataType
	}
	for _, tc := range []struct {
		name       string
		send, recv [][]msg // per rank
		want       string
	}{
		{"self", [][]msg{{{0, 4, Uint8}}}, [][]msg{{{0, 8, Uint8}}}, "rank 0 receives 8 bytes from rank 0, which sends 4"},
		{"pair",
			[][]msg{{{1, 40, Uint8}}, {{0, 2, Float32}}},
			[][]msg{{{1, 8, Uint8}}, {{0, 20, Float32}}},
			"rank 1 receives 80 bytes from rank 0, which sends 40"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.send)
			devices := make([]int, n)
			for i := range devices {
				devices[i] = i
			}
			comms, err := l.InitAll(devices)
			if err != nil {
				t.Fatal(err)
			}
			defer destroyAll(t, comms)
			buf := make([]byte, 256)
			errs := make([]error, n)
			within(t, time.Minute, func() {
				var wg sync.WaitGroup
				for rank, c := range comms {
					wg.Go(func() {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
						errs[rank] = group(l, func() error {
							for _, m := range tc.send[rank] {
								if err := c.Send(addr(buf), m.count, m.dt, m.peer, 0); err != nil {
									return err
								}
							}
							for _, m := range tc.recv[rank] {
								if err := c.Recv(addr(buf[128:]), m.count, m.dt, m.peer, 0); err != nil {
									return err
								}
							}
							return nil
						})
					})
				}
				wg.Wait()
			})
			runtime.KeepAlive(buf)
			for rank, err := range errs {
				var e *Error
				if !errors.As(err, &e) || e.Call != "ncclGroupEnd" || e.Result != InvalidUsage ||
					!strings.Contains(err.Error(), "ncclGroupEnd: ") || !strings.Contains(e.Detail, tc.want) {
					t.Errorf("rank %d: %v, want an ncclGroupEnd error with %q", rank, err, tc.want)
				}
				if err := comms[rank].AsyncError(); !errors.Is(err, InvalidUsage) {
					t.Errorf("rank %d: AsyncError = %v", rank, err)
				}
			}
		})
	}
}

// TestAbort checks that aborting a communicator releases a rank waiting in GroupEnd, whether
// another rank aborts its own communicator or a watchdog aborts the waiter's.
func TestAbort(t *testing.T) {
	l := fakeLibrary(t)
	for _, tc := range []struct {
		name    string
		aborted int // rank 1 waits for rank 0's send, which never comes
	}{
		{"peer aborts", 0},
		{"watchdog aborts the waiter", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms, err := l.InitAll([]int{0, 1})
			if err != nil {
				t.Fatal(err)
			}
			survivor := comms[1-tc.aborted]
			defer survivor.Destroy()
			buf := make([]byte, 64)
			waiting := make(chan struct{})
			var waitErr error
			within(t, time.Minute, func() {
				var wg sync.WaitGroup
				wg.Go(func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					waitErr = group(l, func() error {
						defer close(waiting) // posted: GroupEnd is next
						return comms[1].Recv(addr(buf), len(buf), Uint8, 0, 0)
					})
				})
				<-waiting
				time.Sleep(50 * time.Millisecond) // likely in GroupEnd by now; if not, it fails at once
				if err := comms[tc.aborted].Abort(); err != nil {
					t.Error(err)
				}
				wg.Wait()
			})
			runtime.KeepAlive(buf)
			var e *Error
			if !errors.As(waitErr, &e) || e.Call != "ncclGroupEnd" || e.Result != RemoteError || !strings.Contains(e.Detail, "aborted") {
				t.Errorf("the waiter got %v, want an abort", waitErr)
			}
			err = survivor.AsyncError()
			if !errors.As(err, &e) || e.Call != "ncclCommGetAsyncError" || e.Result != RemoteError || !strings.Contains(e.Detail, "aborted") {
				t.Errorf("AsyncError = %v, want the abort", err)
			}
			if err := comms[tc.aborted].Send(addr(buf), 1, Uint8, 0, 0); !errors.Is(err, InvalidArgument) {
				t.Errorf("Send on an aborted communicator = %v", err)
			}
			if err := comms[tc.aborted].Abort(); err != nil {
				t.Errorf("second Abort = %v", err)
			}
		})
	}
}

// TestOutsideGroup checks a send and a receive outside groups (each a group of one), and that
// a send nobody receives times out with an error rather than hanging.
func TestOutsideGroup(t *testing.T) {
	l := fakeLibrary(t)
	comms, err := l.InitAll([]int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(t, comms)
	src, dst := []byte("a lone message"), make([]byte, 14)
	within(t, time.Minute, func() {
		var wg sync.WaitGroup
		var errs [2]error
		wg.Go(func() { errs[0] = comms[0].Send(addr(src), len(src), Uint8, 1, 0) })
		wg.Go(func() { errs[1] = comms[1].Recv(addr(dst), len(dst), Uint8, 0, 0) })
		wg.Wait()
		if err := errors.Join(errs[:]...); err != nil || string(dst) != string(src) {
			t.Errorf("received %q, %v", dst, err)
		}
	})

	t.Setenv("FAKENCCL_TIMEOUT_MS", "100")
	err = comms[0].Send(addr(src), len(src), Uint8, 1, 0)
	var e *Error
	if !errors.As(err, &e) || e.Call != "ncclSend" || e.Result != SystemError || !strings.Contains(e.Detail, "waited 100 ms for rank 1") {
		t.Errorf("a send nobody receives = %v, want a timeout", err)
	}
	if err := comms[1].AsyncError(); !errors.Is(err, SystemError) {
		t.Errorf("AsyncError after the timeout = %v", err)
	}
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
}

// TestHotCallAllocations checks what a group of a send and a receive allocates: they run for
// every layer of every token batch. Each call with arguments costs one allocation, the
// argument slice that purego.SyscallN's go:uintptrescapes moves to the heap; nothing more.
func TestHotCallAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts vary under the race detector")
	}
	l := fakeLibrary(t)
	comms, err := l.InitAll([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(t, comms)
	c := comms[0]
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	src, dst := make([]byte, 16), make([]byte, 16)
	ps, pd := addr(src), addr(dst)
	allocs := testing.AllocsPerRun(100, func() {
		l.GroupStart()
		c.Send(ps, 16, Uint8, 0, 0)
		c.Recv(pd, 16, Uint8, 0, 0)
		if err := l.GroupEnd(); err != nil {
			t.Fatal(err)
		}
	})
	runtime.KeepAlive(src)
	runtime.KeepAlive(dst)
	if allocs > 2 {
		t.Errorf("a group of a send and a receive allocates %v times, want 2", allocs)
	}
}
