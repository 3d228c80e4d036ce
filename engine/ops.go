package engine

import (
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/sim"
)

// setupOps chooses how a forward pass computes besides the matrix products. On a device with
// Ops and memory of its own (a GPU), a pass runs in device memory: activations, the KV cache
// and the norm weights live there, and the host reads back only router logits and output
// logits. That needs every layer's attention to compute with Ops alone (models.OnDevice).
// Everywhere else the host's Ops compute, the CPU reference.
func (m *Model) setupOps() error {
	if err := m.checkFeatures(); err != nil {
		return err
	}
	m.ops = models.HostOps{K: m.dev}
	if !m.resident {
		if m.replay != nil {
			m.ops = chargedOps{Ops: sim.NopOps{}, c: m.charger}
		} else if m.charger != nil {
			m.ops = chargedOps{Ops: models.HostOps{K: m.dev}, c: m.charger}
		}
		return nil
	}
	ops := m.dev.(device.Ops)
	res := m.dev.(device.Resident)
	// The small host-decoded weights the Ops read: norms, biases, the shared expert's gate,
	// RoPE's frequency factors, attention sinks.
	up := func(v []float32, what string) error {
		if len(v) == 0 {
			return nil
		}
		return res.Upload(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)), what)
	}
	norm := func(n models.Norm, what string) error {
		if err := up(n.Weight, what); err != nil {
			return err
		}
		return up(n.Bias, what+" bias")
	}
	if err := norm(m.arch.OutputNorm, "output_norm"); err != nil {
		return err
	}
	for i, l := range m.arch.Layers {
		name := func(s string) string { return fmt.Sprintf("blk.%d.%s", i, s) }
		errs := []error{norm(l.AttnNorm, name("attn_norm")), norm(l.FFNNorm, name("ffn_norm"))}
		switch a := l.Attn.(type) {
		case *models.StdAttention:
			errs = append(errs, up(a.BQ, name("attn_q.bias")), up(a.BK, name("attn_k.bias")), up(a.BV, name("attn_v.bias")),
				up(a.BO, name("attn_output.bias")), norm(a.QNorm, name("attn_q_norm")), norm(a.KNorm, name("attn_k_norm")),
				up(a.Rope.FreqFactors, name("rope_freqs")), up(a.Sinks, name("attn_sinks")))
		case *models.MLAttention:
			errs = append(errs, norm(a.QANorm, name("attn_q_a_norm")), norm(a.KVANorm, name("attn_kv_a_norm")),
				up(a.Rope.FreqFactors, name("rope_freqs")))
		case *models.DeltaNet:
			errs = append(errs, up(a.Conv, name("ssm_conv1d")), up(a.DtBias, name("ssm_dt.bias")), up(a.A, name("ssm_a")),
				up(a.NormW, name("ssm_norm")), up(a.NormB, name("ssm_norm.bias")))
		}
		if moe := l.MoE; moe != nil {
			errs = append(errs, up(moe.SharedGate, name("ffn_gate_inp_shexp")), up(moe.SelectionBias, name("exp_probs_b")),
				up(moe.RouterBias, name("ffn_gate_inp.bias")), up(moe.GateBias, name("ffn_gate_exps.bias")),
				up(moe.UpBias, name("ffn_up_exps.bias")), up(moe.DownBias, name("ffn_down_exps.bias")))
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	m.ops = ops
	return nil
}

// residentPasses says whether passes run in the device's memory: a device with Ops and memory
// of its own, and a model whose passes can (passesOnDevice).
func (m *Model) residentPasses() bool {
	_, ok := m.dev.(device.Ops)
	_, rok := m.dev.(device.Resident)
	return ok && rok && m.passesOnDevice()
}

// passesOnDevice says whether the model's passes can run on a GPU: one device, and every
// layer's attention computing with Ops alone.
func (m *Model) passesOnDevice() bool {
	if m.opts.EP != nil {
		return false
	}
	for _, l := range m.arch.Layers {
		if _, ok := l.Attn.(models.OnDevice); !ok {
			return false
		}
	}
	return true
}

// activationFloats is the device memory of one pass's activations (gpuActivationFloats), zero
// when passes do not run in device memory. A simulated GPU computes on the host but reserves
// them too, as the card would, so that a budget leaves it the card's expert slots.
func (m *Model) activationFloats() (pass, layer int64) {
	_, simulated := m.dev.(*sim.Device)
	if !m.resident && !(simulated && m.passesOnDevice()) {
		return 0, 0
	}
	return m.gpuActivationFloats()
}

// gpuActivationFloats bounds the device memory of one pass's activations on a GPU (see
// activationFloatsOf) for the model's blocks.
func (m *Model) gpuActivationFloats() (pass, layer int64) {
	blocks := make([]blockActs, len(m.arch.Layers))
	for i, l := range m.arch.Layers {
		b := &blocks[i]
		b.attn = l.Attn
		if f := l.Dense; f != nil {
			b.denseFF = int64(f.Gate.Rows)
		}
		if moe := l.MoE; moe != nil {
			b.experts, b.used = int64(moe.Experts), int64(moe.Used)
			b.expertFF = int64(moe.GateExps.Expert(0).Rows)
			if sh := moe.Shared; sh != nil {
				b.sharedFF = int64(sh.Gate.Rows)
			}
		}
	}
	c := m.arch.Config
	return activationFloatsOf(int64(c.Embd), int64(c.Vocab), blocks)
}

// blockActs are the sizes one block's activations depend on.
type blockActs struct {
	attn     models.Attention // only its sizes are read
	denseFF  int64            // a dense block's FFN width, 0 if none
	experts  int64            // 0 if the block has no MoE
	used     int64
	expertFF int64
	sharedFF int64 // the shared expert's width, 0 if none
}

// activationFloatsOf bounds the device memory of one pass's activations on a GPU at up to
// prefillBatch tokens, the output logits headRows rows at a time: the floats forward takes
// from its pass arena and, in its largest layer, from its layer arena, each allocation
// rounded up to 64 floats.
func activationFloatsOf(embd, vocab int64, blocks []blockActs) (pass, layer int64) {
	T, d := int64(prefillBatch), embd
	const slack = 64
	pass = 3*(T*d+slack) + min(T, headRows)*vocab + slack
	for _, b := range blocks {
		var n int64
		switch a := b.attn.(type) {
		case *models.StdAttention:
			n += T*int64(a.Heads*a.HeadDK+a.HeadsKV*(a.HeadDK+a.HeadDV)+a.Heads*a.HeadDV) + 4*slack
			if a.OutGate { // the joint query/gate projection, and the gates
				n += 3*T*int64(a.Heads*a.HeadDK) + 2*slack
			}
		case *models.DeltaNet:
			// qkv and its convolution, z and the output, beta and alpha.
			ch, vd := int64(a.Channels()), int64(a.VHeads*a.HeadDim)
			n += 2*T*ch + 2*T*vd + 2*T*int64(a.VHeads) + 6*slack
		case *models.MLAttention:
			n += mlaFloats(a, T, slack)
		}
		if b.denseFF > 0 {
			n += 2 * (T*b.denseFF + slack)
		}
		if b.experts > 0 {
			k, E, nff := b.used, b.experts, b.expertFF
			// Router logits, the outputs in computing order and in slot order (expanded drop
			// adds at most one expert per token), and per computed expert its gathered input,
			// gate and up.
			slots := T * (k + 1)
			n += T*E + (slots+1)*d + slots*d + slots*(d+2*nff) + min(E, slots)*3*slack + 3*slack
			if b.sharedFF > 0 {
				n += T*d + 2*T*b.sharedFF + 3*slack
			}
		}
		layer = max(layer, n)
	}
	return pass, layer
}

// mlaFloats is what MLAttention.Forward takes from the layer's arena for T tokens, each
// allocation rounded up by slack: q (and q_a), the kv_a rows [latent | k_pe], then for the
// absorbed form the absorbed queries, each head's latent output and its value, for the legacy
// form the packed latent, kv_b's output, the heads' keys and values and the attention output.
func mlaFloats(a *models.MLAttention, T, slack int64) int64 {
	H, nope, rope, rank, hv := int64(a.Heads), int64(a.Nope), int64(a.RopeD), int64(a.Rank), int64(a.HeadV)
	n := T*H*(nope+rope) + T*(rank+rope) + 2*slack
	if a.QA.Data != nil {
		n += T*int64(a.QA.Rows) + slack
	}
	if a.KVB.Data != nil {
		return n + T*rank + T*H*(nope+hv) + T*H*(nope+rope) + 2*T*H*hv + 5*slack
	}
	return n + T*H*(rank+rope) + T*H*rank + T*H*hv + 3*slack
}

// Resident reports whether forward passes run in the device's memory (a GPU with every
// layer's attention on its Ops), rather than with host activations.
func (m *Model) Resident() bool { return m.resident }

// newKV allocates a session's KV cache: in device memory when passes run there, in address
// space alone for a timing-only model, where a failure part way gives back what it took.
func (m *Model) newKV() (*models.KVCache, error) {
	switch {
	case m.replay != nil:
		return m.newKVWith(models.VirtualAlloc, models.VirtualFree)
	case !m.resident:
		return models.NewKVCache(m.arch, m.kvOptions(), models.HostAlloc)
	}
	res := m.dev.(device.Resident)
	return m.newKVWith(res.Buffer, res.Release)
}

// newKVWith allocates a KV cache with alloc, and gives what it took back with free if it
// fails part way.
func (m *Model) newKVWith(alloc models.Alloc, free func([]byte)) (*models.KVCache, error) {
	var got [][]byte
	kv, err := models.NewKVCache(m.arch, m.kvOptions(), func(n int64, what string) ([]byte, error) {
		b, err := alloc(n, what)
		if err == nil {
			got = append(got, b)
		}
		return b, err
	})
	if err != nil {
		for _, b := range got {
			free(b)
		}
	}
	return kv, err
}

// freeKV gives a KV cache's device memory back.
func (m *Model) freeKV(kv *models.KVCache) {
	m.graphs.drop(kv)
	m.logitsHost.release(kv)
	if !m.resident && m.replay == nil {
		return
	}
	for _, b := range kv.Buffers() {
		if m.replay != nil {
			models.VirtualFree(b)
		} else {
			m.dev.(device.Resident).Release(b)
		}
	}
}

// arena hands out a pass's activations, and reset makes them reusable. On a device they are
// carved from one device buffer that the arena keeps, of the floats activationFloats bounds:
// the device runs its work in stream order, so a later kernel writing reused memory runs
// after the earlier ones reading it. The buffers are the model's activation reserve, taken
// from the device's budget when it was opened. On the host they are carved from Go blocks
// that the arena keeps and adds to as a pass needs (zeroed when handed out, as make's), and
// the arenas go back to a pool: a decoded token takes a few hundred activations, and
// allocating each, then collecting them, was a tenth of a token.
type arena struct {
	res   device.Resident // nil: host memory
	limit int             // on a device: the floats of its buffer
	buf   []float32       // on a device: the buffer; on the host: blocks[bi]
	off   int             // the floats taken of buf
	err   error           // the first failed allocation
	// On the host: whether the arena carves blocks (a pass's, from the model's pool) or makes
	// each allocation (a zero arena, for work outside a pass's lifetime), the blocks, and the
	// one being carved.
	carve  bool
	blocks [][]float32
	bi     int
	// pin, where set, allocates the blocks in the device's pinned memory (the exchange
	// arena's, exchangeArena).
	pin device.HostAllocator
}

// hostBlockFloats is the least floats of a host arena's block: a small model's whole pass.
const hostBlockFloats = 64 << 10

func (a *arena) floats(n int) []float32 {
	if a.res == nil {
		if !a.carve {
			return make([]float32, n)
		}
		return a.hostFloats(n)
	}
	if a.buf == nil {
		b, err := a.res.Buffer(int64(a.limit)*4, "activations")
		if err != nil {
			return a.failed(n, err)
		}
		a.buf = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), a.limit)
	}
	// 256-byte alignment, as cudaMalloc's, for the kernels' vector loads.
	n64 := (n + 63) &^ 63
	if a.off+n64 > len(a.buf) {
		return a.failed(n, fmt.Errorf("%d bytes more than the %d reserved", 4*n, 4*len(a.buf)))
	}
	s := a.buf[a.off : a.off+n : a.off+n]
	a.off += n64
	return s
}

