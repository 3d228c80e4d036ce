package cuda

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// The GPU's device.Ops: every operation is a kernel launch (or a copy) on the compute stream,
// on slices that stand for device memory (buffers, uploads). The host arrays some take (token
// ids, mixing weights) go through a ring of device memory on the same stream, staged in a
// ring of pinned host memory, so that the copies are asynchronous (from pageable memory the
// driver would stage them itself, holding the host): a copy into the device ring is ordered
// after every kernel enqueued before it, so reusing the ring never overwrites what a pending
// kernel still reads, and the host writes half of the pinned ring again only once the copies
// from it have run (ringHalf). An operation on memory that is not the device's fails the GPU
// (a sticky error the pass reports) instead of touching it.

// Computes implements device.Featured: the attention kernel's sliding windows and sinks, the
// router's and experts' biases and gpt-oss's activation (in the routed MoE kernels, and for
// the engine's host-routed expert path AddRows and SwiGLUOAI), the gated attention output
// (MulSigmoid), the sigmoid shared-expert gate (GatedAdd) and DeltaNet layers
// (GatedDeltaNet).
func (g *GPU) Computes(f device.Feature) bool {
	switch f {
	case device.SlidingWindow, device.AttentionSinks, device.RouterBiases, device.ExpertBiases, device.SwiGLUOAI,
		device.GatedAttnOutput, device.SigmoidSharedGate, device.DeltaNetLayers:
		return true
	}
	return false
}

// paramRing is the bytes of the ring for the host arrays of operations.
const paramRing = 1 << 20

