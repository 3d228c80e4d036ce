package device

import (
	"fmt"
	"math"

	"github.com/commit-run/commit-run/quant"
)

// Defaults of HostRates, for a desktop host with DDR5.
const (
	// DefaultHostBandwidth: the rate a desktop's DDR5 delivers a Q4_K matrix-vector product at.
	DefaultHostBandwidth = 20e9
	// DefaultHostFLOPS keeps the ratio of the further tokens' arithmetic to the first token's
	// bandwidth that MeasureHostRates and BenchmarkHostMatMulBatch (package cpu) find on a 2-core
	// x86-64 machine: 6 to 8 flops a byte of Q4_K.
	DefaultHostFLOPS = 140e9
	// DefaultHostOverhead: the dispatch to the host's threads and a kernel's share of moving
	// the activations between host and device.
	DefaultHostOverhead = 10e-6
)

// HostRates price the host's expert kernels (cpu-miss) as a Planner sees them. A kernel reads
// its weights once for a batch: the first token's pass is bound by reading and decoding them,
// each further token by its multiply-adds. That is what package cpu's BenchmarkHostMatMulBatch
// measures: on a 2-core x86-64 machine a Q4_K 2048x4096 product takes 0.25 ms for one token
// with its weights read from memory, as an expert's are (0.14 ms from the caches), and about
// 0.05 ms more for each further one.
type HostRates struct {
	// Bandwidth is the rate in bytes/s at which a kernel reads its weights for one token;
	// 0 = DefaultHostBandwidth.
	Bandwidth float64
	// FLOPS is the rate of the further tokens' arithmetic, two flops a multiply-add;
	// 0 = DefaultHostFLOPS.
	FLOPS float64
	// Overhead is a kernel's fixed cost in seconds; 0 = DefaultHostOverhead.
	Overhead float64
	// Memory is the host DRAM's read rate in bytes/s, which no kernel beats: the physical
	// limit of the host's reads (DESIGN.md §6), not a price; 0 = Bandwidth.
	Memory float64
}

// WithDefaults checks r and fills its zero rates with the defaults.
func (r HostRates) WithDefaults() (HostRates, error) {
	for _, f := range []struct {
		name string
		v    *float64
		def  float64
	}{{"bandwidth", &r.Bandwidth, DefaultHostBandwidth}, {"flops", &r.FLOPS, DefaultHostFLOPS}, {"overhead", &r.Overhead, DefaultHostOverhead}, {"memory bandwidth", &r.Memory, 0}} {
		if !(*f.v >= 0) || math.IsInf(*f.v, 0) {
			return r, fmt.Errorf("host %s %v: want a positive number, or 0 for the default", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if r.Memory == 0 {
		r.Memory = r.Bandwidth
	}
	return r, nil
}

// Seconds is the host's time for w at rates r (which have their defaults).
func (r HostRates) Seconds(w HostWork) float64 {
	return float64(w.Bytes)/r.Bandwidth + w.FLOPs/r.FLOPS + float64(w.Kernels)*r.Overhead
}

// HostWork is work for the host's kernels, in the terms HostRates price.
type HostWork struct {
	Bytes   int64   // the weights the kernels read
	FLOPs   float64 // the arithmetic of the tokens after each kernel's first
	Kernels int
}

// Plus is w and a product of weights m with tokens tokens (at least one).
func (w HostWork) Plus(m quant.Matrix, tokens int) HostWork {
	w.Bytes += int64(len(m.Data))
	w.FLOPs += 2 * float64(m.Rows) * float64(m.Cols) * float64(max(tokens, 1)-1)
	w.Kernels++
	return w
}

// BatchProduct is one product of a Batcher's batch: Out = W times the T rows of X.
type BatchProduct struct {
	W   quant.Matrix
	X   []float32
	T   int
	Out []float32
}

// Batcher is implemented by host kernels that compute several MatMulID products in one
// parallel region (the CPU's), each output MatMulID's, at one kernel's fixed cost
// (HostRates.Overhead).
type Batcher interface {
	MatMulIDs([]BatchProduct)
}

// Add is the sum of w and v.
func (w HostWork) Add(v HostWork) HostWork {
	return HostWork{Bytes: w.Bytes + v.Bytes, FLOPs: w.FLOPs + v.FLOPs, Kernels: w.Kernels + v.Kernels}
}
