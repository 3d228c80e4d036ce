package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// pool runs a parallel region on the calling goroutine and a fixed set of worker goroutines,
// started once. A decoded token runs some hundred matrix products of a few tens of
// microseconds each; starting goroutines for each, and waking them through the scheduler,
// costs a noticeable part of that. The workers instead spin for a short while after a region,
// where the next one usually comes, and park only when none does.
type pool struct {
	workers int        // goroutines beside the caller
	mu      sync.Mutex // held for a region: one at a time
	// The region: ranges of [0, n) aligned to align, one per thread. Held here, not in a
	// closure, so that starting a region allocates nothing.
	n, align int
	r        ranger
	epoch    atomic.Uint64 // counts regions; a worker runs each once
	pending  atomic.Int64  // workers still in the current region
	parked   []atomic.Bool
	wake     []chan struct{}
	stop     atomic.Bool
}

// spinRounds bounds how long an idle worker polls for the next region before it parks (some
// tens of microseconds): longer than the gap between two products of one token, much shorter
// than a user's pause.
const spinRounds = 1 << 15

func newPool(workers int) *pool {
	p := &pool{workers: workers, parked: make([]atomic.Bool, workers), wake: make([]chan struct{}, workers)}
	for i := range p.wake {
		p.wake[i] = make(chan struct{}, 1)
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
	p.epoch.Add(1)
	p.wakeAll()
}

func (p *pool) wakeAll() {
	for i := range p.parked {
		if p.parked[i].CompareAndSwap(true, false) {
			p.wake[i] <- struct{}{}
		}
	}
}

func (p *pool) work(i int) {
	// Not the epoch at the time this goroutine starts: a region may already have begun.
	var seen uint64
	for {
		for spins := 0; p.epoch.Load() == seen; spins++ {
			if spins < spinRounds {
				continue
			}
			// Park, unless a region started since the last look: whoever clears parked
			// first decides whether a wake-up is on its way.
			p.parked[i].Store(true)
			if p.epoch.Load() != seen && p.parked[i].CompareAndSwap(true, false) {
				break
			}
			<-p.wake[i]
			spins = 0
		}
		if p.stop.Load() {
			return
		}
		seen = p.epoch.Load()
		p.part(i + 1)
		p.pending.Add(-1)
	}
}

// A ranger computes the items [lo, hi) of a region.
type ranger interface{ runRange(lo, hi int) }

// rangeFunc is a ranger.
type rangeFunc func(lo, hi int)

func (f rangeFunc) runRange(lo, hi int) { f(lo, hi) }

// rangeBound is the start of thread w's range of [0, n) split into parts ranges aligned to
// align; the last ends at n.
func rangeBound(n, align, parts, w int) int {
	if w == parts {
		return n
	}
	return n * w / parts / align * align
}

// part runs thread w's range of the current region.
func (p *pool) part(w int) {
	if lo, hi := rangeBound(p.n, p.align, p.workers+1, w), rangeBound(p.n, p.align, p.workers+1, w+1); lo < hi {
		p.r.runRange(lo, hi)
	}
}

// run runs r over [0, n) in ranges aligned to align, one per thread (the caller's first), and
// returns when all are done. It reports false, having run nothing, when another region holds
// the pool (a concurrent session, or a region started from inside a region).
func (p *pool) run(n, align int, r ranger) bool {
	if !p.mu.TryLock() {
		return false
	}
	defer p.mu.Unlock()
	p.n, p.align, p.r = n, align, r
	p.pending.Store(int64(p.workers))
	p.epoch.Add(1)
	p.wakeAll()
	p.part(0)
	for spins := 0; p.pending.Load() != 0; spins++ {
		if spins > spinRounds {
			runtime.Gosched()
		}
	}
	p.r = nil
	return true
}