func floatBytes(x []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

func int32Bytes(x []int32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

// opCall is one operation's launches: it collects the device addresses of its operands and
// the first failure, and enqueues under g.mu.
type opCall struct {
	g      *GPU
	name   string
	err    error
	qoff   int64 // the quantized activations' scratch it took (ops_quant.go)
	quants [4]quantized
	nq     int
}

// begin starts operation name; the caller must call end. Operations run one at a time (g.mu),
// so each takes the GPU's own opCall, and an operation allocates nothing.
func (g *GPU) begin(name string) *opCall {
	g.mu.Lock()
	g.op = opCall{g: g, name: name}
	return &g.op
}

func (c *opCall) end() {
	if c.err != nil {
		c.g.failCompute(fmt.Errorf("%s: %w", c.name, c.err))
	}
	c.g.mu.Unlock()
}

// pos returns how a kernel finds position p: eagerly as the int p (posp 0), and in a captured
// decode step as the step's position in device memory plus p's offset from the captured one,
// so that a replay at another position reads its own.
func (c *opCall) pos(p int) (posp DevicePtr, off int) {
	if st := c.g.step; st != nil {
		return st.dev, p - st.pos0
	}
	return 0, p
}

// ptr returns the device address of b, which must be device memory (nil b: a null pointer).
func (c *opCall) ptr(b []byte, what string) DevicePtr {
	if b == nil || c.err != nil {
		return 0
	}
	p, ok := c.g.lookup(b)
	if !ok {
		c.err = fmt.Errorf("%s (%d bytes at %p) is not device memory", what, len(b), unsafe.SliceData(b))
	}
	return p
}

func (c *opCall) f(x []float32, what string) DevicePtr {
	if x == nil {
		return 0
	}
	return c.ptr(floatBytes(x), what)
}

// param copies host bytes b into the ring and returns their device address. A captured step
// cannot take them: its replays would read the ring as it is then.
func (c *opCall) param(b []byte) DevicePtr {
	g := c.g
	if c.err != nil {
		return 0
	}
	if g.step != nil {
		c.err = errCapture("parameters copied from the host")
		return 0
	}
	const half = paramRing / 2
	n := int64(len(b)+255) &^ 255
	if n > half {
		c.err = fmt.Errorf("%d bytes of parameters, over the ring's half of %d", len(b), half)
		return 0
	}
	if g.ring == 0 {
		if c.err = g.newRing(); c.err != nil {
			return 0
		}
	}
	start := g.ringOff
	if start/half != (start+n-1)/half || start+n > paramRing { // to the start of the next half
		start = 0
		if g.ringOff < half {
			start = half
		}
	}
	if h := int(start / half); h != g.ringHalf {
		c.err = g.enterHalf(h)
	}
	g.ringOff = start + n
	p := g.ring.Add(start)
	if len(b) > 0 && c.err == nil {
		staged := g.ringHost.Bytes[start : start+int64(len(b))]
		copy(staged, b)
		c.err = g.compute.CopyHtoD(p, staged)
	}
	return p
}

// newRing allocates the parameter ring, its pinned staging and the events of its halves.
// The caller holds g.mu.
func (g *GPU) newRing() error {
	host, err := g.ctx.HostAlloc(paramRing)
	if err != nil {
		return err
	}
	var evs [2]*Event
	for i := range evs {
		if evs[i], err = g.ctx.NewEvent(false); err != nil {
			host.Free()
			for _, ev := range evs[:i] {
				ev.Destroy()
			}
			return err
		}
	}
	p, err := g.ctx.Alloc(paramRing)
	if err != nil {
		host.Free()
		evs[0].Destroy()
		evs[1].Destroy()
		return err
	}
	g.ring, g.ringHost, g.ringEv, g.ringOff, g.ringHalf, g.ringUsed = p, host, evs, 0, 0, [2]bool{}
	return nil
}

// enterHalf moves the ring's writes to half h: it marks the copies from the half it leaves
// with that half's event, and waits for h's copies of its last turn.
func (g *GPU) enterHalf(h int) error {
	if err := g.ringEv[g.ringHalf].Record(g.compute); err != nil {
		return err
	}
	g.ringUsed[g.ringHalf] = true
	g.ringHalf = h
	if g.ringUsed[h] {
		return g.ringEv[h].Synchronize()
	}
	return nil
}

// launch runs kernel name with the arguments in g.args.
func (c *opCall) launch(name string, grid, block Dim3) {
	g := c.g
	if c.err != nil {
		return
	}
	if n, most := block.X*block.Y*block.Z, maxBlockThreads(name); n > most {
		c.err = fmt.Errorf("%s: a block of %d threads, more than the %d its registers are known to fit", name, n, most)
		return
	}
	var fn *Function
	if fn, c.err = g.function(name); c.err != nil {
		return
	}
	if c.err = g.launch(fn, grid, block, &g.args); c.err == nil {
		g.launched(false)
	}
}

// maxBlockThreads is the largest block a kernel may be launched with: 256, whose registers always
// fit an SM's 65536 (a kernel takes at most 255 a thread), or moe_down's larger blocks
// (moeDownMaxThreads), rope_kv_f32's 1024 (ropeKVThreads) and moe_group_ids's 512
// (moeGroupThreads), whose registers TestPTXAssembles checks. A card refuses a launch whose
// block's registers do not fit (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES), and the JIT decides them,
// so neither the fake driver nor a test of the launches alone would see it.
func maxBlockThreads(kernel string) int {
	switch {
	case strings.HasPrefix(kernel, "moe_down_"):
		return moeDownMaxThreads
	case kernel == "rope_kv_f32":
		return ropeKVThreads
	case kernel == "moe_group_ids":
		return moeGroupThreads
	}
	return 256
}

func blocks(n, per int) int { return max((n+per-1)/per, 1) }

// elementwise grid: a grid-stride loop, so the grid can be capped.
func ewGrid(n int) Dim3 { return Dim3{X: min(blocks(n, 256), 4096)} }

// Embed implements device.Ops.
func (g *GPU) Embed(dst []float32, w quant.Matrix, ids []int32) {
	c := g.begin("embedding")
	defer c.end()
	name, ok := mmvKernels[w.Type]
	if !ok {
		c.err = fmt.Errorf("no kernel for %s rows", w.Type)
		return
	}
	wp, d := c.ptr(w.Data, "the embedding"), c.f(dst, "the activations")
	var idp DevicePtr
	if st := g.step; st != nil {
		if len(ids) != st.ntok {
			c.err = fmt.Errorf("%d tokens in a step captured with %d", len(ids), st.ntok)
		}
		idp = st.dev.Add(4) // the step's tokens, after its position
	} else {
		idp = c.param(int32Bytes(ids))
	}
	g.args.Reset().Ptr(wp).Ptr(idp).Ptr(d).Int(w.Cols).Int(len(ids))
	c.launch("get_rows_"+strings.TrimPrefix(name, "mmv_"), Dim3{X: len(ids), Y: blocks(w.Cols, 32*256)}, Dim3{X: 256})
}

// RMSNorm implements device.Ops.
func (g *GPU) RMSNorm(dst, x []float32, d int, w, b []float32, eps float32) {
	c := g.begin("RMSNorm")
	defer c.end()
	dp, xp := c.f(dst, "the output"), c.f(x, "the input")
	wp, bp := c.f(w, "the norm's weight"), c.f(b, "the norm's bias")
	g.args.Reset().Ptr(dp).Ptr(xp).Ptr(wp).Ptr(bp).Int(d).Float(eps)
	c.launch("rms_norm_f32", Dim3{X: len(x) / d}, Dim3{X: 256})
}

// Add implements device.Ops.
func (g *GPU) Add(dst, src []float32) {
	c := g.begin("add")
	defer c.end()
	g.args.Reset().Ptr(c.f(dst, "the sum")).Ptr(c.f(src, "the addend")).Int(len(dst))
	c.launch("add_f32", ewGrid(len(dst)), Dim3{X: 256})
}

// AddRows implements device.Ops.
func (g *GPU) AddRows(x, bias []float32) {
	c := g.begin("bias")
	defer c.end()
	g.args.Reset().Ptr(c.f(x, "the activations")).Ptr(c.f(bias, "the bias")).Int(len(x)).Int(len(bias))
	c.launch("add_rows_f32", ewGrid(len(x)), Dim3{X: 256})
}

// SwiGLU implements device.Ops. The kernel is the CPU's arithmetic on rows of a multiple of
// 16 values, as every feed-forward width is.
func (g *GPU) SwiGLU(gate, u []float32, d int) {
	c := g.begin("SwiGLU")
	defer c.end()
	g.args.Reset().Ptr(c.f(gate, "the gate")).Ptr(c.f(u, "the up projection")).Int(len(gate))
	c.launch("swiglu_f32", ewGrid(len(gate)), Dim3{X: 256})
}

// SwiGLUOAI implements device.Ops: models.SwiGLUOAI's arithmetic, to the bit.
func (g *GPU) SwiGLUOAI(gate, u []float32, d int, alpha, limit float32) {
	c := g.begin("SwiGLU-OAI")
	defer c.end()
	g.args.Reset().Ptr(c.f(gate, "the gate")).Ptr(c.f(u, "the up projection")).Int(len(gate)).Float(alpha).Float(limit)
	c.launch("swiglu_oai_f32", ewGrid(len(gate)), Dim3{X: 256})
}

// Rope implements device.Ops.
func (g *GPU) Rope(x []float32, pos0, T, heads, headStride, tokStride int, r *device.RoPE) {
	c := g.begin("RoPE")
	defer c.end()
	xp, ff := c.f(x, "the activations"), c.f(r.FreqFactors, "the frequency factors")
	posp, off := c.pos(pos0)
	neox := b2i(r.NeoX)
	g.args.Reset().Ptr(xp).Ptr(posp).Int(off).Int(T).Int(heads).Int(headStride).Int(tokStride).Int(r.Dims).Int(neox).
		Float(r.ThetaScale).Float(r.FreqScale).Float(r.ExtFactor).Float(r.MScale).Float(r.CorrLo).Float(r.CorrHi).Ptr(ff)
	c.launch("rope_f32", Dim3{X: T}, Dim3{X: min(max((r.Dims/2+31)&^31, 32), 256)}) // the threads loop over the pairs
}

// StoreKV implements device.Ops.
func (g *GPU) StoreKV(kv *device.KVLayer, pos0 int, k, v []float32) {
	c := g.begin("KV store")
	defer c.end()
	posp, off := c.pos(pos0)
	store := func(src []float32, dim int, d32 []float32, d16 []uint16, what string) {
		n := len(src)
		if dim <= 0 || n%dim != 0 || !kvFits(kv, pos0, n/dim, max(len(d32), len(d16))/dim) {
			if c.err == nil {
				c.err = fmt.Errorf("%d %s of %d at position %d: the cache holds %d", n, what, dim, pos0, max(len(d32), len(d16)))
			}
			return
		}
		dp := c.kvCache(d32, d16, "the "+what+" cache")
		g.args.Reset().Ptr(dp).Ptr(c.f(src, what)).Int(b2i(kv.F16)).Ptr(posp).Int(off).Int(dim).Int(n / dim).Int(kv.Ring)
		c.launch("kv_store_f32", ewGrid(n), Dim3{X: 256})
	}
	store(k, kv.KDim, kv.K, kv.K16, "keys")
	if v != nil {
		store(v, kv.VDim, kv.V, kv.V16, "values")
	}
}

// kvFits reports whether T tokens at pos0 fit a cache of size positions: within them, or
// within a ring's period (device.KVLayer.Ring), past which a ring's rows are reused.
func kvFits(kv *device.KVLayer, pos0, T, size int) bool {
	if kv.Ring > 0 {
		return pos0 >= 0 && T <= kv.Ring && kv.Ring <= size
	}
	return pos0 >= 0 && pos0+T <= size
}

// kvCache returns the device address of a cache of floats, or of halves when d16 is not nil.
func (c *opCall) kvCache(d32 []float32, d16 []uint16, what string) DevicePtr {
	if d16 != nil {
		return c.ptr(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(d16))), 2*len(d16)), what)
	}
	return c.f(d32, what)
}

