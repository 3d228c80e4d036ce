package sim

import (
	"math"
	"strings"
	"testing"
)

// The timelines below use whole-number durations so that every sum is exact and times can
// be compared with ==; the timeline does not care about the unit.

func checkSpans(t *testing.T, got, want []Span) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d spans, want %d:\n got  %+v\n want %+v", len(got), len(want), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("span %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func checkFloat(t *testing.T, what string, got, want float64) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// (a) A copy overlapped with a kernel: both start at 0 and the host never waits.
func TestTimelineOverlap(t *testing.T) {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")
	compute.Enqueue("attention", "attn 0", 3)
	cp.Enqueue("copy", "expert 1.4", 2)
	checkFloat(t, "host time after two asynchronous launches", tl.Now(), 0)
	checkSpans(t, tl.Spans(), []Span{
		{Stream: "compute", Kind: "attention", Label: "attn 0", Start: 0, End: 3},
		{Stream: "copy", Kind: "copy", Label: "expert 1.4", Start: 0, End: 2},
	})
	checkFloat(t, "compute busy", compute.Busy(), 3)
	checkFloat(t, "copy busy", cp.Busy(), 2)
	checkFloat(t, "compute stalled", compute.Stalled(), 0)
	checkFloat(t, "copy stalled", cp.Stalled(), 0)
	checkFloat(t, "host waited", tl.HostWaited(), 0)
}

// (b) A kernel that needs a longer copy: it starts when the copy ends and the gap before it
// is a stall on the compute stream.
func TestTimelineStall(t *testing.T) {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")
	compute.Enqueue("attention", "attn", 1)
	cp.Enqueue("copy", "load e7", 3)
	compute.Wait(cp.Record())
	k := compute.Enqueue("expert", "e7", 2)
	checkFloat(t, "kernel start", k.Start, 3)
	checkFloat(t, "kernel end", k.End, 5)
	checkSpans(t, tl.Spans(), []Span{
		{Stream: "compute", Kind: "attention", Label: "attn", Start: 0, End: 1},
		{Stream: "copy", Kind: "copy", Label: "load e7", Start: 0, End: 3},
		{Stream: "compute", Kind: KindStall, Label: "wait copy", Start: 1, End: 3},
		{Stream: "compute", Kind: "expert", Label: "e7", Start: 3, End: 5},
	})
	checkFloat(t, "compute stalled", compute.Stalled(), 2)
	checkFloat(t, "compute busy", compute.Busy(), 3)
	checkFloat(t, "copy stalled", cp.Stalled(), 0)
	checkFloat(t, "host time", tl.Now(), 0)
}

// (c) Two streams ordered by an event recorded in the middle of the copy sequence, plus
// host synchronisation on a stream and on an event.
func TestTimelineEventsAndSync(t *testing.T) {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")

	cp.Enqueue("copy", "c1", 2) // [0,2]
	mid := cp.Record()          // after c1 only
	checkFloat(t, "mid-sequence event", mid.At, 2)
	cp.Enqueue("copy", "c2", 3) // [2,5]

	compute.Enqueue("attention", "k1", 1) // [0,1]
	compute.Wait(mid)
	compute.Enqueue("expert", "k2", 4) // stall [1,2], then [2,6]
	compute.Wait(cp.Record())          // at 5, before compute's tail: no stall
	compute.Enqueue("expert", "k3", 1) // [6,7]

	tl.HostAdvance(1)
	checkFloat(t, "host time after CPU work", tl.Now(), 1)
	checkFloat(t, "Synchronize wait", compute.Synchronize(), 6)
	checkFloat(t, "host time after Synchronize", tl.Now(), 7)

	cp.Enqueue("copy", "c3", 2)                            // host issues it at 7: [7,9]
	checkFloat(t, "HostWait", tl.HostWait(cp.Record()), 2) // [7,9]
	checkFloat(t, "host time after HostWait", tl.Now(), 9)
	checkFloat(t, "HostWait on a past event", tl.HostWait(mid), 0)

	checkSpans(t, tl.Spans(), []Span{
		{Stream: "copy", Kind: "copy", Label: "c1", Start: 0, End: 2},
		{Stream: "copy", Kind: "copy", Label: "c2", Start: 2, End: 5},
		{Stream: "compute", Kind: "attention", Label: "k1", Start: 0, End: 1},
		{Stream: "compute", Kind: KindStall, Label: "wait copy", Start: 1, End: 2},
		{Stream: "compute", Kind: "expert", Label: "k2", Start: 2, End: 6},
		{Stream: "compute", Kind: "expert", Label: "k3", Start: 6, End: 7},
		{Stream: HostRow, Kind: KindWait, Label: "sync compute", Start: 1, End: 7},
		{Stream: "copy", Kind: "copy", Label: "c3", Start: 7, End: 9},
		{Stream: HostRow, Kind: KindWait, Label: "sync copy", Start: 7, End: 9},
	})
	checkFloat(t, "compute busy", compute.Busy(), 6)
	checkFloat(t, "compute stalled", compute.Stalled(), 1)
	checkFloat(t, "copy busy", cp.Busy(), 7)
	checkFloat(t, "copy stalled", cp.Stalled(), 0)
	checkFloat(t, "host waited", tl.HostWaited(), 8)
	checkFloat(t, "host busy", tl.HostBusy(), 1)
}

