package multigpu

import (
	"strings"
	"testing"
)

// The dropper refuses options it cannot plan, plans as CapacityDrop does over the round-robin
// placement, and adds up every plan's choices, drops and additions.
func TestDropper(t *testing.T) {
	for _, c := range []struct {
		o    DropOptions
		want string
	}{
		{DropOptions{Gamma: -1}, "capacity factor"},
		{DropOptions{Gamma: 2e6}, "capacity factor"},
		{DropOptions{Gamma: 1, Metric: DropMetric(99)}, "unknown metric"},
		{DropOptions{Gamma: 1, Devices: 9}, "token drop over 9 devices"},
		{DropOptions{Gamma: 1, Devices: -1}, "token drop over -1 devices"},
	} {
		if _, err := NewDropper(c.o, 8); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %q", c.o, err, c.want)
		}
	}
	d, err := NewDropper(DropOptions{Gamma: 1, Devices: 2}, 8)
	if err != nil {
		t.Fatal(err)
	}
	// Eight tokens all to expert 0: capacity floor(1 * 4 * 1 / 8) = 0 on each device's half.
	b := Batch{Routing: top1(8, make([]int, 8), nil)}
	p, _ := RoundRobin(8, 2)
	want, err := CapacityDrop{Gamma: 1}.Plan(b, p)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		s, err := d.Plan(b)
		if err != nil {
			t.Fatal(err)
		}
		if s.Dropped != want.Dropped || len(s.Assign) != len(want.Assign) {
			t.Fatalf("dropped %d, %d assignments; CapacityDrop drops %d, %d assignments", s.Dropped, len(s.Assign), want.Dropped, len(want.Assign))
		}
	}
	if st := d.Stats(); st != (DropStats{Choices: 16, Dropped: int64(2 * want.Dropped)}) {
		t.Errorf("stats %+v after two plans of 8 choices dropping %d each", st, want.Dropped)
	}
}
