package engine_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/synth"
)

// TestCUDAPrefillMMQ prefills a prompt of more tokens than mmv takes in one pass on cuda:0 of
// the fake driver (or -gpu=system): the batched products (cuda/kernels/mmq.cu) run, and the GPU
// still gives the CPU's greedy tokens and its next-token probabilities within 2e-3, as in
// TestCUDAFakeDriver.
func TestCUDAPrefillMMQ(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, path := range []string{bundledQwen, bundledMixtral} {
		m, err := engine.Open(path, engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		prompt, err := m.Tokenize("The old prince said that he would not go to the war, and Pierre looked at him with a smile.", true)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(prompt) < 17 {
			t.Fatalf("%s: the prompt is %d tokens, want at least 17 (two of mmv's passes)", path, len(prompt))
		}
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
		want := runOn(t, path, base, prompt, 4)
		o := base
		o.Device, o.CUDALibrary = "cuda:0", lib
		got := runOn(t, path, o, prompt, 4)
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%s: greedy on the GPU %v, on the CPU %v", path, got.tokens, want.tokens)
		}
		if d := maxDiff(got.probs, want.probs); d > 2e-3 {
			t.Errorf("%s: probabilities differ from the CPU's by up to %g", path, d)
		}
		if got.gpu.MMQLaunches == 0 || got.gpu.HostFallbacks != 0 {
			t.Errorf("%s: %+v: want the prefill's products on mmq, all on the GPU", path, got.gpu)
		}
	}
}

// TestCUDAPrefillTensorCores prefills 16-token prompts of golden models in the types whose
// prompt products run on the tensor cores (cuda/kernels/mmqi.cu: Q8_0, Q5_1 and Q5_0, IQ4_NL,
// Q4_0 and Q4_1, MXFP4, and the K-quants Q2_K to Q6_K) on cuda:0, and requires the CPU's greedy
// tokens after every prompt and its next-token probabilities within 2e-3 at most positions.
//
// Most, not all: the GPU adds a product's block sums in another order than the CPU, and where
// such a last-bit difference lands next to a rounding boundary of an activation's 8-bit
// quantization, or next to a tie of two experts' router scores, a discrete choice flips and the
// golden models' small random weights amplify it, at that position and, through the KV cache,
// at later ones. Of a model's first five prompts, on today's kernels (mmvq or mmqi alike),
// prompt 1 of olmoe-q5_1 moves by 0.0094 at one position; prompt 4 of gpt-oss-mxfp4 by 0.02,
// from its second position on; qwen3moe-q5km's first prompt by 0.017. A fault in a kernel or in
// the plumbing moves every position of every prompt, so at least half the positions of
// promptsPerModel prompts are held to 2e-3, and every one to what a flip moves, 0.05. The
// kernels themselves are held to the exact products in package cuda. On the fake driver the
// first prompt runs again as on a 2080 Ti (compute capability 7.5: no sm_80 module), which
// must give the same bits: its products are the same integer sums.
func TestCUDAPrefillTensorCores(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, name := range []string{"olmoe-q8_0", "olmoe-q5_1", "olmoe-iq4_nl", "llama-q4_0", "gpt-oss-mxfp4", "qwen2moe-q4km", "mixtral-q2k", "qwen3-q2k", "qwen3moe-q3km", "qwen3moe-q5km"} {
		t.Run(name, func(t *testing.T) {
			spec, err := synth.GoldenSpec(name)
			if err != nil {
				t.Fatal(err)
			}
			path, _ := writeSpec(t, spec, name)
			prompts, err := synth.Prompts(spec, promptsPerModel)
			if err != nil {
				t.Fatal(err)
			}
			var diffs []float64 // every position's, of every prompt
			var first gpuRun    // the first prompt's on the GPU
			for i, prompt := range prompts {
				want, got := cpuAndGPU(t, path, prompt, lib)
				if i == 0 {
					first = got
				}
				if !slices.Equal(got.tokens, want.tokens) {
					t.Errorf("prompt %d: greedy on the GPU %v, on the CPU %v", i, got.tokens, want.tokens)
				}
				if got.gpu.MMQLaunches == 0 || got.gpu.HostFallbacks != 0 {
					t.Errorf("prompt %d: %+v: want the prompt's products on the batched kernels, all on the GPU", i, got.gpu)
				}
				if len(got.probs) != len(want.probs) {
					t.Fatalf("prompt %d: %d positions on the GPU, %d on the CPU", i, len(got.probs), len(want.probs))
				}
				for p := range got.probs {
					diffs = append(diffs, maxDiff(got.probs[p:p+1], want.probs[p:p+1]))
				}
			}
			slices.Sort(diffs)
			med, worst := diffs[len(diffs)/2], diffs[len(diffs)-1]
			t.Logf("the GPU's probabilities differ from the CPU's by a median of %.2g over %d positions, by up to %.2g", med, len(diffs), worst)
			if med > 2e-3 {
				t.Errorf("probabilities differ from the CPU's by more than 2e-3 at half the positions or more (the median: %g)", med)
			}
			if worst > 0.05 {
				t.Errorf("probabilities differ from the CPU's by up to %g, more than a flipped quant or expert moves them", worst)
			}
			if lib == "" {
				return // a card's compute capability is its own
			}
			// The first prompt again as on a 2080 Ti (compute capability 7.5): the base module's
			// mmqi, four m8n8k16 for each m16n8k32, whose integer sums are the same.
			t.Setenv("FAKECUDA_CC", "75")
			sm75 := runOn(t, path, cpuAndGPUOptions(lib), prompts[0], 6)
			if !slices.Equal(sm75.tokens, first.tokens) || len(sm75.probs) != len(first.probs) || maxDiff(sm75.probs, first.probs) != 0 {
				t.Errorf("prompt 0 on compute capability 7.5: greedy %v, probabilities not 8.9's (greedy %v) bit for bit", sm75.tokens, first.tokens)
			}
			if sm75.gpu.MMQLaunches != first.gpu.MMQLaunches {
				t.Errorf("prompt 0: %d batched products on compute capability 7.5, %d on 8.9", sm75.gpu.MMQLaunches, first.gpu.MMQLaunches)
			}
		})
	}
}

