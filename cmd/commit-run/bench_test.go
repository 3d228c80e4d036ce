package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/internal/fakecuda"
	"github.com/commit-run/commit-run/shapes"
)

func TestBenchShapeOnSim(t *testing.T) {
	dir := t.TempDir()
	out, _ := mustRun(t, "", "--device", "sim:rtx2080ti", "bench", "--shape", "olmoe-1b-7b@q4_k", "--gpu-mem", "2GiB",
		"--tokens", "8", "--host-bw", "20GB", "--timeline", filepath.Join(dir, "t.svg"))
	for _, want := range []string{"SYNTHETIC routing", "after a 128-token prompt", "TTFT ms", "ondemand", "prefetch", "commit", "cpu-miss", "measured/limit"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	for _, p := range []string{"ondemand", "prefetch", "commit", "cpu-miss"} {
		if b, err := os.ReadFile(filepath.Join(dir, "t-"+p+".svg")); err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("timeline of %s: %v", p, err)
		}
	}
	js, _ := mustRun(t, "", "--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--tokens", "4", "--policy", "commit", "--json")
	var rep struct {
		Synthetic bool
		Resident  float64
		Policies  []struct{ Policy string }
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil || !rep.Synthetic || len(rep.Policies) != 1 || rep.Policies[0].Policy != "commit" {
		t.Errorf("--json: %v %+v\n%s", err, rep, js)
	}
	// Beside its weights and cache, the card holds a 256-token pass's activations: for Mixtral
	// about 150 MiB, most of it the experts' gate and up outputs.
	m, err := shapes.Open("mixtral-8x7b", engine.Options{Device: "sim:rtx4090", ContextLength: 512, Offload: &engine.OffloadOptions{GPUMem: 20 << 30},
		TimingOnly: &engine.TimingOnlyOptions{Routing: func(int, int) []int { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	weights := float64(m.Info().NonExpertBytes + m.KVCacheBytes())
	m.Close()
	if act := (rep.Resident - weights) / (1 << 20); act < 100 || act > 200 {
		t.Errorf("resident %.0f MiB, %.0f MiB more than the weights and cache: want the activations, about 150 MiB", rep.Resident/(1<<20), act)
	}
}

func TestBenchModel(t *testing.T) {
	model := needModel(t)
	out, _ := mustRun(t, "", "-m", model, "bench", "--tokens", "4")
	for _, want := range []string{"per-token latency", "time to first token", "tokens/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	// Prompts of a number of token ids, as llama-bench's -p: their prefill rate.
	out, _ = mustRun(t, "", "-m", model, "bench", "--tokens", "4", "--prompt-len", "40")
	if !regexp.MustCompile(`\nprefill [0-9.]+ tokens/s \(40-token prompts\)\n`).MatchString(out) {
		t.Errorf("bench --prompt-len 40 does not give the prefill rate:\n%s", out)
	}
}

func TestBenchModelOnSim(t *testing.T) {
	model := needModel(t)
	dir := t.TempDir()
	out, _ := mustRun(t, "", "-m", model, "--device", "sim:rtx2080ti", "--gpu-mem", "8.5MiB", "--host-bw", "10GB", "--host-flops", "100GFLOPS",
		"bench", "--tokens", "6", "--timeline", filepath.Join(dir, "t.svg"))
	for _, want := range []string{"simulated time", "ondemand", "prefetch", "commit", "cpu-miss", "stall ms/tok", "measured/limit",
		"10.0 GB/s of weights for a token, 100 GFLOP/s for each further token"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
	for _, p := range []string{"ondemand", "prefetch", "commit", "cpu-miss"} {
		if b, err := os.ReadFile(filepath.Join(dir, "t-"+p+".svg")); err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("timeline of %s: %v", p, err)
		}
	}
	// llama.cpp's split joins the policies when --cpu-moe-layers says how.
	out, _ = mustRun(t, "", "-m", model, "--device", "sim:rtx2080ti", "--gpu-mem", "11MiB", "--host-bw", "10GB", "--cpu-moe-layers", "2", "bench", "--tokens", "4")
	if !strings.Contains(out, "  static ") || !strings.Contains(out, "8.00") || !strings.Contains(out, "static-cache") {
		t.Errorf("bench --cpu-moe-layers 2 lacks static's row, 8 experts a token on the host, or static-cache's:\n%s", out)
	}
	out, _ = mustRun(t, "", "-m", model, "--device", "sim:rtx2080ti", "--gpu-mem", "64MiB", "--host-bw", "10GB", "bench", "--timing-only", "--tokens", "6")
	for _, want := range []string{"recorded routing", "recorded while", "commit", "measured/limit"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench --timing-only output lacks %q:\n%s", want, out)
		}
	}
}

// Offloading on the CPU device runs the same pipeline on the wall clock.
func TestBenchModelOffloadedOnCPU(t *testing.T) {
	model := needModel(t)
	js, _ := mustRun(t, "", "-m", model, "--gpu-mem", "3.4MiB", "--policy", "ondemand,prefetch", "bench", "--tokens", "3", "--json")
	var rep struct {
		Simulated bool
		Rows      []struct {
			Policy  string
			Slots   int
			HitRate float64
		}
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil || rep.Simulated || len(rep.Rows) != 2 || rep.Rows[1].Policy != "prefetch" || rep.Rows[0].Slots != 10 {
		t.Errorf("--json: %v %+v\n%s", err, rep, js)
	}
}

func TestBenchBadInput(t *testing.T) {
	model := needModel(t)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--shape", "mixtral-8x7b"}, "--device sim:"},
		{[]string{"--device", "sim:gtx480", "bench", "--shape", "mixtral-8x7b"}, "unknown"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "gpt-9"}, "unknown model shape"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--gpu-mem", "-3GiB"}, "--gpu-mem"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--gpu-mem", "100GiB"}, "exceeds"},
		{[]string{"--device", "sim:rtx2080ti", "bench", "--shape", "mixtral-8x7b", "--gpu-mem", "1GiB"}, "budget is too small"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--policy", "magic"}, "unknown expert policy"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--eviction", "fifo"}, "--eviction"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--trace", "/nonexistent.trace"}, "no such file"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--predictor", "accuracy=7"}, "accuracy"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--skew", "-2"}, "skew"},
		{[]string{"bench", "--policy", "ondemand"}, "--gpu-mem"},
		{[]string{"--device", "sim:rtx4090", "--cpu-moe-layers", "2", "bench"}, "bench: offloading needs a device memory budget (--gpu-mem)"},
		{[]string{"bench", "--prompt-len", "8", "--prompts", "bench_test.go"}, "not both"},
		{[]string{"bench", "--prompt-len", "0"}, "--prompt-len 0: want 1 to"},
		{[]string{"--device", "sim:rtx4090", "bench", "--shape", "mixtral-8x7b", "--prompt-len", "-1"}, "prompt length"},
		{[]string{"bench", "--timeline", "x.svg"}, "--device sim:"},
		{[]string{"bench", "--gpu-mem", "64MiB", "--policy", "commit", "--predictor", "oracle"}, "--timing-only"},
		{[]string{"--device", "sim:rtx4090", "bench", "--trace", "x.trace"}, "timing-only"},
		{[]string{"--device", "sim:rtx4090", "bench", "--timing-only", "--trace", "x.trace"}, "--trace replays"},
		{[]string{"--device", "sim:rtx4090", "bench", "--gpu-mem", "1KiB"}, "at least 8202752 bytes"},
		{[]string{"--device", "sim:rtx2080ti", "bench", "--gpu-mem", "64GiB"}, "exceeds"},
		{[]string{"--device", "sim:nope", "bench"}, "unknown"},
		{[]string{"--device", "tpu:0", "bench"}, "not available"},
		{[]string{"bench", "--tokens", "-1"}, "--tokens"},
		{[]string{"--gpu-mem", "64MiB", "--policy", "ondemand", "--cpu-moe-layers", "2", "bench"}, "pass --policy static or static-cache"},
		{[]string{"--gpu-mem", "64MiB", "--policy", "static", "--cpu-moe-layers", "9", "bench"}, "the model has 4 MoE layers"},
		{[]string{"--gpu-mem", "64MiB", "--policy", "static", "--cpu-moe-layers", "-1", "bench"}, "static with -1 host layers"},
		{[]string{"--device", "sim:rtx2080ti", "--policy", "static", "--cpu-moe-layers", "12", "bench", "--shape", "mixtral-8x7b"}, "static needs 160"},
	}
	for _, c := range cases {
		_, errOut, code := runCLI(t, "", append([]string{"-m", model}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want an error mentioning %q", c.args, code, errOut, c.want)
		}
	}
}

// On a GPU (the fake driver's cuda:0) the stall, the device time and the physical limit are
// measured with CUDA events, so the table prints them rather than dashes.
func TestBenchModelOnFakeGPU(t *testing.T) {
	model := needModel(t)
	lib := fakecuda.ForTests(t)
	prompts := filepath.Join(t.TempDir(), "prompts.txt")
	if err := os.WriteFile(prompts, []byte("Prince Andrew said\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The whole model on the card: a decoded token replays a CUDA graph and reads back its
	// logits alone; with --no-graphs it launches its kernels one by one. The prompt, of a few
	// tokens, is routed on the device too: its logits are its one read-back.
	for _, c := range []struct{ flag, want string }{
		{"--threads=2", "resident, per decoded token: 1.0 host launches (a CUDA graph replayed), 47.0 kernels, 1.0 read-backs, 0.0 writes, 0.0 of them from pageable memory"},
		{"--threads=2", "resident, per prompt: 64.0 host launches, 1.0 read-backs, 0.0 writes, 0.0 of them from pageable memory"},
		{"--no-graphs", "resident, per decoded token: 47.0 host launches (kernels launched one by one), 47.0 kernels, 1.0 read-backs, 0.0 writes, 0.0 of them from pageable memory"},
		// The bundled model's F16 products are float ones, which keep a warp a row: the flag
		// changes no count, and the header says it was given.
		{"--gpu-row-warps=4", "prompts x 3 tokens (after an untimed warm-up prompt) (4 warps a row of the integer decode products)"},
	} {
		out, _ := mustRun(t, "", "-m", model, "--device", "cuda:0", "--cuda-lib", lib, c.flag, "bench", "--tokens", "3", "--prompts", prompts)
		if !strings.Contains(out, c.want) {
			t.Errorf("%s: bench does not say %q:\n%s", c.flag, c.want, out)
		}
	}
	args := []string{"-m", model, "--device", "cuda:0", "--cuda-lib", lib, "--gpu-mem", "10MiB", "--policy", "ondemand,prefetch",
		"bench", "--tokens", "3", "--prompts", prompts}
	out, _ := mustRun(t, "", args...)
	if !strings.Contains(out, "limit = max(device compute, bytes needed / the copy stream's measured bandwidth)") {
		t.Errorf("the header does not say what the limit is on a GPU:\n%s", out)
	}
	var header []string
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		f := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(l), -1) // the table's columns
		if len(f) > 0 && f[0] == "policy" {
			header = f
			continue
		}
		if header == nil || len(f) != len(header) || (f[0] != "ondemand" && f[0] != "prefetch") {
			continue
		}
		rows++
		for i, col := range header {
			switch col {
			case "device ms/tok", "stall ms/tok", "limit ms", "measured/limit":
				if v, err := strconv.ParseFloat(f[i], 64); err != nil || v < 0 {
					t.Errorf("%s: %s is %q, want a figure:\n%s", f[0], col, f[i], out)
				}
			}
		}
	}
	if rows != 2 || !slices.Contains(header, "device ms/tok") {
		t.Errorf("%d rows, header %q:\n%s", rows, header, out)
	}

	js, _ := mustRun(t, "", append(args, "--json")...)
	var rep struct {
		Rows []struct {
			DeviceTimePerToken       float64
			StallPerToken, OverLimit *float64
			LimitPerToken            *float64
		}
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil || len(rep.Rows) != 2 {
		t.Fatalf("--json: %v\n%s", err, js)
	}
	for _, r := range rep.Rows {
		if r.DeviceTimePerToken <= 0 || r.StallPerToken == nil || r.LimitPerToken == nil || r.OverLimit == nil || *r.OverLimit <= 0 {
			t.Errorf("--json row %+v:\n%s", r, js)
		}
	}
}

// bench --kernel-profile accounts for a decoded token's kernels one by one: the launches of
// its profile are those the GPU counted, and it is refused where there is no GPU to profile.
func TestBenchKernelProfile(t *testing.T) {
	model := needModel(t)
	lib := fakecuda.ForTests(t)
	args := []string{"-m", model, "--device", "cuda:0", "--cuda-lib", lib, "bench", "--tokens", "4", "--prompt-len", "6", "--kernel-profile"}
	js, _ := mustRun(t, "", append(args, "--json")...)
	var rep struct {
		Rows []engine.PolicyReport
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil || len(rep.Rows) != 1 {
		t.Fatalf("--json: %v\n%s", err, js)
	}
	r := rep.Rows[0]
	if r.Kernels == nil || r.GPUPerToken == nil {
		t.Fatalf("no kernel profile or GPU counters in %s", js)
	}
	if r.GPUPerToken.Launches != r.GPUPerToken.Kernels {
		t.Errorf("a profiled token replayed a graph: %+v", r.GPUPerToken)
	}
	for _, part := range []struct {
		what   string
		shares []engine.KernelShare
		want   float64
	}{{"decode", r.Kernels.Decode, r.GPUPerToken.Kernels}, {"prefill", r.Kernels.Prefill, -1}} {
		var calls float64
		for i, s := range part.shares {
			if s.Calls <= 0 || s.Seconds < 0 || (i > 0 && s.Seconds > part.shares[i-1].Seconds) {
				t.Errorf("%s: %+v (after %+v)", part.what, s, part.shares[max(i-1, 0)])
			}
			calls += s.Calls
		}
		if len(part.shares) == 0 || part.want >= 0 && calls != part.want {
			t.Errorf("%s: %v calls in %d kernels, want %v", part.what, calls, len(part.shares), part.want)
		}
	}
	out, _ := mustRun(t, "", args...)
	for _, want := range []string{"resident: device time by kernel per prompt pass", "resident: device time by kernel per decoded token", "moe_up_"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench --kernel-profile does not say %q:\n%s", want, out)
		}
	}
	for _, bad := range [][]string{
		{"-m", model, "--device", "cpu", "bench", "--tokens", "3", "--kernel-profile"},
		{"--device", "sim:rtx4090", "bench", "--shape", "olmoe-1b-7b", "--kernel-profile"},
		{"--device", "cuda:0", "bench", "--ep", "2", "--shape", "olmoe-1b-7b", "--kernel-profile"},
	} {
		if _, errOut, code := runCLI(t, "", bad...); code == 0 || !strings.Contains(errOut, "--kernel-profile times a CUDA GPU's kernels") {
			t.Errorf("%v: exit %d, stderr %q", bad, code, errOut)
		}
	}
}

// bench --policy auto runs the placement it predicts fastest beside the others, names it in
// its row and says what it weighed; llama.cpp's split is labelled as such.
func TestBenchAutoOnSim(t *testing.T) {
	out, _ := mustRun(t, "", "--device", "sim:rtx2080ti", "--host", "xeon-e5-2680v4", "--cpu-moe-layers", "10", "bench", "--shape", "olmoe-1b-7b@q4km",
		"--gpu-mem", "2GiB", "--tokens", "8", "--prompt-len", "8", "--policy", "static,static-cache,auto")
	for _, want := range []string{"static 10 ", "static-cache 10 ", "auto: ", "llama.cpp's strategy, -ngl 99 --n-cpu-moe 10", "auto placement: ", "predicted", "host profile xeon-e5-2680v4"} {
		if !strings.Contains(out, want) {
			t.Errorf("bench output lacks %q:\n%s", want, out)
		}
	}
}

// bench warms up with an untimed prompt by default and says so; --warmup-prompt=false runs
// none, and the flag is refused where nothing is computed.
func TestBenchWarmupPrompt(t *testing.T) {
	model := needModel(t)
	const said = "(after an untimed warm-up prompt)"
	args := []string{"-m", model, "--device", "cpu", "--threads", "2", "bench", "--tokens", "3", "--prompt-len", "4"}
	if out, _ := mustRun(t, "", args...); !strings.Contains(out, "prompts x 3 tokens "+said) {
		t.Errorf("bench does not say %q:\n%s", said, out)
	}
	js, _ := mustRun(t, "", append(args, "--warmup-prompt=false", "--json")...)
	var rep struct{ WarmupPrompt *bool }
	if err := json.Unmarshal([]byte(js), &rep); err != nil || rep.WarmupPrompt == nil || *rep.WarmupPrompt {
		t.Errorf("--warmup-prompt=false --json: %v, WarmupPrompt %v\n%s", err, rep.WarmupPrompt, js)
	}
	if _, errOut, code := runCLI(t, "", "--device", "sim:rtx4090", "bench", "--shape", "olmoe-1b-7b", "--warmup-prompt"); code == 0 || !strings.Contains(errOut, "--warmup-prompt applies to runs of -m") {
		t.Errorf("--shape --warmup-prompt: exit %d, stderr %q", code, errOut)
	}
}
