package offload

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// step is one operation of a hand-worked sequence. For assign, want is the outcome as
// describe writes it; for pin and unpin, want is "" or the sentinel error's text.
type step struct {
	op   string
	k    ExpertKey
	want string
}

func describe(slot int, hit bool, victim ExpertKey, evicted bool, err error) string {
	switch {
	case err != nil:
		return "error: " + err.Error()
	case hit:
		return fmt.Sprintf("slot %d hit", slot)
	case evicted:
		return fmt.Sprintf("slot %d miss, evict %v", slot, victim)
	}
	return fmt.Sprintf("slot %d miss", slot)
}

func run(t *testing.T, c *Cache, steps []step) {
	t.Helper()
	for i, s := range steps {
		var got string
		switch s.op {
		case "assign":
			got = describe(c.Assign(s.k))
		case "touch":
			c.Touch(s.k)
		case "pin":
			got = errText(c.Pin(s.k))
		case "unpin":
			got = errText(c.Unpin(s.k))
		default:
			t.Fatalf("step %d: unknown op %q", i, s.op)
		}
		if got != s.want {
			t.Fatalf("step %d: %s %v = %q, want %q", i, s.op, s.k, got, s.want)
		}
		checkInvariants(t, c)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestCacheSequences(t *testing.T) {
	a, b, c, d, e := ExpertKey{0, 0}, ExpertKey{0, 1}, ExpertKey{0, 2}, ExpertKey{1, 0}, ExpertKey{1, 1}
	// The same opening under both policies: a is used most but least recently.
	opening := []step{
		{"assign", a, "slot 0 miss"}, // clock 1
		{"assign", b, "slot 1 miss"}, // 2
		{"assign", c, "slot 2 miss"}, // 3
		{"touch", a, ""},             // a: 2 uses, last 4
		{"touch", a, ""},             // a: 3 uses, last 5
		{"touch", b, ""},             // b: 2 uses, last 6
		{"touch", c, ""},             // c: 2 uses, last 7
	}
	tests := []struct {
		name     string
		ev       Eviction
		slots    int
		steps    []step
		stats    CacheStats
		resident []ExpertKey
	}{
		{
			name: "lru evicts least recent", ev: LRU, slots: 3,
			steps: []step{
				{"assign", a, "slot 0 miss"},              // 1
				{"assign", b, "slot 1 miss"},              // 2
				{"assign", c, "slot 2 miss"},              // 3
				{"touch", a, ""},                          // a last 4: b is now oldest
				{"assign", d, "slot 1 miss, evict L0/E1"}, // d last 5
				{"assign", c, "slot 2 hit"},               // c last 6
				{"assign", e, "slot 0 miss, evict L0/E0"}, // a (4) < d (5) < c (6); e last 7
				{"assign", b, "slot 1 miss, evict L1/E0"}, // d (5) < c (6) < e (7)
			},
			stats:    CacheStats{Hits: 1, Misses: 6, Evictions: 3},
			resident: []ExpertKey{e, b, c},
		},
		{
			name: "lfu evicts least frequent, least recent among equals", ev: LFU, slots: 3,
			steps: []step{
				{"assign", a, "slot 0 miss"},              // a 1 use, last 1
				{"assign", b, "slot 1 miss"},              // b 1, 2
				{"assign", c, "slot 2 miss"},              // c 1, 3
				{"touch", a, ""},                          // a 2, 4
				{"touch", b, ""},                          // b 2, 5
				{"touch", a, ""},                          // a 3, 6
				{"assign", d, "slot 2 miss, evict L0/E2"}, // c has 1 use; d 1, 7
				{"assign", e, "slot 2 miss, evict L1/E0"}, // a newcomer is the cheapest victim; e 1, 8
				{"touch", e, ""},                          // e 2, 9: ties b (2, 5)
				{"assign", c, "slot 1 miss, evict L0/E1"}, // c forgot its count: back to 1 use; c 1, 10
				{"assign", c, "slot 1 hit"},               // c 2, 11
			},
			stats:    CacheStats{Hits: 1, Misses: 6, Evictions: 3},
			resident: []ExpertKey{a, c, e},
		},
		{
			name: "same opening, lru", ev: LRU, slots: 3,
			steps: append(slices.Clone(opening),
				step{"assign", d, "slot 0 miss, evict L0/E0"}, // a was used longest ago
				step{"assign", a, "slot 1 miss, evict L0/E1"},
			),
			stats:    CacheStats{Misses: 5, Evictions: 2},
			resident: []ExpertKey{d, a, c},
		},
		{
			name: "same opening, lfu", ev: LFU, slots: 3,
			steps: append(slices.Clone(opening),
				step{"assign", d, "slot 1 miss, evict L0/E1"}, // b and c have 2 uses; b is older
				step{"assign", a, "slot 0 hit"},
			),
			stats:    CacheStats{Hits: 1, Misses: 4, Evictions: 1},
			resident: []ExpertKey{a, d, c},
		},
		{
			name: "one slot", ev: LFU, slots: 1,
			steps: []step{
				{"assign", a, "slot 0 miss"},
				{"touch", a, ""},
				{"touch", b, ""}, // not resident: no effect
				{"assign", b, "slot 0 miss, evict L0/E0"},
				{"assign", b, "slot 0 hit"},
			},
			stats:    CacheStats{Hits: 1, Misses: 2, Evictions: 1},
			resident: []ExpertKey{b},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := mustCache(t, tt.slots, tt.ev)
			run(t, cache, tt.steps)
			if got := cache.Stats(); got != tt.stats {
				t.Errorf("stats = %+v, want %+v", got, tt.stats)
			}
			if got := cache.Resident(); !slices.Equal(got, tt.resident) {
				t.Errorf("resident = %v, want %v", got, tt.resident)
			}
		})
	}
}

func TestCachePins(t *testing.T) {
	a, b, c, d := ExpertKey{2, 0}, ExpertKey{2, 1}, ExpertKey{2, 2}, ExpertKey{3, 5}
	for _, ev := range []Eviction{LRU, LFU} {
		t.Run(ev.String(), func(t *testing.T) {
			cache := mustCache(t, 2, ev)
			run(t, cache, []step{
				{"assign", a, "slot 0 miss"},
				{"assign", b, "slot 1 miss"},
				{"pin", a, ""}, // a is both LRU and LFU victim, but pinned
				{"pin", a, ""}, // nested
				{"assign", c, "slot 1 miss, evict L2/E1"},
				{"pin", c, ""},
				{"assign", d, "error: assign expert L3/E5: all 2 slots pinned: offload: every expert slot is pinned"},
				{"assign", a, "slot 0 hit"}, // hits still work with everything pinned
				{"unpin", a, ""},
				{"assign", d, "error: assign expert L3/E5: all 2 slots pinned: offload: every expert slot is pinned"},
				{"unpin", a, ""},
				{"unpin", a, "unpin expert L2/E0: offload: expert is not pinned"},
				{"assign", d, "slot 0 miss, evict L2/E0"},
				{"pin", a, "pin expert L2/E0: offload: expert is not resident"},
				{"unpin", b, "unpin expert L2/E1: offload: expert is not resident"},
				{"unpin", c, ""},
				{"touch", d, ""}, // d is now more recent and more used than c
				{"assign", a, "slot 1 miss, evict L2/E2"},
			})
			// The failed assigns counted nothing.
			if got, want := cache.Stats(), (CacheStats{Hits: 1, Misses: 5, Evictions: 3}); got != want {
				t.Errorf("stats = %+v, want %+v", got, want)
			}
		})
	}
}

func TestCacheNoSlotIsWrapped(t *testing.T) {
	cache := mustCache(t, 1, LRU)
	k := ExpertKey{7, 42}
	if _, _, _, _, err := cache.Assign(ExpertKey{0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := cache.Pin(ExpertKey{0, 0}); err != nil {
		t.Fatal(err)
	}
	slot, hit, _, evicted, err := cache.Assign(k)
	if !errors.Is(err, ErrNoSlot) || !strings.Contains(err.Error(), k.String()) {
		t.Fatalf("err = %v, want ErrNoSlot naming %v", err, k)
	}
	if slot != -1 || hit || evicted {
		t.Errorf("failed assign returned slot %d hit %v evicted %v", slot, hit, evicted)
	}
	if _, ok := cache.Lookup(k); ok {
		t.Errorf("%v resident after a failed assign", k)
	}
	if err := cache.Pin(k); !errors.Is(err, ErrNotResident) {
		t.Errorf("pin of unknown key: err = %v, want ErrNotResident", err)
	}
	if err := cache.Unpin(k); !errors.Is(err, ErrNotResident) {
		t.Errorf("unpin of unknown key: err = %v, want ErrNotResident", err)
	}
}

func TestCacheLookupHasNoSideEffects(t *testing.T) {
	a, b, c := ExpertKey{0, 0}, ExpertKey{0, 1}, ExpertKey{0, 2}
	cache := mustCache(t, 2, LRU)
	cache.Assign(a)
	cache.Assign(b)
	for range 3 {
		if slot, ok := cache.Lookup(a); !ok || slot != 0 {
			t.Fatalf("lookup %v = %d, %v; want 0, true", a, slot, ok)
		}
	}
	if slot, ok := cache.Lookup(c); ok || slot != -1 {
		t.Fatalf("lookup %v = %d, %v; want -1, false", c, slot, ok)
	}
	// Had Lookup counted as a use, b would be the victim.
	if _, _, victim, _, _ := cache.Assign(c); victim != a {
		t.Errorf("victim = %v, want %v", victim, a)
	}
	if got, want := cache.Stats(), (CacheStats{Misses: 3, Evictions: 1}); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
}

func TestCacheReset(t *testing.T) {
	cache := mustCache(t, 2, LFU)
	for e := range 5 {
		cache.Assign(ExpertKey{0, e})
	}
	cache.Pin(ExpertKey{0, 4})
	cache.Reset()
	checkInvariants(t, cache)
	if got := cache.Resident(); len(got) != 0 {
		t.Errorf("resident after reset = %v", got)
	}
	if got := cache.Stats(); got != (CacheStats{}) {
		t.Errorf("stats after reset = %+v", got)
	}
	run(t, cache, []step{
		{"assign", ExpertKey{0, 4}, "slot 0 miss"}, // the pin went with the reset
		{"assign", ExpertKey{0, 3}, "slot 1 miss"},
		{"assign", ExpertKey{0, 2}, "slot 0 miss, evict L0/E4"},
	})
}

func TestEvictionOrderTieBreaksOnKey(t *testing.T) {
	// The clock makes last uses unique inside a Cache, so the key tie-break cannot be reached
	// through the API; check the order itself.
	lo, hi := item{uses: 2, last: 9, key: ExpertKey{1, 3}}, item{uses: 2, last: 9, key: ExpertKey{1, 4}}
	for name, less := range map[string]func(a, b item) bool{"lru": lruLess, "lfu": lfuLess} {
		if !less(lo, hi) || less(hi, lo) || less(lo, lo) {
			t.Errorf("%s: key tie-break is not a strict order", name)
		}
	}
	if !lfuLess(item{uses: 1, last: 9}, item{uses: 2, last: 1}) {
		t.Error("lfu: fewer uses must come first whatever the recency")
	}
	if !lruLess(item{uses: 9, last: 1}, item{uses: 1, last: 2}) {
		t.Error("lru: use count must not matter")
	}
}

func TestNewCacheErrors(t *testing.T) {
	for _, tt := range []struct {
		slots int
		ev    Eviction
		want  string
	}{
		{0, LRU, "0 slots"},
		{-3, LFU, "-3 slots"},
		{4, Eviction(7), "Eviction(7)"},
	} {
		c, err := NewCache(tt.slots, tt.ev)
		if err == nil || c != nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewCache(%d, %v) = %v, %v; want an error naming %q", tt.slots, tt.ev, c, err, tt.want)
		}
	}
}

func TestParseEviction(t *testing.T) {
	for _, ev := range []Eviction{LRU, LFU} {
		got, err := ParseEviction(ev.String())
		if err != nil || got != ev {
			t.Errorf("ParseEviction(%q) = %v, %v; want %v", ev.String(), got, err, ev)
		}
	}
	if got, err := ParseEviction(" LFU "); err != nil || got != LFU {
		t.Errorf("ParseEviction(\" LFU \") = %v, %v; want lfu", got, err)
	}
	for _, s := range []string{"", "fifo", "lru2", "l r u"} {
		_, err := ParseEviction(s)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", s)) || !strings.Contains(err.Error(), "lru or lfu") {
			t.Errorf("ParseEviction(%q): err = %v, want one naming the input and the choices", s, err)
		}
	}
}

func mustCache(t testing.TB, slots int, ev Eviction) *Cache {
	t.Helper()
	c, err := NewCache(slots, ev)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkInvariants ties the slot table, the key map, the free list and the index together.
func checkInvariants(t testing.TB, c *Cache) {
	t.Helper()
	used, unpinned := 0, 0
	for s, e := range c.slots {
		if !e.used {
			if e != (entry{}) {
				t.Fatalf("free slot %d holds %+v", s, e)
			}
			continue
		}
		used++
		if got, ok := c.where[e.key]; !ok || got != s {
			t.Fatalf("slot %d holds %v but the map says %d, %v", s, e.key, got, ok)
		}
		if e.last > c.clock || e.uses == 0 || e.pins < 0 {
			t.Fatalf("slot %d: bad entry %+v at clock %d", s, e, c.clock)
		}
		_, indexed := c.index.Get(e.item())
		if indexed != (e.pins == 0) {
			t.Fatalf("slot %d (%v, %d pins): indexed = %v", s, e.key, e.pins, indexed)
		}
		if e.pins == 0 {
			unpinned++
		}
	}
	if used != len(c.where) {
		t.Fatalf("%d used slots but %d keys in the map", used, len(c.where))
	}
	if used+len(c.free) != len(c.slots) {
		t.Fatalf("%d used + %d free != %d slots", used, len(c.free), len(c.slots))
	}
	for _, s := range c.free {
		if c.slots[s].used {
			t.Fatalf("free list holds used slot %d", s)
		}
	}
	if c.index.Len() != unpinned {
		t.Fatalf("index holds %d items, want the %d unpinned residents", c.index.Len(), unpinned)
	}
}

// Victim names the next Assign's victim without evicting it, and SetUses seeds LFU with a
// history from before the expert was loaded.
func TestCacheVictimAndSetUses(t *testing.T) {
	a, b, c := ExpertKey{0, 0}, ExpertKey{0, 1}, ExpertKey{1, 0}
	cache := mustCache(t, 2, LFU)
	if _, _, ok := cache.Victim(); ok {
		t.Error("a victim while slots are free")
	}
	for _, k := range []ExpertKey{a, b, b} {
		if _, _, _, _, err := cache.Assign(k); err != nil {
			t.Fatal(err)
		}
	}
	if v, uses, ok := cache.Victim(); !ok || v != a || uses != 1 {
		t.Errorf("victim %v with %d uses (%v), want %v with 1", v, uses, ok, a)
	}
	if err := cache.SetUses(a, 10); err != nil {
		t.Fatal(err)
	}
	if v, uses, _ := cache.Victim(); v != b || uses != 2 {
		t.Errorf("after seeding %v with 10 uses the victim is %v (%d uses), want %v", a, v, uses, b)
	}
	if err := cache.Pin(b); err != nil {
		t.Fatal(err)
	}
	if err := cache.SetUses(b, 0); err != nil { // pinned: outside the index until unpinned
		t.Fatal(err)
	}
	if v, _, _ := cache.Victim(); v != a {
		t.Errorf("victim %v while %v is pinned, want %v", v, b, a)
	}
	if err := cache.Unpin(b); err != nil {
		t.Fatal(err)
	}
	if v, uses, _ := cache.Victim(); v != b || uses != 0 {
		t.Errorf("victim %v (%d uses), want %v with 0", v, uses, b)
	}
	if err := cache.SetUses(c, 3); err == nil {
		t.Error("SetUses of an expert not resident")
	}
	if _, _, victim, _, _ := cache.Assign(c); victim != b {
		t.Errorf("Assign evicted %v, Victim said %v", victim, b)
	}
}
