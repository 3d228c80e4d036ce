package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchEP(t *testing.T) {
	out, _ := mustRun(t, "", "--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b@q4_k", "--alpha", "0.9",
		"--batch", "512", "--batches", "2", "--harmoeny-q", "40", "--per-layer")
	for _, want := range []string{"4 x rtx4090", "SYNTHETIC routing", "skew 0.90", "HarMoEny threshold q = 40", "balancedness", "straggler ms/layer",
		"round-robin", "token-drop", "expanded-drop/device", "harmoeny", "eplb", "macs", "1.00x", "harmoeny per layer"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench --ep output lacks %q:\n%s", want, out)
		}
	}
	js, _ := mustRun(t, "", "--device", "sim:h100-pcie", "--capacity-factor", "1", "bench", "--ep", "2", "--shape", "mixtral-8x7b",
		"--batch", "64", "--batches", "1", "--ep-policy", "round-robin,token-drop", "--json")
	var rep struct {
		Devices int
		Rows    []struct {
			Policy  string
			Dropped float64
			Layers  []struct{ MaxLoad float64 }
		}
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil || rep.Devices != 2 || len(rep.Rows) != 2 || len(rep.Rows[1].Layers) != 32 || rep.Rows[0].Dropped != 0 {
		t.Errorf("--json: %v %+v\n%s", err, rep, js)
	}
}

// With -m, the model's own tensors give the costs.
func TestBenchEPModel(t *testing.T) {
	model := needModel(t)
	out, _ := mustRun(t, "", "-m", model, "--device", "sim:rtx2080ti", "bench", "--ep", "2", "--batch", "64", "--batches", "2", "--alpha", "0.5")
	if !strings.Contains(out, "2 x rtx2080ti") || !strings.Contains(out, "expanded-drop") {
		t.Errorf("bench --ep -m:\n%s", out)
	}
}

func TestBenchEPBadInput(t *testing.T) {
	model := needModel(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--ep", "4", "--shape", "olmoe-1b-7b"}, "sim:<profile>"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "0", "--shape", "olmoe-1b-7b"}, "--ep 0"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b", "--alpha", "2"}, "skew"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b", "--ep-policy", "magic"}, "want one of"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b", "--link-bw", "-1GB"}, "--link-bw"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b", "--harmoeny-q", "-3"}, "threshold"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b", "--batch", "0"}, "--batch 0"},
		{[]string{"--device", "sim:rtx4090", "bench", "--ep", "4", "--shape", "olmoe-1b-7b", "--tokens", "8"}, "does not apply to --ep"},
		{[]string{"--device", "sim:rtx4090", "--gpu-mem", "4GiB", "bench", "--ep", "4", "--shape", "olmoe-1b-7b"}, "--ep spreads"},
		{[]string{"--device", "sim:rtx4090", "--drop-metric", "worst", "bench", "--ep", "4", "--shape", "olmoe-1b-7b"}, "--drop-metric"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "olmoe-1b-7b", "--alpha", "0.5"}, "--ep N"},
		{[]string{"-m", model, "--expanded-drop", "eval", "ppl", "--text", heldOut}, "--capacity-factor"},
		{[]string{"-m", model, "--capacity-factor", "1", "--drop-devices", "0", "eval", "ppl", "--text", heldOut}, "--drop-devices"},
		{[]string{"-m", model, "--capacity-factor", "1", "--drop-devices", "17", "eval", "ppl", "--text", heldOut}, "17 devices"},
	} {
		_, errOut, code := runCLI(t, "", c.args...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
}

// A recorded trace drives the planners: the bundled model's own routing, with its router
// logits as the gating scores expanded drop offers by.
func TestBenchEPTrace(t *testing.T) {
	tr := filepath.Join(t.TempDir(), "r.trace")
	mustRun(t, "", "-m", bundledQwen, "predictor", "collect", "--text", heldOut, "--max-tokens", "300", "--window", "128", "--out", tr)
	out, _ := mustRun(t, "", "-m", bundledQwen, "--device", "sim:rtx4090", "bench", "--ep", "4", "--trace", tr, "--batch", "128", "--batches", "2")
	if !strings.Contains(out, "recorded routing: trace") || !strings.Contains(out, "expanded-drop") {
		t.Errorf("bench --ep --trace:\n%s", out)
	}
	_, errOut, code := runCLI(t, "", "-m", bundledQwen, "--device", "sim:rtx4090", "bench", "--ep", "4", "--trace", tr, "--batch", "128", "--batches", "9")
	if code == 0 || !strings.Contains(errOut, "holds") {
		t.Errorf("a trace too short: exit %d, %q", code, errOut)
	}
}
