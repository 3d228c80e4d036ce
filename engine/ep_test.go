package engine_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

func openEP(t *testing.T, path, dev string, ep *engine.EPOptions) *engine.Model {
	t.Helper()
	m, err := engine.Open(path, engine.Options{Device: dev, Threads: 2, EP: ep})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// generated is the tokens a new session of m generates after prompt.
func generated(t *testing.T, m *engine.Model, prompt []int32, o engine.GenerateOptions) []int32 {
	t.Helper()
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.Generate(context.Background(), prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	return res.Tokens
}

// Expert parallelism with a policy that drops nothing computes what one device computes, to
// the bit: the held-out perplexity with windows spread over the ranks, and a greedy
// generation whose tokens live on rank 0 while the other ranks serve their experts.
func TestEPMatchesOneDevice(t *testing.T) {
	text := heldOutPrefix(t, 6000)
	po := engine.PerplexityOptions{Window: 128, MaxTokens: 900}
	ctx := context.Background()
	for _, path := range []string{bundledQwen, bundledMixtral} {
		one := openEP(t, path, "cpu", nil)
		want, err := one.PerplexityWith(ctx, text, po)
		if err != nil {
			t.Fatal(err)
		}
		prompt, err := one.Tokenize("The old prince", true)
		if err != nil {
			t.Fatal(err)
		}
		gen := func(m *engine.Model) []int32 {
			return generated(t, m, prompt, engine.GenerateOptions{MaxTokens: 12, IgnoreEOS: true})
		}
		wantGen := gen(one)
		for _, c := range []struct {
			dev    string
			n      int
			policy string
		}{
			{"cpu", 2, "round-robin"}, {"cpu", 4, "round-robin"}, {"sim:rtx4090", 4, "round-robin"},
			{"cpu", 3, "harmoeny"}, {"cpu", 4, "eplb"}, {"sim:h100-pcie", 4, "harmoeny"},
		} {
			name := fmt.Sprintf("%s %d x %s %s", path, c.n, c.dev, c.policy)
			m := openEP(t, path, c.dev, &engine.EPOptions{Devices: c.n, Policy: c.policy, HarMoEnyThreshold: 2})
			got, err := m.PerplexityWith(ctx, text, po)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got != want {
				t.Errorf("%s: perplexity %+v, one device %+v", name, got, want)
			}
			if g := gen(m); fmt.Sprint(g) != fmt.Sprint(wantGen) {
				t.Errorf("%s: generated %v, one device %v", name, g, wantGen)
			}
			st, ok := m.EPStats()
			if !ok || st.Steps == 0 || st.Devices != c.n || len(st.Layers) == 0 {
				t.Fatalf("%s: stats %+v", name, st)
			}
			var fetches int64
			for _, l := range st.Layers {
				if l.Passes == 0 || l.Dropped != 0 || l.Extra != 0 || l.Choices == 0 || l.Bytes == 0 {
					t.Errorf("%s: layer %+v", name, l)
				}
				fetches += l.Fetches
			}
			if c.policy == "harmoeny" && fetches == 0 {
				t.Errorf("%s: HarMoEny with q = 2 moved nothing", name)
			}
			if c.policy == "eplb" && st.Replans == 0 {
				t.Errorf("%s: EPLB never re-planned", name)
			}
			if strings.HasPrefix(c.dev, "sim:") && !(st.Seconds > 0) {
				t.Errorf("%s: %v s on the simulated clock", name, st.Seconds)
			}
		}
	}
}

// Token drop executed over ranks drops choices and costs perplexity; the capacity-aware
// policies run end to end on real routing.
func TestEPPoliciesBundled(t *testing.T) {
	text := heldOutPrefix(t, 6000)
	po := engine.PerplexityOptions{Window: 128, MaxTokens: 900}
	ctx := context.Background()
	base, err := openEP(t, bundledQwen, "cpu", nil).PerplexityWith(ctx, text, po)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range engine.EPPolicies() {
		m := openEP(t, bundledQwen, "sim:rtx4090", &engine.EPOptions{Devices: 4, Policy: p, Gamma: 1})
		got, err := m.PerplexityWith(ctx, text, po)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		st, _ := m.EPStats()
		var ch, dr, ex int64
		var bal, strag float64
		for _, l := range st.Layers {
			ch, dr, ex = ch+l.Choices, dr+l.Dropped, ex+l.Extra
			bal += l.Balancedness / float64(l.Passes)
			strag += l.Straggler / float64(l.Passes)
		}
		n := float64(len(st.Layers))
		t.Logf("%-20s perplexity %.4f (%+.2f%%), dropped %.3f, extra %.3f, balancedness %.3f, straggler %.1f us/layer, %.2f ms/step",
			p, got.Perplexity, 100*(got.Perplexity/base.Perplexity-1), float64(dr)/float64(ch), float64(ex)/float64(ch), bal/n, strag/n*1e6, st.Seconds/float64(st.Steps)*1e3)
		drops := strings.Contains(p, "drop") || strings.HasPrefix(p, "macs")
		if drops && dr == 0 {
			t.Errorf("%s at capacity factor 1 dropped nothing", p)
		}
		if !drops && (dr != 0 || got.Perplexity != base.Perplexity) {
			t.Errorf("%s: dropped %d, perplexity %v (base %v)", p, dr, got.Perplexity, base.Perplexity)
		}
		if (strings.HasPrefix(p, "expanded") || p == "macs-expanded") && ex == 0 {
			t.Errorf("%s added no expert", p)
		}
	}
}

// MACS's semantic rerouting in a run of the model: the centroids come from a calibration
// text, each rank sends its tokens' affinities, and with eta 1 the planner reroutes by them
// alone, so the run differs from rerouting by gating score; nothing else changes.
func TestEPMACSSemanticRerouting(t *testing.T) {
	raw, err := os.ReadFile(heldOutText)
	if err != nil {
		t.Fatal(err)
	}
	calibration := string(raw[100000:130000]) // far from the evaluated text
	text := heldOutPrefix(t, 6000)
	po := engine.PerplexityOptions{Window: 128, MaxTokens: 900}
	ctx := context.Background()
	var ppl [2]float64
	for i, eta := range []float64{0, 1} {
		o := &engine.EPOptions{Devices: 4, Policy: "macs", Gamma: 1}
		if eta > 0 {
			o.MACSEta, o.MACSCalibration = eta, calibration
		}
		m := openEP(t, bundledQwen, "cpu", o)
		got, err := m.PerplexityWith(ctx, text, po)
		if err != nil {
			t.Fatal(err)
		}
		st, _ := m.EPStats()
		var ch, dr, ex int64
		for _, l := range st.Layers {
			ch, dr, ex = ch+l.Choices, dr+l.Dropped, ex+l.Extra
		}
		t.Logf("eta %g: perplexity %.4f, calibrated on %d tokens, dropped %.3f, rerouted %.3f", eta, got.Perplexity, st.CalibrationTokens, float64(dr)/float64(ch), float64(ex)/float64(ch))
		if want := map[bool]int{false: 0, true: 4096}[eta > 0]; st.CalibrationTokens != want {
			t.Errorf("eta %g: calibrated on %d tokens, want %d", eta, st.CalibrationTokens, want)
		}
		if dr == 0 || ex == 0 {
			t.Errorf("eta %g: dropped %d and rerouted %d choices: the test needs both", eta, dr, ex)
		}
		ppl[i] = got.Perplexity
	}
	if ppl[0] == ppl[1] {
		t.Errorf("eta 1 computed what eta 0 computed (perplexity %v): the affinities did not reach the planner", ppl[0])
	}
}

func TestEPBadOptions(t *testing.T) {
	for _, c := range []struct {
		o    engine.Options
		want string
	}{
		{engine.Options{EP: &engine.EPOptions{Devices: 1}}, "want 2 to"},
		{engine.Options{EP: &engine.EPOptions{Devices: 17}}, "want 2 to"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "fastest"}}, "expert-parallel policy"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Gamma: -1}}, "capacity factor"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, LinkBandwidth: -1}}, "link"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2}, Drop: &engine.DropOptions{Gamma: 1}}, "token drop"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2}, Offload: &engine.OffloadOptions{GPUMem: 1 << 20}}, "offload"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2}, Device: "sim:nonesuch"}, "nonesuch"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "macs", MACSEta: 1.5, MACSCalibration: "text"}}, "eta 1.5"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "macs", MACSEta: math.NaN(), MACSCalibration: "text"}}, "eta NaN"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "macs", MACSEta: 0.5}}, "give a calibration text"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "macs", MACSCalibration: "text"}}, "give eta above 0"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "eplb", MACSEta: 0.5, MACSCalibration: "text"}}, "not \"eplb\""},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "macs", MACSEta: 0.5, MACSCalibration: "text", MACSCalibrationTokens: -1}}, "-1 tokens"},
		{engine.Options{EP: &engine.EPOptions{Devices: 2, Policy: "macs", MACSEta: 0.5, MACSCalibration: "a"}}, "MACS calibration: text has 1 tokens"},
	} {
		m, err := engine.Open(bundledQwen, c.o)
		if err == nil {
			m.Close()
			t.Errorf("%+v: opened", c.o.EP)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.o.EP, err, c.want)
		}
	}
}