// TestCUDAPrefillFlashAttention prefills 100-token prompts over the default F16 cache on the
// fake GPU, where a pass's attention takes the tensor-core kernels (cuda/kernels/flash.cu):
// Qwen3-MoE's heads of 128 on 2 KV heads, gpt-oss's heads of 64 with sinks and a window of 8
// (two blocks of 64 tokens a head, several tiles of positions), the full-attention layer of
// the Qwen3.5/3.6 hybrid (gated heads of 64 beside DeltaNet layers), and DeepSeek-V2-Lite's
// MLA heads in both file layouts (legacy: 192 keys and 128 values a head; absorbed: the latent
// cache of 576). The models' weights are F32, so that the products agree with the CPU's to
// float rounding and the attention's own difference shows: the flash kernel rounds each
// probability to a half before dividing by the sum, where the CPU (and attn_f16kv, to the bit)
// rounds after. Measured at 100 tokens, median and worst difference from the CPU's
// probabilities:
//
//	                     flash               attn_f16kv
//	qwen3moe-f32         8.5e-5   3.9e-4     1e-5     2.7e-4
//	gpt-oss-f32          2.3e-4   2.5e-3     3.4e-5   2.4e-4
//	qwen35moe-f32        7.5e-6   6.7e-5
//	deepseek2-legacy     2.6e-4   1e-3       7.3e-5   6.5e-4
//	deepseek2-mla        2.6e-4   1.1e-2     1.2e-4   1.1e-2
//
// Required: the CPU's greedy tokens, a median within 1e-3 and every position within 1e-2, or
// 2e-2 on the absorbed MLA model, where attn_f16kv too is 1.1e-2 off at one position (its
// per-head products, mla.cu's, add in another order than the CPU's, and the random weights
// amplify it). (At 100 tokens the quantized golden models' random weights turn last-bit
// differences into medians of 7e-3 with either kernel, beyond any bound that would still
// catch a wrong kernel.)
func TestCUDAPrefillFlashAttention(t *testing.T) {
	lib := engine.GPUForTests(t)
	// DeepSeek-V2-Lite's attention (rank 512, rope 64, nope and values 128) on the small golden
	// models: the sizes its flash kernels take.
	v2lite := func(s *synth.Spec) { s.KVLoraRank, s.RopeDim, s.QKNopeDim, s.VHeadDim = 512, 64, 128, 128 }
	for _, c := range []struct {
		name, kernel string
		shape        func(*synth.Spec)
		worst        float64
	}{
		{"qwen3moe-f32", "attn_fa_f16kv_d128", nil, 1e-2}, {"gpt-oss-f32", "attn_fa_f16kv_d64", nil, 1e-2},
		{"qwen35moe-f32", "attn_fa_f16kv_d64", nil, 1e-2},
		{"deepseek2-legacy-f32", "attn_fa_f16kv_d192v128", v2lite, 1e-2}, {"deepseek2-mla-f32", "attn_fa_f16kv_latent576", v2lite, 2e-2},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, err := synth.GoldenSpec(c.name)
			if err != nil {
				t.Fatal(err)
			}
			if c.shape != nil {
				c.shape(&spec)
			}
			path, golden := writeSpec(t, spec, c.name)
			var prompt []int32 // the golden prompt's tokens, shifted by one more each time round
			for i := 0; len(prompt) < 100; i++ {
				prompt = append(prompt, (golden[i%len(golden)]+int32(i/len(golden)))%int32(spec.Vocab))
			}
			base := engine.Options{Threads: 2, ContextLength: 256}
			o := base
			o.Device, o.CUDALibrary, o.ProfileKernels = "cuda:0", lib, true
			want, got := runOn(t, path, base, prompt, 4), runOn(t, path, o, prompt, 4)
			if got.kernels[c.kernel] == 0 {
				t.Fatalf("the prompt's attention did not take %s: %v", c.kernel, got.kernels)
			}
			if !slices.Equal(got.tokens, want.tokens) {
				t.Errorf("greedy on the GPU %v, on the CPU %v", got.tokens, want.tokens)
			}
			var diffs []float64
			for p := range got.probs {
				diffs = append(diffs, maxDiff(got.probs[p:p+1], want.probs[p:p+1]))
			}
			slices.Sort(diffs)
			med, worst := diffs[len(diffs)/2], diffs[len(diffs)-1]
			t.Logf("%s ran %d times; the GPU's probabilities differ from the CPU's by a median of %.2g over %d positions, by up to %.2g",
				c.kernel, got.kernels[c.kernel], med, len(diffs), worst)
			if med > 1e-3 || worst > c.worst {
				t.Errorf("probabilities differ from the CPU's by a median of %g (want at most 1e-3) and up to %g (want at most %g)", med, worst, c.worst)
			}
			if lib == "" {
				return // a card's compute capability is its own
			}
			// A 2080 Ti's (compute capability 7.5): the base module's kernels, one tile of
			// keys and values a block where the sm_80 module's keep two, with two m16n8k8 for
			// each m16n8k16. The emulator adds both in the same order, so bit for bit.
			t.Setenv("FAKECUDA_CC", "75")
			sm75 := runOn(t, path, o, prompt, 4)
			if sm75.kernels[c.kernel] != got.kernels[c.kernel] {
				t.Errorf("compute capability 7.5 ran %s %d times, 8.9 %d", c.kernel, sm75.kernels[c.kernel], got.kernels[c.kernel])
			}
			if !slices.Equal(sm75.tokens, got.tokens) {
				t.Errorf("greedy on compute capability 7.5 %v, on 8.9 %v", sm75.tokens, got.tokens)
			}
			if len(sm75.probs) != len(got.probs) {
				t.Fatalf("%d positions on compute capability 7.5, %d on 8.9", len(sm75.probs), len(got.probs))
			}
			if d := maxDiff(sm75.probs, got.probs); d != 0 {
				t.Errorf("probabilities on compute capability 7.5 differ from 8.9's by up to %g, want bit for bit", d)
			}
		})
	}
}

