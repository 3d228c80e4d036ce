package device_test

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/device"
)

func TestMemoryBudget(t *testing.T) {
	if _, err := device.NewMemory(0); err == nil {
		t.Error("a zero budget was accepted")
	}
	m, err := device.NewMemory(100)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		alloc, free int64
		wantErr     string
		used, peak  int64
	}{
		{alloc: 60, used: 60, peak: 60},
		{alloc: 41, wantErr: "needs 41 bytes, 60 of the 100-byte budget", used: 60, peak: 60},
		{alloc: 40, used: 100, peak: 100},
		{free: 70, used: 30, peak: 100},
		{alloc: -1, wantErr: "asks for -1", used: 30, peak: 100},
		{alloc: 1 << 62, wantErr: "needs", used: 30, peak: 100},
	}
	for i, s := range steps {
		if s.free > 0 {
			m.Free(s.free)
		} else {
			err := m.Alloc(s.alloc, "slab")
			if (err != nil) != (s.wantErr != "") || err != nil && !strings.Contains(err.Error(), s.wantErr) {
				t.Errorf("step %d: alloc %d: %v, want error %q", i, s.alloc, err, s.wantErr)
			}
		}
		if m.Used() != s.used || m.Peak() != s.peak || m.Budget() != 100 {
			t.Errorf("step %d: used %d peak %d, want %d %d", i, m.Used(), m.Peak(), s.used, s.peak)
		}
	}
}
