package offload

import (
	"fmt"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/quant"
)

// Arch is the public architecture of a target model (DESIGN.md §7), enough to price a decode
// token: the timing-only mode needs no weights.
type Arch struct {
	Layers, Dense   int // blocks; leading dense blocks
	Embd, Vocab     int
	Experts, Used   int
	FFN, DenseFFN   int // routed expert width; the dense blocks' width
	SharedFFN       int // total shared-expert width (0 = none)
	Heads, HeadsKV  int
	HeadDim         int
	MLA             bool // DeepSeek-V2 multi-head latent attention, in its absorbed form
	KVLora, RopeDim int  // MLA
	NopeDim, VDim   int  // MLA per-head sizes
}

// publicShapes are the target models' published hyper-parameters.
var publicShapes = map[string]Arch{
	"mixtral-8x7b":      {Layers: 32, Embd: 4096, Vocab: 32000, Experts: 8, Used: 2, FFN: 14336, Heads: 32, HeadsKV: 8, HeadDim: 128},
	"qwen1.5-moe-a2.7b": {Layers: 24, Embd: 2048, Vocab: 151936, Experts: 60, Used: 4, FFN: 1408, SharedFFN: 5632, Heads: 16, HeadsKV: 16, HeadDim: 128},
	"deepseek-v2-lite": {Layers: 27, Dense: 1, Embd: 2048, Vocab: 102400, Experts: 64, Used: 6, FFN: 1408, DenseFFN: 10944,
		SharedFFN: 2 * 1408, Heads: 16, MLA: true, KVLora: 512, RopeDim: 64, NopeDim: 128, VDim: 128},
	"olmoe-1b-7b":   {Layers: 16, Embd: 2048, Vocab: 50304, Experts: 64, Used: 8, FFN: 1024, Heads: 16, HeadsKV: 16, HeadDim: 128},
	"qwen3-30b-a3b": {Layers: 48, Embd: 2048, Vocab: 151936, Experts: 128, Used: 8, FFN: 768, Heads: 32, HeadsKV: 4, HeadDim: 128},
}

// PublicArch returns the architecture of a named target model; the name may carry a type
// after an "@", which PublicArch ignores.
func PublicArch(name string) (Arch, error) {
	base, _, _ := strings.Cut(name, "@")
	a, ok := publicShapes[base]
	if !ok {
		return Arch{}, fmt.Errorf("unknown model shape %q: known are %s", base, strings.Join(PublicShapes(), ", "))
	}
	return a, nil
}

// PublicShapes lists the names PublicShape knows.
func PublicShapes() []string {
	names := make([]string, 0, len(publicShapes))
	for n := range publicShapes {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// PublicShape prices one decode token of a target model whose weights are all of type t (a
// K-quant file mixes types; a uniform type is the stated approximation), with an F16 KV cache
// filled to ctx positions. The name may carry the type after an "@": "mixtral-8x7b@q4_k".
// Resident counts weights and the cache but not one pass's activation buffers, whose size
// the engine's layout of a pass decides: the engine adds them.
func PublicShape(name string, t quant.Type, ctx int) (*Shape, error) {
	base, typ, ok := strings.Cut(name, "@")
	if ok {
		var err error
		if t, err = typeByName(typ); err != nil {
			return nil, fmt.Errorf("shape %s: %w", name, err)
		}
	}
	a, err := PublicArch(base)
	if err != nil {
		return nil, err
	}
	if !t.Weight() || t.BlockSize() == 0 {
		return nil, fmt.Errorf("shape %s: %v is not a weight type", name, t)
	}
	if ctx < 1 {
		return nil, fmt.Errorf("shape %s: context %d", name, ctx)
	}
	bpw := float64(t.BlockBytes()) / float64(t.BlockSize()) // bytes per weight
	const f32, f16 = 4, 2
	d, c := float64(a.Embd), float64(ctx)

	var attnW, kvRead, attnFLOPs float64
	if a.MLA {
		h := float64(a.Heads)
		attnW = d*h*float64(a.NopeDim+a.RopeDim) + d*float64(a.KVLora+a.RopeDim) +
			float64(a.KVLora)*h*float64(a.NopeDim+a.VDim) + h*float64(a.VDim)*d
		kvRead = c * float64(a.KVLora+a.RopeDim) * f16
		// Absorbed MLA attends in the latent space: scores and values over kv_lora+rope per head.
		attnFLOPs = 2*attnW + 4*h*c*float64(a.KVLora+a.RopeDim)
	} else {
		q, kv := float64(a.Heads*a.HeadDim), float64(a.HeadsKV*a.HeadDim)
		attnW = d*q + 2*d*kv + q*d
		kvRead = 2 * c * kv * f16
		attnFLOPs = 2*attnW + 4*float64(a.Heads*a.HeadDim)*c
	}
	expertW := 3 * d * float64(a.FFN)
	sharedW := 3 * d * float64(a.SharedFFN)
	denseW := 3 * d * float64(a.DenseFFN)
	routerBytes := d * float64(a.Experts) * f32 // routers stay F32
	headW := d * float64(a.Vocab)

	moeLayers := a.Layers - a.Dense
	s := &Shape{
		Name:        base + "@" + strings.ToLower(t.String()),
		DenseLayers: a.Dense, MoELayers: moeLayers, Experts: a.Experts, Used: a.Used, Embd: a.Embd,
		ExpertBytes: expertW * bpw, ExpertFLOPs: 2 * expertW,
		// Norms, projections, rope, attention, residual: about ten launches per block.
		Attn:   Cost{Bytes: attnW*bpw + kvRead, FLOPs: attnFLOPs, Kernels: 10},
		Router: Cost{Bytes: routerBytes, FLOPs: 2 * d * float64(a.Experts), Kernels: 2},
		Shared: Cost{Bytes: sharedW * bpw, FLOPs: 2 * sharedW, Kernels: 3},
		Dense:  Cost{Bytes: denseW * bpw, FLOPs: 2 * denseW, Kernels: 3},
		Head:   Cost{Bytes: headW * bpw, FLOPs: 2 * headW, Kernels: 2},
		// The Commit Router of one layer: a d x experts linear layer in F32.
		Predictor: Cost{Bytes: routerBytes, FLOPs: 2 * d * float64(a.Experts), Kernels: 1},
	}
	kvCache := float64(a.Layers) * kvRead
	s.Resident = float64(a.Layers)*attnW*bpw + float64(moeLayers)*(routerBytes+sharedW*bpw) + float64(a.Dense)*denseW*bpw +
		2*headW*bpw + kvCache
	return s, nil
}

func typeByName(name string) (quant.Type, error) {
	for t := quant.Type(0); t <= quant.BF16; t++ {
		if t.Weight() && strings.EqualFold(t.String(), name) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("unknown weight type %q", name)
}
