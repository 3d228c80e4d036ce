package sim

import (
	"fmt"
	"math"
)

// Kinds and the row name that the timeline itself produces; callers choose their own kinds
// (e.g. "attention", "expert", "copy") for the work they enqueue.
const (
	// KindStall marks time an issued op on a stream spent blocked on another stream's event.
	KindStall = "stall"
	// KindWait marks time the host spent blocked in HostWait or Synchronize.
	KindWait = "wait"
	// HostRow is the Stream name of spans that belong to the host thread (HostWork, waits).
	HostRow = "host"
)

// Span is one interval on one row of the timeline, in seconds.
type Span struct {
	Stream string // stream name, or HostRow
	Kind   string
	Label  string
	Start  float64
	End    float64
}

// Duration is End - Start.
func (s Span) Duration() float64 { return s.End - s.Start }

// Event is a point in virtual time that work can be ordered after, as a recorded CUDA event.
// The zero Event is at time 0 and orders nothing.
type Event struct {
	At     float64
	Stream string // the stream it was recorded on, for stall labels
}

// Timeline is the virtual clock of one host thread driving a GPU through in-order streams.
// It is not safe for concurrent use: it models a single issuing thread.
type Timeline struct {
	now        float64
	hostBusy   float64
	hostWaited float64
	streams    []*Stream
	spans      []Span
}

// NewTimeline returns an empty timeline at host time 0.
func NewTimeline() *Timeline { return &Timeline{} }

// Stream is an in-order queue of work on the modelled GPU, like a cudaStream_t.
type Stream struct {
	tl      *Timeline
	name    string
	tail    float64 // end of the last op enqueued
	floor   float64 // no later op may start before this (from Wait)
	floorOf string  // stream whose event set floor, for the stall label
	busy    float64
	stalled float64
}

// NewStream adds a stream. Stream names are chosen by code, not users, and a repeated name
// would merge two rows of the picture, so NewStream panics on an empty, duplicate or
// reserved (HostRow) name, as package flag does on a redefined flag.
func (tl *Timeline) NewStream(name string) *Stream {
	if name == "" || name == HostRow {
		panic(fmt.Sprintf("sim: invalid stream name %q", name))
	}
	for _, s := range tl.streams {
		if s.name == name {
			panic(fmt.Sprintf("sim: stream %q already exists", name))
		}
	}
	s := &Stream{tl: tl, name: name}
	tl.streams = append(tl.streams, s)
	return s
}

// Streams returns the streams in creation order.
func (tl *Timeline) Streams() []*Stream { return append([]*Stream(nil), tl.streams...) }

// Now is the host time: when the host thread issues its next call.
func (tl *Timeline) Now() float64 { return tl.now }

// HostBusy is the total host CPU work charged by HostAdvance and HostWork.
func (tl *Timeline) HostBusy() float64 { return tl.hostBusy }

// HostWaited is the total time the host spent blocked in HostWait and Synchronize.
func (tl *Timeline) HostWaited() float64 { return tl.hostWaited }

// HostAdvance charges d seconds of host CPU work (argument setup, sampling, ...) without
// drawing it.
func (tl *Timeline) HostAdvance(d float64) {
	checkDuration("HostAdvance", d)
	tl.now += d
	tl.hostBusy += d
}

// HostWork charges d seconds of host CPU work and records it as a span on the host row, for
// work worth seeing in the picture (an expert computed on the CPU instead of copied).
func (tl *Timeline) HostWork(kind, label string, d float64) Span {
	checkDuration("HostWork", d)
	sp := Span{Stream: HostRow, Kind: kind, Label: label, Start: tl.now, End: tl.now + d}
	tl.now = sp.End
	tl.hostBusy += d
	tl.spans = append(tl.spans, sp)
	return sp
}

// HostWait blocks the host until ev has happened, like cudaEventSynchronize, and returns how
// long it waited.
func (tl *Timeline) HostWait(ev Event) float64 {
	return tl.hostWaitUntil(ev.At, "sync "+ev.Stream)
}

func (tl *Timeline) hostWaitUntil(t float64, label string) float64 {
	if t <= tl.now {
		return 0
	}
	d := t - tl.now
	tl.spans = append(tl.spans, Span{Stream: HostRow, Kind: KindWait, Label: label, Start: tl.now, End: t})
	tl.now = t
	tl.hostWaited += d
	return d
}

// Spans returns a copy of every span in the order it was recorded.
func (tl *Timeline) Spans() []Span { return append([]Span(nil), tl.spans...) }

// Reset returns the timeline to time 0 with no spans. Streams stay valid and keep their
// names, with their clocks and totals cleared, so a caller can rerun a schedule.
func (tl *Timeline) Reset() {
	tl.now, tl.hostBusy, tl.hostWaited = 0, 0, 0
	tl.spans = nil
	for _, s := range tl.streams {
		*s = Stream{tl: tl, name: s.name}
	}
}

// Name is the stream's name.
func (s *Stream) Name() string { return s.name }

// Tail is when the last op enqueued on s ends.
func (s *Stream) Tail() float64 { return s.tail }

// Busy is the total duration of the ops enqueued on s.
func (s *Stream) Busy() float64 { return s.busy }

// Stalled is the total time issued ops on s spent blocked on other streams' events.
func (s *Stream) Stalled() float64 { return s.stalled }

// Enqueue issues an op of the given duration without advancing host time (an asynchronous
// launch). It starts when the stream is free, the host has issued it, and every event the
// stream was told to Wait for has happened. When the events are what holds it back, the gap
// is recorded as a stall span before it.
func (s *Stream) Enqueue(kind, label string, d float64) Span {
	checkDuration("Enqueue", d)
	tl := s.tl
	ready := max(s.tail, tl.now)
	start := max(ready, s.floor)
	if start > ready {
		tl.spans = append(tl.spans, Span{Stream: s.name, Kind: KindStall, Label: "wait " + s.floorOf, Start: ready, End: start})
		s.stalled += start - ready
	}
	sp := Span{Stream: s.name, Kind: kind, Label: label, Start: start, End: start + d}
	tl.spans = append(tl.spans, sp)
	s.tail = sp.End
	s.busy += d
	return sp
}

// Record returns an event that happens when all work issued on s so far is done, like
// cudaEventRecord. On an idle stream that is the host time of the call, never the past.
func (s *Stream) Record() Event {
	return Event{At: max(s.tail, s.floor, s.tl.now), Stream: s.name}
}

// Wait makes every op issued on s after this call start no earlier than ev, like
// cudaStreamWaitEvent. The host does not block. The stall, if any, is charged when the next
// op is issued, so waiting with nothing to run costs nothing.
func (s *Stream) Wait(ev Event) {
	if ev.At > s.floor {
		s.floor, s.floorOf = ev.At, ev.Stream
	}
}

// Synchronize blocks the host until all work issued on s is done, like
// cudaStreamSynchronize, and returns how long it waited.
func (s *Stream) Synchronize() float64 {
	return s.tl.hostWaitUntil(max(s.tail, s.floor), "sync "+s.name)
}

// checkDuration rejects durations no cost formula can produce from valid inputs: they mean
// a bug in the caller, and a NaN would silently poison every later time.
func checkDuration(op string, d float64) {
	if d < 0 || math.IsNaN(d) || math.IsInf(d, 0) {
		panic(fmt.Sprintf("sim: %s with invalid duration %v", op, d))
	}
}
