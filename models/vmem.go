package models

import (
	"fmt"
	"syscall"
)

// VirtualAlloc is an Alloc of address space that nothing is meant to touch: the weights, KV
// caches and expert slots of timing-only runs, which may be far larger than this machine's
// memory. Pages are only backed once written (reading one gives zeros), and a timing-only run
// writes none.
func VirtualAlloc(n int64, what string) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|mapNoReserve)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes of address space for %s: %w", n, what, err)
	}
	return b, nil
}

// VirtualFree gives back what VirtualAlloc reserved.
func VirtualFree(b []byte) {
	if len(b) > 0 {
		syscall.Munmap(b)
	}
}
