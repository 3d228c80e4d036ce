package bench_test

import (
	"context"
	"errors"
	"flag"
	"math"
	"testing"

	"github.com/commit-run/commit-run/bench"
	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/internal/fakecuda"
	"github.com/commit-run/commit-run/offload"
)

const (
	tinyModel   = "../models/testdata/tiny.gguf"
	bundledQwen = "../models/testdata/tinymoe-qwen2moe.gguf"
)

var gpuDriver = flag.String("gpu", "fake", "the CUDA driver the GPU tests run on: fake (built from internal/fakecuda) or system")

// gpuForTests returns the CUDA driver library for a test on cuda:0: the fake driver, or with
// -gpu=system the machine's (""). It skips without a C compiler to build the fake.
func gpuForTests(t *testing.T) string {
	t.Helper()
	switch *gpuDriver {
	case "system":
		return ""
	case "fake":
	default:
		t.Fatalf("-gpu=%s: want fake or system", *gpuDriver)
	}
	return fakecuda.ForTests(t)
}

// offloadProbe opens path offloaded with a roomy budget and returns its offloader's figures:
// the resident bytes and an expert slot's.
func offloadProbe(t *testing.T, path string, opts engine.Options) engine.OffloadStats {
	t.Helper()
	o := *opts.Offload
	o.GPUMem = 1 << 30
	opts.Offload = &o
	m, err := engine.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, _ := m.Offload()
	return st
}

// TestAutoPlacementShapes: on shapes that do not fit the card, bench's auto row runs the
// candidate auto predicted fastest; it weighed llama.cpp's split (plain and cached) at the
// fewest host layers that fit; its choice is exact (never commit unless allowed); and it
// decodes no slower than the splits and the exact policies timed beside it.
func TestAutoPlacementShapes(t *testing.T) {
	host, err := engine.LoadHost("i9-10900x")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		shape, device string
		gpuMem        float64
		hostLayers    int
	}{
		{"qwen3-30b-a3b@q4km", "sim:rtx2080", 0, 30},
		{"olmoe-1b-7b@q4km", "sim:rtx2080ti", 2 << 30, 10},
	} {
		rep, err := bench.Sim(bench.SimOptions{Shape: c.shape, Device: c.device, GPUMem: c.gpuMem, Tokens: 32, PromptLen: 16,
			Policies:   []offload.Policy{offload.OnDemand, offload.CPUMiss, offload.Static, offload.StaticCache, offload.Auto},
			HostLayers: c.hostLayers, HostRates: host.Rates(), Predictor: "accuracy=0.8"})
		if err != nil {
			t.Fatalf("%s: %v", c.shape, err)
		}
		auto := rep.Policies[len(rep.Policies)-1]
		plan := auto.Auto
		if plan == nil {
			t.Fatalf("%s: the auto row has no plan", c.shape)
		}
		t.Logf("%s: %s", c.shape, plan.Summary())
		var splits int
		for _, cand := range plan.Candidates {
			if cand.Err == nil && cand.TokensPerSecond > plan.Chosen.TokensPerSecond {
				t.Errorf("%s: chose %s at %.1f tokens/s over %s at %.1f", c.shape, plan.Chosen, plan.Chosen.TokensPerSecond, cand, cand.TokensPerSecond)
			}
			if cand.Offload.Policy == offload.Commit {
				t.Errorf("%s: weighed commit without being allowed to", c.shape)
			}
			if cand.Offload.Policy.Split() {
				splits++
			}
		}
		if splits < 2 {
			t.Errorf("%s: weighed %d placements of llama.cpp's split", c.shape, splits)
		}
		for _, p := range rep.Policies[:len(rep.Policies)-1] {
			if auto.TokensPerSecond < p.TokensPerSecond*0.97 {
				t.Errorf("%s: auto (%s) decodes at %.1f tokens/s, %s at %.1f", c.shape, plan.Chosen, auto.TokensPerSecond, p.Policy, p.TokensPerSecond)
			}
		}
	}
}

