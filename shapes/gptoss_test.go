package shapes_test

import (
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/shapes"
)

// gpt-oss's public shapes: 64 heads of 64 over 8 KV heads on a width of 2880, a window of 128
// on half the layers, sinks, every layer routing top-4 by the biased router's logits over
// experts of 2880 in MXFP4 with the rest in Q8_0 (F16 for the token embedding). gpt-oss-20b
// has 24 layers of 32 experts, 20.9B parameters; gpt-oss-120b 36 layers of 128 experts,
// 116.8B. The published MXFP4 GGUFs are 12.1 GB and 63.4 GB.
func TestGPTOSSShapes(t *testing.T) {
	for _, c := range []struct {
		shape             string
		layers, experts   int
		params            float64 // billions
		minGB, maxGB      float64
		expertTensorCount int
	}{
		{"gpt-oss-20b@mxfp4", 24, 32, 20.9, 11.5, 13, 3 * 24},
		{"gpt-oss-120b@mxfp4", 36, 128, 116.8, 61, 66, 3 * 36},
	} {
		in, err := shapes.Inspect(c.shape)
		if err != nil {
			t.Fatal(err)
		}
		if in.Architecture != "gpt-oss" || in.Layers != c.layers || len(in.MoELayers) != c.layers || in.Embedding != 2880 ||
			in.Heads != 64 || in.HeadsKV != 8 || in.Experts != c.experts || in.ExpertsUsed != 4 || in.ExpertFFN != 2880 ||
			in.Vocab != 201088 || in.Context != 131072 || in.SlidingWindow != 128 || in.SlidingLayers != c.layers/2 ||
			!in.AttentionSinks || !in.RouterBias || !in.ExpertBiases || in.Activation != "swiglu-oai" {
			t.Errorf("%s: %+v", c.shape, in)
		}
		if b := float64(in.Parameters) / 1e9; b < c.params-0.1 || b > c.params+0.1 {
			t.Errorf("%s: %.2fB parameters, want %.1fB", c.shape, b, c.params)
		}
		if gb := float64(in.ExpertBytes+in.NonExpertBytes) / 1e9; gb < c.minGB || gb > c.maxGB {
			t.Errorf("%s: %.1f GB of weights, want %.1f-%.1f", c.shape, gb, c.minGB, c.maxGB)
		}
		if in.TensorTypes["MXFP4"] != c.expertTensorCount || in.TensorTypeBytes["MXFP4"] != in.ExpertBytes || in.TensorTypes["Q8_0"] == 0 {
			t.Errorf("%s: tensor types %v", c.shape, in.TensorTypes)
		}
	}
}

// TestGPTOSSKVCache: gpt-oss's windowed layers keep a ring (models.RingPeriod: 448 slots,
// twice over on the host's layout, with 4 snapshots beside it on a device) once the context
// is long enough, and every position below that: one sequence's F16 cache on a device is
// then the full-attention half of the layers at every position and 12 (or 18) rings, where
// every layer kept every position before. The figures of issue 37's note.
func TestGPTOSSKVCache(t *testing.T) {
	const perPos = 8 * 64 * 2 * 2 // a layer's keys and values of a position, F16
	const ring = 5 * 2 * 448 * perPos
	for _, c := range []struct {
		shape  string
		layers int
	}{{"gpt-oss-20b@mxfp4", 24}, {"gpt-oss-120b@mxfp4", 36}} {
		for _, ctx := range []int{4096, 32768, 131072} {
			m, err := shapes.Open(c.shape, engine.Options{Device: "sim:h100-pcie", ContextLength: ctx, KVType: "f16",
				Offload:    &engine.OffloadOptions{GPUMem: 60 << 30},
				TimingOnly: &engine.TimingOnlyOptions{Routing: func(int, int) []int { return nil }}})
			if err != nil {
				t.Fatal(err)
			}
			full := int64(c.layers * ctx * perPos)
			want := full
			if 5*2*448 < ctx {
				want = int64(c.layers/2*ctx*perPos + c.layers/2*ring)
			}
			got := m.KVCacheBytes()
			m.Close()
			t.Logf("%s at %d positions: %.1f MiB of KV cache, %.1f MiB keeping every position", c.shape, ctx, float64(got)/(1<<20), float64(full)/(1<<20))
			if got != want {
				t.Errorf("%s at %d positions: %d bytes, want %d", c.shape, ctx, got, want)
			}
		}
	}
}
