package engine

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Continuous batching. Sessions that generate at the same time hand their next token to the
// model's batcher instead of running a pass each; the batcher runs one forward pass for all
// of the tokens handed to it, so that every weight, a layer's experts and their copies over
// the link included, is read once for all the sequences. A session joins with its first
// decode step, once its prompt has been evaluated (a prompt's pass runs on its own, between
// two steps), and leaves when its generation ends: the next step simply has one row more or
// one row fewer.
//
// A step waits for every member's token, so that the sequences keep decoding in one pass
// rather than drifting apart into several, but not for long: a member whose caller is slow
// between two tokens (a client reading its stream slowly) joins the step after.

// MaxParallel bounds Options.Parallel: a pass's activations are reserved for prefillBatch
// rows.
const MaxParallel = prefillBatch

// batchGrace bounds how long a step waits for the members' tokens beyond the first one's,
// and batchGraceMin is the least it waits: sampling a token and handing it to a client take
// microseconds, a pass milliseconds.
const (
	batchGraceMin = 200 * time.Microsecond
	batchGraceMax = 5 * time.Millisecond
)

// batcher runs the decode steps of the sessions generating at the same time.
type batcher struct {
	m        *Model
	max      int
	steps    chan *stepReq // the members' tokens
	wake     chan struct{} // a member left: a step waiting for its token stops waiting
	quit     chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}
	members  atomic.Int32
	last     time.Duration // the last step's pass; the batcher's goroutine's alone
	timer    *time.Timer   // gather's, reused so that a step allocates none

	// The steps' scratch, reused: the batcher's goroutine's alone.
	batch  []*stepReq
	seqs   []seqRows
	tokens []int32

	passes, rows atomic.Int64
}

// stepReq is one member's decode step: the token to evaluate, then its logits (copied into
// the session's own buffer, so that the next step cannot overwrite them while the session
// samples) or the pass's error.
type stepReq struct {
	s      *Session
	token  int32
	logits []float32
	err    error
	done   chan struct{}
}

func newBatcher(m *Model, max int) *batcher {
	// steps is unbuffered: a token handed in is one the batcher's goroutine has taken, which
	// it then evaluates or fails, so that no member waits on a step nobody will run.
	b := &batcher{m: m, max: max, steps: make(chan *stepReq), wake: make(chan struct{}, 1),
		quit: make(chan struct{}), stopped: make(chan struct{}), timer: time.NewTimer(time.Hour)}
	b.timer.Stop()
	go b.loop()
	return b
}

// stop ends the batcher's goroutine once the step in flight is done; steps handed to it
// later fail with ErrClosed. It may be called more than once.
func (b *batcher) stop() {
	b.stopOnce.Do(func() { close(b.quit) })
	<-b.stopped
}

// BatchStats count the decode steps of continuous batching since the model opened.
type BatchStats struct {
	// Passes are the forward passes of decode steps; Rows the tokens they evaluated, each
	// a sequence's next: Rows/Passes is the mean batch.
	Passes, Rows int64
}

// BatchStats reports continuous batching's counts; ok is false when it is off
// (Options.Parallel below 2).
func (m *Model) BatchStats() (st BatchStats, ok bool) {
	if m.batch == nil {
		return BatchStats{}, false
	}
	return BatchStats{Passes: m.batch.passes.Load(), Rows: m.batch.rows.Load()}, true
}

// Batches says whether sessions that generate at the same time share their decode steps'
// passes: Options.Parallel above 1, and no Commit Router, whose predictions are one token's.
func (m *Model) Batches() bool { return m.batch != nil && m.commit == nil }

// batchable says whether the session's decode steps may share a pass: not when it observes
// its routing or follows the Commit Router, whose events and predictions are one sequence's
// (committing computes with the predicted experts of one token, at batch size 1).
func (s *Session) batchable() bool {
	return s.m.batch != nil && s.route == nil && s.commit == nil
}