// failed records a failed allocation and returns host memory, which the device's Ops refuse
// (a sticky device error), so that the pass ends with the error instead of a crash.
func (a *arena) failed(n int, err error) []float32 {
	if a.err == nil {
		a.err = fmt.Errorf("memory for activations: %w", err)
	}
	return make([]float32, n)
}

func (a *arena) reset() {
	a.off = 0
	if a.res == nil {
		a.bi, a.buf = 0, nil
		if len(a.blocks) > 0 {
			a.buf = a.blocks[0]
		}
	}
}

// hostFloats is floats on the host: the rest of the current block, or the next block that
// holds n (allocated when none does).
func (a *arena) hostFloats(n int) []float32 {
	n64 := (n + 15) &^ 15 // 64-byte alignment within a block, for the vector kernels
	for a.off+n64 > len(a.buf) {
		if a.buf != nil {
			a.bi++
		}
		if a.bi == len(a.blocks) {
			size := hostBlockFloats
			if len(a.blocks) > 0 {
				size = 2 * len(a.blocks[len(a.blocks)-1])
			}
			a.blocks = append(a.blocks, a.block(max(size, n64)))
		}
		a.buf, a.off = a.blocks[a.bi], 0
	}
	s := a.buf[a.off : a.off+n : a.off+n]
	a.off += n64
	clear(s)
	return s
}

