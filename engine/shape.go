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
	type blockCost struct{ attn, router, shared, dense offload.Cost }
	blocks := make([]blockCost, c.Layers)
	s := &offload.Shape{Name: m.info.Name, Experts: c.Experts, Used: c.ExpertsUsed, Embd: c.Embd}
	expertBytes := make(map[int]float64)
	var nonExpert float64
	for _, t := range m.file.Tensors {
		b, flops := float64(t.Bytes()), 2*float64(t.Elements())
		if len(t.Ne) < 2 {
			flops = float64(t.Elements()) // norms, biases: one op per element
		}
		layer, role, ok := blockRole(t.Name)
		switch {
		case !ok:
			nonExpert += b
			if strings.HasPrefix(t.Name, "output") || (t.Name == "token_embd.weight" && m.arch.Output.Name == t.Name) {
				s.Head.Bytes += b
				s.Head.FLOPs += flops
			}
			continue
		case layer < 0 || layer >= c.Layers:
			return nil, fmt.Errorf("shape: tensor %s outside the %d blocks", t.Name, c.Layers)
		case strings.HasSuffix(role, "_exps"):
			expertBytes[layer] += b / float64(c.Experts)
			s.ExpertFLOPs = max(s.ExpertFLOPs, flops/float64(c.Experts))
			continue
		}
		nonExpert += b
		bc := &blocks[layer]
		switch {
		case role == "ffn_gate_inp":
			bc.router.Bytes += b
			bc.router.FLOPs += flops
		case strings.HasSuffix(role, "_shexp"):
			bc.shared.Bytes += b
			bc.shared.FLOPs += flops
		case role == "ffn_gate" || role == "ffn_up" || role == "ffn_down":
			bc.dense.Bytes += b
			bc.dense.FLOPs += flops
		default: // attention and the norms
			bc.attn.Bytes += b
			bc.attn.FLOPs += flops
		}
	}
	var kvRead, kvResident float64
	var moe, dense int
	for i, l := range m.arch.Layers {
		kd, vd := l.Attn.CacheDims()
		perPos := float64(kd+vd) * 2
		kvResident += perPos * float64(m.nctx)
		read := perPos * float64(ctxFill)
		kvRead += read
		heads := float64(c.Heads[i])
		blocks[i].attn.Bytes += read
		blocks[i].attn.FLOPs += 2 * heads * float64(ctxFill) * float64(kd+vd) / max(1, float64(c.HeadsKV[i]))
		if l.MoE != nil {
			moe++
			s.Attn = addCost(s.Attn, blocks[i].attn)
			s.Router = addCost(s.Router, blocks[i].router)
			s.Shared = addCost(s.Shared, blocks[i].shared)
			s.ExpertBytes = max(s.ExpertBytes, expertBytes[i])
		} else {
			if moe > 0 {
				return nil, fmt.Errorf("shape: dense block %d after MoE blocks is not modelled", i)
			}
			dense++
			s.Dense = addCost(s.Dense, blocks[i].dense)
		}
	}
	s.MoELayers, s.DenseLayers = moe, dense
	scale := func(c offload.Cost, n int) offload.Cost {
		if n == 0 {
			return offload.Cost{}
		}
		return offload.Cost{Bytes: c.Bytes / float64(n), FLOPs: c.FLOPs / float64(n), Kernels: c.Kernels}
	}
	// Launches per block as a fused-free CUDA graph would issue them (norms, projections,
	// rope, attention, residual; router and top-k; a SwiGLU's three products).
	s.Attn, s.Router, s.Shared, s.Dense = scale(s.Attn, moe), scale(s.Router, moe), scale(s.Shared, moe), scale(s.Dense, dense)
	s.Attn.Kernels, s.Router.Kernels, s.Shared.Kernels, s.Dense.Kernels, s.Head.Kernels = 10, 2, 3, 3, 2
	s.Predictor = offload.Cost{Bytes: float64(c.Embd * c.Experts * 4), FLOPs: float64(2 * c.Embd * c.Experts), Kernels: 1}
	s.Resident = nonExpert + kvResident
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
