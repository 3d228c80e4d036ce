package shapes_test

import (
	"testing"

	"github.com/commit-run/commit-run/shapes"
)

// Qwen3.6-35B-A3B's public shape, as llama.cpp's qwen35moe files have it (Qwen3.5-35B-A3B's
// architecture): 40 layers of 2048, 16 heads of 256 over 2 KV heads in the full-attention
// layers, every layer routing top-8 over 256 experts of 512 with a shared expert of 512, a
// vocabulary of 248320 and a context of 262144: 34.66B parameters without the vision encoder
// and the multi-token-prediction block, which llama.cpp's files leave out. The published
// Q4_K_M GGUFs are 20-22 GB; synth's Q4_K_M, llama.cpp's preset rule for rule, gives 21.2 GB.
func TestQwen36Shape(t *testing.T) {
	in, err := shapes.Inspect("qwen3.6-35b-a3b@q4km")
	if err != nil {
		t.Fatal(err)
	}
	if in.Architecture != "qwen35moe" || in.Layers != 40 || len(in.MoELayers) != 40 || in.Embedding != 2048 ||
		in.Heads != 16 || in.HeadsKV != 2 || in.Experts != 256 || in.ExpertsUsed != 8 || in.ExpertFFN != 512 ||
		in.SharedExperts != 1 || in.Vocab != 248320 || in.Context != 262144 || in.Gating != "softmax" ||
		!in.ExpertWeightsNorm || in.Activation != "swiglu" || in.NextN != 0 || in.SlidingWindow != 0 {
		t.Errorf("qwen3.6-35b-a3b: %+v", in)
	}
	// Three layers in four gated DeltaNet, 16 key and 32 value heads of 128 behind a
	// convolution of 4, each keeping per sequence 3 inputs of its 8192 convolved channels
	// and a 128x128 state per value head (62.8 MiB in all); every fourth gated attention.
	if in.DeltaNetLayers != 30 || in.GatedAttentionLayers != 10 || in.DeltaNetKHeads != 16 || in.DeltaNetVHeads != 32 ||
		in.DeltaNetHeadDim != 128 || in.DeltaNetConvK != 4 || in.RecurrentStateBytes != 30*(3*8192+32*128*128)*4 {
		t.Errorf("qwen3.6-35b-a3b's hybrid stack: %+v", in)
	}
	if b := float64(in.Parameters) / 1e9; b < 34.6 || b > 34.7 {
		t.Errorf("qwen3.6-35b-a3b: %.2fB parameters, want 34.66B", b)
	}
	if b := float64(in.ExpertParameters) / 1e9; b < 32.2 || b > 32.3 {
		t.Errorf("qwen3.6-35b-a3b: %.2fB expert parameters, want 256*3*2048*512*40 = 32.21B", b)
	}
	if gb := float64(in.ExpertBytes+in.NonExpertBytes) / 1e9; gb < 20 || gb > 22 {
		t.Errorf("qwen3.6-35b-a3b@q4km: %.1f GB of weights, want 20-22", gb)
	}
	// Every row divides into 256-element blocks: no Q5_0/Q8_0 fallbacks, and the DeltaNet
	// convolutions, norms and decays stay F32.
	for typ := range in.TensorTypes {
		switch typ {
		case "Q4_K", "Q5_K", "Q6_K", "F32":
		default:
			t.Errorf("qwen3.6-35b-a3b@q4km has %s tensors: %v", typ, in.TensorTypes)
		}
	}
}