// block is a new host block of n floats: pinned where the arena pins and the device still
// pins, else Go memory (a refused pinning makes the copies through the block the driver's
// slower staged ones, nothing worse).
func (a *arena) block(n int) []float32 {
	if a.pin != nil {
		if f, ok := pinnedFloats(a.pin, n); ok {
			return f
		}
		a.pin = nil
	}
	return make([]float32, n)
}

// pinnedFloats returns n floats of the device's pinned host memory, which live as long as
// the device, or false where it refuses them.
func pinnedFloats(ha device.HostAllocator, n int) ([]float32, bool) {
	b, err := ha.HostAlloc(int64(4 * n))
	if err != nil {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n), true
}

// activations are a model's activation reserve: on a device, the floats of a pass's arena and
// of its layer arena, and the two arenas, which passes in device memory (one at a time,
// under passMu) reuse.
type activations struct {
	pass, layer int64
	arenas      [2]*arena
	// exchange is the host memory through which a pass in device memory hands a layer's
	// input to the experts the host computes and their outputs back (exchangeArena).
	exchange *arena
	// router is the host memory a layer routed on the host reads its router's logits into
	// (routerToHost).
	router *arena
}

// bytes is the reserve's size.
func (a *activations) bytes() int64 { return 4 * (a.pass + a.layer) }

