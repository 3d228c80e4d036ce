package device

import (
	"fmt"

	"github.com/commit-run/commit-run/quant"
)

// Fused is implemented by devices that compute some runs of a pass's operations in one kernel
// each (a GPU, where every launch costs a few microseconds of a token that takes a few
// hundred), with the numbers of the unfused operations, to the bit. The engine and the models
// take them where the device has them; HostOps has none, as the CPU gains nothing by them.
type Fused interface {
	// Products computes up to three products of one input x of T rows: for each p whose
	// matrix has data, p.Out = p.W x (MatMul), plus p.Bias on every row when it is not nil
	// (AddRows). (An array, not a slice, so that a call allocates nothing.)
	Products(x []float32, T int, ps [3]Product)
	// AddRMSNorm adds add to x (Add: the residual) and writes the rows of x, d floats each,
	// normalised to dst (RMSNorm with w, b and eps); dst overlaps neither.
	AddRMSNorm(x, add, dst []float32, d int, w, b []float32, eps float32)
	// RopeKV is standard attention's q/k norms, RoPE and cache store for T tokens at
	// positions pos0..: with n, the queries and the keys normalised in place (RMSNorm of n's
	// rows); the queries q (T rows of a.Heads heads of a.DK) rotated in place, and the keys k
	// (a.KVHeads heads of a.DK) rotated and stored with the values v (a.KVHeads*a.DV a
	// token) into c, as Rope of q and of k and then StoreKV would, except that k itself is
	// not rotated.
	RopeKV(q, k, v []float32, c *KVLayer, pos0, T int, a *AttnShape, r *RoPE, n *QKNorm)
}

// QKNorm is the RMSNorm of queries and keys before RoPE (OLMoE's over a token's every head,
// Qwen3's head by head): each row of QDim query floats normalised with QWeight and QBias
// (nil: none), each row of KDim key floats with KWeight and KBias, eps Eps, as RMSNorm does.
type QKNorm struct {
	QDim, KDim     int
	QWeight, QBias []float32
	KWeight, KBias []float32
	Eps            float32
}

// Product is one matrix product of Fused.Products.
type Product struct {
	W    quant.Matrix
	Out  []float32
	Bias []float32 // nil: none
}

// RoutedMoE is implemented by devices that route a MoE layer's tokens and compute its experts
// on their own (a GPU): the host enqueues the routing, the experts and their weighted sum
// without reading the router's logits, and the kernels find each chosen expert's weights in a
// table in device memory (llama.cpp's MUL_MAT_ID). The numbers are the engine's host-routed
// ones to the bit.
type RoutedMoE interface {
	// PrepareMoE readies layer l for MoE, its expert table in device memory included, or
	// says why the device cannot compute it (the engine then routes it on the host).
	PrepareMoE(l *MoELayer) error
	// MoE computes the routed experts (and the shared expert, if any) of T rows of x (d =
	// the experts' input width) into out from the router's logits (T rows of
	// len(l.Experts)): the routing, every chosen expert's SwiGLU, and their sum weighted in
	// top-k order, plus the shared expert's output as the engine's sharedExpert adds it.
	// scratch (device memory, l.ScratchFloats(T) floats) holds the routing first: T*Used
	// expert ids (int32) then their T*Used weights, which the host may read back.
	MoE(l *MoELayer, x, logits []float32, T int, out, scratch []float32)
	// Experts is MoE's experts and their weighted sum for a routing the host chose (the
	// offloader's layers, whose experts it places itself): token t's j-th expert's weights
	// are experts[t*k+j] (device memory; the experts' gates of one type and shape, and their
	// ups and downs likewise) and its mixing weight weights[t*k+j] (host memory, or device
	// memory where the device weighed them: committed routing). out (T
	// rows of the experts' input width) receives the sums in top-k order, as the engine's
	// combine adds them; scratch (device memory) holds T*k times the experts' width floats.
	Experts(x []float32, T, k int, experts []ExpertMatrices, weights []float32, out, scratch []float32)
}