// promptsPerModel is how many of a golden model's prompts TestCUDAPrefillTensorCores runs.
const promptsPerModel = 3

// TestCUDAGroupedExperts prefills golden models on the fake GPU with prompts whose layers give
// 9 tokens or more to every expert (128 tokens) or to some of them (40 tokens on Qwen3-MoE's
// 16 experts, top 4), gpt-oss's biased experts and clamped activation among them: the experts
// grouped (device.GroupedExperts: mmqi_id, a launch per product for all of them) must give
// the probabilities and greedy tokens of the experts computed one by one in more launches.
// Bit for bit where every expert has 9 tokens or more, which one by one take mmqi too; an
// expert of fewer takes mmvq one by one, whose float sums add in another order, so there
// the probabilities agree to float rounding (1e-5). The device routes and groups a prompt's
// tokens itself (device.GroupedMoE), which must give the host-routed groups' numbers (the
// unfused pass's) bit for bit, with one read-back fewer a MoE layer in each prompt's pass.
func TestCUDAGroupedExperts(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, c := range []struct {
		name string
		n    int
		tol  float64
	}{{"olmoe-q8_0", 128, 0}, {"qwen3moe-q3km", 128, 0}, {"qwen2moe-q4km", 128, 0}, {"qwen3moe-q3km", 40, 1e-5}, {"gpt-oss-mxfp4", 128, 0}} {
		name := c.name
		t.Run(fmt.Sprint(name, "/", c.n), func(t *testing.T) {
			path, spec, golden := goldenWithPrompt(t, name)
			var prompt []int32 // the golden prompt's tokens, shifted by one more each time round
			for i := 0; len(prompt) < c.n; i++ {
				prompt = append(prompt, (golden[i%len(golden)]+int32(i/len(golden)))%int32(spec.Vocab))
			}
			o := engine.Options{Threads: 2, KVType: "f32", ContextLength: 256, Device: "cuda:0", CUDALibrary: lib}
			got := runOn(t, path, o, prompt, 4)
			want := runOn(t, path, engine.UngroupedForTests(o), prompt, 4)
			if !slices.Equal(got.tokens, want.tokens) {
				t.Errorf("greedy %v grouped, %v one by one", got.tokens, want.tokens)
			}
			if d := maxDiff(got.probs, want.probs); d > c.tol {
				t.Errorf("probabilities grouped differ by up to %g from one by one, want at most %g", d, c.tol)
			}
			if got.gpu.Launches >= want.gpu.Launches {
				t.Errorf("%d launches grouped, %d one by one: nothing was grouped", got.gpu.Launches, want.gpu.Launches)
			}
			host := runOn(t, path, engine.UnfusedForTests(o), prompt, 4)
			if !slices.Equal(got.tokens, host.tokens) || len(got.probs) != len(host.probs) || maxDiff(got.probs, host.probs) != 0 {
				t.Errorf("greedy %v routed and grouped on the device, %v on the host; probabilities %g apart, want the same bits",
					got.tokens, host.tokens, maxDiff(got.probs, host.probs))
			}
			// The unfused pass reads every MoE layer's router logits back in the two prompt
			// passes (Probs's, then Generate's) and in the 3 decode steps after the first
			// token; the device-routed run in none of them.
			if moeLayers := int64(spec.Layers - spec.LeadingDense); host.gpu.Reads-got.gpu.Reads != (2+3)*moeLayers {
				t.Errorf("%d read-backs routed on the device, %d on the host: want %d fewer", got.gpu.Reads, host.gpu.Reads, (2+3)*moeLayers)
			}
			t.Logf("%s: %d launches grouped, %d one by one; %d read-backs routed on the device, %d on the host", name, got.gpu.Launches,
				want.gpu.Launches, got.gpu.Reads, host.gpu.Reads)
		})
	}
}

