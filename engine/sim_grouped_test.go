package engine_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
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
// kernels and less simulated time.
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
				// Room for 8 experts of a layer's 16 beside the rest: the groups go 8 at a time.
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
	ctx := context.Background()
	if err := s.Probs(ctx, prompt, func(_ int, p []float32) error {
		r.probs = append(r.probs, slices.Clone(p))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Generate(ctx, prompt, engine.GenerateOptions{MaxTokens: 4, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
	if err != nil {
		t.Fatal(err)
	}
	r.tokens = res.Tokens
	spans, _ := m.Timeline()
	for _, sp := range spans {
		if sp.Stream == "compute" {
			r.kernels++
		}
	}
	r.clock, _ = m.Clock()
	return r
}
