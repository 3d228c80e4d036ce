package offload

import (
	"fmt"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/quant"
)

// arch is the public architecture of a target model (DESIGN.md §7), enough to price a decode
// token: the timing-only mode needs no weights.
type arch struct {
	layers, dense   int // blocks; leading dense blocks
	embd, vocab     int
	experts, used   int
	ffn, denseFFN   int // routed expert width; the dense blocks' width
	sharedFFN       int // total shared-expert width (0 = none)
	heads, headsKV  int
	headDim         int
	mla             bool // DeepSeek-V2 multi-head latent attention
	kvLora, ropeDim int  // MLA
	nopeDim, vDim   int  // MLA per-head sizes
}

// publicShapes are the target models' published hyper-parameters.
var publicShapes = map[string]arch{
	"mixtral-8x7b":      {layers: 32, embd: 4096, vocab: 32000, experts: 8, used: 2, ffn: 14336, heads: 32, headsKV: 8, headDim: 128},
	"qwen1.5-moe-a2.7b": {layers: 24, embd: 2048, vocab: 151936, experts: 60, used: 4, ffn: 1408, sharedFFN: 5632, heads: 16, headsKV: 16, headDim: 128},
	"deepseek-v2-lite": {layers: 27, dense: 1, embd: 2048, vocab: 102400, experts: 64, used: 6, ffn: 1408, denseFFN: 10944,
		sharedFFN: 2 * 1408, heads: 16, mla: true, kvLora: 512, ropeDim: 64, nopeDim: 128, vDim: 128},
	"olmoe-1b-7b":   {layers: 16, embd: 2048, vocab: 50304, experts: 64, used: 8, ffn: 1024, heads: 16, headsKV: 16, headDim: 128},
	"qwen3-30b-a3b": {layers: 48, embd: 2048, vocab: 151936, experts: 128, used: 8, ffn: 768, heads: 32, headsKV: 4, headDim: 128},
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
func PublicShape(name string, t quant.Type, ctx int) (*Shape, error) {
	base, typ, ok := strings.Cut(name, "@")
	if ok {
		var err error
		if t, err = typeByName(typ); err != nil {
			return nil, fmt.Errorf("shape %s: %w", name, err)
		}
	}
	a, found := publicShapes[base]
	if !found {
		return nil, fmt.Errorf("unknown model shape %q: known are %s", base, strings.Join(PublicShapes(), ", "))
	}
	if !t.Weight() || t.BlockSize() == 0 {
		return nil, fmt.Errorf("shape %s: %v is not a weight type", name, t)
	}
	if ctx < 1 {
		return nil, fmt.Errorf("shape %s: context %d", name, ctx)
	}
	bpw := float64(t.BlockBytes()) / float64(t.BlockSize()) // bytes per weight
	const f32, f16 = 4, 2
	d, c := float64(a.embd), float64(ctx)

	var attnW, kvRead, attnFLOPs float64
	if a.mla {
		h := float64(a.heads)
		attnW = d*h*float64(a.nopeDim+a.ropeDim) + d*float64(a.kvLora+a.ropeDim) +
			float64(a.kvLora)*h*float64(a.nopeDim+a.vDim) + h*float64(a.vDim)*d
		kvRead = c * float64(a.kvLora+a.ropeDim) * f16
		// Absorbed MLA attends in the latent space: scores and values over kv_lora+rope per head.
		attnFLOPs = 2*attnW + 4*h*c*float64(a.kvLora+a.ropeDim)
	} else {
		q, kv := float64(a.heads*a.headDim), float64(a.headsKV*a.headDim)
		attnW = d*q + 2*d*kv + q*d
		kvRead = 2 * c * kv * f16
		attnFLOPs = 2*attnW + 4*float64(a.heads*a.headDim)*c
	}
	expertW := 3 * d * float64(a.ffn)
	sharedW := 3 * d * float64(a.sharedFFN)
	denseW := 3 * d * float64(a.denseFFN)
	routerBytes := d * float64(a.experts) * f32 // routers stay F32
	headW := d * float64(a.vocab)

	moeLayers := a.layers - a.dense
	s := &Shape{
		Name:        base + "@" + strings.ToLower(t.String()),
		DenseLayers: a.dense, MoELayers: moeLayers, Experts: a.experts, Used: a.used, Embd: a.embd,
		ExpertBytes: expertW * bpw, ExpertFLOPs: 2 * expertW,
		// Norms, projections, rope, attention, residual: about ten launches per block.
		Attn:   Cost{Bytes: attnW*bpw + kvRead, FLOPs: attnFLOPs, Kernels: 10},
		Router: Cost{Bytes: routerBytes, FLOPs: 2 * d * float64(a.experts), Kernels: 2},
		Shared: Cost{Bytes: sharedW * bpw, FLOPs: 2 * sharedW, Kernels: 3},
		Dense:  Cost{Bytes: denseW * bpw, FLOPs: 2 * denseW, Kernels: 3},
		Head:   Cost{Bytes: headW * bpw, FLOPs: 2 * headW, Kernels: 2},
		// The Commit Router of one layer: a d x experts linear layer in F32.
		Predictor: Cost{Bytes: routerBytes, FLOPs: 2 * d * float64(a.experts), Kernels: 1},
	}
	kvCache := float64(a.layers) * kvRead
	s.Resident = float64(a.layers)*attnW*bpw + float64(moeLayers)*(routerBytes+sharedW*bpw) + float64(a.dense)*denseW*bpw +
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