// GroupedMoE is implemented by RoutedMoE devices that also route a prompt's pass on their own
// and compute each chosen expert on its tokens grouped (GroupedExperts's products, llama.cpp's
// MUL_MAT_ID with the ids on the device): the host reads no routing back, where without it a
// prompt's every MoE layer waits for its router's logits to reach the host, which routes and
// groups the tokens while the device idles. The numbers are the host-routed pass's with
// GroupedExperts to the bit.
type GroupedMoE interface {
	// GroupsMoE says whether MoEGrouped takes layer l's pass of T tokens.
	GroupsMoE(l *MoELayer, T int) bool
	// MoEGrouped computes the routed experts of T rows of x into out from the router's
	// logits as MoE does, but not the shared expert, which the caller adds: the routing,
	// each expert's tokens grouped in token order, every chosen expert's gated FFN on its
	// group, and each token's outputs summed weighted in top-k order. scratch (device
	// memory) holds l.GroupedScratchFloats(T) floats, the routing first as MoE's.
	MoEGrouped(l *MoELayer, x, logits []float32, T int, out, scratch []float32)
}

// GroupedScratch lays out MoEGrouped's scratch for T rows of l, each part from a multiple of 4
// floats (16 bytes): the routing's ids and weights (T*Used each), the groups' offsets
// (len(l.Experts)+1), each group's rows and each slot's row (T*Used each), then the experts'
// gate and up outputs (T*Used times their width each) and their down outputs (T*Used times
// their input's width). It returns the parts' sizes in that order and their total.
func (l *MoELayer) GroupedScratch(T int) (parts [8]int, total int) {
	var d, ff int
	if len(l.Experts) > 0 {
		d, ff = l.Experts[0].Gate.Cols, l.Experts[0].Gate.Rows
	}
	n := T * l.Used
	parts = [8]int{n, n, len(l.Experts) + 1, n, n, n * ff, n * ff, n * d}
	for _, p := range parts {
		total += (p + 3) &^ 3
	}
	return parts, total
}

// GroupedScratchFloats is the scratch MoEGrouped needs for T rows (GroupedScratch).
func (l *MoELayer) GroupedScratchFloats(T int) int {
	_, n := l.GroupedScratch(T)
	return n
}

// GroupedExperts is implemented by devices that compute a prompt pass's routed experts a
// product of all of them at a time (a GPU: one launch per product, llama.cpp's MUL_MAT_ID)
// rather than each expert's products one by one.
type GroupedExperts interface {
	// GroupMinTokens is the fewest tokens an expert's group may have in a pass of T
	// tokens: fewer are computed one by one (on a GPU, where MatMulID takes another kernel
	// for them).
	GroupMinTokens(T int) int
	// GroupsExperts says whether ExpertGroups computes experts like e (their types and
	// shapes), so that a caller asks before it gathers their inputs.
	GroupsExperts(e ExpertMatrices) bool
	// ExpertGroups computes expert g's gated FFN (ex[g]: device memory; the experts' gates
	// of one type and shape, their ups and downs likewise, their biases alike and one
	// activation) on rows off[g] .. off[g+1]-1 of x (device memory, the experts' input
	// width each) into the same number of y's rows from row at[g] (device memory). scratch
	// (device memory) holds 2*off[len(ex)] times the experts' width floats. The numbers are
	// MatMulID's, AddRows's and SwiGLU's (or SwiGLUOAI's) one expert at a time, to the bit.
	// It returns false, having done nothing, where the device has no grouped product for
	// the experts' types or they are not alike.
	ExpertGroups(ex []ExpertMatrices, x []float32, off, at []int32, y, scratch []float32) bool
}

// ExpertMatrices are one expert's weights (device memory).
type ExpertMatrices struct {
	Gate, Up, Down quant.Matrix
	// GateBias, UpBias and DownBias (device memory, nil if none) are added to the expert's
	// products (gpt-oss); OAI, when set, replaces its SwiGLU with gpt-oss's activation. The
	// experts of a layer or a call have biases alike and one activation.
	GateBias, UpBias, DownBias []float32
	OAI                        *OAIActivation
}

// OAIActivation is gpt-oss's gated activation in place of SwiGLU, with its constants
// (Ops.SwiGLUOAI).
type OAIActivation struct {
	Alpha, Limit float32
}

// MoELayer is a MoE block as a RoutedMoE computes it.
type MoELayer struct {
	Experts []ExpertMatrices
	Used    int
	Gating  Gating
	// Shared is the shared expert, or nil; SharedGate (device memory), when not nil, weighs
	// it by silu(v)/v with v = SharedGate . x (Qwen2-MoE), or by v's sigmoid with
	// SharedSigmoid (Qwen3.5), as Ops.GatedAdd.
	Shared        *ExpertMatrices
	SharedGate    []float32
	SharedSigmoid bool
	// Table is the device's own state of the layer, made by PrepareMoE.
	Table any
}