// Attend implements device.Ops. A decoded token's heads are split over the cache
// (attendSplit); a pass of 32 tokens or more over an F16 cache with heads of 64, 128 or 256,
// DeepSeek's MLA heads (192 keys and 128 values, or the latent cache of 576) takes the tensor
// cores (flashKernel); anything else a block a (head, token) of attn_f32 or attn_f16kv.
func (g *GPU) Attend(out, q []float32, kv *device.KVLayer, pos0, T int, a *device.AttnShape) {
	c := g.begin("attention")
	defer c.end()
	qp, op := c.f(q, "the queries"), c.f(out, "the output")
	sp := c.f(a.Sinks, "the attention sinks")
	var kp, vp DevicePtr
	name := "attn_f32"
	if kv.F16 {
		name = "attn_f16kv"
		kp = c.ptr(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(kv.K16))), 2*len(kv.K16)), "the key cache")
		vp = kp
		if !a.Latent {
			vp = c.ptr(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(kv.V16))), 2*len(kv.V16)), "the value cache")
		}
	} else {
		kp = c.f(kv.K, "the key cache")
		vp = kp
		if !a.Latent {
			vp = c.f(kv.V, "the value cache")
		}
	}
	vstride := kv.VDim
	if a.Latent {
		vstride = kv.KDim
	}
	posp, off := c.pos(pos0)
	rows := max(len(kv.K), len(kv.K16)) / max(kv.KDim, 1)
	if kv.Ring > 0 {
		rows = min(rows, kv.Ring)
	}
	if splits := attnSplits(a.Heads, rows, g.info.SMs); T == 1 && splits > 1 && a.Heads <= attnCounters {
		c.attendSplit(qp, kp, vp, op, posp, off, sp, kv, vstride, rows+16, splits, a)
		return
	}
	grid, block := Dim3{X: a.Heads, Y: T}, Dim3{X: 256}
	if fa, fg := flashKernel(T, kv, kp, vp, vstride, a); fa != "" {
		name, grid, block = fa, fg, Dim3{X: 128}
	}
	g.args.Reset().Ptr(qp).Ptr(kp).Ptr(vp).Ptr(op).Int(T).Int(a.Heads).Int(a.KVHeads).Int(a.DK).Int(a.DV).
		Int(kv.KDim).Int(vstride).Int(a.KHeadStride).Int(a.VHeadStride).Ptr(posp).Int(off).Float(a.Scale).
		Int(a.Window).Ptr(sp).Int(kv.Ring)
	c.launch(name, grid, block)
}

