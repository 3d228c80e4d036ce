package cuda

import (
	"slices"
	"strings"
	"sync"
)

// KernelTime is one kernel's share of the compute stream over a profiled run
// (GPUOptions.ProfileKernels): how often it ran and its device time, summed.
type KernelTime struct {
	Name    string
	Calls   int64
	Seconds float64
}

// kernelProfiler times every eager launch between two timing events of its own, so that a
// kernel's time is its own: the time the stream sat idle waiting for the host before it, or
// in a wait for the copy stream, falls outside it. The events are pooled; they are read
// when the backlog grows (those already done, without blocking) and when the profile is
// asked for. A captured step's launches are not profiled: a graph's timing events would
// time its replays together.
type kernelProfiler struct {
	on bool
	mu sync.Mutex
	eventPool
	spans  []profSpan // launched, not yet read
	totals map[string]*KernelTime
}

type profSpan struct {
	name       string
	start, end *Event
}

// profileBacklog is how many launches' events wait before the done ones are read.
const profileBacklog = 4096

// launch enqueues fn on the compute stream: between two timing events when kernels are
// profiled, else as it is. The caller holds g.mu.
func (g *GPU) launch(fn *Function, grid, block Dim3, a *Args) error {
	p := &g.prof
	if !p.on || g.step != nil {
		return g.compute.Launch(fn, grid, block, 0, a)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	start, err := p.event(g.ctx)
	var end *Event
	if err == nil {
		end, err = p.event(g.ctx)
	}
	if err == nil {
		err = start.Record(g.compute)
	}
	if err != nil {
		p.release(start, end)
		g.fail(err)
		return g.compute.Launch(fn, grid, block, 0, a)
	}
	if err := g.compute.Launch(fn, grid, block, 0, a); err != nil {
		p.release(start, end)
		return err
	}
	if err := end.Record(g.compute); err != nil {
		p.release(start, end)
		g.fail(err)
		return nil
	}
	p.spans = append(p.spans, profSpan{fn.Name, start, end})
	if len(p.spans) >= profileBacklog {
		n := len(p.spans)
		for i, s := range p.spans {
			if ok, err := s.end.Done(); !ok || err != nil {
				n = i
				break
			}
		}
		g.readProfile(n)
	}
	return nil
}

// readProfile adds the n oldest spans to the totals, waiting for them. The caller holds
// g.prof.mu.
func (g *GPU) readProfile(n int) {
	p := &g.prof
	if p.totals == nil {
		p.totals = map[string]*KernelTime{}
	}
	for _, s := range p.spans[:n] {
		if err := s.end.Synchronize(); err != nil {
			g.fail(err)
		} else if sec, err := Elapsed(s.start, s.end); err != nil {
			g.fail(err)
		} else {
			k := p.totals[s.name]
			if k == nil {
				k = &KernelTime{Name: s.name}
				p.totals[s.name] = k
			}
			k.Calls++
			k.Seconds += max(sec, 0)
		}
		p.release(s.start, s.end)
	}
	p.spans = slices.Delete(p.spans, 0, n)
}

// KernelProfile waits for the profiled launches enqueued so far and returns every kernel's
// calls and device time since the GPU opened, by name; nil unless it was opened with
// ProfileKernels. The difference of two profiles is what ran between them.
func (g *GPU) KernelProfile() []KernelTime {
	p := &g.prof
	if !p.on {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	g.readProfile(len(p.spans))
	out := make([]KernelTime, 0, len(p.totals))
	for _, k := range p.totals {
		out = append(out, *k)
	}
	slices.SortFunc(out, func(a, b KernelTime) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// closeProfile destroys the profiler's events.
func (g *GPU) closeProfile() []error {
	p := &g.prof
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.spans {
		p.release(s.start, s.end)
	}
	p.spans = nil
	return p.destroy()
}
