package models

import (
	"fmt"
	"slices"

	"github.com/commit-run/commit-run/device"
)

// Recurrent is implemented by layers that keep a recurrent state per sequence instead of
// keys and values (DeltaNet): NewKVCache gives each such layer a RecState.
type Recurrent interface {
	Attention
	// StateDims returns the floats of the convolution's state and of the recurrent state.
	StateDims() (conv, state int)
}

// MaxSnapshots bounds the states a recurrent layer keeps from earlier positions of its
// sequence. A recurrent state cannot be cut back to a shorter prefix as a KV cache can, so
// prefix reuse resumes from one of these (llama.cpp's context checkpoints do the same).
const MaxSnapshots = 4

// RecState is one recurrent layer's state for one sequence, after its first Pos tokens,
// and snapshots of it at earlier positions of the same tokens, in the memory of the cache's
// Alloc (the device's, where passes run there).
type RecState struct {
	device.DeltaNetState
	Pos   int
	snaps []*recSnap // by position, oldest first
	spare []*recSnap // snapshots' memory for reuse
	alloc Alloc
	what  string
	bufs  [][]byte // every allocation, for KVCache.Buffers
}

// recSnap is a RecState's state at position pos.
type recSnap struct {
	pos int
	device.DeltaNetState
}

// newRecState allocates a state of conv and state floats with alloc, for what.
func newRecState(conv, state int, alloc Alloc, what string) (*RecState, error) {
	r := &RecState{alloc: alloc, what: what}
	st, err := r.newState(conv, state)
	if err != nil {
		return nil, err
	}
	r.DeltaNetState = st
	return r, nil
}

// newState allocates a state of conv and state floats.
func (r *RecState) newState(conv, state int) (device.DeltaNetState, error) {
	cb, err := r.alloc(int64(4*conv), r.what+"'s convolution state")
	if err != nil {
		return device.DeltaNetState{}, err
	}
	r.bufs = append(r.bufs, cb) // given back with the cache, even if the next fails
	sb, err := r.alloc(int64(4*state), r.what+"'s recurrent state")
	if err != nil {
		return device.DeltaNetState{}, err
	}
	r.bufs = append(r.bufs, sb)
	return device.DeltaNetState{Conv: bytesAs[float32](cb), S: bytesAs[float32](sb)}, nil
}

// reset starts the state afresh, at position 0.
func (r *RecState) reset(o device.Ops) {
	o.Zero(r.Conv)
	o.Zero(r.S)
	r.Pos = 0
	r.dropAfter(-1)
}

// dropAfter forgets the snapshots after position p.
func (r *RecState) dropAfter(p int) {
	for len(r.snaps) > 0 && r.snaps[len(r.snaps)-1].pos > p {
		r.spare = append(r.spare, r.snaps[len(r.snaps)-1])
		r.snaps = r.snaps[:len(r.snaps)-1]
	}
}

// snapshot returns a snapshot for position pos, which the layer's pass fills, taking the
// oldest's place when MaxSnapshots are kept; nil when there is no memory for one (a later
// prompt then resumes from an earlier position).
func (r *RecState) snapshot(pos int) *device.DeltaNetState {
	r.dropAfter(pos - 1)
	s := reuseSnap(&r.snaps, &r.spare)
	if s == nil {
		st, err := r.newState(len(r.Conv), len(r.S))
		if err != nil {
			return nil
		}
		s = &recSnap{DeltaNetState: st}
	}
	s.pos = pos
	r.snaps = append(r.snaps, s)
	return &s.DeltaNetState
}

// reuseSnap takes the snapshot whose memory a new one reuses out of snaps (the oldest, when
// MaxSnapshots are kept) or spare; nil when there is none to reuse.
func reuseSnap[S any](snaps, spare *[]*S) *S {
	switch {
	case len(*snaps) == MaxSnapshots:
		s := (*snaps)[0]
		*snaps = append((*snaps)[:0], (*snaps)[1:]...)
		return s
	case len(*spare) > 0:
		s := (*spare)[len(*spare)-1]
		*spare = (*spare)[:len(*spare)-1]
		return s
	}
	return nil
}

// resumable reports whether the state can be set to position p: its own, a snapshot's or 0.
func (r *RecState) resumable(p int) bool {
	if p == 0 || p == r.Pos {
		return true
	}
	return slices.ContainsFunc(r.snaps, func(s *recSnap) bool { return s.pos == p })
}

