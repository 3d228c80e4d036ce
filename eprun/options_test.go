package eprun

import (
	"errors"
	"strings"
	"testing"
)

// Check reports the first objection in a fixed order: the model and the ranks' count, then the
// caller's to the other options, then the rest.
func TestCheckOrder(t *testing.T) {
	conflict := errors.New("offloads too")
	for _, c := range []struct {
		o        Options
		experts  int
		conflict error
		want     string
	}{
		{Options{Devices: 2}, 0, conflict, "dense"},
		{Options{Devices: 9}, 8, conflict, "want 2 to the model's 8 experts"},
		{Options{Devices: 2, Gamma: -1}, 8, conflict, "offloads too"},
		{Options{Devices: 2, Gamma: -1}, 8, nil, "capacity factor"},
		{Options{Devices: 2, Rank: 1}, 8, nil, "rendezvous address"},
		{Options{Devices: 2, MACSEta: 0.5, Policy: "macs"}, 8, nil, "calibration text"},
		{Options{Devices: 2, MACSEta: 0.5, Policy: "eplb", MACSCalibration: "x"}, 8, nil, "macs planners"},
	} {
		err := Check(c.o, c.experts, c.conflict)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v over %d experts: %v, want %q", c.o, c.experts, err, c.want)
		}
	}
	if err := Check(Options{Devices: 4, Policy: "macs", MACSEta: 0.3, MACSCalibration: "text"}, 8, nil); err != nil {
		t.Errorf("good options: %v", err)
	}
	if len(Policies()) == 0 {
		t.Error("no planners")
	}
}
