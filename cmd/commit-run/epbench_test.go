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

// With -m and --text the model runs on the devices: every planner's perplexity beside its
// loads and times, and eval ppl under expert parallelism.
func TestBenchEPRun(t *testing.T) {
	out, _ := mustRun(t, "", "-m", bundledQwen, "--device", "sim:rtx4090", "--ep", "4", "--capacity-factor", "1", "bench",
		"--text", heldOut, "--batch", "256", "--batches", "2", "--per-layer")
	for _, want := range []string{"4 x sim:rtx4090", "windows of 64 tokens", "simulated time", "perplexity", "MB moved/batch",
		"round-robin", "token-drop", "expanded-drop/device", "harmoeny", "eplb", "macs", "1.00x", "macs per layer"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench --ep --text output lacks %q:\n%s", want, out)
		}
	}
	js, _ := mustRun(t, "", "-m", bundledMixtral, "--ep", "2", "--ep-policy", "round-robin,token-drop", "--capacity-factor", "1",
		"bench", "--text", heldOut, "--batch", "64", "--batches", "2", "--json")
	var rows []struct {
		Policy     string
		Perplexity float64
		Stats      struct {
			Devices, Steps int
			Layers         []struct{ Choices, Dropped int64 }
		}
	}
	if err := json.Unmarshal([]byte(js), &rows); err != nil || len(rows) != 2 || rows[0].Stats.Devices != 2 || rows[0].Stats.Steps != 2 ||
		rows[0].Stats.Layers[0].Dropped != 0 || rows[1].Stats.Layers[0].Dropped == 0 || !(rows[1].Perplexity > 0) {
		t.Errorf("--json: %v %+v\n%s", err, rows, js)
	}
	// eval ppl over the devices: round-robin drops nothing, so it is the one device's number.
	one, _ := mustRun(t, "", "-m", bundledQwen, "eval", "ppl", "--text", heldOut, "--window", "64", "--max-tokens", "512")
	ep, _ := mustRun(t, "", "-m", bundledQwen, "--ep", "3", "eval", "ppl", "--text", heldOut, "--window", "64", "--max-tokens", "512")
	pick := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, "perplexity") {
				return l
			}
		}
		return ""
	}
	if pick(one) == "" || pick(one) != pick(ep) {
		t.Errorf("eval ppl --ep 3 %q, one device %q", pick(ep), pick(one))
	}
	if !strings.Contains(ep, "expert parallelism") {
		t.Errorf("eval ppl --ep does not report its devices:\n%s", ep)
	}
	// MACS's semantic rerouting: both commands say where the centroids came from.
	calibrated := "MACS reroutes with eta 0.5, expert centroids from 4096 tokens of " + heldOut
	macs, _ := mustRun(t, "", "-m", bundledQwen, "--ep", "2", "--ep-policy", "macs", "--capacity-factor", "1", "--macs-eta", "0.5",
		"--macs-calibration", heldOut, "eval", "ppl", "--text", heldOut, "--window", "64", "--max-tokens", "256")
	bench, _ := mustRun(t, "", "-m", bundledQwen, "--ep", "2", "--ep-policy", "round-robin,macs-expanded", "--capacity-factor", "1", "--macs-eta", "0.5",
		"--macs-calibration", heldOut, "bench", "--text", heldOut, "--batch", "128", "--batches", "1")
	for _, out := range []string{macs, bench} {
		if !strings.Contains(out, calibrated) {
			t.Errorf("MACS with eta 0.5: want %q in\n%s", calibrated, out)
		}
	}
}

func TestEPBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ep", "1", "eval", "ppl", "--text", heldOut}, "--ep 1"},
		{[]string{"--ep-policy", "eplb", "eval", "ppl", "--text", heldOut}, "pass --ep N"},
		{[]string{"--harmoeny-q", "5", "eval", "ppl", "--text", heldOut}, "pass --ep N"},
		{[]string{"--ep", "2", "--ep-policy", "eplb,macs", "eval", "ppl", "--text", heldOut}, "one planner"},
		{[]string{"--ep", "2", "--ep-policy", "magic", "eval", "ppl", "--text", heldOut}, "want one of"},
		{[]string{"--ep", "2", "--expanded-drop", "eval", "ppl", "--text", heldOut}, "--ep-policy expanded-drop"},
		{[]string{"--ep", "2", "--gpu-mem", "1MiB", "eval", "ppl", "--text", heldOut}, "--ep spreads"},
		{[]string{"--ep", "64", "eval", "ppl", "--text", heldOut}, "want 2 to the model's 16 experts"},
		{[]string{"--ep", "2", "--link-bw", "fast", "eval", "ppl", "--text", heldOut}, "--link-bw"},
		{[]string{"--ep", "4", "bench", "--text", heldOut, "--batch", "4"}, "at least 2"},
		{[]string{"--ep", "4", "bench", "--text", "/nonexistent", "--batch", "64"}, "--text"},
		{[]string{"--ep", "4", "bench", "--text", heldOut, "--alpha", "0.5"}, "--alpha does not apply"},
		{[]string{"--ep-transport", "nccl", "eval", "ppl", "--text", heldOut}, "pass --ep N"},
		{[]string{"--ep", "2", "--ep-transport", "nccl", "eval", "ppl", "--text", heldOut}, "moves tokens between CUDA GPUs"},
		{[]string{"--ep", "2", "--ep-transport", "pigeon", "eval", "ppl", "--text", heldOut}, "want nccl, local or auto"},
		{[]string{"--ep-rank", "1", "eval", "ppl", "--text", heldOut}, "--ep-rank applies"},
		{[]string{"--ep", "2", "--ep-rank", "1", "eval", "ppl", "--text", heldOut}, "pass --ep-rendezvous"},
		{[]string{"--ep", "2", "--ep-rendezvous", "127.0.0.1:1", "--ep-rank", "2", "ep-serve"}, "want 0 to 1"},
		{[]string{"--ep", "2", "--ep-rendezvous", "127.0.0.1:1", "--ep-rank", "1", "ep-serve"}, "runs on CUDA GPUs"},
		{[]string{"ep-serve"}, "pass --ep N, --ep-rendezvous"},
		{[]string{"--macs-eta", "0.5", "--macs-calibration", heldOut, "eval", "ppl", "--text", heldOut}, "pass --ep N and --ep-policy macs"},
		{[]string{"--ep", "2", "--macs-eta", "0.5", "--macs-calibration", heldOut, "eval", "ppl", "--text", heldOut}, "apply to --ep-policy macs"},
		{[]string{"--ep", "2", "--ep-policy", "macs", "--macs-eta", "0.5", "eval", "ppl", "--text", heldOut}, "pass both"},
		{[]string{"--ep", "2", "--ep-policy", "macs", "--macs-calibration", heldOut, "eval", "ppl", "--text", heldOut}, "pass both"},
		{[]string{"--ep", "2", "--ep-policy", "macs", "--macs-eta", "2", "--macs-calibration", heldOut, "eval", "ppl", "--text", heldOut}, "--macs-eta 2: want 0 to 1"},
		{[]string{"--ep", "2", "--ep-policy", "macs", "--macs-eta", "0.5", "--macs-calibration", "/nonexistent", "eval", "ppl", "--text", heldOut}, "--macs-calibration: open /nonexistent"},
		{[]string{"--ep", "2", "--ep-policy", "eplb,harmoeny", "--macs-eta", "0.5", "--macs-calibration", heldOut, "bench", "--text", heldOut}, "apply to --ep-policy macs"},
		{[]string{"--ep", "2", "--macs-eta", "0.5", "--macs-calibration", heldOut, "bench", "--shape", "olmoe-1b-7b"}, "need the model's hidden states"},
	} {
		_, errOut, code := runCLI(t, "", append([]string{"-m", bundledQwen}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
}
