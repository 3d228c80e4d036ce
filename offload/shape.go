package offload

import (
	"fmt"
	"math"
)

// Cost is what one kernel (or a group of kernels priced together) reads and computes.
type Cost struct {
	Bytes, FLOPs float64
	Kernels      int // launches the group stands for; 0 counts as 1
}

// Shape is the timing model of a model at batch size 1: what every part of one decode token
// costs, without any weights. It describes real models (from a GGUF file's metadata) and
// the public shapes of models no machine here can hold (DESIGN.md §7).
type Shape struct {
	Name        string
	DenseLayers int // leading blocks with a dense FFN instead of experts (DeepSeek-V2)
	MoELayers   int
	Experts     int
	Used        int // top-k
	// Embd is the hidden width: a token's activations are Embd values (expert parallelism
	// sends them between devices).
	Embd int
	// ExpertBytes is one routed expert's weights as stored (the slot size); ExpertFLOPs one
	// token through one expert.
	ExpertBytes float64
	ExpertFLOPs float64
	Attn        Cost // per block: norms, projections, attention over the cache
	Router      Cost // per MoE block
	Shared      Cost // per MoE block: shared experts, zero if none
	Dense       Cost // per dense block: its FFN
	Head        Cost // final norm and output projection
	// Predictor is the Commit Router's cost per MoE block (prefetch and commit run it).
	Predictor Cost
	// Resident is what always stays on the device: non-expert weights, KV cache, buffers.
	Resident float64
}

// Validate checks that the shape can be timed.
func (s *Shape) Validate() error {
	switch {
	case s.MoELayers < 1 || s.DenseLayers < 0:
		return fmt.Errorf("shape %s: %d MoE and %d dense layers", s.Name, s.MoELayers, s.DenseLayers)
	case s.Experts < 1 || s.Used < 1 || s.Used > s.Experts:
		return fmt.Errorf("shape %s: top-%d of %d experts", s.Name, s.Used, s.Experts)
	case !(s.ExpertBytes > 0) || math.IsInf(s.ExpertBytes, 0) || s.ExpertFLOPs < 0 || s.Resident < 0:
		return fmt.Errorf("shape %s: expert bytes %v, flops %v, resident %v", s.Name, s.ExpertBytes, s.ExpertFLOPs, s.Resident)
	}
	return nil
}

// Predictor gives the experts predicted for MoE layer j of token t, made while the previous
// MoE layer runs (for j = 0: the previous token's last layer). truth is what the router will
// choose; a predictor may look at it only to model a given accuracy.
type Predictor interface {
	Predict(t, j int, truth []int) []int
}

// TokenStats are one decode token's figures.
type TokenStats struct {
	Latency float64 // host time from the token's start to its logits
	Stall   float64 // compute-stream time spent waiting for copies (or host results)
	Compute float64 // sum of kernel times: the token's compute if nothing waited
	Moved   float64 // bytes copied to the device
	// Needed is the bytes of the experts the token computed with on the device that were not
	// resident when the token started: what any schedule has to move.
	Needed float64
	// HostRead is the weight bytes of the experts the host computed.
	HostRead float64
	// Limit is the physical limit (DESIGN.md §6): max(Compute, Needed / PCIe bandwidth,
	// HostRead / host memory bandwidth).
	Limit  float64
	Hits   int // experts found resident (or in flight from a prefetch) when needed
	Misses int // experts loaded on demand, or computed on the host by cpu-miss
	OnCPU  int // experts computed on the host
	// Correct counts predicted experts that the router also chose, Predicted the
	// predictions made (prefetch, commit).
	Correct, Predicted int
}
