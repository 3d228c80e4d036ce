// Package sim is a virtual-time model of one GPU: the clock behind the simulated device
// sim:<profile> (DESIGN.md §4). It prices work with a roofline and orders it the way CUDA
// does, so an offloading pipeline can be run, tested and timed on a machine with no GPU. It
// knows nothing about models: callers say how many bytes and flops a kernel touches and how
// many bytes a copy moves. The one MoE operation it implements itself is a prompt's experts
// grouped (device.GroupedExperts, grouped.go), priced as the CUDA engine launches them.
//
// A Profile holds the public numbers of one card (memory, memory bandwidth, peak dense FP16
// tensor flops, PCIe bandwidth) and prices work with two formulas:
//
//	KernelTime(bytes, flops) = max(bytes / memory_bandwidth, flops / peak_flops) + launch_overhead
//	CopyTime(bytes)          = bytes / pcie_effective + copy_latency
//
// A matrix product of up to DecodeTokens tokens reads its weights at decode_bandwidth[type]
// instead of memory_bandwidth where the profile measured one (ProductTime): a card's decode
// kernels reach a share of its memory's rate that depends on the weights' type.
//
// pcie_effective is the measured pinned host-to-device rate (bandwidthTest, nvbandwidth),
// not the link's theoretical rate, because that is what an expert upload actually gets.
// Profiles ship embedded (see Profiles) and users can load their own JSON file; none is
// trusted until its Calibrated flag says it was compared against a real GPU.
//
// A Timeline models one host thread issuing asynchronous work onto in-order streams:
// Enqueue starts an op at max(stream tail, host time) and does not move host time; events
// (Record, Wait) order streams against each other like cudaEventRecord and
// cudaStreamWaitEvent; HostWait and Synchronize block the host like cudaEventSynchronize and
// cudaStreamSynchronize. Time an issued op spends blocked on another stream's event is a
// stall, kept per stream and recorded as a span of kind "stall". WriteSVG draws the spans as
// one row per stream, which shows which copies overlap which kernels and where the stalls are.
//
// All times are float64 seconds. The cost formulas are ratios of floats, and a decode step
// sums thousands of sub-microsecond ops (a 4 KiB copy at 25 GB/s is 164 ns), which integer
// nanoseconds (time.Duration) would round one by one; float64 keeps about 1e-12 s resolution
// over an hour of virtual time. Nothing here reads the wall clock, so every run is
// deterministic.
package sim
