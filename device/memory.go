package device

import (
	"fmt"
	"sync"
)

// Memory is a hard memory budget. Every allocation on a device is checked against it and the
// peak is kept, so that a test can prove a run never used more than it was given.
type Memory struct {
	mu                 sync.Mutex
	budget, used, peak int64
}

// NewMemory returns a budget of n bytes; n must be positive.
func NewMemory(n int64) (*Memory, error) {
	if n <= 0 {
		return nil, fmt.Errorf("device memory budget of %d bytes: want a positive size", n)
	}
	return &Memory{budget: n}, nil
}

// Alloc takes n bytes for what (named in the error), or fails without taking any.
func (m *Memory) Alloc(n int64, what string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n < 0 {
		return fmt.Errorf("device memory: %s asks for %d bytes", what, n)
	}
	if m.used+n > m.budget || m.used+n < m.used {
		return fmt.Errorf("device memory: %s needs %d bytes, %d of the %d-byte budget are in use", what, n, m.used, m.budget)
	}
	m.used += n
	m.peak = max(m.peak, m.used)
	return nil
}

// Free returns n bytes taken by Alloc.
func (m *Memory) Free(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used = max(m.used-n, 0)
}

// Budget, Used and Peak report the budget, the bytes in use and the most ever in use.
func (m *Memory) Budget() int64 { m.mu.Lock(); defer m.mu.Unlock(); return m.budget }
func (m *Memory) Used() int64   { m.mu.Lock(); defer m.mu.Unlock(); return m.used }
func (m *Memory) Peak() int64   { m.mu.Lock(); defer m.mu.Unlock(); return m.peak }