// A stall is only charged for issued work: if the host is still busy when the awaited event
// fires, the stream was idle for lack of work, not blocked.
func TestTimelineNoStallWhenHostIsLate(t *testing.T) {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")
	cp.Enqueue("copy", "c", 3)
	compute.Wait(cp.Record())
	tl.HostWork("cpu", "expert on CPU", 5)
	k := compute.Enqueue("expert", "k", 1)
	checkFloat(t, "kernel start", k.Start, 5)
	checkFloat(t, "compute stalled", compute.Stalled(), 0)
	checkSpans(t, tl.Spans(), []Span{
		{Stream: "copy", Kind: "copy", Label: "c", Start: 0, End: 3},
		{Stream: HostRow, Kind: "cpu", Label: "expert on CPU", Start: 0, End: 5},
		{Stream: "compute", Kind: "expert", Label: "k", Start: 5, End: 6},
	})
}

// Part of a wait can be stall and part host lateness.
func TestTimelinePartialStall(t *testing.T) {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")
	cp.Enqueue("copy", "c", 4)
	compute.Wait(cp.Record())
	tl.HostAdvance(1)
	k := compute.Enqueue("expert", "k", 1)
	checkFloat(t, "kernel start", k.Start, 4)
	checkFloat(t, "compute stalled", compute.Stalled(), 3)
	sp := tl.Spans()[1]
	if sp.Kind != KindStall || sp.Start != 1 || sp.End != 4 {
		t.Errorf("stall span = %+v, want stall [1,4]", sp)
	}
}

func TestTimelineRecordAndWaitEdgeCases(t *testing.T) {
	tl := NewTimeline()
	s := tl.NewStream("compute")
	tl.HostAdvance(2)
	// An event recorded on an idle stream happens when it is recorded, not in the past.
	checkFloat(t, "Record on idle stream", s.Record().At, 2)
	// The zero Event orders nothing.
	s.Wait(Event{})
	sp := s.Enqueue("k", "k", 1)
	checkFloat(t, "start after zero-event wait", sp.Start, 2)
	checkFloat(t, "stalled", s.Stalled(), 0)
	// A wait with nothing issued after it still orders a later Record and Synchronize.
	other := tl.NewStream("copy")
	other.Wait(Event{At: 10, Stream: "x"})
	checkFloat(t, "Record after pending wait", other.Record().At, 10)
	checkFloat(t, "Synchronize after pending wait", other.Synchronize(), 8)
	checkFloat(t, "stalled with nothing issued", other.Stalled(), 0)
}

func TestTimelineReset(t *testing.T) {
	tl := NewTimeline()
	compute, cp := tl.NewStream("compute"), tl.NewStream("copy")
	cp.Enqueue("copy", "c", 3)
	compute.Wait(cp.Record())
	compute.Enqueue("expert", "k", 1)
	compute.Synchronize()
	tl.HostAdvance(1)
	tl.Reset()
	if len(tl.Spans()) != 0 || tl.Now() != 0 || tl.HostWaited() != 0 || tl.HostBusy() != 0 {
		t.Fatalf("after Reset: %d spans, now %v, waited %v, busy %v", len(tl.Spans()), tl.Now(), tl.HostWaited(), tl.HostBusy())
	}
	for _, s := range tl.Streams() {
		if s.Tail() != 0 || s.Busy() != 0 || s.Stalled() != 0 || s.Record().At != 0 {
			t.Errorf("stream %s after Reset: tail %v busy %v stalled %v", s.Name(), s.Tail(), s.Busy(), s.Stalled())
		}
	}
	// The old handles still work and the old wait is gone.
	sp := compute.Enqueue("expert", "k", 1)
	checkFloat(t, "start after Reset", sp.Start, 0)
	checkSpans(t, tl.Spans(), []Span{{Stream: "compute", Kind: "expert", Label: "k", Start: 0, End: 1}})
}

func TestTimelineSpansIsACopy(t *testing.T) {
	tl := NewTimeline()
	tl.NewStream("compute").Enqueue("k", "k", 1)
	got := tl.Spans()
	got[0].End = 99
	if tl.Spans()[0].End != 1 {
		t.Error("mutating the result of Spans changed the timeline")
	}
}

func TestTimelinePanicsOnProgrammerErrors(t *testing.T) {
	cases := []struct {
		name string
		do   func(tl *Timeline)
		want string
	}{
		{"negative duration", func(tl *Timeline) { tl.NewStream("s").Enqueue("k", "k", -1) }, "invalid duration"},
		{"NaN duration", func(tl *Timeline) { tl.NewStream("s").Enqueue("k", "k", math.NaN()) }, "invalid duration"},
		{"infinite host work", func(tl *Timeline) { tl.HostAdvance(math.Inf(1)) }, "invalid duration"},
		{"negative host work span", func(tl *Timeline) { tl.HostWork("cpu", "x", -2) }, "invalid duration"},
		{"duplicate stream", func(tl *Timeline) { tl.NewStream("s"); tl.NewStream("s") }, "already exists"},
		{"reserved stream name", func(tl *Timeline) { tl.NewStream(HostRow) }, "invalid stream name"},
		{"empty stream name", func(tl *Timeline) { tl.NewStream("") }, "invalid stream name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("no panic")
				}
				if msg, _ := r.(string); !strings.Contains(msg, c.want) {
					t.Errorf("panic %v, want it to mention %q", r, c.want)
				}
			}()
			c.do(NewTimeline())
		})
	}
}
