package offload

import (
	"slices"
	"testing"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// ratePlanner is a Planner on a clock that stands still: a copy costs copy seconds a byte,
// the host host seconds a byte of weights and flop seconds a flop of the further tokens, so
// that hostPlan's queue accounting decides alone.
type ratePlanner struct{ copy, host, flop float64 }

func (p ratePlanner) CopyDone(n int64) float64 { return float64(n) * p.copy }
func (p ratePlanner) HostDone(w device.HostWork) float64 {
	return float64(w.Bytes)*p.host + w.FLOPs*p.flop
}

var _ device.Planner = ratePlanner{}

// openCPUMiss makes a cpu-miss offloader of the bundled Qwen1.5-MoE model on the CPU, with
// room for every expert.
func openCPUMiss(t *testing.T) *Offloader {
	t.Helper()
	file, err := models.Open("../models/testdata/tinymoe-qwen2moe.gguf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { file.Close() })
	m, err := models.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := device.NewMemory(1 << 40)
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Model: m, Device: cpu.New(2, cpu.WithMemory(mem))}, Options{Policy: CPUMiss, GPUMem: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// TestHostPlan: cpu-miss puts on the host the misses that the host finishes no later than
// their copies would land, counting the copies and host work planned before them; a device
// that cannot tell puts every miss there; a resident expert is never on the host.
func TestHostPlan(t *testing.T) {
	f := openCPUMiss(t)
	layer := f.store.Layers()[0]
	f.mu.Lock()
	f.cache.Reset() // empty the slots filled at open
	if _, _, err := f.load(ExpertKey{Layer: layer, Expert: 5}); err != nil {
		t.Fatal(err)
	}
	f.mu.Unlock()
	w, err := f.store.Expert(ExpertKey{Layer: layer, Expert: 0})
	if err != nil {
		t.Fatal(err)
	}
	// A further token's arithmetic priced at 0.3 of a copy: with the weights read at half a
	// copy's time, a second token fits before the copy lands, three more do not.
	perToken := expertWork(w, 2).FLOPs
	if perToken != 2*float64(w.Gate.Rows*w.Gate.Cols+w.Up.Rows*w.Up.Cols+w.Down.Rows*w.Down.Cols) {
		t.Fatalf("an expert's arithmetic per token: %v flops", perToken)
	}
	batch := ratePlanner{1, 0.5, 0.3 * float64(f.store.SlotBytes()) / perToken}
	ones := []int{1, 1, 1, 1}
	cases := []struct {
		name    string
		planner device.Planner
		experts []int
		tokens  []int
		want    []bool
	}{
		{"no planner: every miss", nil, []int{0, 5, 2}, []int{1, 1, 1}, []bool{true, false, true}},
		{"host as fast as a copy: alternate", ratePlanner{1, 1, 0}, []int{0, 1, 2, 3}, ones, []bool{true, false, true, false}},
		{"host half as fast: one in three", ratePlanner{1, 2, 0}, []int{0, 1, 2, 3, 4, 5}, []int{1, 1, 1, 1, 1, 1}, []bool{false, true, false, false, true, false}},
		{"resident expert skipped", ratePlanner{1, 1, 0}, []int{5, 0, 1}, []int{1, 1, 1}, []bool{false, true, false}},
		{"host far slower", ratePlanner{1, 100, 0}, []int{0, 1, 2, 3}, ones, nil},
		{"a second token's arithmetic fits", batch, []int{0}, []int{2}, []bool{true}},
		{"four tokens' does not", batch, []int{0, 1}, []int{4, 1}, []bool{false, true}},
		{"host far faster", ratePlanner{1, 0.01, 0}, []int{0, 1, 2, 3}, ones, []bool{true, true, true, true}},
	}
	for _, c := range cases {
		f.planner = c.planner
		if got := f.OnHost(layer, c.experts, c.tokens); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	f.pol = onDemand{}
	if got := f.OnHost(layer, []int{0}, []int{1}); got != nil {
		t.Errorf("ondemand planned %v on the host", got)
	}

	// prefetch and commit weigh as cpu-miss where prediction serves worst: a token's first
	// MoE layer and a prompt's passes; elsewhere, and with no planner, they copy every miss.
	second := f.store.Layers()[1]
	fast := ratePlanner{1, 0.01, 0}
	for _, pol := range []strategy{prefetchPolicy{}, commitPolicy{}} {
		f.pol = pol
		for _, c := range []struct {
			name    string
			planner device.Planner
			layer   int
			tokens  []int
			want    []bool
		}{
			{"first layer, one token", fast, layer, []int{1, 1}, []bool{true, true}},
			{"later layer, one token", fast, second, []int{1, 1}, nil},
			{"later layer, a prompt", fast, second, []int{3, 1}, []bool{true, true}},
			{"first layer, no planner", nil, layer, []int{1, 1}, nil},
			{"a prompt, no planner", nil, second, []int{3, 1}, nil},
		} {
			f.planner = c.planner
			if got := f.OnHost(c.layer, []int{0, 1}, c.tokens); !slices.Equal(got, c.want) {
				t.Errorf("%T, %s: %v, want %v", pol, c.name, got, c.want)
			}
		}
	}
}
