package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/shapes"
	"github.com/commit-run/commit-run/sim"
)

// groupedSimRun is what TestSimGroupedExperts compares: the numbers, the simulated card's kernels
// and its clock.
type groupedSimRun struct {
	probs   [][]float32
	tokens  []int32
	kernels int
	clock   float64
}

// TestSimGroupedExperts prefills golden models (gpt-oss's biased experts among them) on the
// simulated card, every expert resident and through an offloader: it groups a prompt's
// experts as the CUDA engine does (device.GroupedExperts, a kernel per product for all of
// them), with the numbers of the experts one by one and of the CPU, bit for bit, in fewer
// kernels and less simulated time; and a timing-only run of the same routing draws the
// computing run's timeline, span for span (TestTimingOnlyTimeline's one scheduler, with
// groups).
func TestSimGroupedExperts(t *testing.T) {
	for _, c := range []struct {
		name    string
		offload *engine.OffloadOptions
	}{
		{"qwen3moe-q3km", nil},
		{"gpt-oss-mxfp4", nil},
		{"qwen3moe-q3km", &engine.OffloadOptions{Policy: offload.OnDemand}},
	} {
		t.Run(fmt.Sprint(c.name, "/offload=", c.offload != nil), func(t *testing.T) {
			path, spec, golden := goldenWithPrompt(t, c.name)
			var prompt []int32
			for i := 0; len(prompt) < 128; i++ {
				prompt = append(prompt, (golden[i%len(golden)]+int32(i/len(golden)))%int32(spec.Vocab))
			}
			o := engine.Options{Threads: 2, KVType: "f32", ContextLength: 256, Device: "sim:rtx4090"}
			if c.offload != nil {
				// Room for 8 experts of a layer's 16 beside the rest: those the slots hold when
				// their layer comes are grouped.
				probe := o
				probe.Offload = &engine.OffloadOptions{Policy: c.offload.Policy, GPUMem: 512 << 20}
				pm, err := engine.Open(path, probe)
				if err != nil {
					t.Fatal(err)
				}
				st, _ := pm.Offload()
				pm.Close()
				o.Offload = &engine.OffloadOptions{Policy: c.offload.Policy, GPUMem: st.Resident + 8*st.SlotBytes}
			}
			got := runGroupedSim(t, path, o, prompt)
			want := runGroupedSim(t, path, engine.UngroupedForTests(o), prompt)
			cpuOpts := engine.Options{Threads: 2, KVType: "f32", ContextLength: 256}
			cpu := runGroupedSim(t, path, cpuOpts, prompt)
			for _, r := range []struct {
				name string
				r    groupedSimRun
			}{{"one by one", want}, {"the CPU", cpu}} {
				if !slices.Equal(got.tokens, r.r.tokens) {
					t.Errorf("greedy %v grouped, %v %s", got.tokens, r.r.tokens, r.name)
				}
				if d := maxDiff(got.probs, r.r.probs); d != 0 {
					t.Errorf("probabilities grouped differ by up to %g from %s", d, r.name)
				}
			}
			if got.kernels >= want.kernels || got.clock >= want.clock {
				t.Errorf("grouped: %d kernels, %.3f ms; one by one: %d kernels, %.3f ms", got.kernels, 1e3*got.clock, want.kernels, 1e3*want.clock)
			}
			t.Logf("grouped: %d kernels, %.3f ms; one by one: %d kernels, %.3f ms", got.kernels, 1e3*got.clock, want.kernels, 1e3*want.clock)

			info, err := engine.Inspect(path)
			if err != nil {
				t.Fatal(err)
			}
			rec := newRecorded(info.MoELayers)
			simRun(t, path, o, prompt, rec)
			computing := simRun(t, path, o, prompt, nil)
			o.TimingOnly = rec.options()
			timing := simRun(t, path, o, prompt, nil)
			if !slices.Equal(timing, computing) {
				t.Errorf("timing only drew %d spans, computing %d, not the same", len(timing), len(computing))
			}
			if !slices.ContainsFunc(computing, func(sp sim.Span) bool { return sp.Label == "grouped L0" }) {
				t.Errorf("no grouped experts drawn")
			}
		})
	}
}

// runGroupedSim computes the prompt's probabilities, then 4 greedy tokens, and counts the kernels
// the simulated card ran (none on the CPU).
func runGroupedSim(t *testing.T, path string, o engine.Options, prompt []int32) groupedSimRun {
	t.Helper()
	m, s := openSession(t, path, o)
	defer m.Close()
	defer s.Close()
	var r groupedSimRun
	r.probs, r.tokens = probsThenGreedy(t, s, prompt, 4)
	spans, _ := m.Timeline()
	for _, sp := range spans {
		if sp.Stream == "compute" {
			r.kernels++
		}
	}
	r.clock, _ = m.Clock()
	return r
}

// TestSimGroupingKeepsCopiesPipelined times a 128-token prompt of Mixtral-8x7B (Q4_K, 8
// experts of about 100 MB a layer, top 2) timing only on sim:rtx4090 with the card's memory,
// under ondemand and cpu-miss: the experts a prompt must copy are computed one by one as
// their copies land, so grouping what the slots hold never costs time to the first token.
// Grouping the copied experts too (tried first) made each layer wait for its last copy and
// took 0.22 s where one by one took 0.19.
func TestSimGroupingKeepsCopiesPipelined(t *testing.T) {
	routing := func(pos, j int) []int { // two of 8, spread over the experts
		h := uint32(pos*131+j*7919) * 2654435761
		a := int(h>>16) % 8
		return []int{a, (a + 1 + int(h>>8)%7) % 8}
	}
	prompt := make([]int32, 128)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	for _, pol := range []offload.Policy{offload.OnDemand, offload.CPUMiss} {
		ttft := func(o engine.Options) float64 {
			m, err := shapes.Open("mixtral-8x7b@q4_k", o)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			s, err := m.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			start, _ := m.Clock() // after the slots' first fill
			if _, err := s.Generate(context.Background(), prompt, engine.GenerateOptions{MaxTokens: 1, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}}); err != nil {
				t.Fatal(err)
			}
			now, _ := m.Clock()
			return now - start
		}
		o := engine.Options{Device: "sim:rtx4090", ContextLength: 256, TimingOnly: &engine.TimingOnlyOptions{Routing: routing},
			Offload: &engine.OffloadOptions{Policy: pol, GPUMem: 24 << 30}}
		got, want := ttft(o), ttft(engine.UngroupedForTests(o))
		if got > want {
			t.Errorf("%s: %.1f ms to the first token grouped, %.1f one by one", pol, 1e3*got, 1e3*want)
		}
		t.Logf("%s: %.1f ms to the first token grouped, %.1f one by one", pol, 1e3*got, 1e3*want)
	}
}
