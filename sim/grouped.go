package sim

import (
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// promptTokens is the fewest tokens of a pass that the CUDA engine multiplies on the tensor
// cores (cuda's mmqMinTokens) and whose experts it groups.
const promptTokens = 9

// GroupMinTokens implements device.GroupedExperts as the CUDA engine decides, so that the
// simulated card groups a prompt's experts where the real one would: in a pass of
// promptTokens or more, every expert with a token; in a shorter one (batched decode), none.
func (d *Device) GroupMinTokens(T int) int {
	if T >= promptTokens {
		return 1
	}
	return promptTokens
}

// GroupsExperts implements device.GroupedExperts as the CUDA engine decides: experts whose
// products are integer ones, against an activation quantized to 8 bits (a weight type whose
// dot type is Q8_0, Q8_1 or Q8_K, other than those activation types themselves), rows of
// whole blocks of it.
func (d *Device) GroupsExperts(e device.ExpertMatrices) bool {
	for _, w := range [...]quant.Matrix{e.Gate, e.Up, e.Down} {
		switch dt := w.Type.DotType(); {
		case dt != quant.Q8_0 && dt != quant.Q8_1 && dt != quant.Q8_K, w.Type == quant.Q8_1, w.Type == quant.Q8_K,
			w.Cols%dt.BlockSize() != 0:
			return false
		}
	}
	return true
}

// ExpertGroups implements device.GroupedExperts as the CUDA engine launches it: a kernel per
// product for all the experts (priced by their bytes and multiply-adds together), and the
// activation's. It computes each expert as the engine's one-by-one path does (MatMulID on
// the numerics device, DeviceOptions.Ops's biases and activation), so the numbers are the
// same; timing only, it computes nothing. Without Ops it declines (false).
func (d *Device) ExpertGroups(ex []device.ExpertMatrices, x []float32, off, at []int32, y, scratch []float32) bool {
	if len(ex) == 0 || len(off) != len(ex)+1 || len(at) != len(ex) {
		return len(ex) == 0
	}
	if d.num != nil && d.ops == nil || !d.GroupsExperts(ex[0]) {
		return false
	}
	ff, dm, total := ex[0].Gate.Rows, ex[0].Gate.Cols, int(off[len(ex)])
	var cost [3][2]float64 // bytes and flops of the gates, the ups and the downs
	for z, e := range ex {
		n := int(off[z+1] - off[z])
		if n <= 0 {
			continue // an empty group reads nothing
		}
		for i, w := range [...]quant.Matrix{e.Gate, e.Up, e.Down} {
			b, f := matMulCost(w, n)
			cost[i][0] += b
			cost[i][1] += f
		}
		if d.num == nil {
			continue
		}
		xz := x[int(off[z])*dm:][:n*dm]
		g, u := scratch[int(off[z])*ff:][:n*ff], scratch[(total+int(off[z]))*ff:][:n*ff]
		d.num.MatMulID(e.Gate, xz, n, g)
		d.num.MatMulID(e.Up, xz, n, u)
		addRows(d.ops, g, e.GateBias)
		addRows(d.ops, u, e.UpBias)
		if a := e.OAI; a != nil {
			d.ops.SwiGLUOAI(g, u, ff, a.Alpha, a.Limit)
		} else {
			d.ops.SwiGLU(g, u, ff)
		}
		yz := y[int(at[z])*dm:][:n*dm]
		d.num.MatMulID(e.Down, g, n, yz)
		addRows(d.ops, yz, e.DownBias)
	}
	d.Charge("expert", cost[0][0], cost[0][1])
	d.Charge("expert", cost[1][0], cost[1][1])
	b, f := ActivationCost(total * ff)
	d.Charge("swiglu", b, f)
	d.Charge("expert", cost[2][0], cost[2][1])
	return true
}

func addRows(o device.Ops, x, bias []float32) {
	if bias != nil {
		o.AddRows(x, bias)
	}
}

// ActivationCost is what a gated activation (SwiGLU) of n values reads, writes and computes,
// as the simulated card charges it: the gate and the up read and the product written, 12
// bytes, and 4 flops a value.
func ActivationCost(n int) (bytes, flops float64) {
	return float64(12 * n), float64(4 * n)
}

var _ device.GroupedExperts = (*Device)(nil)
