package cuda

import (
	"errors"
	"slices"
	"sync"
)

// computeTimer times the compute stream with timing events: the device time between the
// engine's marks (a decode token's), and the time the stream sat in waits for the copy
// stream (the stall behind expert copies). Its events are pooled: a wait records two, a mark
// one, and none is created once the pool has grown to the run's needs.
type computeTimer struct {
	mu sync.Mutex
	eventPool
	waits []timedCopy // compute-stream waits on the copy stream not yet read (n unused)
	last  *Event      // the latest mark, the start of the next interval
	stall float64     // seconds of the waits read
	dev   float64     // seconds between consecutive marks, summed
	marks int64
}

// eventPool keeps events for reuse: creating one per use would cost a driver call a token
// (or, profiling, two a launch). Its owner's lock guards it.
type eventPool struct {
	free  []*Event // ready for reuse
	made  int      // created, all in free or held by the owner
	plain bool     // events without timing (Record's), cheaper to record
}

// event returns an event from the pool, or a new one.
func (p *eventPool) event(c *Context) (*Event, error) {
	if n := len(p.free); n > 0 {
		ev := p.free[n-1]
		p.free = p.free[:n-1]
		return ev, nil
	}
	ev, err := c.NewEvent(!p.plain)
	if err == nil {
		p.made++
	}
	return ev, err
}

// release returns events to the pool; nil ones are skipped.
func (p *eventPool) release(evs ...*Event) {
	for _, ev := range evs {
		if ev != nil {
			p.free = append(p.free, ev)
		}
	}
}

// destroy destroys the pool's events and empties it.
func (p *eventPool) destroy() []error {
	var errs []error
	for _, ev := range p.free {
		errs = append(errs, ev.Destroy())
	}
	p.free, p.made = nil, 0
	return errs
}

// waitForCopy makes the compute stream wait for ev, an event of the copy stream, between two
// timing events: the time from the first to the second is how long the stream waited,
// nothing enqueued on it left to run, for the copy to land. Both are recorded under t.mu so
// that a mark never falls between them.
func (g *GPU) waitForCopy(ev *Event) {
	t := &g.timing
	t.mu.Lock()
	defer t.mu.Unlock()
	start, err1 := t.event(g.ctx)
	end, err2 := t.event(g.ctx)
	if err := errors.Join(err1, err2); err != nil {
		t.release(start, end)
		g.fail(err)
		// The wait still orders the kernels after the copy.
		if err := g.compute.Wait(ev); err != nil {
			g.fail(err)
		}
		return
	}
	if err := errors.Join(start.Record(g.compute), g.compute.Wait(ev), end.Record(g.compute)); err != nil {
		t.release(start, end)
		g.fail(err)
		return
	}
	t.waits = append(t.waits, timedCopy{start: start, end: end})
	if len(t.waits) >= 256 {
		// Read what has happened without blocking; block only on a backlog that has not.
		if g.drainWaits(done(t.waits)) == 0 && len(t.waits) >= 1024 {
			g.drainWaits(len(t.waits) / 2)
		}
	}
}

// done counts the oldest of the timed spans whose end has happened, without blocking: those
// a drain can read without waiting.
func done(spans []timedCopy) int {
	for i, w := range spans {
		if ok, err := w.end.Done(); !ok || err != nil {
			return i
		}
	}
	return len(spans)
}

// drainWaits adds the time of the n oldest waits to the stall, waiting for them, and returns
// n. The caller holds g.timing.mu.
func (g *GPU) drainWaits(n int) int {
	t := &g.timing
	for _, w := range t.waits[:n] {
		if err := w.end.Synchronize(); err != nil {
			g.fail(err)
		} else if sec, err := Elapsed(w.start, w.end); err != nil {
			g.fail(err)
		} else {
			t.stall += max(sec, 0)
		}
		t.release(w.start, w.end)
	}
	t.waits = slices.Delete(t.waits, 0, n)
	return n
}

// Mark records a timing event on the compute stream after the work enqueued so far, waits
// for it, and reports the counters up to it. The engine marks where a decode token's logits
// have been read, when the stream has nothing left to run, so the wait costs nothing; the
// change of DeviceSeconds between two marks is then the device time of the token, and that
// of StallSeconds its time waiting for copies. Copies still in flight (a prefetch for the
// next token) are not waited for: the copy figures are those of the copies already landed.
func (g *GPU) Mark() GPUStats {
	t := &g.timing
	t.mu.Lock()
	ev, err := t.event(g.ctx)
	if err == nil {
		if err = errors.Join(ev.Record(g.compute), ev.Synchronize()); err != nil {
			t.release(ev)
		}
	}
	if err != nil {
		g.fail(err)
	} else {
		if t.last != nil {
			if sec, err := Elapsed(t.last, ev); err != nil {
				g.fail(err)
			} else {
				t.dev += max(sec, 0)
			}
			t.release(t.last)
		}
		t.last = ev
		t.marks++
		// Every wait enqueued so far came before the mark on the stream: all have happened.
		g.drainWaits(len(t.waits))
	}
	s := GPUStats{DeviceSeconds: t.dev, StallSeconds: t.stall, Marks: t.marks}
	t.mu.Unlock()

	g.copyMu.Lock()
	g.drainCopies(done(g.copies))
	s.CopyBytes, s.CopySeconds = g.copyBytes, g.copySec
	g.copyMu.Unlock()
	g.counters(&s)
	return s
}

// readTiming waits for the compute stream's timed waits and adds the timer's totals to s.
func (g *GPU) readTiming(s *GPUStats) {
	t := &g.timing
	t.mu.Lock()
	g.drainWaits(len(t.waits))
	s.DeviceSeconds, s.StallSeconds, s.Marks = t.dev, t.stall, t.marks
	t.mu.Unlock()
}

// closeTiming destroys the timer's events.
func (g *GPU) closeTiming() []error {
	t := &g.timing
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, w := range t.waits {
		t.release(w.start, w.end)
	}
	t.release(t.last)
	t.waits, t.last = nil, nil
	return t.destroy()
}