// ScratchFloats is the scratch MoE needs for T rows: the routing (ids and weights), each
// chosen expert's SwiGLU output, the shared expert's and its gate.
func (l *MoELayer) ScratchFloats(T int) int {
	ff := 0
	if len(l.Experts) > 0 {
		ff = l.Experts[0].Gate.Rows
	}
	n := 2*T*l.Used + T*l.Used*ff
	if l.Shared != nil {
		n += T*l.Shared.Gate.Rows + T
	}
	return n
}

// Check checks the layer's shapes: the experts' gates of one type and shape, and their ups
// and downs likewise (a stacked tensor each), the shared expert's fitting their input, and a
// top-k of 1 to the experts' number.
func (l *MoELayer) Check() error {
	n := len(l.Experts)
	if n == 0 || l.Used < 1 || l.Used > n {
		return fmt.Errorf("a MoE layer of %d experts, %d used", n, l.Used)
	}
	e0 := l.Experts[0]
	d, ff := e0.Gate.Cols, e0.Gate.Rows
	ok := func(m quant.Matrix, t quant.Type, rows, cols int) bool {
		return m.Type == t && m.Rows == rows && m.Cols == cols && m.Data != nil
	}
	bias := func(b, b0 []float32, n int) bool { return (b == nil) == (b0 == nil) && (b == nil || len(b) == n) }
	for e, x := range l.Experts {
		if !ok(x.Gate, e0.Gate.Type, ff, d) || !ok(x.Up, e0.Up.Type, ff, d) || !ok(x.Down, e0.Down.Type, d, ff) {
			return fmt.Errorf("expert %d's weights (%s %dx%d, %s %dx%d, %s %dx%d) differ from expert 0's in type or shape",
				e, x.Gate.Type, x.Gate.Rows, x.Gate.Cols, x.Up.Type, x.Up.Rows, x.Up.Cols, x.Down.Type, x.Down.Rows, x.Down.Cols)
		}
		if !bias(x.GateBias, e0.GateBias, ff) || !bias(x.UpBias, e0.UpBias, ff) || !bias(x.DownBias, e0.DownBias, d) ||
			(x.OAI == nil) != (e0.OAI == nil) || x.OAI != nil && *x.OAI != *e0.OAI {
			return fmt.Errorf("expert %d's biases (%d, %d, %d floats) or activation differ from expert 0's or its shape",
				e, len(x.GateBias), len(x.UpBias), len(x.DownBias))
		}
	}
	if s := l.Shared; s != nil {
		sff := s.Gate.Rows
		if !ok(s.Gate, s.Gate.Type, sff, d) || !ok(s.Up, s.Up.Type, sff, d) || !ok(s.Down, s.Down.Type, d, sff) {
			return fmt.Errorf("the shared expert's weights do not fit the experts' input of %d", d)
		}
	}
	if l.Gating.Bias != nil && len(l.Gating.Bias) != n {
		return fmt.Errorf("a selection bias of %d for %d experts", len(l.Gating.Bias), n)
	}
	if g := l.Gating; g.Groups > 1 && (n%g.Groups != 0 || n/g.Groups < 2 || g.GroupsUsed < 1 || g.GroupsUsed > g.Groups) {
		return fmt.Errorf("%d experts in %d groups, %d used", n, g.Groups, g.GroupsUsed)
	}
	return nil
}

// Grapher is implemented by devices that capture the work of a decode step once and replay it
// in one launch (a GPU with CUDA graphs): the host then issues one launch a token instead of
// dozens, and the device runs the kernels back to back.
type Grapher interface {
	// BeginStep starts capturing a step of the given tokens at positions pos0..: the work
	// enqueued next, until EndStep, is recorded, not run. Its operations read the token ids
	// and the positions from the step's inputs, which Replay sets anew. An operation the
	// device cannot capture (a read the host waits for, a product on the host, parameters
	// copied from host memory) makes EndStep fail, and leaves the device as it was.
	BeginStep(tokens []int32, pos0 int) error
	// EndStep ends the capture and returns the step; on an error nothing that was enqueued
	// since BeginStep has run, and the caller enqueues it again.
	EndStep() (Step, error)
	// Replay enqueues step s with new tokens (as many as it was captured with) at positions
	// pos0..: the same work, reading the same memory, as when it was captured.
	Replay(s Step, tokens []int32, pos0 int) error
	// ReleaseStep frees a step once the work enqueued so far is done with it.
	ReleaseStep(s Step)
}

// Step is a captured decode step; its concrete type belongs to the device that captured it.
type Step any
