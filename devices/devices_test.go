package devices

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/sim"
)

// Open takes the names a user gives and the budget the engine may use: the whole card without
// one, the budget with one, and says what it cannot open.
func TestOpen(t *testing.T) {
	prof, err := sim.LoadProfile("rtx4090")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec   Spec
		budget int64
		err    string
	}{
		{Spec{Name: "cpu", Threads: 1, Budget: 1 << 20}, 1 << 20, ""},
		{Spec{Name: " sim:rtx4090 ", Threads: 1}, prof.MemoryBytes, ""},
		{Spec{Name: "sim:rtx4090", Budget: 1 << 30, TimingOnly: true}, 1 << 30, ""},
		{Spec{Name: "sim:voodoo2"}, 0, "voodoo2"},
		{Spec{Name: "cuda:x"}, 0, "want cuda:N"},
		{Spec{Name: "tpu"}, 0, "is not available"},
		{Spec{Name: "auto", Threads: 1, CPUForAuto: true}, 0, ""},
	} {
		dev, note, err := Open(c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: %v, want %q", c.spec, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", c.spec, err)
			continue
		}
		if c.budget != 0 && dev.Memory().Budget() != c.budget {
			t.Errorf("%+v: budget %d, want %d", c.spec, dev.Memory().Budget(), c.budget)
		}
		if note != "" || Close(dev) != nil {
			t.Errorf("%+v: note %q", c.spec, note)
		}
	}
	if len(Names()) < 4 {
		t.Errorf("names %v", Names())
	}
}

// TestSimGroupsAsTheGPU: the simulated card groups a prompt's experts from the number of
// tokens the CUDA engine groups them from, so that it prices the launches the card makes.
func TestSimGroupsAsTheGPU(t *testing.T) {
	d, _, err := Open(Spec{Name: "sim:rtx4090", TimingOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.(device.GroupedExperts)
	if !ok {
		t.Fatalf("%s does not group experts", d.Name())
	}
	var g cuda.GPU
	for _, T := range []int{1, 2, 8, 9, 10, 512} {
		if s.GroupMinTokens(T) != g.GroupMinTokens(T) {
			t.Errorf("in a pass of %d tokens the simulated card groups experts of %d tokens or more, the GPU of %d", T, s.GroupMinTokens(T), g.GroupMinTokens(T))
		}
	}
	// And experts of the types, and the widths, the GPU groups.
	grouped := 0
	for ty := quant.Type(0); ty < 64; ty++ {
		if !ty.Known() {
			continue
		}
		for _, cols := range []int{4096, 4096 + 32} {
			w := quant.Matrix{Type: ty, Rows: 64, Cols: cols}
			e := device.ExpertMatrices{Gate: w, Up: w, Down: w}
			if got, want := s.GroupsExperts(e), g.GroupsExperts(e); got != want {
				t.Errorf("%s experts of %d columns: the simulated card groups them %v, the GPU %v", ty, cols, got, want)
			} else if got {
				grouped++
			}
		}
	}
	if grouped < 12 {
		t.Errorf("the GPU groups experts of %d types and widths, want every quantized type's", grouped)
	}
}
