package offload

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// refCache is the obviously correct model the Cache is checked against: parallel slices
// indexed by slot and linear scans, with the eviction order spelled out by hand.
type refCache struct {
	ev         Eviction
	keys       []ExpertKey
	used, cold []bool
	uses, last []uint64
	pins       []int
	clock      uint64
	stats      CacheStats
}

func newRef(slots int, ev Eviction) *refCache {
	return &refCache{
		ev: ev, keys: make([]ExpertKey, slots), used: make([]bool, slots), cold: make([]bool, slots),
		uses: make([]uint64, slots), last: make([]uint64, slots), pins: make([]int, slots),
	}
}

func (r *refCache) find(k ExpertKey) int {
	for s := range r.keys {
		if r.used[s] && r.keys[s] == k {
			return s
		}
	}
	return -1
}

func (r *refCache) use(s int) {
	r.clock++
	r.uses[s]++
	r.last[s] = r.clock
	r.cold[s] = false
}

// cheaper reports whether the expert in slot i is a better victim than the one in slot j.
func (r *refCache) cheaper(i, j int) bool {
	if r.cold[i] != r.cold[j] {
		return r.cold[i]
	}
	if r.ev == LFU && r.uses[i] != r.uses[j] {
		return r.uses[i] < r.uses[j]
	}
	if r.last[i] != r.last[j] {
		return r.last[i] < r.last[j]
	}
	if r.keys[i].Layer != r.keys[j].Layer {
		return r.keys[i].Layer < r.keys[j].Layer
	}
	return r.keys[i].Expert < r.keys[j].Expert
}

func (r *refCache) assign(k ExpertKey) (slot int, hit bool, victim ExpertKey, evicted, noSlot bool) {
	if s := r.find(k); s >= 0 {
		r.stats.Hits++
		r.use(s)
		return s, true, ExpertKey{}, false, false
	}
	slot = -1
	for s := range r.used {
		if !r.used[s] {
			slot = s
			break
		}
	}
	if slot < 0 {
		for s := range r.used {
			if r.pins[s] == 0 && (slot < 0 || r.cheaper(s, slot)) {
				slot = s
			}
		}
		if slot < 0 {
			return -1, false, ExpertKey{}, false, true
		}
		victim, evicted = r.keys[slot], true
		r.stats.Evictions++
	}
	r.stats.Misses++
	r.keys[slot], r.used[slot], r.uses[slot], r.pins[slot] = k, true, 0, 0
	r.use(slot)
	return slot, false, victim, evicted, false
}

func (r *refCache) pin(k ExpertKey) error {
	s := r.find(k)
	if s < 0 {
		return ErrNotResident
	}
	r.pins[s]++
	return nil
}

func (r *refCache) unpin(k ExpertKey) error {
	s := r.find(k)
	switch {
	case s < 0:
		return ErrNotResident
	case r.pins[s] == 0:
		return ErrNotPinned
	}
	r.pins[s]--
	return nil
}

func (r *refCache) resident() []ExpertKey {
	var out []ExpertKey
	for s := range r.keys {
		if r.used[s] {
			out = append(out, r.keys[s])
		}
	}
	return out
}

// differential drives a Cache and a refCache with the same operations, one byte each: the
// high nibble picks the operation, the low nibble one of 16 keys (4 layers x 4 experts), few
// enough that small caches see hits, evictions and pins of residents.
func differential(t *testing.T, slots int, ev Eviction, ops []byte) {
	c := mustCache(t, slots, ev)
	r := newRef(slots, ev)
	for i, b := range ops {
		k := ExpertKey{Layer: int(b&15) >> 2, Expert: int(b & 3)}
		switch op := b >> 4; {
		case op == 15 && b&15 == 15:
			c.Reset()
			r = newRef(slots, ev)
		case op <= 5 || op == 15:
			slot, hit, victim, evicted, err := c.Assign(k)
			rslot, rhit, rvictim, revicted, noSlot := r.assign(k)
			if slot != rslot || hit != rhit || victim != rvictim || evicted != revicted || errors.Is(err, ErrNoSlot) != noSlot {
				t.Fatalf("op %d: assign %v = (%d, %v, %v, %v, %v), reference (%d, %v, %v, %v, noSlot %v)",
					i, k, slot, hit, victim, evicted, err, rslot, rhit, rvictim, revicted, noSlot)
			}
			if err != nil && !strings.Contains(err.Error(), k.String()) {
				t.Fatalf("op %d: error %q does not name %v", i, err, k)
			}
		case op <= 8:
			c.Touch(k)
			if s := r.find(k); s >= 0 {
				r.use(s)
			}
		case op <= 10:
			checkErr(t, i, "pin", k, c.Pin(k), r.pin(k))
		case op <= 12:
			checkErr(t, i, "unpin", k, c.Unpin(k), r.unpin(k))
		case op == 13 && b&15 == 15:
			c.Restore()
			clear(r.cold)
		case op == 13:
			c.Demote(k)
			if s := r.find(k); s >= 0 {
				r.cold[s] = true
			}
		default:
			slot, ok := c.Lookup(k)
			if rs := r.find(k); ok != (rs >= 0) || (ok && slot != rs) {
				t.Fatalf("op %d: lookup %v = %d, %v; reference slot %d", i, k, slot, ok, rs)
			}
		}
		if got, want := c.Resident(), r.resident(); !slices.Equal(got, want) {
			t.Fatalf("op %d: resident %v, reference %v", i, got, want)
		}
		if got, want := c.Stats(), r.stats; got != want {
			t.Fatalf("op %d: stats %+v, reference %+v", i, got, want)
		}
		checkInvariants(t, c)
	}
}

func checkErr(t *testing.T, i int, op string, k ExpertKey, got, want error) {
	t.Helper()
	if !errors.Is(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("op %d: %s %v: err = %v, reference %v", i, op, k, got, want)
	}
	if got != nil && !strings.Contains(got.Error(), k.String()) {
		t.Fatalf("op %d: %s error %q does not name %v", i, op, got, k)
	}
}

func TestCacheMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 7))
	runs := 400
	if testing.Short() {
		runs = 50
	}
	for n := range runs {
		slots := 1 + rng.IntN(12)
		ev := Eviction(n % 2)
		ops := make([]byte, 200)
		for i := range ops {
			ops[i] = byte(rng.UintN(256))
		}
		differential(t, slots, ev, ops)
	}
}

func FuzzCache(f *testing.F) {
	f.Add(uint8(2), false, []byte{0x00, 0x01, 0x02, 0x90, 0x03, 0xb0, 0x04})
	f.Add(uint8(3), true, []byte{0x00, 0x01, 0x02, 0x60, 0x60, 0x71, 0x03, 0x04, 0x92, 0x05, 0xff, 0x00})
	f.Add(uint8(0), true, []byte{0x05, 0x95, 0x96, 0x06, 0xc5, 0xc5, 0xc5, 0x06, 0xd5, 0xe6})
	f.Fuzz(func(t *testing.T, slots uint8, lfu bool, ops []byte) {
		ev := LRU
		if lfu {
			ev = LFU
		}
		differential(t, int(slots%8)+1, ev, ops)
	})
}