// flashMinTokens is the fewest tokens of a pass the tensor-core prompt attention takes: below
// that a block a (head, token) of attn_f16kv is expected to fill the card better than a block
// of 64 tokens a head. An estimate until BenchmarkAttnPrefill has run on a card.
const flashMinTokens = 32

// flashKernel names the tensor-core prompt attention for a pass of T tokens and its grid, or
// "" where attn_f16kv takes the pass: flash.cu's kernels take an F16 cache, read 16 bytes at a
// time, with a ring that holds a pass's window and tokens, and the heads of flashLaunch. kp and
// vp are the caches' device addresses, vstride the values' row (the keys' for MLA's latent).
func flashKernel(T int, kv *device.KVLayer, kp, vp DevicePtr, vstride int, a *device.AttnShape) (string, Dim3) {
	if T < flashMinTokens || !kv.F16 || a.KVHeads <= 0 || a.Heads%a.KVHeads != 0 ||
		kv.Ring > 0 && kv.Ring < a.Window+T-1 || kp%16 != 0 || vp%16 != 0 {
		return "", Dim3{}
	}
	for _, n := range []int{kv.KDim, vstride, a.KHeadStride, a.VHeadStride} {
		if n%8 != 0 {
			return "", Dim3{}
		}
	}
	// The latent kernel reads the values from the keys' rows.
	if a.Latent && (a.KVHeads != 1 || kp != vp || vstride != kv.KDim) {
		return "", Dim3{}
	}
	return flashLaunch(a.DK, a.DV, a.Latent, T, a.Heads)
}

