package main

import (
	"os"
	"syscall"
)

// peakRSS is a finished child's maximum resident set size in bytes (Linux reports kilobytes),
// or 0 when it never ran.
func peakRSS(ps *os.ProcessState) int64 {
	if ps == nil {
		return 0
	}
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Maxrss * 1024
	}
	return 0
}