// Arena kinds: a pass's long-lived activations, and each layer's, reset between layers.
const (
	passArena = iota
	layerArena
)

// getArena returns an arena of kind for a pass: on the host one of the model's pool, on a
// device the model's own, which the caller, holding passMu, has to itself until putArena.
// Nothing handed out may be read after putArena.
func (m *Model) getArena(kind int) *arena {
	if !m.resident {
		return m.hostArena()
	}
	a := m.act.arenas[kind]
	if a == nil {
		limit := m.act.pass
		if kind == layerArena {
			limit = m.act.layer
		}
		a = &arena{res: m.dev.(device.Resident), limit: int(limit)}
		m.act.arenas[kind] = a
	}
	return a
}

// hostArena returns one of the model's host arenas, for a host pass or for the host's share
// of a device's (hostExperts), until putArena.
func (m *Model) hostArena() *arena {
	if a, ok := m.hostArenas.Get().(*arena); ok {
		return a
	}
	return &arena{carve: true}
}

func (m *Model) putArena(a *arena) {
	a.reset()
	a.err = nil
	if a.carve {
		m.hostArenas.Put(a)
	}
}

// exchangeArena returns the arena of host memory, pinned where the device allocates it, that
// a pass in device memory (holding passMu) reads a layer's input into and writes its host
// experts' outputs from, reset when a layer's copies are enqueued (computeJobs) and when a
// layer's input is read ahead (readAhead). Pinned,
// a read is the link's DMA and a write returns at once, where from Go memory the driver
// stages each copy itself, holding the host (GPUStats.Pageable). Reusing it is safe: the
// next layer's host work starts after a read or an event on the compute stream, which runs
// the copies enqueued before it first. Its blocks live as long as the device.
func (m *Model) exchangeArena() *arena {
	if m.act.exchange == nil {
		ha, _ := m.dev.(device.HostAllocator)
		m.act.exchange = &arena{carve: true, pin: ha}
	}
	return m.act.exchange
}

