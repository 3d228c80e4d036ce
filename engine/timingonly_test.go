package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// recorded is what a computing run's routers and Commit Router chose, by position and MoE
// layer: what a timing-only run replays.
type recorded struct {
	moe             map[int]int // block index -> MoE layer number
	layers          int
	routing, predic map[[2]int][]int
}

func newRecorded(moeLayers []int) *recorded {
	r := &recorded{moe: map[int]int{}, layers: len(moeLayers), routing: map[[2]int][]int{}, predic: map[[2]int][]int{}}
	for j, l := range moeLayers {
		r.moe[l] = j
	}
	return r
}

func (r *recorded) observe(ev *engine.RouteEvent) {
	j := r.moe[ev.Layer]
	for t := 0; t < ev.Tokens; t++ {
		r.routing[[2]int{ev.Pos0 + t, j}] = slices.Clone(ev.Selected[t*ev.Used : (t+1)*ev.Used])
	}
	if ev.Predicted != nil {
		nj, npos := j+1, ev.Pos0
		if nj == r.layers {
			nj, npos = 0, npos+1
		}
		r.predic[[2]int{npos, nj}] = slices.Clone(ev.Predicted)
	}
}

func (r *recorded) options() *engine.TimingOnlyOptions {
	return &engine.TimingOnlyOptions{
		Routing: func(pos, j int) []int { return r.routing[[2]int{pos, j}] },
		Predict: func(pos, j int) []int { return r.predic[[2]int{pos, j}] },
	}
}

// simRun runs a prompt and a few greedy tokens on a simulated GPU, observing the routing with
// rec when it is not nil, and returns the device's timeline.
func simRun(t *testing.T, path string, opts engine.Options, prompt []int32, rec *recorded) []sim.Span {
	t.Helper()
	m, s := openSession(t, path, opts)
	defer m.Close()
	defer s.Close()
	if rec != nil {
		s.ObserveRouting(rec.observe)
	}
	if _, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: 6, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}); err != nil {
		t.Fatal(err)
	}
	spans, ok := m.Timeline()
	if !ok {
		t.Fatalf("%s keeps no timeline", m.Device())
	}
	return spans
}

