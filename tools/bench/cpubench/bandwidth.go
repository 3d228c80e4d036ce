package main

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"
)

// A reader streams through a slice and returns something that depends on every byte, so the
// compiler cannot drop the reads.
type reader struct {
	Name string
	Read func([]byte) uint64
}

// readers are the ways of streaming memory compared: whichever reaches the highest rate is the
// host's read bandwidth. A plain Go loop issues scalar 8-byte loads and may not keep enough
// reads in flight to saturate DRAM; bytes.Count and bytes.IndexByte run the Go runtime's AVX2
// assembly (internal/bytealg) on amd64, 32-byte loads with more memory-level parallelism.
var readers = []reader{
	{"go-loop", sumWords},
	{"bytes.IndexByte", func(b []byte) uint64 { return uint64(bytes.IndexByte(b, 0xA5) + 1) }},
	{"bytes.Count", func(b []byte) uint64 { return uint64(bytes.Count(b, []byte{0xA5})) }},
}

// sumWords adds the slice's 8-byte words with four accumulators, so that the loop is not
// bound by one chain of dependent adds.
func sumWords(b []byte) uint64 {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	var s0, s1, s2, s3 uint64
	i := 0
	for ; i+4 <= len(w); i += 4 {
		s0 += w[i]
		s1 += w[i+1]
		s2 += w[i+2]
		s3 += w[i+3]
	}
	for ; i < len(w); i++ {
		s0 += w[i]
	}
	return s0 + s1 + s2 + s3
}

// bwSink keeps the readers' results, so that no read can be optimised away.
var bwSink uint64

// rate is one reader's best rate at a thread count.
type rate struct {
	Reader string  `json:"reader"`
	GBps   float64 `json:"gb_per_s"`
}

// bandwidth is the host's measured memory read bandwidth at a thread count: the best reader's
// rate, and every reader's.
type bandwidth struct {
	Threads     int     `json:"threads"`
	BufferBytes int64   `json:"buffer_bytes"`
	GBps        float64 `json:"gb_per_s"`
	Reader      string  `json:"reader"`
	Rates       []rate  `json:"rates"`
}

// measureBandwidth streams a buffer of size bytes with threads goroutines, each reading its own
// contiguous part, reps times per reader, and keeps each reader's best rate. The buffer is
// written first: untouched memory would map the kernel's zero page and read from cache.
func measureBandwidth(threads int, size int64, reps int) (bandwidth, error) {
	if threads < 1 || reps < 1 {
		return bandwidth{}, fmt.Errorf("bandwidth: %d threads, %d repetitions: want at least 1 of each", threads, reps)
	}
	// Each thread's part a whole number of 64-byte lines.
	part := size / int64(threads) &^ 63
	if part < 1<<20 {
		return bandwidth{}, fmt.Errorf("bandwidth: a %d-byte buffer over %d threads is too small to stream", size, threads)
	}
	buf := make([]byte, part*int64(threads))
	for i := range buf {
		buf[i] = 1 // not 0xA5, so IndexByte reads it all; not 0, see above
	}
	defer func() {
		buf = nil
		debug.FreeOSMemory()
	}()
	if runtime.GOMAXPROCS(0) < threads {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
	}
	bw := bandwidth{Threads: threads, BufferBytes: int64(len(buf))}
	for _, r := range readers {
		best := 0.0
		for range reps {
			sums := make([]uint64, threads)
			var wg sync.WaitGroup
			start := time.Now()
			for g := range threads {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sums[g] = r.Read(buf[int64(g)*part : int64(g+1)*part])
				}()
			}
			wg.Wait()
			if s := time.Since(start).Seconds(); s > 0 {
				best = max(best, float64(len(buf))/s/1e9)
			}
			for _, s := range sums {
				bwSink += s
			}
		}
		bw.Rates = append(bw.Rates, rate{Reader: r.Name, GBps: best})
		if best > bw.GBps {
			bw.GBps, bw.Reader = best, r.Name
		}
	}
	return bw, nil
}