// rewind sets the state to position p, which must be resumable, and forgets the snapshots
// after it (they belong to tokens that a later pass overwrites).
func (r *RecState) rewind(p int, o device.Ops) {
	switch {
	case p == r.Pos:
	case p == 0:
		r.reset(o)
		return
	default:
		for _, s := range r.snaps {
			if s.pos == p {
				o.Copy2D(r.Conv, s.Conv, 1, len(r.Conv), 0, 0)
				o.Copy2D(r.S, s.S, 1, len(r.S), 0, 0)
				r.Pos = p
			}
		}
	}
	r.dropAfter(p)
}

// Resumable returns the longest prefix, of at most p of the cached tokens, that a pass can
// continue from: p itself where every layer holds all it needs for it; else the longest
// that every recurrent layer can be set to (its position, a snapshot's, or 0) and every
// sliding-window ring still holds the window before (itself, or a snapshot of it).
func (kv *KVCache) Resumable(p int) int {
	if kv == nil {
		return p
	}
	ok := func(q int) bool {
		for i := range kv.Layers {
			l := &kv.Layers[i]
			if l.Rec != nil && !l.Rec.resumable(q) || l.Win != nil && !l.Win.resumable(q) {
				return false
			}
		}
		return true
	}
	if ok(p) {
		return p
	}
	best := 0
	try := func(q int) {
		if q > best && q <= p && ok(q) {
			best = q
		}
	}
	for i := range kv.Layers {
		l := &kv.Layers[i]
		if r := l.Rec; r != nil {
			try(r.Pos)
			for _, s := range r.snaps {
				try(s.pos)
			}
		}
		if w := l.Win; w != nil {
			try(w.best(p))
		}
	}
	return best
}

// Rewind sets every recurrent layer and ring to position Resumable(p) with o (the Ops of the
// cache's memory) and returns it; the caller evaluates the tokens after it again.
func (kv *KVCache) Rewind(p int, o device.Ops) int {
	q := kv.Resumable(p)
	if kv == nil {
		return q
	}
	for i := range kv.Layers {
		l := &kv.Layers[i]
		if l.Rec != nil {
			l.Rec.rewind(q, o)
		}
		if l.Win != nil {
			l.Win.rewind(o, &l.KVLayer, q)
		}
	}
	return q
}

// Recurrent reports whether the cache holds recurrent states.
func (kv *KVCache) Recurrent() bool {
	return kv != nil && slices.ContainsFunc(kv.Layers, func(l LayerCache) bool { return l.Rec != nil })
}

// Replayed records that a replayed decode step (a captured pass, whose layers' Forward did
// not run) moved every recurrent state and ring on to pos, as Forward of one token does.
func (kv *KVCache) Replayed(pos int) {
	for i := range kv.Layers {
		l := &kv.Layers[i]
		if l.Rec != nil {
			l.Rec.Pos = pos
		}
		if l.Win != nil {
			l.Win.moved(&l.KVLayer, pos-1, 1)
		}
	}
}

// CheckPass returns an error unless a pass of T tokens at pos0 can run on the cache: every
// recurrent layer's state is at pos0, or pos0 is 0 (which starts them afresh), and every
// ring holds the window before pos0 and has room for T tokens.
func (kv *KVCache) CheckPass(pos0, T int) error {
	if kv == nil {
		return nil
	}
	for i := range kv.Layers {
		l := &kv.Layers[i]
		if r := l.Rec; r != nil && pos0 != 0 && r.Pos != pos0 {
			return fmt.Errorf("layer %d's recurrent state is at position %d, not at the pass's %d (rewind it first)", i, r.Pos, pos0)
		}
		if w := l.Win; w != nil {
			if T > w.MaxPass {
				return fmt.Errorf("a pass of %d tokens: layer %d's sliding-window ring takes %d at most", T, i, w.MaxPass)
			}
			if !w.holds(w.Lo, w.Hi, pos0) {
				return fmt.Errorf("layer %d's sliding-window ring holds positions %d..%d, not the window before the pass's %d (rewind it first)", i, w.Lo, w.Hi, pos0)
			}
		}
	}
	return nil
}
