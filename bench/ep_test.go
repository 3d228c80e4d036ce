package bench_test

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/bench"
	"github.com/commit-run/commit-run/multigpu"
)

// The simulation: 8 devices, 90% of the tokens on one hot expert per layer. HarMoEny
// (at a threshold the batch reaches) and expanded drop cut the straggler layer against
// round-robin; EPLB, once it has re-planned, does too; every policy's schedules pass
// Schedule.Check inside Simulate.
func TestEPBenchSkewed(t *testing.T) {
	rep, err := bench.EP(bench.EPOptions{Shape: "qwen1.5-moe-a2.7b@q4_k", Device: "sim:h100-pcie", Devices: 8,
		Tokens: 4096, Steps: 2, Skew: 0.9, Seed: 1, HarMoEnyThreshold: 150,
		Policies: []string{"round-robin", "harmoeny", "expanded-drop", "token-drop", "expanded-drop/device"}})
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]multigpu.SimReport{}
	for _, r := range rep.Rows {
		rows[r.Policy] = r
		t.Logf("%-22s batch %.3f ms, dropped %.3f, extra %.3f, fetches %.1f", r.Policy, r.Latency*1e3, r.Dropped, r.Extra, r.Fetches)
	}
	mean := func(r multigpu.SimReport, f func(multigpu.LayerReport) float64) float64 {
		var s float64
		for _, l := range r.Layers {
			s += f(l)
		}
		return s / float64(len(r.Layers))
	}
	rr := rows["round-robin"]
	if b := mean(rr, func(l multigpu.LayerReport) float64 { return l.Balancedness }); b > 0.5 {
		t.Errorf("round-robin balancedness %v under 90%% skew", b)
	}
	for _, p := range []string{"harmoeny", "expanded-drop", "expanded-drop/device"} {
		r := rows[p]
		straggler := func(l multigpu.LayerReport) float64 { return l.Straggler }
		if mean(r, straggler) >= mean(rr, straggler) || r.Latency >= rr.Latency {
			t.Errorf("%s: straggler %v s, batch %v s; round-robin %v, %v", p, mean(r, straggler), r.Latency, mean(rr, straggler), rr.Latency)
		}
		if mean(r, func(l multigpu.LayerReport) float64 { return l.MaxLoad }) >= mean(rr, func(l multigpu.LayerReport) float64 { return l.MaxLoad }) {
			t.Errorf("%s: the busiest device is not less loaded than round-robin's", p)
		}
	}
	if h := rows["harmoeny"]; h.Dropped != 0 || h.Fetches == 0 {
		t.Errorf("HarMoEny drops %v and fetches %v experts per batch: want none dropped, some fetched", h.Dropped, h.Fetches)
	}
	if e, d := rows["expanded-drop"], rows["token-drop"]; e.Dropped != d.Dropped || e.Extra <= 0 {
		t.Errorf("expanded drop drops %v (token drop %v) and adds %v", e.Dropped, d.Dropped, e.Extra)
	}
	if rr.Dropped != 0 || rr.Fetches != 0 {
		t.Errorf("round-robin dropped %v, fetched %v", rr.Dropped, rr.Fetches)
	}
	// Eq. 4's threshold on an H100 is thousands of tokens: no source device sends that
	// many, and HarMoEny leaves the plan as it is.
	rep, err = bench.EP(bench.EPOptions{Shape: "qwen1.5-moe-a2.7b@q4_k", Device: "sim:h100-pcie", Devices: 8,
		Tokens: 1024, Steps: 1, Skew: 0.9, Policies: []string{"round-robin", "harmoeny"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.HarMoEnyThreshold < 1000 || rep.Rows[1].Latency != rep.Rows[0].Latency {
		t.Errorf("eq. 4 threshold %d; HarMoEny %v s, round-robin %v s", rep.HarMoEnyThreshold, rep.Rows[1].Latency, rep.Rows[0].Latency)
	}
}

// MACS on a synthetic multimodal batch: experts classed from a calibration batch, image
// tokens weighed below text, and a schedule for every layer.
func TestEPBenchMultimodal(t *testing.T) {
	rep, err := bench.EP(bench.EPOptions{Shape: "olmoe-1b-7b@q4_k", Device: "sim:rtx4090", Devices: 4,
		Tokens: 512, Steps: 2, Skew: 0.3, Visual: 0.6, Seed: 3, Policies: []string{"token-drop", "macs"}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.Routing, "60% image tokens") {
		t.Errorf("routing %q", rep.Routing)
	}
	td, macs := rep.Rows[0], rep.Rows[1]
	// Image tokens weigh about half a text token in MACS's effective load, so its experts
	// keep more of them: fewer drops than token drop at the same capacity factor.
	if macs.Dropped >= td.Dropped {
		t.Errorf("MACS drops %v, token drop %v", macs.Dropped, td.Dropped)
	}
}

func TestEPBenchBadInput(t *testing.T) {
	base := bench.EPOptions{Shape: "olmoe-1b-7b@q4_k", Device: "sim:rtx4090", Devices: 4, Tokens: 64, Steps: 1}
	for _, c := range []struct {
		edit func(*bench.EPOptions)
		want string
	}{
		{func(o *bench.EPOptions) { o.Devices = 0 }, "--ep 0"},
		{func(o *bench.EPOptions) { o.Device = "cpu" }, "sim:<profile>"},
		{func(o *bench.EPOptions) { o.Device = "sim:voodoo2" }, "voodoo2"},
		{func(o *bench.EPOptions) { o.Shape = "" }, "--shape"},
		{func(o *bench.EPOptions) { o.Shape = "gpt-9" }, "unknown model shape"},
		{func(o *bench.EPOptions) { o.Skew = 1.5 }, "skew"},
		{func(o *bench.EPOptions) { o.Hot = 65 }, "hot experts"},
		{func(o *bench.EPOptions) { o.Tokens = -5 }, "tokens per batch"},
		{func(o *bench.EPOptions) { o.Gamma = -1 }, "capacity factor"},
		{func(o *bench.EPOptions) { o.HarMoEnyThreshold = -1 }, "threshold"},
		{func(o *bench.EPOptions) { o.Policies = []string{"magic"} }, "want one of"},
		{func(o *bench.EPOptions) { o.Trace = "/nonexistent.trace" }, "no such file"},
		{func(o *bench.EPOptions) { o.Policies = []string{"macs"}; o.Visual = 2 }, "visual share"},
	} {
		o := base
		c.edit(&o)
		if _, err := bench.EP(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one mentioning %q", o, err, c.want)
		}
	}
}
