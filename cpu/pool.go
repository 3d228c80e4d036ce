package cpu

import (
	"sync"
	"sync/atomic"
	"time"
)

// pool runs a parallel region on the calling goroutine and a fixed set of worker goroutines,
// started once. A decoded token runs some hundred matrix products of a few tens of
// microseconds each; starting goroutines for each, and waking them through the scheduler,
// costs a noticeable part of that. The workers instead spin for a short while after a region,
// where the next one usually comes, and park only when none does.
//
// A region is split into a few chunks per thread that the threads claim one at a time, so
// that a thread the operating system has descheduled (another program is running, or the
// machine has fewer free cores than threads) holds up only the chunk it has claimed: the
// others, the caller first, take the rest. The caller then waits for the chunks in progress,
// spinning for a while and then parked.
type pool struct {
	workers int        // goroutines beside the caller
	mu      sync.Mutex // held for a region: one at a time
	// The region: [0, n) in chunks whose bounds are multiples of align. Held here, not in a
	// closure, so that starting a region allocates nothing.
	n, align int
	r        ranger
	// state is the region's number (high 32 bits), its chunk count (16 bits) and the next
	// chunk to claim (low 16 bits), in one word so that a worker still in an earlier region
	// can claim nothing of a later one.
	state  atomic.Uint64
	region uint32       // the caller's count of regions
	done   atomic.Int64 // chunks finished in the current region
	parked []parking    // the workers'
	caller parking      // the caller's, waiting for the chunks in progress
	stop   atomic.Bool
}

// chunksPerThread is how many chunks a region has per thread: enough that a late thread
// leaves work to the others, few enough that claiming costs nothing.
const chunksPerThread = 4

// parking is a goroutine's way to sleep until another wakes it, with no lost wake-up:
// whoever clears parked first decides whether a wake-up is on its way.
type parking struct {
	parked atomic.Bool
	wake   chan struct{} // buffered: the waker never blocks
}

func newParking() parking { return parking{wake: make(chan struct{}, 1)} }

// sleep parks until wakeUp, unless ready holds once parked.
func (k *parking) sleep(ready func() bool) {
	k.parked.Store(true)
	if ready() && k.parked.CompareAndSwap(true, false) {
		return
	}
	<-k.wake
}

// wakeUp wakes the goroutine if it is parked.
func (k *parking) wakeUp() {
	if k.parked.CompareAndSwap(true, false) {
		k.wake <- struct{}{}
	}
}

// Spinning budgets. An idle worker polls for the next region for workerSpin before it parks:
// longer than the gaps between the products of one token, much shorter than a user's pause.
// The caller polls for the chunks in progress for callerSpin.
const (
	workerSpin = 100 * time.Microsecond
	callerSpin = 100 * time.Microsecond
)

// spin polls done until it holds or budget has passed, and reports whether it held.
func spin(budget time.Duration, done func() bool) bool {
	var start time.Time
	for i := 0; ; i++ {
		if done() {
			return true
		}
		if i%256 == 255 { // the clock costs tens of polls
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > budget {
				return false
			}
		}
	}
}

func newPool(workers int) *pool {
	p := &pool{workers: workers, parked: make([]parking, workers), caller: newParking()}
	for i := range p.parked {
		p.parked[i] = newParking()
		go p.work(i)
	}
	return p
}

// close ends the workers. It waits for a region in progress: the device's cleanup may run
// while a method of the device is still in a region (the receiver is dead once the method has
// loaded its pool).
func (p *pool) close() {
	p.mu.Lock()
	p.stop.Store(true)
	p.region++
	p.state.Store(uint64(p.region) << 32)
	for i := range p.parked {
		p.parked[i].wakeUp()
	}
}

func (p *pool) work(i int) {
	// Not the region current when this goroutine starts: it may already have begun.
	var seen uint32
	started := func() bool { return uint32(p.state.Load()>>32) != seen }
	for {
		for !spin(workerSpin, started) {
			p.parked[i].sleep(started)
		}
		if p.stop.Load() {
			return
		}
		seen = uint32(p.state.Load() >> 32)
		p.drain(seen)
	}
}

// drain claims and runs chunks of region until none is left.
func (p *pool) drain(region uint32) {
	for {
		s := p.state.Load()
		next, chunks := int(s&0xffff), int(s>>16&0xffff)
		if uint32(s>>32) != region || next >= chunks {
			return
		}
		if !p.state.CompareAndSwap(s, s+1) {
			continue
		}
		p.r.runRange(chunkBound(p.n, p.align, chunks, next), chunkBound(p.n, p.align, chunks, next+1))
		if p.done.Add(1) == int64(chunks) {
			p.caller.wakeUp()
		}
	}
}

// A ranger computes the items [lo, hi) of a region.
type ranger interface{ runRange(lo, hi int) }

// chunkBound is the start of chunk c of [0, n) split into chunks ranges aligned to align;
// the last ends at n.
func chunkBound(n, align, chunks, c int) int {
	if c == chunks {
		return n
	}
	return n * c / chunks / align * align
}

// run runs r over [0, n) in chunks aligned to align, on the caller and the workers, and
// returns when all are done. It reports false, having run nothing, when another region holds
// the pool (a concurrent session, or a region started from inside a region).
func (p *pool) run(n, align int, r ranger) bool {
	if !p.mu.TryLock() {
		return false
	}
	defer p.mu.Unlock()
	chunks := min((n+align-1)/align, chunksPerThread*(p.workers+1), 0xffff)
	p.n, p.align, p.r = n, align, r
	p.done.Store(0)
	p.region++
	p.state.Store(uint64(p.region)<<32 | uint64(chunks)<<16)
	for i := range p.parked {
		p.parked[i].wakeUp()
	}
	p.drain(p.region)
	finished := func() bool { return p.done.Load() == int64(chunks) }
	for !spin(callerSpin, finished) {
		p.caller.sleep(finished)
	}
	p.r = nil
	return true
}