// Under a skewed router hot fills the device with each layer's favourites, copying them in
// behind the host: its hit rate climbs above cpu-miss's, whose cache keeps what the prompt
// left, and it decodes faster than llama.cpp's split at the same memory.
func TestHotFollowsPopularity(t *testing.T) {
	host, err := engine.LoadHost("xeon-e5-2680v4")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := bench.Sim(bench.SimOptions{Shape: "mixtral-8x7b@q4km", Device: "sim:rtx2080ti",
		Tokens: 128, PromptLen: 16, Policies: []offload.Policy{offload.CPUMiss, offload.Static, offload.Hot}, HostLayers: 21,
		HostRates: host.Rates(), Synthetic: engine.DefaultSynthetic})
	if err != nil {
		t.Fatal(err)
	}
	miss, static, hot := rep.Policies[0], rep.Policies[1], rep.Policies[2]
	t.Logf("hit rate: cpu-miss %.3f, static %.3f, hot %.3f; tokens/s %.1f, %.1f, %.1f", miss.HitRate, static.HitRate, hot.HitRate,
		miss.TokensPerSecond, static.TokensPerSecond, hot.TokensPerSecond)
	if !(hot.HitRate > miss.HitRate+0.03) || !(hot.MovedPerToken > 0) {
		t.Errorf("hot: hit rate %.3f (cpu-miss %.3f), %.0f bytes moved a token: it did not follow popularity", hot.HitRate, miss.HitRate, hot.MovedPerToken)
	}
	if !(hot.TokensPerSecond > static.TokensPerSecond) {
		t.Errorf("hot %.1f tokens/s, static %.1f", hot.TokensPerSecond, static.TokensPerSecond)
	}
}

// The simulator's one published calibration point (issue 25): llama.cpp's server with
// -ngl 99 --n-cpu-moe 36 decodes Qwen3-30B-A3B-2507 Q4_K_M at 36.7 tokens/s on an RTX 2080
// 8 GB beside an i9-10900X (AlexsJones/llmfit pull request 755). The same split, timed by the
// engine's own scheduler on the rtx2080 and i9-10900x profiles, must stay within 25% of it,
// so that a change to the pricing that breaks the calibration is seen. The figure is
// simulated time, the same on every machine.
func TestCalibrationPoint(t *testing.T) {
	host, err := engine.LoadHost("i9-10900x")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := bench.Sim(bench.SimOptions{Shape: "qwen3-30b-a3b@q4km", Device: "sim:rtx2080", Tokens: 16,
		Policies: []offload.Policy{offload.Static}, HostLayers: 36, HostRates: host.Rates(), Host: host.Name})
	if err != nil {
		t.Fatal(err)
	}
	const published = 36.7
	got := rep.Policies[0].TokensPerSecond
	t.Logf("static, 36 of 48 MoE layers on the host: %.1f tokens/s, published %.1f", got, published)
	if math.Abs(got/published-1) > 0.25 {
		t.Errorf("static decodes at %.1f tokens/s, more than 25%% from the published %.1f", got, published)
	}
}

