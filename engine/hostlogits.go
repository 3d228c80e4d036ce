package engine

import (
	"slices"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// hostLogits is the host memory that a pass in device memory reads its one row of logits into
// (a decoded token's, or a prompt's last): one vocabulary's worth per KV cache, reused at every
// pass of its session, which samples from the logits before it asks for the next, and pinned
// where the device allows, so that the read is the link's DMA into it rather than the
// driver's staging into a fresh Go slice each token (GPUStats.Pageable, and a vocabulary's
// floats of garbage a token). A closed session's memory goes to the next session's first
// pass, since pinned memory lives as long as the device.
type hostLogits struct {
	pin  device.HostAllocator // nil: Go memory
	mu   sync.Mutex           // sessions close on their own goroutines
	byKV map[*models.KVCache][]float32
	free [][]float32
}

func newHostLogits(dev device.Device) *hostLogits {
	pin, _ := dev.(device.HostAllocator)
	return &hostLogits{pin: pin, byKV: map[*models.KVCache][]float32{}}
}

// get returns kv's n floats: its own, a closed session's, or new.
func (h *hostLogits) get(kv *models.KVCache, n int) []float32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f, ok := h.byKV[kv]; ok && len(f) == n {
		return f
	}
	var f []float32
	if i := slices.IndexFunc(h.free, func(f []float32) bool { return len(f) == n }); i >= 0 {
		f = h.free[i]
		h.free = slices.Delete(h.free, i, i+1)
	} else if h.pin != nil {
		f, _ = pinnedFloats(h.pin, n)
	}
	if f == nil {
		f = make([]float32, n)
	}
	if old, ok := h.byKV[kv]; ok {
		h.free = append(h.free, old)
	}
	h.byKV[kv] = f
	return f
}

// release gives kv's memory to the next session.
func (h *hostLogits) release(kv *models.KVCache) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if f, ok := h.byKV[kv]; ok {
		delete(h.byKV, kv)
		h.free = append(h.free, f)
	}
}
