package sim_test

import (
	"fmt"

	"github.com/commit-run/commit-run/sim"
)

// One MoE layer on an RTX 4090: the experts of the next layer load on the copy stream while
// this layer computes, and the next layer waits for them. Two 50 MB experts take 4 ms over
// PCIe against 0.14 ms of compute, which is why offloaded decode is bound by the copies.
func Example() {
	gpu, err := sim.LoadProfile("rtx4090")
	if err != nil {
		fmt.Println(err)
		return
	}
	tl := sim.NewTimeline()
	compute, copies := tl.NewStream("compute"), tl.NewStream("copy")

	const expertBytes = 50e6 // one expert's weights, quantised
	compute.Enqueue("attention", "attn", gpu.KernelTime(30e6, 1e9))
	copies.Enqueue("copy", "next e1", gpu.CopyTime(expertBytes))
	copies.Enqueue("copy", "next e2", gpu.CopyTime(expertBytes))
	compute.Enqueue("expert", "e1", gpu.KernelTime(expertBytes, 2e8))
	compute.Enqueue("expert", "e2", gpu.KernelTime(expertBytes, 2e8))
	compute.Wait(copies.Record())
	compute.Enqueue("attention", "next attn", gpu.KernelTime(30e6, 1e9))
	compute.Synchronize()

	for _, s := range tl.Spans() {
		fmt.Printf("%-7s %-9s %-12s %7.1f µs – %7.1f µs\n", s.Stream, s.Kind, s.Label, s.Start*1e6, s.End*1e6)
	}
	fmt.Printf("compute stalled %.1f µs of %.1f µs\n", compute.Stalled()*1e6, tl.Now()*1e6)
	// Output:
	// compute attention attn             0.0 µs –    34.8 µs
	// copy    copy      next e1          0.0 µs –  2010.0 µs
	// copy    copy      next e2       2010.0 µs –  4020.0 µs
	// compute expert    e1              34.8 µs –    89.4 µs
	// compute expert    e2              89.4 µs –   144.0 µs
	// compute stall     wait copy      144.0 µs –  4020.0 µs
	// compute attention next attn     4020.0 µs –  4054.8 µs
	// host    wait      sync compute     0.0 µs –  4054.8 µs
	// compute stalled 3876.0 µs of 4054.8 µs
}
