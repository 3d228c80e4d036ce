package device

// DeltaNetLayer is a gated DeltaNet layer's weights besides its products, as
// Ops.GatedDeltaNet reads them (models.DeltaNet; in device memory on a device with its own).
type DeltaNetLayer struct {
	// Conv holds each channel's ConvK taps, oldest first (channel c's at c*ConvK).
	Conv []float32
	// DtBias and A make a value head's decay from its alpha: g = softplus(alpha + DtBias) * A.
	DtBias, A []float32
	// NormW and NormB (nil if none) are the per-head RMSNorm's before the output gate.
	NormW, NormB []float32
	// KHeads query/key heads and VHeads value heads of HeadDim values; value head h reads
	// key head h % KHeads.
	KHeads, VHeads, HeadDim, ConvK int
	Eps                            float32
}

// Channels is the width of the convolved q/k/v projection: q and k of every key head, then v
// of every value head.
func (l *DeltaNetLayer) Channels() int { return (2*l.KHeads + l.VHeads) * l.HeadDim }

// DeltaNetState is one sequence's state of a DeltaNet layer: the convolution's last ConvK-1
// inputs of each channel (channel c's at c*(ConvK-1), oldest first), and each value head's
// HeadDim x HeadDim matrix, transposed (row j of head h's is column j of its S).
type DeltaNetState struct {
	Conv, S []float32
}
