package cuda

import (
	"time"

	"github.com/commit-run/commit-run/device"
)

const (
	// defaultCopyBandwidth prices copies until the copy stream has timed one: a PCIe 4.0 x16
	// link's effective rate. One measured copy replaces it.
	defaultCopyBandwidth = 24e9
	// copyLatency is a copy's fixed cost: the driver's submission and the DMA engine's start.
	copyLatency = 10e-6
)

// CopyDone implements device.Planner: when a copy of n bytes enqueued now would land,
// behind the copies still in flight, at the bandwidth the copy stream has measured so far.
// The copies that have landed are timed here without waiting, so the estimate follows the
// link as it runs.
func (g *GPU) CopyDone(n int64) float64 {
	g.copyMu.Lock()
	defer g.copyMu.Unlock()
	landed := 0
	for _, c := range g.copies {
		done, err := c.end.Done()
		if err != nil || !done {
			break // a stream's copies land in order
		}
		landed++
	}
	g.drainCopies(landed)
	queued := n
	for _, c := range g.copies {
		queued += c.n
	}
	bw := defaultCopyBandwidth
	if g.copySec > 0 {
		bw = float64(g.copyBytes) / g.copySec
	}
	return g.now() + copyLatency + float64(queued)/bw
}

// HostDone implements device.Planner: the host computes the experts it is given when the
// engine asks, so it starts now, at GPUOptions.HostRates.
func (g *GPU) HostDone(w device.HostWork) float64 {
	return g.now() + g.hostRates.Seconds(w)
}

// now is the Planner's clock: seconds since the device was opened.
func (g *GPU) now() float64 { return time.Since(g.opened).Seconds() }

var _ device.Planner = (*GPU)(nil)