// TestCUDAGroupedExpertsOffloaded prefills a 64-token prompt of Qwen3-MoE (2 MoE layers of 16
// experts) through an offloader, twice, in two sessions: the experts the slots hold when
// their layer comes are grouped, those still to be copied computed one by one as their
// copies land. With slots for every expert the second prompt finds them all there, and takes
// fewer launches; with 8 slots few are there. Under ondemand and static (a layer kept on the
// device), with the host priced too slow to take any miss, the probabilities and greedy
// tokens are those of the same policy computing every expert one by one, to float rounding
// (1e-5: a grouped expert of fewer than 9 tokens takes mmqi where one by one it takes mmvq,
// TestCUDAGroupedExperts). cpu-miss at the default host rates leaves to the host the experts
// that the link's measured speed decides, so its numbers are held to the one-by-one run's
// within the CPU's tolerance, as TestCUDAFakeDriver holds them.
func TestCUDAGroupedExpertsOffloaded(t *testing.T) {
	lib := engine.GPUForTests(t)
	path, spec, golden := goldenWithPrompt(t, "qwen3moe-q3km")
	var prompt []int32
	for i := 0; len(prompt) < 64; i++ {
		prompt = append(prompt, (golden[i%len(golden)]+int32(i/len(golden)))%int32(spec.Vocab))
	}
	o := engine.Options{Threads: 2, KVType: "f32", ContextLength: 256, Device: "cuda:0", CUDALibrary: lib}
	for _, c := range []struct {
		pol       offload.Policy
		slots     int
		slowHost  bool
		fewerRuns bool // the grouped run must take fewer launches
	}{
		{offload.OnDemand, 40, true, true}, {offload.OnDemand, 8, true, false},
		{offload.Static, 8, true, true}, {offload.CPUMiss, 8, false, false},
	} {
		t.Run(fmt.Sprintf("%s/%d-slots/slow-host=%v", c.pol, c.slots, c.slowHost), func(t *testing.T) {
			oo := o
			oo.Offload = &engine.OffloadOptions{Policy: c.pol, Predictor: map[offload.Policy]string{offload.Prefetch: "prev-token"}[c.pol]}
			probe := oo
			probe.Offload = &engine.OffloadOptions{Policy: c.pol, GPUMem: 512 << 20, Predictor: oo.Offload.Predictor}
			pm, err := engine.Open(path, probe)
			if err != nil {
				t.Fatal(err)
			}
			st, _ := pm.Offload()
			pm.Close()
			oo.Offload.GPUMem = st.Resident + int64(c.slots)*st.SlotBytes
			if c.pol == offload.Static {
				oo.Offload.HostLayers = 1 // a layer's 16 experts kept in their slots, besides the spare ones
				oo.Offload.GPUMem += 16 * st.SlotBytes
			}
			if c.slowHost {
				oo.HostRates = engine.HostRates{Bandwidth: 1}
			}
			got := prefillTwice(t, path, oo, prompt)
			want := prefillTwice(t, path, engine.UngroupedForTests(oo), prompt)
			tol := 1e-5
			if !c.slowHost {
				tol = 2e-3
			}
			if !slices.Equal(got.tokens, want.tokens) {
				t.Errorf("greedy %v grouped, %v one by one", got.tokens, want.tokens)
			}
			if d := maxDiff(got.probs, want.probs); d > tol {
				t.Errorf("probabilities grouped differ by up to %g from one by one", d)
			}
			if c.fewerRuns && got.gpu.Launches >= want.gpu.Launches || got.off.BytesCopied == 0 {
				t.Errorf("%d launches grouped, %d one by one, %d bytes copied: want the held experts grouped", got.gpu.Launches, want.gpu.Launches, got.off.BytesCopied)
			}
			t.Logf("%d launches grouped, %d one by one; %d slots, %d hits, %d misses, %d on the host", got.gpu.Launches, want.gpu.Launches, got.off.Slots, got.off.Hits, got.off.Misses, got.off.OnCPU)
		})
	}
}

