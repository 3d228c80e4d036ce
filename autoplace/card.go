package autoplace

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/sim"
)

// DescribeGPU describes a real card for the candidates' runs, which a real card cannot time
// only: its kind's embedded profile when there is one, else its figures from the driver (the
// dense FP16 rate with FP32 accumulate taken as 512 flops a clock a multiprocessor, as on
// Turing, Ampere and Ada GeForce cards), with its free memory and the copy stream's rate
// measured now on 16 MiB copies.
func DescribeGPU(g *cuda.GPU) (*sim.Profile, error) {
	in := g.Info()
	p := profileOfKind(in.Name)
	if p == nil {
		p = &sim.Profile{Name: "cuda", Description: in.Name, MemoryBandwidth: in.MemoryBandwidth,
			PeakFLOPS: float64(in.SMs) * float64(in.ClockKHz) * 1e3 * 512, CopyLatency: 10e-6, LaunchOverhead: 5e-6}
	}
	p.MemoryBytes = g.Memory().Budget()
	bw, err := measureCopies(g, 16<<20, 4)
	if err != nil {
		return nil, err
	}
	p.PCIeEffective = bw
	p.PCIeBandwidth = max(p.PCIeBandwidth, bw)
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", in.Name, err)
	}
	return p, nil
}

// profileOfKind returns the embedded profile of a card the driver names ("NVIDIA GeForce RTX
// 4090" is rtx4090), or nil.
func profileOfKind(name string) *sim.Profile {
	n := strings.ToLower(name)
	for _, drop := range []string{"nvidia", "geforce", " ", "-"} {
		n = strings.ReplaceAll(n, drop, "")
	}
	for _, k := range sim.Profiles() {
		if strings.ReplaceAll(k, "-", "") == n {
			p, err := sim.LoadProfile(k)
			if err == nil {
				return p
			}
		}
	}
	return nil
}

// measureCopies times n copies of size bytes from pinned host memory to the card and returns
// the best rate.
func measureCopies(g *cuda.GPU, size int64, n int) (float64, error) {
	src, err := g.HostAlloc(size)
	if err != nil {
		return 0, fmt.Errorf("measure the copy stream: %w", err)
	}
	dst, err := g.Buffer(size, "copy stream measurement")
	if err != nil {
		return 0, fmt.Errorf("measure the copy stream: %w", err)
	}
	defer g.Release(dst)
	best := math.Inf(1)
	for range n {
		start := time.Now()
		g.CopyIn(dst, src)
		g.Sync(g.Copy().Record())
		best = min(best, time.Since(start).Seconds())
	}
	if err := g.Err(); err != nil {
		return 0, fmt.Errorf("measure the copy stream: %w", err)
	}
	return float64(size) / max(best, 1e-9), nil
}
