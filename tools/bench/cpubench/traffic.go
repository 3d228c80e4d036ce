package main

import (
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/models"
)

// traffic is what one decoded token reads from memory, by part, from a GGUF file's tensors and
// metadata. A decoded token cannot be faster than these bytes over the memory's read rate.
type traffic struct {
	Arch        string `json:"arch"`
	Layers      int    `json:"layers"`
	MoELayers   int    `json:"moe_layers"`
	Experts     int    `json:"experts"`
	ExpertsUsed int    `json:"experts_used"`
	// EmbedRow is one row of token_embd: the token's own embedding, all a token reads of it
	// (unless the head is tied to it).
	EmbedRow int64 `json:"embed_row_bytes"`
	// Head is the output projection, output.weight, or all of token_embd when the head is
	// tied to it.
	Head int64 `json:"head_bytes"`
	// Dense is every other weight outside the routed experts: attention, norms, routers,
	// shared experts, dense FFN layers.
	Dense int64 `json:"dense_bytes"`
	// Experts is top-k experts' share of every routed-expert tensor (gate, up and down) of
	// every MoE layer: the k experts a token is routed to, each read once.
	ExpertBytes int64 `json:"expert_bytes"`
	// KVPerPosition is the K and V cache bytes of one position over every layer, in F16.
	KVPerPosition int64 `json:"kv_bytes_per_position"`
}

// weights is every weight byte a token reads, whatever the context length.
func (t traffic) weights() int64 { return t.EmbedRow + t.Head + t.Dense + t.ExpertBytes }

// perToken is the bytes a token reads with positions entries in the KV cache (its own
// included).
func (t traffic) perToken(positions float64) float64 {
	return float64(t.weights()) + float64(t.KVPerPosition)*positions
}

// meanPositions is the mean KV cache length over decode steps after a prompt of prompt
// tokens: step i (from 0) attends over prompt+i+1 positions.
func meanPositions(prompt, steps int) float64 {
	if steps <= 0 {
		return float64(prompt)
	}
	return float64(prompt) + float64(steps+1)/2
}

// f16Bytes is the KV cache element size both engines run with here.
const f16Bytes = 2

// readTraffic opens a GGUF file and computes its traffic.
func readTraffic(path string) (traffic, error) {
	f, err := models.Open(path)
	if err != nil {
		return traffic{}, err
	}
	defer f.Close()
	t, err := trafficOf(f)
	if err != nil {
		return traffic{}, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

func trafficOf(f *models.File) (traffic, error) {
	kv := f.KV
	t := traffic{Arch: f.Architecture(), Layers: int(kv.BlockCount()),
		Experts: int(kv.Uint("expert_count")), ExpertsUsed: int(kv.Uint("expert_used_count"))}
	if t.Layers <= 0 {
		return traffic{}, fmt.Errorf("no block_count in the metadata")
	}
	embd := f.Tensor("token_embd.weight")
	if embd == nil || len(embd.Ne) != 2 {
		return traffic{}, fmt.Errorf("no 2-D token_embd.weight")
	}
	t.EmbedRow = embd.Bytes() / int64(embd.Ne[1])
	if out := f.Tensor("output.weight"); out != nil {
		t.Head = out.Bytes()
	} else {
		t.Head, t.EmbedRow = embd.Bytes(), 0 // tied: the head reads the whole table, the row among it
	}
	moe := map[string]bool{}
	for _, x := range f.Tensors {
		switch {
		case x.Name == "token_embd.weight" || x.Name == "output.weight":
		case strings.Contains(x.Name, "_exps."):
			if t.ExpertsUsed <= 0 {
				return traffic{}, fmt.Errorf("expert tensor %s but no expert_used_count", x.Name)
			}
			n := x.Experts()
			if strings.HasSuffix(x.Name, ".bias") {
				n = x.Ne[len(x.Ne)-1] // gpt-oss's expert biases: {rows, n_expert}
			}
			if n <= 1 || t.ExpertsUsed > n {
				return traffic{}, fmt.Errorf("expert tensor %s holds %d experts, fewer than the %d used", x.Name, n, t.ExpertsUsed)
			}
			t.ExpertBytes += x.Bytes() / int64(n) * int64(t.ExpertsUsed)
			layer, _, _ := strings.Cut(x.Name, ".ffn")
			moe[layer] = true
		default:
			t.Dense += x.Bytes()
		}
	}
	t.MoELayers = len(moe)
	// Recurrent (DeltaNet) layers read and write their F32 state once a token, and cache no
	// keys or values.
	if d := int64(kv.Uint("ssm.state_size")); d > 0 {
		for i := 0; i < t.Layers; i++ {
			if f.Tensor(fmt.Sprintf("blk.%d.ssm_conv1d.weight", i)) != nil {
				t.Dense += 2 * 4 * int64(kv.Uint("ssm.time_step_rank")) * d * d
			}
		}
	}
	perPos, err := kvPerPosition(f)
	if err != nil {
		return traffic{}, err
	}
	t.KVPerPosition = perPos
	return t, nil
}

// kvPerPosition is the F16 K and V bytes one position takes in every layer's cache. MLA
// (DeepSeek-V2 with attention.kv_lora_rank) caches the compressed latent and the RoPE key, as
// llama.cpp does; other attention caches n_kv_heads keys and values per layer.
func kvPerPosition(f *models.File) (int64, error) {
	kv := f.KV
	if rank := kv.Uint("attention.kv_lora_rank"); rank > 0 {
		rope := kv.Uint("rope.dimension_count")
		return int64(kv.BlockCount()) * int64(rank+rope) * f16Bytes, nil
	}
	k, v := kv.EmbeddingHeadCountK(), kv.EmbeddingHeadCountV()
	if k == 0 || v == 0 {
		return 0, fmt.Errorf("no attention head size (embedding_length / head_count)")
	}
	var n int64
	for i, h := range kv.HeadCountKV() {
		if f.Tensor(fmt.Sprintf("blk.%d.ssm_conv1d.weight", i)) != nil {
			continue // a recurrent layer
		}
		n += int64(h) * int64(k+v) * f16Bytes
	}
	return n, nil
}
