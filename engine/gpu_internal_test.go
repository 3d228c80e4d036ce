package engine

import (
	"flag"
	"testing"

	"github.com/commit-run/commit-run/internal/fakecuda"
)

var gpuDriver = flag.String("gpu", "fake", "the CUDA driver the tests that compute on cuda:0 use: fake (built from internal/fakecuda) or system (the machine's libcuda.so.1, on a machine with a GPU)")

// GPUForTests returns the CUDA driver library for a test that computes on cuda:0 and checks
// what must hold on any GPU: the fake driver, or with -gpu=system the machine's (""). Tests of
// the fake's own limits (its 1 GiB, its several devices) build the fake themselves.
func GPUForTests(tb testing.TB) string {
	tb.Helper()
	switch *gpuDriver {
	case "system":
		return ""
	case "fake":
	default:
		tb.Fatalf("-gpu=%s: want fake or system", *gpuDriver)
	}
	return FakeGPUForTests(tb)
}

// FakeGPUForTests builds the fake CUDA driver and returns its library, or skips without a C
// compiler.
func FakeGPUForTests(tb testing.TB) string {
	tb.Helper()
	return fakecuda.ForTests(tb)
}

// UnfusedForTests returns o computing passes on a GPU with one kernel per operation, as before
// the fused kernels: their reference.
func UnfusedForTests(o Options) Options {
	o.unfused = true
	return o
}

// UngroupedForTests returns o computing a prompt's experts one by one on a GPU, the grouped
// products' reference.
func UngroupedForTests(o Options) Options {
	o.ungrouped = true
	return o
}
