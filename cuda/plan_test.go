package cuda

import (
	"math"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
)

// TestGPUPlanner checks the Planner's prices on the fake driver, whose copies land at once
// and whose events take the host's clock: a copy at the default rate until the copy stream
// has timed one, then at the measured rate; host work at GPUOptions.HostRates.
func TestGPUPlanner(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{HostRates: device.HostRates{Bandwidth: 1e9, FLOPS: 1e10, Overhead: 1e-5}})
	const n = 1 << 20
	// within checks that f, evaluated between the clock readings lo and hi, is wait seconds
	// after a time in [lo, hi].
	within := func(what string, f func() float64, wait float64) {
		t.Helper()
		lo := g.now()
		got := f()
		hi := g.now()
		if got < lo+wait-1e-9 || got > hi+wait+1e-9 {
			t.Errorf("%s: %.9f, want %.9f after a time in [%.9f, %.9f]", what, got, wait, lo, hi)
		}
	}
	within("a copy before any is timed", func() float64 { return g.CopyDone(n) }, copyLatency+n/defaultCopyBandwidth)
	within("host work", func() float64 { return g.HostDone(device.HostWork{Bytes: n, FLOPs: 1e6, Kernels: 3}) }, n/1e9+1e6/1e10+3e-5)
	within("no host work", func() float64 { return g.HostDone(device.HostWork{}) }, 0)

	slot, err := g.Buffer(n, "a slot")
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, n)
	for range 4 {
		g.CopyIn(slot, src)
	}
	g.Sync(g.Copy().Record())
	g.CopyDone(n) // times the copies that landed
	if g.copyBytes != 4*n || len(g.copies) != 0 {
		t.Fatalf("the planner timed %d bytes and left %d copies in flight: want the 4 that landed, none", g.copyBytes, len(g.copies))
	}
	rate := float64(g.copyBytes) / g.copySec
	within("a copy at the measured rate", func() float64 { return g.CopyDone(n) }, copyLatency+n/rate)
	if !(g.CopyDone(2*n) > g.CopyDone(n)) {
		t.Error("a larger copy does not land later")
	}
}

func TestGPUPlannerOptions(t *testing.T) {
	fakeDriver(t)
	for _, r := range []device.HostRates{{Bandwidth: -1}, {FLOPS: math.NaN()}, {Overhead: math.Inf(1)}} {
		_, err := Open(GPUOptions{Library: fake.path, PTX: fakeModule, Host: cpu.New(1), HostRates: r})
		if err == nil || !strings.Contains(err.Error(), "host") {
			t.Errorf("host rates %+v: %v", r, err)
		}
	}
	want := device.HostRates{Bandwidth: device.DefaultHostBandwidth, FLOPS: device.DefaultHostFLOPS, Overhead: device.DefaultHostOverhead, Memory: device.DefaultHostBandwidth}
	if g := openFakeGPU(t, GPUOptions{}); g.hostRates != want {
		t.Errorf("default host rates %+v, want %+v", g.hostRates, want)
	}
}
