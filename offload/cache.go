package offload

import (
	"errors"
	"fmt"

	"github.com/tidwall/btree"
)

var (
	// ErrNoSlot reports a miss that cannot be served because every slot holds a pinned expert.
	ErrNoSlot = errors.New("offload: every expert slot is pinned")
	// ErrNotResident reports an operation on an expert that holds no slot.
	ErrNotResident = errors.New("offload: expert is not resident")
	// ErrNotPinned reports an Unpin without a matching Pin.
	ErrNotPinned = errors.New("offload: expert is not pinned")
)

// CacheStats counts the outcomes of Assign. A failed Assign (ErrNoSlot) counts nothing, so a
// caller that retries after unpinning does not count the same miss twice.
type CacheStats struct {
	Hits, Misses, Evictions uint64
}

// Cache maps experts to a fixed set of device slots [0, Slots()). Slots are overwritten in place:
// a miss takes a free slot or evicts the least valuable unpinned resident expert.
//
// The cache only does the bookkeeping; moving bytes is the caller's job. Because Assign hands
// back a slot whose old contents are about to be overwritten, a caller that copies
// asynchronously should Pin the expert right after Assign and Unpin it once the copy and the
// kernels reading it are done.
//
// A Cache is not safe for concurrent use: the engine drives it from the one goroutine that
// schedules a layer, and a lock here would only hide ordering bugs there.
type Cache struct {
	ev    Eviction
	slots []entry             // by slot; entry.used says whether the slot holds an expert
	where map[ExpertKey]int   // resident expert -> slot
	free  []int               // free slots, lowest on top so fills are deterministic
	index *btree.BTreeG[item] // unpinned residents in eviction order, cheapest victim first
	clock uint64              // logical time: one tick per use, never wall time, for determinism
	stats CacheStats
}

type entry struct {
	key  ExpertKey
	uses uint64 // uses since the expert was loaded into this slot
	last uint64 // clock at the last use
	cold bool   // demoted since its last use: no more use expected soon
	pins int
	used bool
}

// item is an entry's position in the eviction index. It is a copy, so it must be removed from
// the index before the entry's uses or last change, and put back after.
type item struct {
	uses, last uint64
	cold       bool
	key        ExpertKey
}

// NewCache returns an empty cache of slots device slots.
func NewCache(slots int, ev Eviction) (*Cache, error) {
	if slots < 1 {
		return nil, fmt.Errorf("expert cache of %d slots: want at least 1", slots)
	}
	if !ev.valid() {
		return nil, fmt.Errorf("expert cache: unknown eviction policy %v", ev)
	}
	less := lruLess
	if ev == LFU {
		less = lfuLess
	}
	c := &Cache{
		ev:    ev,
		slots: make([]entry, slots),
		where: make(map[ExpertKey]int, slots),
		free:  make([]int, 0, slots),
		index: btree.NewBTreeGOptions(less, btree.Options{NoLocks: true}),
	}
	c.Reset()
	return c, nil
}

// lruLess orders demoted experts first, then by last use. Each use takes its own clock tick,
// so last is already unique among residents; the key only makes the order total by
// construction.
func lruLess(a, b item) bool {
	if a.cold != b.cold {
		return a.cold
	}
	if a.last != b.last {
		return a.last < b.last
	}
	return a.key.compare(b.key) < 0
}

// lfuLess orders demoted experts first, then by use count, then last use, then key.
func lfuLess(a, b item) bool {
	if a.cold != b.cold {
		return a.cold
	}
	if a.uses != b.uses {
		return a.uses < b.uses
	}
	return lruLess(a, b)
}

// Slots returns the number of device slots.
func (c *Cache) Slots() int { return len(c.slots) }

// Eviction returns the policy the cache was made with.
func (c *Cache) Eviction() Eviction { return c.ev }

// Lookup reports k's slot without counting a use, so that planning code can ask freely.
func (c *Cache) Lookup(k ExpertKey) (slot int, ok bool) {
	slot, ok = c.where[k]
	if !ok {
		return -1, false
	}
	return slot, true
}

// Touch counts a use of k: recency for LRU, frequency and recency for LFU. Touching an expert
// that is not resident does nothing: LFU here is in-cache LFU, so there is no count to keep
// for an expert without a slot.
func (c *Cache) Touch(k ExpertKey) {
	if slot, ok := c.where[k]; ok {
		c.use(slot)
	}
}