// decode evaluates the sampled token id after the session's tokens and returns the logits
// that follow it: in the model's next batched step when the session may share one (joining
// the batch with its first step; the caller leaves it), else in a pass of its own. The caller
// holds s.mu.
func (s *Session) decode(ctx context.Context, id int32, joined *bool) ([]float32, error) {
	if !s.batchable() {
		return s.eval(ctx, []int32{id}, false)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b := s.m.batch
	if !*joined {
		b.members.Add(1)
		*joined = true
	}
	r := &s.step
	r.s, r.token, r.err = s, id, nil
	select {
	case b.steps <- r:
	case <-b.quit:
		return nil, ErrClosed
	}
	<-r.done // the pass writes this session's cache: wait for it even if ctx ends
	if r.err != nil {
		return nil, r.err
	}
	s.tokens = append(s.tokens, id)
	return r.logits, nil
}

// leave takes a member out of the batch: the steps stop waiting for its tokens.
func (b *batcher) leave() {
	b.members.Add(-1)
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *batcher) loop() {
	defer close(b.stopped)
	for {
		var first *stepReq
		select {
		case first = <-b.steps:
		case <-b.quit:
			b.drain()
			return
		}
		b.batch = append(b.batch[:0], first)
		b.gather()
		b.step(b.batch)
		// The members' goroutines take turns with this one, each made ready by the other, and
		// the Go scheduler lets such a pair keep its thread for a whole time slice (10 ms):
		// a session about to evaluate its prompt, or to join, would wait that long on the
		// same thread's queue while the others decode without it. Yielding after each step
		// lets it run.
		runtime.Gosched()
	}
}

// gather adds the members' tokens to the step until every member has handed one, the step is
// full, or the grace time since the first has passed.
func (b *batcher) gather() {
	grace := min(max(b.last/2, batchGraceMin), batchGraceMax)
	armed := false
	for len(b.batch) < b.max {
		select {
		case r := <-b.steps:
			b.batch = append(b.batch, r)
			continue
		default:
		}
		if len(b.batch) >= int(b.members.Load()) {
			break
		}
		if !armed {
			// Since Go 1.23 a stopped timer delivers nothing stale after Reset.
			b.timer.Reset(grace)
			armed = true
			defer b.timer.Stop()
		}
		select {
		case r := <-b.steps:
			b.batch = append(b.batch, r)
		case <-b.wake:
		case <-b.timer.C:
			return
		case <-b.quit:
			return
		}
	}
}

// drain fails the steps being handed in as the batcher stops.
func (b *batcher) drain() {
	for {
		select {
		case r := <-b.steps:
			r.err = ErrClosed
			r.done <- struct{}{}
		default:
			return
		}
	}
}

// step runs one forward pass for the batch's tokens and hands each member its logits.
func (b *batcher) step(batch []*stepReq) {
	m := b.m
	start := time.Now()
	var logits []float32
	var err error
	m.mu.RLock()
	if m.closed {
		err = ErrClosed
	} else {
		b.seqs, b.tokens = b.seqs[:0], b.tokens[:0]
		for _, r := range batch {
			b.seqs = append(b.seqs, seqRows{kv: r.s.kv, pos0: len(r.s.tokens), T: 1})
			b.tokens = append(b.tokens, r.token)
		}
		if len(batch) == 1 {
			// One sequence's step is the pass it would run alone.
			logits, err = m.forward(batch[0].s.kv, b.tokens, b.seqs[0].pos0, lastLogits, nil, nil)
		} else {
			logits, err = m.forwardSeqs(b.seqs, b.tokens, allLogits, nil, nil)
		}
	}
	m.mu.RUnlock()
	b.last = time.Since(start)
	if err == nil {
		b.passes.Add(1)
		b.rows.Add(int64(len(batch)))
	}
	V := m.arch.Config.Vocab
	for i, r := range batch {
		r.err = err
		if err == nil {
			r.logits = append(r.logits[:0], logits[i*V:(i+1)*V]...)
		}
		r.done <- struct{}{}
	}
}