// TestBenchOnSim decodes the bundled model on a simulated GPU with the experts offloaded and
// checks what the timeline must obey: no token beats its physical limit, a budget of one
// layer's experts stalls on copies where one holding every expert does not, prediction
// accuracy is a share, and cpu-miss with a fast host computes experts there.
func TestBenchOnSim(t *testing.T) {
	info, err := engine.Inspect(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	st := offloadProbe(t, tinyModel, engine.Options{Device: "sim:rtx2080ti", ContextLength: 128, Offload: &engine.OffloadOptions{}})
	run := func(slots int64, hostBW float64) *bench.Report {
		t.Helper()
		rep, err := bench.Run(context.Background(), tinyModel, bench.Options{
			Options:  engine.Options{Device: "sim:rtx2080ti", ContextLength: 128, HostRates: engine.HostRates{Bandwidth: hostBW}},
			Policies: []offload.Policy{offload.OnDemand, offload.Prefetch, offload.CPUMiss},
			GPUMem:   st.Resident + slots*st.SlotBytes, Prompts: []string{"Prince Andrew said", "It was"}, Tokens: 6})
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Simulated || rep.Device != "sim:rtx2080ti" || len(rep.Rows) != 3 {
			t.Fatalf("report %+v", rep)
		}
		return rep
	}
	tight := run(int64(2*info.ExpertsUsed), 1e9)
	roomy := run(int64(info.Experts*len(info.MoELayers)), 1e9)
	for _, rep := range []*bench.Report{tight, roomy} {
		for _, r := range rep.Rows {
			if !(r.OverLimit >= 1-1e-9) || !(r.Mean > 0) || !(r.TTFT > 0) || r.P50 > r.P90 {
				t.Errorf("%s: %+v: a token beat its physical limit, or the figures are not times", r.Policy, r)
			}
		}
	}
	if tight.Rows[0].StallPerToken <= 0 || tight.Rows[0].HitRate >= 1 {
		t.Errorf("ondemand with %d slots: %+v, want stalls and misses", 2*info.ExpertsUsed, tight.Rows[0])
	}
	if roomy.Rows[0].MovedPerToken >= tight.Rows[0].MovedPerToken {
		t.Errorf("every expert resident moved %v bytes per token, one layer's worth %v", roomy.Rows[0].MovedPerToken, tight.Rows[0].MovedPerToken)
	}
	if a := tight.Rows[1].Accuracy; !(a >= 0 && a <= 1) {
		t.Errorf("prefetch accuracy %v", a)
	}
	if tight.Rows[2].OnCPUPerToken != 0 {
		t.Errorf("a 1 GB/s host computed %v experts per token; copying is faster", tight.Rows[2].OnCPUPerToken)
	}
	if fast := run(int64(2*info.ExpertsUsed), 1e12); fast.Rows[2].OnCPUPerToken == 0 {
		t.Errorf("a 1 TB/s host computed no expert")
	}
}

// TestSimBenchModelOracle times the bundled model from its own routing with an oracle standing
// in for the Commit Router: the engine's prefetch and commit then predict every expert right,
// and the policies that predict nothing report no accuracy.
func TestSimBenchModelOracle(t *testing.T) {
	m, err := engine.Open(bundledQwen, engine.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rep, err := bench.Sim(bench.SimOptions{Model: m, Prompts: []string{"The prince said", "Natasha"}, Device: "sim:rtx2080ti",
		GPUMem: 9 << 20, Tokens: 8, Predictor: "oracle", HostRates: engine.HostRates{Bandwidth: 10e9}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Tokens != 14 || len(rep.Policies) != 4 {
		t.Fatalf("%d tokens and %d policies, want 14 and 4", rep.Tokens, len(rep.Policies))
	}
	for _, p := range rep.Policies {
		predicts := p.Policy == "prefetch" || p.Policy == "commit"
		if predicts && p.Accuracy != 1 || !predicts && !math.IsNaN(p.Accuracy) {
			t.Errorf("%s: accuracy %v, want 1 for an oracle's predictions and none without", p.Policy, p.Accuracy)
		}
		if !(p.Mean > 0) || !(p.OverLimit >= 1) {
			t.Errorf("%s: mean %v s, %v x its limit", p.Policy, p.Mean, p.OverLimit)
		}
	}
}

// TestSimBenchShape times public shapes through the engine, timing only: with an oracle,
// prefetch and commit predict every expert, and every policy has a time to first token and a
// latency no better than its limit.
func TestSimBenchShape(t *testing.T) {
	for _, shape := range []string{"olmoe-1b-7b@q4km", "deepseek-v2-lite"} {
		rep, err := bench.Sim(bench.SimOptions{Shape: shape, Device: "sim:rtx2080ti", GPUMem: 3 << 30, Tokens: 4, PromptLen: 8,
			Predictor: "oracle", HostRates: engine.HostRates{Bandwidth: 20e9}})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Tokens != 4 || len(rep.Policies) != 4 || !rep.Synthetic || rep.ExpertBytes <= 0 {
			t.Fatalf("%s: %+v", shape, rep)
		}
		for _, p := range rep.Policies {
			predicts := p.Policy == "prefetch" || p.Policy == "commit"
			if predicts && p.Accuracy != 1 || !predicts && !math.IsNaN(p.Accuracy) {
				t.Errorf("%s %s: accuracy %v, want 1 for an oracle's predictions and none without", shape, p.Policy, p.Accuracy)
			}
			if !(p.TTFT > 0) || !(p.Mean > 0) || !(p.OverLimit >= 1) {
				t.Errorf("%s %s: TTFT %v s, mean %v s, %v x its limit", shape, p.Policy, p.TTFT, p.Mean, p.OverLimit)
			}
		}
	}
}

// TestCUDABench benchmarks offloaded decode on cuda:0 of the fake driver (or -gpu=system): the
// stall, the compute and the physical limit come from the GPU's events and its measured copy
// stream, so they are figures, not the NaN of a device whose only clock is the wall's.
func TestCUDABench(t *testing.T) {
	lib := gpuForTests(t)
	o := engine.Options{Device: "cuda:0", CUDALibrary: lib, Threads: 2, ContextLength: 64}
	probe := o
	probe.Offload = &engine.OffloadOptions{GPUMem: 512 << 20}
	pm, err := engine.Open(tinyModel, probe)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := pm.Offload()
	info := pm.Info()
	pm.Close()
	rep, err := bench.Run(context.Background(), tinyModel, bench.Options{Options: o,
		Policies: []offload.Policy{offload.OnDemand, offload.Prefetch}, Predictor: "prev-token",
		GPUMem: st.Resident + 2*int64(info.ExpertsUsed)*st.SlotBytes, Prompts: []string{"Prince Andrew said"}, Tokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Simulated || rep.Device != "cuda:0" || len(rep.Rows) != 2 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Rows {
		t.Logf("%s: mean %.3g s, device %.3g s, stall %.3g s, limit %.3g s, measured/limit %.3g",
			r.Policy, r.Mean, r.DeviceTimePerToken, r.StallPerToken, r.LimitPerToken, r.OverLimit)
		if !(r.StallPerToken >= 0) || math.IsInf(r.StallPerToken, 0) || !(r.LimitPerToken >= 0) || math.IsInf(r.LimitPerToken, 0) ||
			!(r.OverLimit > 0) || math.IsInf(r.OverLimit, 0) || !(r.DeviceTimePerToken > 0) || r.MovedPerToken == 0 {
			t.Errorf("%s: %+v: want the GPU's stall, limit and device time", r.Policy, r)
		}
		if r.GPU == nil || r.GPU.Marks == 0 || r.GPU.CopyBandwidth() <= 0 || !(r.GPU.StallSeconds >= 0) {
			t.Errorf("%s: GPU %+v", r.Policy, r.GPU)
		}
	}
}

// TestRunAutoFakeGPU: bench --policy auto on a real driver's card (the fake's): its
// candidates run on the card's description.
func TestRunAutoFakeGPU(t *testing.T) {
	lib, err := fakecuda.Build() // the fake's memory is what FAKECUDA_MEM says, even with -gpu=system
	if errors.Is(err, fakecuda.ErrNoCompiler) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKECUDA_MEM", "281018368") // 256 + 12 MiB
	o := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64, Device: "cuda:0", CUDALibrary: lib}
	prompt := []int32{1, 5, 9, 14, 3, 27, 8, 2, 11, 6}
	rep, err := bench.Run(context.Background(), bundledQwen, bench.Options{Options: o, PromptIDs: [][]int32{prompt}, Tokens: 4,
		GPUMem: 10 << 20, Policies: []offload.Policy{offload.Auto}})
	if err != nil || rep.Rows[0].Auto == nil {
		t.Fatalf("bench auto on the fake GPU: %v", err)
	}
	t.Log(rep.Rows[0].Auto.Summary())
}

// TestRunWarmupPrompt: with Options.WarmupPrompt a prompt runs before the timed ones and
// none of its work is in their figures. On the fake GPU the decode steps' counters are the
// same with and without it, while the card launched the warm-up's kernels as well; on a
// simulated card, which has no one-time costs, every timed figure is the same (to the
// rounding of a clock that has run longer).
func TestRunWarmupPrompt(t *testing.T) {
	lib := gpuForTests(t)
	prompts := []string{"Prince Andrew said", "It was"}
	for _, dev := range []string{"cuda:0", "sim:rtx4090"} {
		run := func(warm bool) engine.PolicyReport {
			t.Helper()
			rep, err := bench.Run(context.Background(), tinyModel, bench.Options{
				Options: engine.Options{Device: dev, CUDALibrary: lib, Threads: 2, ContextLength: 64}, Prompts: prompts, Tokens: 4, WarmupPrompt: warm})
			if err != nil {
				t.Fatal(err)
			}
			if rep.WarmupPrompt != warm || rep.Prompts != len(prompts) || len(rep.Rows) != 1 {
				t.Fatalf("%s: report %+v", dev, rep)
			}
			return rep.Rows[0]
		}
		cold, warm := run(false), run(true)
		if dev == "cuda:0" {
			if cold.GPUPerToken == nil || warm.GPUPerToken == nil || *cold.GPUPerToken != *warm.GPUPerToken {
				t.Errorf("a decoded token's counters: %+v without the warm-up, %+v with it", cold.GPUPerToken, warm.GPUPerToken)
			}
			if warm.GPU.Launches <= cold.GPU.Launches || warm.GPU.Kernels <= cold.GPU.Kernels {
				t.Errorf("the card launched %d (%d kernels) with a warm-up prompt, %d (%d) without: no warm-up ran",
					warm.GPU.Launches, warm.GPU.Kernels, cold.GPU.Launches, cold.GPU.Kernels)
			}
			continue
		}
		same := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Abs(b) } // the later clock's rounding
		if !same(warm.TTFT, cold.TTFT) || !same(warm.Mean, cold.Mean) || !same(warm.P90, cold.P90) {
			t.Errorf("%s: TTFT %g, mean %g, p90 %g after a warm-up prompt; %g, %g, %g without", dev, warm.TTFT, warm.Mean, warm.P90, cold.TTFT, cold.Mean, cold.P90)
		}
	}
}
