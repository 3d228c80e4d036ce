package engine

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/offload"
)

// Shape prices one decode token of the model for the offloading timing model: every tensor's
// bytes and flops sorted into attention, router, shared experts, dense FFN, head and routed
// experts, with the attention reading an F16 KV cache filled to ctxFill positions. Resident is
// what the offloading engine keeps on a GPU: every non-expert weight, a KV cache of the
// model's context length and one pass's activations.
func (m *Model) Shape(ctxFill int) (*offload.Shape, error) {
	if ctxFill < 1 {
		return nil, fmt.Errorf("shape: context fill %d", ctxFill)
	}
	c := m.arch.Config
	if c.Experts == 0 {
		return nil, fmt.Errorf("shape: %s is a dense model; offloading moves experts", m.info.Path)
	}
	s := &offload.Shape{Name: m.info.Name, Experts: c.Experts, Used: c.ExpertsUsed, Embd: c.Embd}
	p, err := m.shapeParts(s)
	if err != nil {
		return nil, err
	}
	kvResident, err := m.shapeBlocks(s, p, ctxFill)
	if err != nil {
		return nil, err
	}
	scale := func(c offload.Cost, n int) offload.Cost {
		if n == 0 {
			return offload.Cost{}
		}
		return offload.Cost{Bytes: c.Bytes / float64(n), FLOPs: c.FLOPs / float64(n), Kernels: c.Kernels}
	}
	// Launches per block as a fused-free CUDA graph would issue them (norms, projections,
	// rope, attention, residual; router and top-k; a SwiGLU's three products).
	s.Attn, s.Router, s.Shared, s.Dense = scale(s.Attn, s.MoELayers), scale(s.Router, s.MoELayers), scale(s.Shared, s.MoELayers), scale(s.Dense, s.DenseLayers)
	s.Attn.Kernels, s.Router.Kernels, s.Shared.Kernels, s.Dense.Kernels, s.Head.Kernels = 10, 2, 3, 3, 2
	s.Predictor = offload.Cost{Bytes: float64(c.Embd * c.Experts * 4), FLOPs: float64(2 * c.Embd * c.Experts), Kernels: 1}
	s.Resident = p.nonExpert + kvResident
	if m.passesOnDevice() {
		// On a GPU one pass's activations live beside them, as the engine reserves them.
		pass, layer := m.gpuActivationFloats()
		s.Resident += 4 * float64(pass+layer)
	}
	if s.Name == "" {
		s.Name = m.info.Architecture
	}
	return s, s.Validate()
}

// shapeParts is the file's tensors sorted into the parts of a block (blocks[i]), one routed
// expert's bytes of each MoE block, and the non-expert bytes in all.
type shapeParts struct {
	blocks      []struct{ attn, router, shared, dense offload.Cost }
	expertBytes map[int]float64
	nonExpert   float64
}

// shapeParts sorts every tensor of the file by its role: the head's go to s, the routed
// experts' (per expert) and each block's parts to the result.
func (m *Model) shapeParts(s *offload.Shape) (shapeParts, error) {
	c := m.arch.Config
	p := shapeParts{expertBytes: map[int]float64{}}
	p.blocks = make([]struct{ attn, router, shared, dense offload.Cost }, c.Layers)
	for _, t := range m.file.Tensors {
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
			if strings.HasPrefix(t.Name, "output") || (t.Name == "token_embd.weight" && m.arch.Output.Name == t.Name) {
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
		cost := offload.Cost{Bytes: b, FLOPs: flops}
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
// the MoE blocks' parts and the leading dense blocks' FFN into s; it returns the bytes of a
// KV cache of the model's context.
func (m *Model) shapeBlocks(s *offload.Shape, p shapeParts, ctxFill int) (kvResident float64, err error) {
	c := m.arch.Config
	for i, l := range m.arch.Layers {
		kd, vd := l.Attn.CacheDims()
		perPos := float64(kd+vd) * 2
		kvResident += perPos * float64(m.nctx)
		read := perPos * float64(ctxFill)
		heads := float64(c.Heads[i])
		b := &p.blocks[i]
		b.attn.Bytes += read
		b.attn.FLOPs += 2 * heads * float64(ctxFill) * float64(kd+vd) / max(1, float64(c.HeadsKV[i]))
		if l.MoE != nil {
			s.MoELayers++
			s.Attn = addCost(s.Attn, b.attn)
			s.Router = addCost(s.Router, b.router)
			s.Shared = addCost(s.Shared, b.shared)
			s.ExpertBytes = max(s.ExpertBytes, p.expertBytes[i])
			continue
		}
		if s.MoELayers > 0 {
			return 0, fmt.Errorf("shape: dense block %d after MoE blocks is not modelled", i)
		}
		s.DenseLayers++
		s.Dense = addCost(s.Dense, b.dense)
	}
	return kvResident, nil
}

func addCost(a, b offload.Cost) offload.Cost {
	return offload.Cost{Bytes: a.Bytes + b.Bytes, FLOPs: a.FLOPs + b.FLOPs}
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
