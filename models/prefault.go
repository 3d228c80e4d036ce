package models

import (
	"fmt"
	"os"
	"strings"
)

// Prefault reads the weights of every tensor but those skipped says no pass reads once, so
// that the first tokens do not stall on page faults, and reports progress while doing so. A
// file larger than most of the free memory is left to fault in on demand: reading it all would
// only evict itself.
func (f *File) Prefault(skipped func(name string) bool, progress func(done, total int64)) {
	var total int64
	var ts []*Tensor
	for _, t := range f.Tensors {
		if !skipped(t.Name) { // a block no pass runs would only take memory
			total += t.Bytes()
			ts = append(ts, t)
		}
	}
	if avail := availableMemory(); avail > 0 && total > avail*3/4 {
		if progress != nil {
			progress(total, total)
		}
		return
	}
	const page = 4096
	var done int64
	var sink byte
	populate := true
	for _, t := range ts {
		// One madvise per tensor where the kernel has it. Measured on the Qwen3-30B-A3B-
		// shaped Q8_0 file of make bench-cpu (medians of 5, alternating): a 128-token
		// prompt then took 0.37 s and 16 tokens 0.40 s, against 0.45 s and 0.47 s after
		// touching every page, and the process held 2.0 GB of the file mapped against
		// 1.6 GB.
		if populate && f.Populate(t) != nil {
			populate = false
		}
		for i := 0; !populate && i < len(t.Data); i += page {
			sink ^= t.Data[i]
		}
		done += t.Bytes()
		if progress != nil {
			progress(done, total)
		}
	}
	_ = sink
}

// availableMemory returns MemAvailable from /proc/meminfo in bytes, or 0 if unknown.
func availableMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if n, _ := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); n == 1 {
			return kb * 1024
		}
	}
	return 0
}
