package models

import (
	"unsafe"

	"github.com/commit-run/commit-run/device"
)

// A sliding-window layer's queries see only the last Window positions, so its cache need
// not hold the whole context: it can be a ring (device.KVLayer.Ring) of the window, one
// pass's tokens and the host's reads before the window, as llama.cpp's SWA cache holds the
// window and a batch. At gpt-oss's window of 128 and passes of 256 tokens that is 448 slots
// (896 with the host's second copy, 4480 with the snapshots beside it) whatever the
// context, where a cache of 131072 positions would be.
//
// A ring cannot give back positions it has overwritten, so prefix reuse can resume only
// where the window before it is still held; a prompt pass leaves a snapshot of the ring
// (up to MaxSnapshots, as recurrent states do, and llama.cpp's context checkpoints for SWA
// caches) from which the next prompt of a conversation resumes after a long answer.

// RingPeriod returns the slots of the ring of a sliding window of window positions, for
// passes of up to maxPass tokens of a sequence: 0 where there is no window, no bound on the
// passes, or where the ring's 2*period slots and its snapshots' would not be fewer than a
// cache of n positions (which needs no snapshots: it can go on from any of its positions).
//
// A pass's first query at pos0 reads from (pos0+1-window) rounded down to 64 (the host's
// windowStart), and its last writes pos0+maxPass-1: the period covers both, so that what the
// pass reads lies in at most period consecutive slots that its writes have not reused.
func RingPeriod(window, n, maxPass int) int {
	if window <= 0 || maxPass <= 0 {
		return 0
	}
	r := (window + maxPass + 62 + 63) &^ 63
	if (1+MaxSnapshots)*2*r >= n {
		return 0
	}
	return r
}

// SlidingWindow returns how many positions attention a's queries see, 0 for all of them.
func SlidingWindow(a Attention) int {
	if s, ok := a.(*StdAttention); ok {
		return s.Window
	}
	return 0
}

// Ring is the state of a sliding-window layer whose cache is a ring: the positions whose
// keys and values it holds, and snapshots of it.
type Ring struct {
	Window, MaxPass int
	// Lo and Hi bound the positions held: [Lo, Hi). Hi is the tokens evaluated.
	Lo, Hi int
	snaps  []*ringSnap // by hi, oldest first
	spare  []*ringSnap // snapshots' memory for reuse
	alloc  Alloc
	what   string
	bufs   [][]byte // the snapshots' allocations, for KVCache.Buffers
}

// ringSnap is a copy of a ring's keys and values when it held [lo, hi).
type ringSnap struct {
	lo, hi int
	words  [][]float32
}

// words returns c's keys and values viewed as floats (F16 halves two to a float), for
// copies that do not look inside them.
func words(c *device.KVLayer) [][]float32 {
	var w [][]float32
	for _, b := range [][]byte{bytesOf(c.K), bytesOf(c.V), bytesOf(c.K16), bytesOf(c.V16)} {
		if len(b) > 0 {
			w = append(w, unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4))
		}
	}
	return w
}

// needs returns the first position a pass at pos0 reads that must be held: its first
// query's window's.
func (r *Ring) needs(pos0 int) int { return max(0, pos0+1-r.Window) }

// holds reports whether a ring holding [lo, hi) can go on at pos0.
func (r *Ring) holds(lo, hi, pos0 int) bool {
	return pos0 == 0 || pos0 <= hi && r.needs(pos0) >= lo
}

// wrote records a pass of T tokens at pos0 that stored their keys and values in c; after a
// prompt's pass (T > 1) it keeps a snapshot of the ring, copied with o.
func (r *Ring) wrote(o device.Ops, c *device.KVLayer, pos0, T int) {
	r.moved(c, pos0, T)
	if T > 1 {
		r.snapshot(o, c)
	}
}

// moved records which positions the ring holds after a pass of T tokens at pos0, and forgets
// the snapshots of the tokens it replaces: wrote's bookkeeping, which a replayed decode step
// (KVCache.Replayed) needs as well.
func (r *Ring) moved(c *device.KVLayer, pos0, T int) {
	if pos0 == 0 {
		r.Lo = 0
	}
	r.dropAfter(pos0)
	r.Hi = pos0 + T
	r.Lo = max(r.Lo, r.Hi-c.Ring)
}

// snapshot copies the ring into a snapshot, taking the oldest's place when MaxSnapshots are
// kept; none when there is no memory for one (a later prompt then resumes from an earlier
// position, or from the start).
func (r *Ring) snapshot(o device.Ops, c *device.KVLayer) {
	src := words(c)
	s := reuseSnap(&r.snaps, &r.spare)
	if s == nil {
		s = &ringSnap{}
		for _, w := range src {
			b, err := r.alloc(int64(4*len(w)), r.what+"'s ring snapshot")
			if err != nil {
				r.spare = append(r.spare, s) // its buffers so far, kept with the cache's
				return
			}
			r.bufs = append(r.bufs, b)
			s.words = append(s.words, unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(w)))
		}
	}
	if len(s.words) != len(src) {
		r.spare = append(r.spare, s)
		return
	}
	for i, w := range src {
		o.Copy2D(s.words[i], w, 1, len(w), 0, 0)
	}
	s.lo, s.hi = r.Lo, r.Hi
	r.snaps = append(r.snaps, s)
}

// best returns the longest prefix, of at most p tokens, from which a pass can go on with
// the ring itself or a snapshot (0 where none can: the pass starts afresh).
func (r *Ring) best(p int) int {
	best := 0
	if q := min(p, r.Hi); r.holds(r.Lo, r.Hi, q) {
		best = q
	}
	for _, s := range r.snaps {
		if q := min(p, s.hi); q > best && r.holds(s.lo, s.hi, q) {
			best = q
		}
	}
	return best
}

// resumable reports whether a pass can go on at p with the ring or a snapshot.
func (r *Ring) resumable(p int) bool { return r.best(p) == p }

// rewind sets the ring to go on at p, which must be resumable, restoring a snapshot with o
// where the ring itself has overwritten what p needs, and forgets the snapshots after p
// (they hold tokens that the next pass replaces).
func (r *Ring) rewind(o device.Ops, c *device.KVLayer, p int) {
	switch {
	case p == 0:
		r.Lo, r.Hi = 0, 0
	case r.holds(r.Lo, r.Hi, p):
		r.Hi = p
	default:
		for i := len(r.snaps) - 1; i >= 0; i-- {
			if s := r.snaps[i]; r.holds(s.lo, s.hi, p) {
				for j, w := range words(c) {
					o.Copy2D(w, s.words[j], 1, len(w), 0, 0)
				}
				r.Lo, r.Hi = s.lo, p
				break
			}
		}
	}
	r.dropAfter(p)
}

// dropAfter forgets the snapshots of more than p tokens.
func (r *Ring) dropAfter(p int) {
	for len(r.snaps) > 0 && r.snaps[len(r.snaps)-1].hi > p {
		r.spare = append(r.spare, r.snaps[len(r.snaps)-1])
		r.snaps = r.snaps[:len(r.snaps)-1]
	}
}