// TestTimingOnlyTimeline is the test of one scheduler: each bundled model and several golden
// architectures run on a simulated GPU under every policy, once computing and once timing
// only with the routing (and the Commit Router's predictions) the first run recorded, and
// the two timelines must be the same, span for span.
func TestTimingOnlyTimeline(t *testing.T) {
	type model struct{ name, path, sidecar string }
	ms := []model{
		{"tinymoe-qwen2moe", "../models/testdata/tinymoe-qwen2moe.gguf", "yes"},
		{"tinymoe-mixtral", "../models/testdata/tinymoe-mixtral.gguf", "yes"},
	}
	fxs, err := fixture.LoadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fx := range fxs {
		if slices.Contains([]string{"olmoe-q8_0", "deepseek2-mla-q4km", "qwen2moe-q4km"}, fx.Name) {
			ms = append(ms, model{name: fx.Name, path: goldenModel(t, fx)})
		}
	}
	if len(ms) != 5 {
		t.Fatalf("%d models, want the 2 bundled ones and 3 golden ones", len(ms))
	}
	type policy struct {
		name string
		off  *engine.OffloadOptions
	}
	pols := []policy{
		{"resident", nil},
		{"ondemand", &engine.OffloadOptions{Policy: offload.OnDemand}},
		{"prefetch/prev-token", &engine.OffloadOptions{Policy: offload.Prefetch, Predictor: "prev-token"}},
		{"prefetch/frequency", &engine.OffloadOptions{Policy: offload.Prefetch, Predictor: "frequency"}},
		{"prefetch/router", &engine.OffloadOptions{Policy: offload.Prefetch, Predictor: "router"}},
		{"commit/router", &engine.OffloadOptions{Policy: offload.Commit}},
		{"commit/prev-token", &engine.OffloadOptions{Policy: offload.Commit, Predictor: "prev-token"}},
		{"cpu-miss", &engine.OffloadOptions{Policy: offload.CPUMiss}},
		{"static", &engine.OffloadOptions{Policy: offload.Static, HostLayers: 1}},
		{"static-cache", &engine.OffloadOptions{Policy: offload.StaticCache, HostLayers: 1}},
		{"hot", &engine.OffloadOptions{Policy: offload.Hot}},
	}
	prompt := []int32{1, 5, 9, 14, 3, 27, 8, 2, 11, 6}
	for _, md := range ms {
		info, err := engine.Inspect(md.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pols {
			if strings.HasSuffix(p.name, "/router") && md.sidecar == "" {
				continue // no Commit Router was trained for the golden models
			}
			t.Run(md.name+"/"+p.name, func(t *testing.T) {
				opts := engine.Options{Device: "sim:rtx2080ti", Threads: 2, ContextLength: 64,
					HostRates: engine.HostRates{Bandwidth: 20e9, FLOPS: 200e9, Overhead: 20e-6}}
				if p.off != nil {
					o := *p.off
					opts.Offload = &o
					st := offloadProbe(t, md.path, opts)
					// Room for a little more than two layers' top-k: misses, prefetches and
					// evictions all happen. Static keeps its device layers' experts.
					slots := 2*info.ExpertsUsed + 3
					if o.Policy.Split() {
						slots = (len(info.MoELayers) - o.HostLayers) * info.Experts
					}
					if o.Policy == offload.StaticCache {
						slots += info.ExpertsUsed + 1 // the cache evicts
					}
					o.GPUMem = st.Resident + int64(slots)*st.SlotBytes
				}
				// Observing the routing is a run of its own: it keeps every row of a prompt
				// to the end, where a run without observers cuts the last block to the
				// last row (the rows are computed alone, so their routing is the same).
				rec := newRecorded(info.MoELayers)
				simRun(t, md.path, opts, prompt, rec)
				want := simRun(t, md.path, opts, prompt, nil)
				opts.TimingOnly = rec.options()
				got := simRun(t, md.path, opts, prompt, nil)
				if len(want) < 10 {
					t.Fatalf("the computing run drew only %d spans", len(want))
				}
				for i := range min(len(got), len(want)) {
					if got[i] != want[i] {
						t.Fatalf("span %d of %d: timing only %+v, computing %+v", i, len(want), got[i], want[i])
					}
				}
				if len(got) != len(want) {
					t.Fatalf("timing only drew %d spans, computing %d", len(got), len(want))
				}
			})
		}
	}
}

// TestTimingOnlyBadInput: a timing-only run refuses what it cannot run, and routing that
// does not fit the model fails its pass with an error that says where.
func TestTimingOnlyBadInput(t *testing.T) {
	const path = "../models/testdata/tinymoe-qwen2moe.gguf"
	info, err := engine.Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	good := func(pos, j int) []int { return []int{0, 1, 2, 3}[:info.ExpertsUsed] }
	for _, c := range []struct {
		name string
		opts engine.Options
		want string
	}{
		{"cpu", engine.Options{TimingOnly: &engine.TimingOnlyOptions{Routing: good}}, "simulated GPU"},
		{"no routing", engine.Options{Device: "sim:rtx4090", TimingOnly: &engine.TimingOnlyOptions{}}, "without routing"},
		{"ep", engine.Options{Device: "sim:rtx4090", EP: &engine.EPOptions{Devices: 2}, TimingOnly: &engine.TimingOnlyOptions{Routing: good}}, "expert parallelism"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := engine.Open(path, c.opts)
			if err == nil {
				m.Close()
				t.Fatalf("Open succeeded, want an error about %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want it to mention %q", err, c.want)
			}
		})
	}
	for name, routing := range map[string]func(pos, j int) []int{
		"short":    func(pos, j int) []int { return []int{0} },
		"repeated": func(pos, j int) []int { return slices.Repeat([]int{1}, info.ExpertsUsed) },
		"range":    func(pos, j int) []int { return append([]int{info.Experts}, good(pos, j)[1:]...) },
	} {
		t.Run(name, func(t *testing.T) {
			m, s := openSession(t, path, engine.Options{Device: "sim:rtx4090", TimingOnly: &engine.TimingOnlyOptions{Routing: routing}})
			defer m.Close()
			defer s.Close()
			_, err := s.Generate(context.Background(), []int32{1, 2}, engine.GenerateOptions{MaxTokens: 2})
			if err == nil || !strings.Contains(err.Error(), "timing-only routing of position 0, MoE layer 0") {
				t.Fatalf("error %v, want one naming position 0 and MoE layer 0", err)
			}
		})
	}
}