// Assign returns the slot k is to be loaded into: k's slot if resident (hit), else a free slot,
// else the slot of the victim the eviction policy picks among unpinned residents (evicted).
// Either way k is resident afterwards and has been used once more; a newly loaded expert starts
// at one use. The evicted expert's use count is forgotten (classic in-cache LFU): history
// outside the cache would need memory for every expert of the model and lets a once-hot expert
// squat a slot long after its layer stopped picking it.
func (c *Cache) Assign(k ExpertKey) (slot int, hit bool, victim ExpertKey, evicted bool, err error) {
	if slot, ok := c.where[k]; ok {
		c.stats.Hits++
		c.use(slot)
		return slot, true, ExpertKey{}, false, nil
	}
	if n := len(c.free); n > 0 {
		slot = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		// The index holds only unpinned residents, so its minimum is the victim.
		v, ok := c.index.PopMin()
		if !ok {
			return -1, false, ExpertKey{}, false, fmt.Errorf("assign expert %v: all %d slots pinned: %w", k, len(c.slots), ErrNoSlot)
		}
		victim, evicted = v.key, true
		slot = c.where[victim]
		delete(c.where, victim)
		c.stats.Evictions++
	}
	c.stats.Misses++
	c.clock++
	c.slots[slot] = entry{key: k, uses: 1, last: c.clock, used: true}
	c.where[k] = slot
	c.index.Set(c.slots[slot].item())
	return slot, false, victim, evicted, nil
}

// Victim returns the expert the next Assign of a non-resident expert would evict and its
// uses, without evicting it; ok is false when a slot is free or every resident is pinned.
func (c *Cache) Victim() (k ExpertKey, uses uint64, ok bool) {
	if len(c.free) > 0 {
		return ExpertKey{}, 0, false
	}
	v, ok := c.index.Min()
	return v.key, v.uses, ok
}

// SetUses sets resident k's use count to n: a caller that knows how often an expert was used
// before it was loaded (every token's routing) seeds LFU with that history, so that an expert
// that was popular while on the host is not the next victim.
func (c *Cache) SetUses(k ExpertKey, n uint64) error {
	slot, ok := c.where[k]
	if !ok {
		return fmt.Errorf("set uses of expert %v: %w", k, ErrNotResident)
	}
	c.update(slot, func(e *entry) { e.uses = n })
	return nil
}

// Demote makes resident k a victim before every expert not demoted (the demoted ones in the
// policy's order), until its next use or Restore: its caller knows that it will not be
// needed again soon. A scan that uses many experts once each, a prompt's pass through every
// layer, would otherwise evict exactly the experts it is about to reach. Demoting an expert
// that is not resident does nothing.
func (c *Cache) Demote(k ExpertKey) {
	if slot, ok := c.where[k]; ok {
		c.update(slot, func(e *entry) { e.cold = true })
	}
}

// Restore undoes every Demote: the scan is over, and the policy's own order holds again.
func (c *Cache) Restore() {
	for s := range c.slots {
		if c.slots[s].cold {
			c.update(s, func(e *entry) { e.cold = false })
		}
	}
}

// Pin keeps k from being evicted until a matching Unpin. Pins nest, because the same expert can
// be in use by the running layer and be the target of a prefetch at once.
func (c *Cache) Pin(k ExpertKey) error {
	slot, ok := c.where[k]
	if !ok {
		return fmt.Errorf("pin expert %v: %w", k, ErrNotResident)
	}
	e := &c.slots[slot]
	if e.pins == 0 {
		// Pinned experts leave the index rather than being skipped in it, so finding a
		// victim stays O(log n) however many experts a batch pins.
		c.index.Delete(e.item())
	}
	e.pins++
	return nil
}

// Unpin undoes one Pin of k.
func (c *Cache) Unpin(k ExpertKey) error {
	slot, ok := c.where[k]
	if !ok {
		return fmt.Errorf("unpin expert %v: %w", k, ErrNotResident)
	}
	e := &c.slots[slot]
	if e.pins == 0 {
		return fmt.Errorf("unpin expert %v: %w", k, ErrNotPinned)
	}
	e.pins--
	if e.pins == 0 {
		c.index.Set(e.item())
	}
	return nil
}

// Resident returns the resident experts in slot order.
func (c *Cache) Resident() []ExpertKey {
	out := make([]ExpertKey, 0, len(c.where))
	for i := range c.slots {
		if c.slots[i].used {
			out = append(out, c.slots[i].key)
		}
	}
	return out
}

// Stats returns the counts of Assign outcomes since the cache was made or last Reset.
func (c *Cache) Stats() CacheStats { return c.stats }

// Reset empties every slot, drops all pins and clears the statistics.
func (c *Cache) Reset() {
	clear(c.slots)
	clear(c.where)
	c.index.Clear()
	c.free = c.free[:0]
	for s := len(c.slots) - 1; s >= 0; s-- {
		c.free = append(c.free, s)
	}
	c.clock = 0
	c.stats = CacheStats{}
}

// use counts one use of the expert in slot.
func (c *Cache) use(slot int) {
	c.clock++
	c.update(slot, func(e *entry) { e.uses, e.last, e.cold = e.uses+1, c.clock, false })
}

// update changes the entry in slot, moving it in the index if it is there (unpinned).
func (c *Cache) update(slot int, change func(*entry)) {
	e := &c.slots[slot]
	if e.pins == 0 {
		c.index.Delete(e.item())
	}
	change(e)
	if e.pins == 0 {
		c.index.Set(e.item())
	}
}

func (e *entry) item() item { return item{uses: e.uses, last: e.last, cold: e.cold, key: e.key} }