// prefillTwice computes prompt's probabilities in one session, then again in another, whose
// prefill finds the experts the first left in the slots, and 4 greedy tokens after it.
func prefillTwice(t *testing.T, path string, o engine.Options, prompt []int32) gpuRun {
	t.Helper()
	m, s := openSession(t, path, o)
	defer m.Close()
	ctx := context.Background()
	err := s.Probs(ctx, prompt, func(int, []float32) error { return nil })
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s, err = m.NewSession(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var r gpuRun
	r.probs, r.tokens = probsThenGreedy(t, s, prompt, 4)
	r.gpu, _ = m.GPUStats()
	r.off, _ = m.Offload()
	return r
}

// goldenWithPrompt writes synth's golden model of the given name into a temporary folder and
// returns its path, its spec and its first golden prompt.
func goldenWithPrompt(t *testing.T, name string) (string, synth.Spec, []int32) {
	t.Helper()
	spec, err := synth.GoldenSpec(name)
	if err != nil {
		t.Fatal(err)
	}
	path, prompt := writeSpec(t, spec, name)
	return path, spec, prompt
}

// writeSpec writes spec's model as file.gguf into a temporary folder and returns its path and
// the spec's first golden prompt.
func writeSpec(t *testing.T, spec synth.Spec, file string) (string, []int32) {
	t.Helper()
	path := filepath.Join(t.TempDir(), file+".gguf")
	if _, err := synth.WriteFile(spec, path); err != nil {
		t.Fatal(err)
	}
	prompts, err := synth.Prompts(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	return path, prompts[0]
}

// TestCUDARowWarpsSharedExpert decodes GLM-4.5's shape in Q8_0 (routed experts top-4 and a
// shared expert of the same type, whose down products one moe_down launch joins) with eight
// warps a row of the integer products: a joined block would be 16 warps, more registers than
// an SM holds for some types (cuda's moeDownMaxThreads), so the shared expert takes a launch
// of its own. The run must succeed and give the greedy tokens of a warp a row, its
// probabilities within float rounding of them (the rows' sums add in another order).
func TestCUDARowWarpsSharedExpert(t *testing.T) {
	lib := engine.GPUForTests(t)
	path, _, prompt := goldenWithPrompt(t, "glm4moe-q8_0")
	o := engine.Options{Threads: 2, ContextLength: 64, Device: "cuda:0", CUDALibrary: lib, ProfileKernels: true}
	one := runOn(t, path, o, prompt, 6)
	o.GPURowWarps = 8
	eight := runOn(t, path, o, prompt, 6)
	if !slices.Equal(eight.tokens, one.tokens) {
		t.Errorf("greedy with eight warps a row %v, with one %v", eight.tokens, one.tokens)
	}
	d := maxDiff(eight.probs, one.probs)
	t.Logf("moe_down_q8_0 ran %d times with eight warps a row, %d with one; probabilities differ by up to %.2g",
		eight.kernels["moe_down_q8_0"], one.kernels["moe_down_q8_0"], d)
	if d > 1e-4 {
		t.Errorf("probabilities with eight warps a row differ from one's by up to %g", d)
	}
	if eight.kernels["moe_down_q8_0"] <= one.kernels["moe_down_q8_0"] {
		t.Errorf("moe_down_q8_0 ran %d times with eight warps a row, %d with one: want the shared expert's launches apart",
			eight.kernels["moe_down_q8_0"], one.kernels["moe_down_q8_0"])
	}
}
