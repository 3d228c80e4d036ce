package device

import "github.com/commit-run/commit-run/quant"

// Ops are the kernels of a forward pass besides the matrix products. models.HostOps computes
// them on the host in the CPU reference's arithmetic; a device that implements Ops itself (a
// GPU) computes whole passes in its own memory: the engine then allocates a pass's
// activations, the KV cache and the norm weights on the device (Resident), and the host sees
// only what it reads back with Read: router logits and output logits (and, under commit on
// a Committer, only output logits).
//
// Like Kernels, the methods enqueue work on the compute stream and report no errors: a
// device whose work can fail later implements Faulter. Slices are rows of floats; d is the row
// width where rows matter.
type Ops interface {
	// Embed writes row ids[t] of w, dequantised, to row t of dst.
	Embed(dst []float32, w quant.Matrix, ids []int32)
	// RMSNorm writes each row of x normalised (x / sqrt(mean(x²) + eps)), times w and plus b
	// where they are not nil, to dst (which may be x).
	RMSNorm(dst, x []float32, d int, w, b []float32, eps float32)
	// Add adds src to dst; AddRows adds bias to every row of x.
	Add(dst, src []float32)
	AddRows(x, bias []float32)
	// SwiGLU writes silu(g) * u to g, row by row.
	SwiGLU(g, u []float32, d int)
	// SwiGLUOAI writes gpt-oss's clamped activation of g and u to g, row by row
	// (models.SwiGLUOAI: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u) + 1)).
	SwiGLUOAI(g, u []float32, d int, alpha, limit float32)
	// RMSNormStrided is RMSNorm for rows that are not packed: row r of x is the d floats at
	// x[r*xStride:], normalised to dst[r*dstStride:]; the floats between d and a stride are
	// left alone. (MLA normalises the latent, the first values of each kv_a row, in place.)
	RMSNormStrided(dst, x []float32, rows, d, dstStride, xStride int, w, b []float32, eps float32)
	// Rope rotates, in place, head h of token t, which starts at x[t*tokStride+h*headStride],
	// for T tokens at positions pos0.. and heads heads.
	Rope(x []float32, pos0, T, heads, headStride, tokStride int, r *RoPE)
	// StoreKV writes the keys (rows of c.KDim) and values (rows of c.VDim; nil when the cache
	// has none) of len(k)/c.KDim tokens to the cache at positions pos0...
	StoreKV(c *KVLayer, pos0 int, k, v []float32)
	// Attend writes the causal attention of T queries at positions pos0.. over the cache to
	// out (T rows of Heads*DV).
	Attend(out, q []float32, c *KVLayer, pos0, T int, a *AttnShape)
	// MatMulHeads computes, for each head h < len(w) and each of T tokens t, w[h] times the
	// w[h].Cols floats at x[t*l.XTok+h*l.XHead:] into the w[h].Rows floats at
	// out[t*l.OutTok+h*l.OutHead:], each head as MatMul(w[h]) of its T rows would: MLA's
	// per-head products with k_b and v_b, many small matrices of one type and shape, read in
	// place from (and written into) the rows of all heads.
	MatMulHeads(w []quant.Matrix, x []float32, T int, out []float32, l *HeadLayout)
	// Copy2D copies rows rows of cols floats, row r from src[r*srcStride:] to
	// dst[r*dstStride:]; dst and src do not overlap (a zero srcStride repeats one row).
	Copy2D(dst, src []float32, rows, cols, dstStride, srcStride int)
	// Gather writes row rows[j] of src to row j of dst.
	Gather(dst, src []float32, rows []int32, d int)
	// Combine writes to row t of out the sum over j in [off[t], off[t+1]) of weights[j] times
	// row j of ys, in j order (weights and off are host memory).
	Combine(out, ys []float32, weights []float32, off []int32, d int)
	// GatedAdd adds to row t of out row t of sh times the sigmoid of g = gate · row t of x,
	// as the graphs compute it: ggml_sigmoid's with sigmoid set (Qwen3.5's shared expert),
	// else silu(g)/g (Qwen2-MoE's).
	GatedAdd(out, sh, x, gate []float32, d int, sigmoid bool)
	// MulSigmoid multiplies each value of x by the sigmoid of gate's (ggml_sigmoid, then
	// ggml_mul: Qwen3.5's gated attention output).
	MulSigmoid(x, gate []float32)
	// GatedDeltaNet is a gated DeltaNet layer between its products (models.DeltaNet), token
	// after token as llama.cpp's CPU op: for T rows of the q/k/v projection qkv (rows of
	// l.Channels()), of the gate projection z (rows of VHeads*HeadDim) and of beta and
	// alpha (rows of VHeads), the causal convolution after st's inputs and its SiLU, q and k
	// to unit length, each value head's decayed delta-rule update of st.S and its read-out by
	// q, then each head's RMSNorm times silu(z) into out (rows of VHeads*HeadDim). st moves on
	// by T tokens; snap, when not nil, receives the state after T-1 of them. conv (T rows of
	// l.Channels()) is scratch; z, beta and alpha may be overwritten.
	GatedDeltaNet(l *DeltaNetLayer, st, snap *DeltaNetState, qkv, z, beta, alpha []float32, T int, conv, out []float32)
	// Zero sets x to zeros.
	Zero(x []float32)
	// Read copies device floats to host memory once the work enqueued so far is done; Write
	// copies host floats to the device in stream order.
	Read(dst, src []float32)
	Write(dst, src []float32)
}

