package engine_test

import (
	"context"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/synth"
)

// TestQwen35PrefixReuse: a recurrent state cannot be cut back to a shorter prefix, so a
// session resumes a new prompt from its own position or a snapshot at or before the shared
// prefix, else from the start, and gives the numbers of a fresh session in every case; on
// the CPU and on the fake GPU, whose states and snapshots live in device memory.
func TestQwen35PrefixReuse(t *testing.T) {
	gpu := engine.Options{Threads: 2, KVType: "f32", ContextLength: 256, Device: "cuda:0", CUDALibrary: engine.GPUForTests(t)}
	for _, o := range []engine.Options{{Threads: 2, KVType: "f32", ContextLength: 256}, gpu} {
		name := o.Device
		if name == "" {
			name = "cpu"
		}
		t.Run(name, func(t *testing.T) { prefixReuse(t, o) })
	}
}

func prefixReuse(t *testing.T, o engine.Options) {
	path, fx := goldenNamed(t, "qwen35moe-f32")
	m, err := engine.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background()
	gen := func(s *engine.Session, prompt []int32) engine.Result {
		t.Helper()
		res, err := s.Generate(ctx, prompt, engine.GenerateOptions{MaxTokens: 6, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	fresh := func(prompt []int32) []int32 {
		t.Helper()
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return gen(s, prompt).Tokens
	}
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p1 := fx.Prompt
	first := gen(s, p1)
	p2 := slices.Concat(p1, first.Tokens, p1[1:6]) // the next turn: everything so far, and more
	p3 := slices.Concat(p2[:len(p2)-1], []int32{p1[7]})
	p4 := slices.Concat(p1[:9], p1[2:12]) // shares 9 tokens: no snapshot so early
	for _, c := range []struct {
		name   string
		prompt []int32
		cached int
	}{
		// The state is at the end of p1 and its generated tokens but the last (never
		// evaluated), all of which p2 starts with.
		{"next turn", p2, len(p1) + len(first.Tokens) - 1},
		// p3 is p2 but its last token: the snapshot taken before p2's last token.
		{"last token changed", p3, len(p2) - 1},
		{"shared prefix before every snapshot", p4, 0},
		// p4's prompt pass left a snapshot before its last token.
		{"same prompt again", p4, len(p4) - 1},
	} {
		if got := s.Shared(c.prompt); got != c.cached {
			t.Errorf("%s: Shared %d, want %d", c.name, got, c.cached)
		}
		res := gen(s, c.prompt)
		if res.CachedTokens != c.cached {
			t.Errorf("%s: %d tokens reused, want %d", c.name, res.CachedTokens, c.cached)
		}
		if want := fresh(c.prompt); !slices.Equal(res.Tokens, want) {
			t.Errorf("%s: resumed session generates %v, a fresh one %v", c.name, res.Tokens, want)
		}
	}
}

// TestCUDARunsQwen35 runs Qwen3.5-MoE on the fake driver, its DeltaNet layers, their states
// in device memory, beside gated full attention, with the CPU's greedy tokens and its
// probabilities within 2e-3, routed on the device with decode steps as graphs (the states
// moving on at every replay.
func TestCUDARunsQwen35(t *testing.T) {
	path, fx := goldenNamed(t, "qwen35moe-f32")
	base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
	want := runOn(t, path, base, fx.Prompt, 8)
	o := base
	o.Device, o.CUDALibrary = "cuda:0", engine.GPUForTests(t)
	got := runOn(t, path, o, fx.Prompt, 8)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
		t.Errorf("greedy on the GPU %v, on the CPU %v; probabilities %g apart", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
	if !got.resident || got.gpu.HostFallbacks != 0 || got.graphs != "" || got.gpu.GraphLaunches == 0 {
		t.Errorf("%+v, resident %v, graph note %q: want the pass and the routing on the device, decode steps as graphs", got.gpu, got.resident, got.graphs)
	}
	// Offloaded: a layer's experts on the host, or every expert copied in when needed.
	for _, off := range []*engine.OffloadOptions{{Policy: offload.Static, HostLayers: 1, GPUMem: 1 << 30}, {Policy: offload.OnDemand, GPUMem: 1 << 30}} {
		oo := o
		oo.Offload = off
		got := runOn(t, path, oo, fx.Prompt, 6)
		if !slices.Equal(got.tokens, want.tokens[:6]) || maxDiff(got.probs, want.probs) > 2e-3 || got.gpu.HostFallbacks != 0 {
			t.Errorf("%s: greedy on the GPU %v, on the CPU %v; probabilities %g apart; %+v", off.Policy, got.tokens, want.tokens[:6], maxDiff(got.probs, want.probs), got.gpu)
		}
	}
	// A prompt of one token: its pass at position 0 (which starts the states afresh) must
	// not become the graph the later steps replay.
	want, got = runOn(t, path, base, fx.Prompt[:1], 6), runOn(t, path, o, fx.Prompt[:1], 6)
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
		t.Errorf("one-token prompt: greedy on the GPU %v, on the CPU %v; probabilities %g apart", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
}

// TestCUDAQwen35FullAttention runs a Qwen3.5-MoE whose every layer is full attention
// (full_attention_interval 1) on the fake driver: its gated attention output (MulSigmoid) and
// its shared expert's sigmoid gate (in the device's routing kernel), with the CPU's greedy
// tokens and its probabilities within 2e-3, routed on the device, decode steps as graphs. In
// F32: with Q8_0 weights the activations are quantized, and an input that differs from the
// CPU's in its last bit can round one quant the other way (seen at position 7 of this
// prompt: the same experts and weights, then 6e-3 apart after the next layer).
func TestCUDAQwen35FullAttention(t *testing.T) {
	path, prompt := goldenVariant(t, "qwen35moe-f32", func(s *synth.Spec) {
		d := *s.DeltaNet // synth.Bases' own stays as it is
		d.Interval = 1
		s.DeltaNet = &d
	})
	want, got := cpuAndGPU(t, path, prompt, engine.GPUForTests(t))
	if !slices.Equal(got.tokens, want.tokens) || maxDiff(got.probs, want.probs) > 2e-3 {
		t.Errorf("greedy on the GPU %v, on the CPU %v; probabilities %g apart", got.tokens, want.tokens, maxDiff(got.probs, want.probs))
	}
	if !got.resident || got.gpu.HostFallbacks != 0 || got.graphs != "" || got.gpu.GraphLaunches == 0 {
		t.Errorf("%+v, resident %v, graph note %q: want the pass and the routing on the device, decode steps as graphs", got.gpu, got.resident, got.graphs)
	}
}

// TestQwen35StateBudget: where passes run in the GPU's memory, a session's KV cache reserves
// beside each recurrent state the models.MaxSnapshots snapshots that prefix reuse takes there;
// on the CPU, one state.
func TestQwen35StateBudget(t *testing.T) {
	path, _ := goldenNamed(t, "qwen35moe-f32")
	kvBytes := func(o engine.Options) int64 {
		m, err := engine.Open(path, o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		return m.KVCacheBytes()
	}
	cpu64, cpu128 := kvBytes(engine.Options{ContextLength: 64, KVType: "f32"}), kvBytes(engine.Options{ContextLength: 128, KVType: "f32"})
	states := cpu64 - (cpu128 - cpu64) // the full-attention layer's keys and values grow with the context
	gpu64 := kvBytes(engine.Options{ContextLength: 64, KVType: "f32", Device: "cuda:0", CUDALibrary: engine.GPUForTests(t)})
	if states <= 0 || gpu64 != cpu64+models.MaxSnapshots*states {
		t.Errorf("KV cache: %d bytes on the GPU, %d on the CPU of which %d recurrent states: want %d more on the GPU", gpu64, cpu64, states, models.MaxSnapshots*states)
	}
}
