package sim

import (
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// NopOps are the Ops of timing-only passes (DeviceOptions.TimingOnly): they compute nothing,
// and their work is priced by the engine's charges, as on a simulated GPU that computes.
type NopOps struct{}

func (NopOps) Embed([]float32, quant.Matrix, []int32)                                    {}
func (NopOps) RMSNorm(_, _ []float32, _ int, _, _ []float32, _ float32)                  {}
func (NopOps) Add(_, _ []float32)                                                        {}
func (NopOps) AddRows(_, _ []float32)                                                    {}
func (NopOps) SwiGLU(_, _ []float32, _ int)                                              {}
func (NopOps) SwiGLUOAI(_, _ []float32, _ int, _, _ float32)                             {}
func (NopOps) RMSNormStrided(_, _ []float32, _, _, _, _ int, _, _ []float32, _ float32)  {}
func (NopOps) Rope([]float32, int, int, int, int, int, *device.RoPE)                     {}
func (NopOps) StoreKV(*device.KVLayer, int, []float32, []float32)                        {}
func (NopOps) Attend(_, _ []float32, _ *device.KVLayer, _, _ int, _ *device.AttnShape)   {}
func (NopOps) MatMulHeads([]quant.Matrix, []float32, int, []float32, *device.HeadLayout) {}
func (NopOps) Copy2D(_, _ []float32, _, _, _, _ int)                                     {}
func (NopOps) Gather(_, _ []float32, _ []int32, _ int)                                   {}
func (NopOps) Combine(_, _ []float32, _ []float32, _ []int32, _ int)                     {}
func (NopOps) GatedAdd(_, _, _, _ []float32, _ int, _ bool)                              {}
func (NopOps) MulSigmoid(_, _ []float32)                                                 {}
func (NopOps) GatedDeltaNet(*device.DeltaNetLayer, *device.DeltaNetState, *device.DeltaNetState, []float32, []float32, []float32, []float32, int, []float32, []float32) {
}
func (NopOps) Zero([]float32)       {}
func (NopOps) Read(_, _ []float32)  {}
func (NopOps) Write(_, _ []float32) {}

var _ device.Ops = NopOps{}
