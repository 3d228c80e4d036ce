package offload

import (
	"fmt"
	"strings"
)

// Eviction chooses which resident expert gives up its slot when a miss finds no free one.
type Eviction int

const (
	// LRU evicts the unpinned resident expert whose last use is oldest.
	LRU Eviction = iota
	// LFU evicts the unpinned resident expert with the fewest uses since it was loaded,
	// the least recently used among equals.
	LFU
)

// ParseEviction reads a policy name as written on a command line; case is ignored so that
// "LRU" from a config file works as well as "lru".
func ParseEviction(s string) (Eviction, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "lru":
		return LRU, nil
	case "lfu":
		return LFU, nil
	}
	return 0, fmt.Errorf("eviction policy %q: want lru or lfu", s)
}

func (e Eviction) String() string {
	switch e {
	case LRU:
		return "lru"
	case LFU:
		return "lfu"
	}
	return fmt.Sprintf("Eviction(%d)", int(e))
}

func (e Eviction) valid() bool { return e == LRU || e == LFU }
