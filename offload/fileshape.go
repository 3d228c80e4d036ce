package offload

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/models"
)

// FileSource is a model file as FileShape prices it.
type FileSource struct {
	File *models.File
	Arch *models.Model
	// Name and Architecture name the shape (Architecture where the file gives no name); Path
	// names the file in errors.
	Name, Architecture, Path string
	// KVBytes is the size of the KV cache kept resident (the engine's, with its sliding
	// windows' rings and recurrent states); Activations the bytes of one pass's activations
	// kept beside it on the device (0: none, the passes run on the host).
	KVBytes     float64
	Activations float64
}

// FileShape prices one decode token of a model file: every tensor's bytes and flops sorted
// into attention, router, shared experts, dense FFN, head and routed experts, with the
// attention reading an F16 KV cache filled to ctxFill positions (a sliding window's, the
// window at most). Resident is what the offloading engine keeps on a GPU: every non-expert
// weight, its KV cache and one pass's activations.
func FileShape(src FileSource, ctxFill int) (*Shape, error) {
	if ctxFill < 1 {
		return nil, fmt.Errorf("shape: context fill %d", ctxFill)
	}
	c := src.Arch.Config
	if c.Experts == 0 {
		return nil, fmt.Errorf("shape: %s is a dense model; offloading moves experts", src.Path)
	}
	s := &Shape{Name: src.Name, Experts: c.Experts, Used: c.ExpertsUsed, Embd: c.Embd}
	p, err := src.shapeParts(s)
	if err != nil {
		return nil, err
	}
	if err := src.shapeBlocks(s, p, ctxFill); err != nil {
		return nil, err
	}
	scale := func(c Cost, n int) Cost {
		if n == 0 {
			return Cost{}
		}
		return Cost{Bytes: c.Bytes / float64(n), FLOPs: c.FLOPs / float64(n), Kernels: c.Kernels}
	}
	// Launches per block as a fused-free CUDA graph would issue them (norms, projections,
	// rope, attention, residual; router and top-k; a SwiGLU's three products).
	s.Attn, s.Router, s.Shared, s.Dense = scale(s.Attn, s.MoELayers), scale(s.Router, s.MoELayers), scale(s.Shared, s.MoELayers), scale(s.Dense, s.DenseLayers)
	s.Attn.Kernels, s.Router.Kernels, s.Shared.Kernels, s.Dense.Kernels, s.Head.Kernels = 10, 2, 3, 3, 2
	s.Predictor = Cost{Bytes: float64(c.Embd * c.Experts * 4), FLOPs: float64(2 * c.Embd * c.Experts), Kernels: 1}
	s.Resident = p.nonExpert + src.KVBytes
	if src.Activations > 0 {
		// On a GPU one pass's activations live beside them, as the engine reserves them.
		s.Resident += src.Activations
	}
	if s.Name == "" {
		s.Name = src.Architecture
	}
	return s, s.Validate()
}

// shapeParts is the file's tensors sorted into the parts of a block (blocks[i]), one routed
// expert's bytes of each MoE block, and the non-expert bytes in all.
type shapeParts struct {
	blocks      []struct{ attn, router, shared, dense Cost }
	expertBytes map[int]float64
	nonExpert   float64
}

// shapeParts sorts every tensor of the file by its role: the head's go to s, the routed
// experts' (per expert) and each block's parts to the result.
func (src FileSource) shapeParts(s *Shape) (shapeParts, error) {
	c := src.Arch.Config
	p := shapeParts{expertBytes: map[int]float64{}}
	p.blocks = make([]struct{ attn, router, shared, dense Cost }, c.Layers)
	for _, t := range src.File.Tensors {
		if c.Skipped(t.Name) {
			continue // never read: no cost
		}
		b, flops := float64(t.Bytes()), 2*float64(t.Elements())
		if len(t.Ne) < 2 {
			flops = float64(t.Elements()) // norms, biases: one op per element
		}
		layer, role, ok := blockRole(t.Name)
		switch {
		case !ok:
			p.nonExpert += b
			if strings.HasPrefix(t.Name, "output") || (t.Name == "token_embd.weight" && src.Arch.Output.Name == t.Name) {
				s.Head.Bytes += b
				s.Head.FLOPs += flops
			}
			continue
		case layer < 0 || layer >= c.Layers:
			return p, fmt.Errorf("shape: tensor %s outside the %d blocks", t.Name, c.Layers)
		case strings.HasSuffix(role, "_exps"):
			p.expertBytes[layer] += b / float64(c.Experts)
			s.ExpertFLOPs = max(s.ExpertFLOPs, flops/float64(c.Experts))
			continue
		}
		p.nonExpert += b
		bc := &p.blocks[layer]
		cost := Cost{Bytes: b, FLOPs: flops}
		switch {
		case role == "ffn_gate_inp":
			bc.router = addCost(bc.router, cost)
		case strings.HasSuffix(role, "_shexp"):
			bc.shared = addCost(bc.shared, cost)
		case role == "ffn_gate" || role == "ffn_up" || role == "ffn_down":
			bc.dense = addCost(bc.dense, cost)
		default: // attention and the norms
			bc.attn = addCost(bc.attn, cost)
		}
	}
	return p, nil
}

// shapeBlocks adds each block's attention reading the KV cache filled to ctxFill, and sums
// the MoE blocks' parts and the leading dense blocks' FFN into s.
func (src FileSource) shapeBlocks(s *Shape, p shapeParts, ctxFill int) error {
	c := src.Arch.Config
	for i, l := range src.Arch.Layers {
		kd, vd := l.Attn.CacheDims()
		seen := ctxFill
		if w := models.SlidingWindow(l.Attn); w > 0 {
			seen = min(seen, w)
		}
		perPos := float64(kd+vd) * 2
		heads := float64(c.Heads[i])
		b := &p.blocks[i]
		b.attn.Bytes += perPos * float64(seen)
		b.attn.FLOPs += 2 * heads * float64(seen) * float64(kd+vd) / max(1, float64(c.HeadsKV[i]))
		if l.MoE != nil {
			s.MoELayers++
			s.Attn = addCost(s.Attn, b.attn)
			s.Router = addCost(s.Router, b.router)
			s.Shared = addCost(s.Shared, b.shared)
			s.ExpertBytes = max(s.ExpertBytes, p.expertBytes[i])
			continue
		}
		if s.MoELayers > 0 {
			return fmt.Errorf("shape: dense block %d after MoE blocks is not modelled", i)
		}
		s.DenseLayers++
		s.Dense = addCost(s.Dense, b.dense)
	}
	return nil
}

func addCost(a, b Cost) Cost {
	return Cost{Bytes: a.Bytes + b.Bytes, FLOPs: a.FLOPs + b.FLOPs}
}

// blockRole splits "blk.N.role.weight" into N and role.
func blockRole(name string) (int, string, bool) {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return 0, "", false
	}
	num, rest, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", false
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return 0, "", false
	}
	role, _, _ := strings.Cut(rest, ".")
	return n, role, true
}