// flashLaunch names the flash kernel for query heads of dk key and dv value values (latent:
// MLA's absorbed cache, one KV head whose keys hold the values) and its grid for T tokens of
// heads query heads, or "" for heads no flash kernel takes. A block takes 64 tokens of a head
// (32 for heads of 256, whose values two warps share), or for the latent cache 16 rows
// (token, head) in the order of the queries.
func flashLaunch(dk, dv int, latent bool, T, heads int) (string, Dim3) {
	tokens := 64
	var name string
	switch {
	case latent && dk == 576 && dv == 512:
		return "attn_fa_f16kv_latent576", Dim3{X: (T*heads + 15) / 16, Y: 1}
	case latent:
		return "", Dim3{}
	case dk == dv && dk == 64:
		name = "attn_fa_f16kv_d64"
	case dk == dv && dk == 128:
		name = "attn_fa_f16kv_d128"
	case dk == dv && dk == 256:
		name, tokens = "attn_fa_f16kv_d256", 32
	case dk == 192 && dv == 128:
		name = "attn_fa_f16kv_d192v128"
	default:
		return "", Dim3{}
	}
	return name, Dim3{X: (T + tokens - 1) / tokens, Y: heads}
}

// attnCounters is how many heads of a decoded token the split attention takes: the counters
// that tell each head's last block to finish (kernels/attention.cu), allocated with the GPU.
const attnCounters = 4096

// attnSplits is how many blocks a query head of a decoded token's attention takes, each a
// chunk of the positions (attn_split_*): about four blocks an SM in all, as long as chunks of
// at least 32 of the cache's rows are left to each, and no more than 64. The attention of one
// token otherwise has a block a head, as few as 16 on a card of 80 to 132 SMs. It depends
// on the cache's size and not on the position, so that a captured step's grid suits every
// position it is replayed at; the chunks a short context leaves empty end at once.
func attnSplits(heads, rows, sms int) int {
	if heads < 1 {
		return 1
	}
	return max(1, min((4*sms+heads-1)/heads, (rows+31)/32, 64))
}

// attendSplit launches a decoded token's attention as attn_split_scores and attn_split_pv:
// splits blocks a head, with their scores, maxima and partial sums in the quantized
// activations' scratch, which the next operation may take again once these have run.
func (c *opCall) attendSplit(qp, kp, vp, op, posp DevicePtr, off int, sp DevicePtr, kv *device.KVLayer, vstride, sstride, splits int, a *device.AttnShape) {
	g := c.g
	if c.err != nil {
		return
	}
	h := int64(a.Heads)
	var sc, st, part DevicePtr
	var err1, err2, err3 error
	sc, err1 = g.takeScratch(4*h*int64(sstride), &c.qoff)
	st, err2 = g.takeScratch(4*h*int64(splits+2), &c.qoff)
	part, err3 = g.takeScratch(4*h*int64(splits)*int64(a.DV), &c.qoff)
	if c.err = errors.Join(err1, err2, err3); c.err != nil {
		return
	}
	scores, pv := "attn_split_scores_f32", "attn_split_pv_f32"
	if kv.F16 {
		scores, pv = "attn_split_scores_f16kv", "attn_split_pv_f16kv"
	}
	grid := Dim3{X: a.Heads, Y: splits, Z: 1}
	g.args.Reset().Ptr(qp).Ptr(kp).Ptr(sc).Ptr(st).Ptr(g.attnCnt).Int(1).Int(a.Heads).Int(a.KVHeads).Int(a.DK).Int(kv.KDim).
		Int(a.KHeadStride).Ptr(posp).Int(off).Float(a.Scale).Int(a.Window).Ptr(sp).Int(kv.Ring).Int(sstride).Int(splits)
	c.launch(scores, grid, Dim3{X: 256})
	g.args.Reset().Ptr(sc).Ptr(st).Ptr(vp).Ptr(part).Ptr(g.attnCnt).Ptr(op).Int(1).Int(a.Heads).Int(a.KVHeads).Int(a.DV).Int(vstride).
		Int(a.VHeadStride).Ptr(posp).Int(off).Int(a.Window).Int(kv.Ring).Int(sstride).Int(splits)
	c.launch(pv, grid, Dim3{X: 256})
}