// routerToHost returns a layer's router logits x readable by the host: x itself on the host,
// else read back into pinned memory the model keeps for them, which the next layer's reuse
// (their last readers, the routing, the Commit Router's apply and the observer's event, are
// done with them by then: RouteObserver's slices are valid during its call only). Passes in
// device memory run one at a time (passMu).
func (m *Model) routerToHost(x []float32) []float32 {
	if !m.resident {
		return x
	}
	if m.act.router == nil {
		ha, _ := m.dev.(device.HostAllocator)
		m.act.router = &arena{carve: true, pin: ha}
	}
	a := m.act.router
	a.reset()
	h := a.floats(len(x))
	m.ops.Read(h, x)
	return h
}

// backend is what a layer computes with: the device's kernels, the pass's Ops and an arena.
type backend struct {
	device.Kernels
	device.Ops
	a     *arena
	fused device.Fused // nil: none
}

func (b *backend) Floats(n int) []float32 { return b.a.floats(n) }

var _ models.Backend = (*backend)(nil)

// toHost returns x readable by the host: x itself, or a copy read back from the device.
func (m *Model) toHost(x []float32) []float32 {
	if !m.resident {
		return x
	}
	h := make([]float32, len(x))
	m.ops.Read(h, x)
	return h
}

// chargedOps are the host's Ops on a device that prices the work it does not compute (the
// simulator). The heads' products (MLA's k_b and v_b) read weights a GPU would read, so they
// are charged as its kernels; the other Ops' traffic is the activations', which the engine
// charges with the work around them.
type chargedOps struct {
	device.Ops // the host's, or nothing at all for timing-only passes
	c          device.Charger
}

// MatMulHeads implements device.Ops.
func (o chargedOps) MatMulHeads(w []quant.Matrix, x []float32, T int, out []float32, l *device.HeadLayout) {
	o.Ops.MatMulHeads(w, x, T, out, l)
	var bytes, flops float64
	for _, h := range w {
		bytes += float64(len(h.Data))
		flops += 2 * float64(T) * float64(h.Rows) * float64(h.Cols)
	}
	o.c.Charge("attention", bytes, flops)
}

// hostBackend computes on the device's kernels with the host's Ops and Go memory: expert
// parallelism, whose ranks are host devices.
func (m *Model) hostBackend() *backend {
	return &backend{Kernels: m.dev, Ops: models.HostOps{K: m.dev}, a: &arena{}}
}