// ReadAheader is implemented by Ops whose reads can be enqueued without the host waiting for
// them (a GPU's): ReadAhead copies device floats src to host memory dst in stream order, and
// dst holds them once the host's next Read returns, which waits for both. Two values the
// host needs at one point (a layer's router logits and its input) then cost one wait.
type ReadAheader interface {
	ReadAhead(dst, src []float32)
}

// RoPE is a rotary embedding's parameters as the kernels use them (models.Rope computes them
// from the file's hyper-parameters).
type RoPE struct {
	Dims        int  // rotated values per head
	NeoX        bool // rotate (i, i+Dims/2) instead of (2i, 2i+1)
	ThetaScale  float32
	FreqScale   float32
	ExtFactor   float32 // YaRN's extrapolation mix, 0 = off
	MScale      float32 // magnitude of cos and sin
	CorrLo      float32 // YaRN's correction range (when ExtFactor != 0)
	CorrHi      float32
	FreqFactors []float32 // Dims/2 divisors of the angles, or nil
}

// HeadLayout places the heads' rows of MatMulHeads: token t's input of head h starts at
// x[t*XTok+h*XHead], and its output at out[t*OutTok+h*OutHead] (strides in floats).
type HeadLayout struct {
	XTok, XHead     int
	OutTok, OutHead int
}

// KVLayer is one layer's key/value cache: KDim keys and VDim values per position, in F32
// (K, V) or F16 (K16, V16), len(K)/KDim positions. How they are laid out is the business of
// the Ops that store and attend over them: models.HostOps keeps the keys in a row per
// position and the values transposed, a row of every position per value (value j of
// position p at j*positions+p: llama.cpp's V cache without flash attention, which attention
// reads in order); the CUDA device keeps both in rows per position.
//
// A sliding-window layer's cache can be a ring (Ring > 0) that holds only the positions its
// queries still see: position p lives at slot p%Ring, and the cache has 2*Ring slots, so
// that the host also keeps it at slot p%Ring+Ring and reads any Ring consecutive positions
// as consecutive slots (RingSlot); the CUDA device uses the first Ring slots alone.
type KVLayer struct {
	KDim, VDim int
	F16        bool
	K, V       []float32
	K16, V16   []uint16
	Ring       int
}

// RingSlot returns the slot at which a run of up to Ring positions starting at position
// from is stored in consecutive slots: from itself without a ring.
func (c *KVLayer) RingSlot(from int) int {
	if c.Ring <= 0 {
		return from
	}
	return from % c.Ring
}

// AttnShape is the geometry of one layer's attention over its cache.
type AttnShape struct {
	Heads, KVHeads int
	DK, DV         int // key and value values per head
	// KHeadStride and VHeadStride are the offsets of consecutive KV heads in a cached row.
	KHeadStride, VHeadStride int
	Scale                    float32
	// Latent says that the values are the first DV keys of the key row (MLA's absorbed
	// form): the cache has no values.
	Latent bool
	// Window, when not 0, is a sliding window: a query at position p sees the keys at
	// positions p-Window+1..p only (llama.cpp's standard SWA mask).
	Window int
	// Sinks, when not nil, holds a logit per query head that joins the softmax's
	// denominator but weighs no value (gpt-oss's attention sinks).
	Sinks []float32
}