// Gather implements device.Ops.
func (g *GPU) Gather(dst, src []float32, rows []int32, d int) {
	if len(rows) == 0 {
		return
	}
	c := g.begin("gather")
	defer c.end()
	dp, sp := c.f(dst, "the destination"), c.f(src, "the source")
	ip := c.param(int32Bytes(rows))
	g.args.Reset().Ptr(sp).Ptr(ip).Ptr(dp).Int(d).Int(len(rows))
	c.launch("get_rows_f32", Dim3{X: len(rows), Y: blocks(d, 32*256)}, Dim3{X: 256})
}

// Combine implements device.Ops.
func (g *GPU) Combine(out, ys []float32, weights []float32, off []int32, d int) {
	c := g.begin("combine")
	defer c.end()
	T := len(off) - 1
	op, yp := c.f(out, "the output"), c.f(ys, "the experts' outputs")
	wp, offp := c.param(floatBytes(weights)), c.param(int32Bytes(off))
	g.args.Reset().Ptr(op).Ptr(yp).Ptr(wp).Ptr(offp).Ptr(0).Int(0).Int(d)
	c.launch("combine_off_f32", Dim3{X: blocks(d, 256), Y: T}, Dim3{X: 256})
}

// GatedAdd implements device.Ops.
func (g *GPU) GatedAdd(out, sh, x, gate []float32, d int, sigmoid bool) {
	c := g.begin("gated shared expert")
	defer c.end()
	g.args.Reset().Ptr(c.f(out, "the output")).Ptr(c.f(sh, "the shared expert's output")).Ptr(c.f(x, "the input")).
		Ptr(c.f(gate, "the gate")).Int(d).Int(b2i(sigmoid))
	c.launch("gated_add_f32", Dim3{X: len(out) / d}, Dim3{X: 256})
}

// MulSigmoid implements device.Ops: models.HostOps.MulSigmoid's arithmetic, to the bit.
func (g *GPU) MulSigmoid(x, gate []float32) {
	c := g.begin("sigmoid gate")
	defer c.end()
	g.args.Reset().Ptr(c.f(x, "the activations")).Ptr(c.f(gate[:len(x)], "the gate")).Int(len(x))
	c.launch("mul_sigmoid_f32", ewGrid(len(x)), Dim3{X: 256})
}

// Zero implements device.Ops.
func (g *GPU) Zero(x []float32) {
	c := g.begin("zero")
	defer c.end()
	if p := c.f(x, "the activations"); c.err == nil {
		c.err = g.compute.Memset(p, 0, int64(4*len(x)))
	}
}

// Read implements device.Ops: it waits for the compute stream.
func (g *GPU) Read(dst, src []float32) {
	c := g.begin("read back")
	defer c.end()
	if g.step != nil {
		c.err = errCapture("a read the host waits for")
	}
	g.reads.Add(1)
	g.countPageable(floatBytes(dst))
	if p := c.f(src, "the source"); c.err == nil {
		if c.err = g.compute.CopyDtoH(floatBytes(dst), p); c.err == nil {
			c.err = g.compute.Synchronize()
		}
	}
	if c.err != nil {
		clear(dst)
	}
}

// ReadAhead implements device.ReadAheader: a copy back to the host that the next Read waits
// for, not one of its own.
func (g *GPU) ReadAhead(dst, src []float32) {
	c := g.begin("read back ahead")
	defer c.end()
	if g.step != nil {
		c.err = errCapture("a read the host waits for")
	}
	g.countPageable(floatBytes(dst))
	if p := c.f(src, "the source"); c.err == nil {
		c.err = g.compute.CopyDtoH(floatBytes(dst), p)
	}
}

var _ device.ReadAheader = (*GPU)(nil)

// Write implements device.Ops.
func (g *GPU) Write(dst, src []float32) {
	c := g.begin("write")
	defer c.end()
	if g.step != nil {
		c.err = errCapture("a write from host memory")
	}
	g.writes.Add(1)
	g.countPageable(floatBytes(src))
	if p := c.f(dst, "the destination"); c.err == nil {
		c.err = g.compute.CopyHtoD(p, floatBytes(src))
	}
}

var _ device.Ops = (*GPU)(nil)
