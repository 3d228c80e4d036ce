package engine

import (
	"errors"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/sim"
)

// rowsIndependent reports whether a pass's feed-forward blocks compute each row alone, so
// that dropping rows changes nothing of the others: not where a batch's rows share a plan
// (token drop, expert parallelism), where an observer or the Commit Router wants every row's
// routing, or where the offloader learns from them.
func (m *Model) rowsIndependent(obs RouteObserver, cs *commitState) bool {
	return obs == nil && cs == nil && m.off == nil && m.ep == nil && m.opts.Drop == nil && m.commit == nil
}

// logitRows says which rows of logits a pass returns.
type logitRows uint8

const (
	lastLogits logitRows = iota // the last token's
	allLogits                   // every token's, T rows of n_vocab
	noLogits                    // none: a prompt's batch before its last, which only fills the cache
)

// forward runs T tokens at positions pos0.. through the model, appending to kv, and returns
// the logits that want asks for (nil for noLogits).
// obs, when not nil, sees every MoE layer's routing; cs, when not nil, holds the session's
// Commit Router predictions. The caller holds m.mu for reading and has checked that the
// positions fit the cache.
func (m *Model) forward(kv *models.KVCache, tokens []int32, pos0 int, want logitRows, obs RouteObserver, cs *commitState) ([]float32, error) {
	one := [1]seqRows{{kv: kv, pos0: pos0, T: len(tokens)}}
	return m.forwardSeqs(one[:], tokens, want, obs, cs)
}

// seqRows is one sequence's rows in a forward pass: T tokens at positions pos0.., whose keys
// and values go to kv.
type seqRows struct {
	kv      *models.KVCache
	pos0, T int
}

// forwardSeqs is forward over the rows of several sequences, seqs[0]'s tokens first. A pass
// of several sequences (a decode step of continuous batching) takes one token of each, wants
// allLogits (each row is its sequence's last) and no observer or Commit Router, whose
// predictions are one sequence's: each row's numbers are then those of its sequence alone,
// and every weight, an expert's copy over the link included, is read once for all of them.
func (m *Model) forwardSeqs(seqs []seqRows, tokens []int32, want logitRows, obs RouteObserver, cs *commitState) ([]float32, error) {
	if len(seqs) > 1 && (want != allLogits || obs != nil || cs != nil) {
		return nil, errors.New("engine: a pass of several sequences wants every row's logits and no observer or Commit Router") // a caller's bug
	}
	for _, s := range seqs {
		if err := s.kv.CheckPass(s.pos0, s.T); err != nil {
			return nil, err // a caller's bug: a session rewinds its cache before a pass
		}
	}
	if m.resident || m.batch != nil {
		m.passMu.Lock()
		defer m.passMu.Unlock()
	}
	if c := m.commitDev; c != nil {
		defer func() { c.pending = c.pending[:0] }() // a failed pass's records are dropped
	}
	if m.graphs.takes(seqs, tokens, want, obs, cs) {
		if logits, ok, err := m.replayStep(seqs[0], tokens); ok {
			return logits, err
		}
	}
	return m.enqueue(seqs, tokens, want, obs, cs, false)
}

// enqueue enqueues a forward pass and returns its logits (forwardSeqs's, whose lock the caller
// holds). With capture, a decode step being captured (device.Grapher), it leaves the logits
// in device memory and waits for nothing.
func (m *Model) enqueue(seqs []seqRows, tokens []int32, want logitRows, obs RouteObserver, cs *commitState, capture bool) ([]float32, error) {
	a := m.arch
	c := a.Config
	d := c.Embd
	T := len(tokens)
	pos0 := seqs[0].pos0 // of a single sequence; a batch's rows each have their own
	// The pass's long-lived activations come from one arena, each layer's from another that
	// the next layer reuses.
	pa, la := m.getArena(passArena), m.getArena(layerArena)
	defer m.putArena(pa)
	defer m.putArena(la)
	var k device.Kernels = m.dev
	if len(seqs) > 1 {
		k = rowKernels{m.dev}
	}
	b := &backend{Kernels: k, Ops: m.ops, a: pa, fused: m.fused}
	bl := &backend{Kernels: k, Ops: m.ops, a: la, fused: m.fused}
	x := b.Floats(T * d)
	emb := a.TokenEmbd.Matrix()
	m.ops.Embed(x, emb, tokens)
	m.place.BeginPass(len(seqs) > 1)
	if cs != nil && len(tokens) > 1 {
		cs.forget()
	}
	m.label("embed", "embed", -1, -1)
	m.charge("embed", float64(T*(emb.RowBytes()+4*d)), 0)
	xn := b.Floats(T * d)
	tmp := b.Floats(T * d)
	// Past the last attention the cache holds every token's keys and values, and only the
	// rows whose logits are asked for have a use: llama.cpp cuts its graph the same way
	// (inp_out_ids), sparing a prompt one feed-forward block of all but one row, or all of
	// it in the batches before the last.
	cut := want != allLogits && T > 1 && len(seqs) == 1 && m.rowsIndependent(obs, cs)
	// On a device that fuses them, a block's residual (x += tmp) is added by the kernel that
	// computes the next norm (pending); elsewhere it is added where the block ends.
	pending := false
	for i := range a.Layers {
		la.reset()
		l := &a.Layers[i]
		m.label("attention", "attn", i, -1)
		m.residualNorm(xn, x, tmp, l.AttnNorm, pending)
		m.attend(bl, i, seqs, xn, tmp)
		if cut && i == len(a.Layers)-1 {
			m.ops.Add(x, tmp)
			if want == noLogits {
				return nil, m.endPass(pa, la)
			}
			x, xn, tmp = x[(T-1)*d:][:d], xn[:d], tmp[:d]
			pos0, T = pos0+T-1, 1
			m.rmsNorm(xn, x, l.FFNNorm)
		} else {
			m.residualNorm(xn, x, tmp, l.FFNNorm, true)
		}
		if err := m.feedForward(bl, i, l, xn, T, pos0, tokens, tmp, obs, cs); err != nil {
			return nil, err
		}
		if pending = m.fused != nil; !pending {
			m.ops.Add(x, tmp)
			m.charge("add", float64(12*T*d), float64(T*d))
		}
	}
	if want == noLogits {
		return nil, m.endPass(pa, la) // nobody reads a head's logits here, nor x
	}
	var dst []float32 // one sequence's one row of logits: read back into its session's memory
	if len(seqs) == 1 && (want == lastLogits || T == 1) && !capture && m.logitsHost != nil {
		dst = m.logitsHost.get(seqs[0].kv, c.Vocab)
	}
	return m.logits(b, pa, la, x, xn, tmp, T, want, pending, capture, dst)
}

// feedForward runs block i's feed-forward on xn's T rows into tmp: its MoE block, whose
// routing obs (if any) is then told, or its dense FFN.
func (m *Model) feedForward(bl *backend, i int, l *models.Layer, xn []float32, T, pos0 int, tokens []int32, tmp []float32, obs RouteObserver, cs *commitState) error {
	if l.MoE == nil {
		m.label("dense", "ffn", i, -1)
		m.ffn(bl, l.Dense, xn, T, tmp)
		return nil
	}
	var ev *RouteEvent
	if obs != nil {
		ev = &RouteEvent{Layer: i, Pos0: pos0, Tokens: T, IDs: tokens}
	}
	if err := m.block.moe(bl, i, l.MoE, xn, T, pos0, tmp, ev, cs); err != nil {
		return err
	}
	if ev != nil {
		obs(ev)
	}
	return nil
}

// logits ends enqueue's pass with the head: the output norm and product of the rows want
// asks for, x's last or all of its T, with the last block's residual (pending) added first.
// With capture they stay in device memory, in the pass arena pa; else one row of them is
// read back into dst where it is not nil (hostLogits).
func (m *Model) logits(b *backend, pa, la *arena, x, xn, tmp []float32, T int, want logitRows, pending, capture bool, dst []float32) ([]float32, error) {
	d := m.arch.Config.Embd
	rows := x
	if want != allLogits {
		rows, T = x[(T-1)*d:], 1
	}
	m.label("head", "head", -1, -1)
	if pending && len(rows) != len(x) {
		m.ops.Add(x, tmp) // the last row alone is normalised
		pending = false
	}
	m.residualNorm(xn[:T*d], rows, tmp, m.arch.OutputNorm, pending)
	out := m.arch.Output.Matrix()
	if capture {
		logits := b.Floats(T * out.Rows)
		b.MatMul(out, xn[:T*d], T, logits)
		return logits, errors.Join(pa.err, la.err)
	}
	logits := m.head(b, out, xn[:T*d], T, dst)
	if err := m.endPass(pa, la); err != nil {
		return nil, err
	}
	return logits, nil
}

// residualNorm normalises the rows of x into xn with n, first adding tmp to x when add says
// that a block's residual is pending: in one kernel where the device fuses them.
func (m *Model) residualNorm(xn, x, tmp []float32, n models.Norm, add bool) {
	switch {
	case add && m.fused != nil:
		m.fused.AddRMSNorm(x, tmp, xn, m.arch.Config.Embd, n.Weight, n.Bias, m.arch.Config.NormEps)
	case add:
		m.ops.Add(x, tmp)
		m.rmsNorm(xn, x, n)
	default:
		m.rmsNorm(xn, x, n)
	}
}

// rowKernels computes every product of a pass of several sequences row by row, with the
// kernels MatMulID takes: llama.cpp's MUL_MAT multiplies a batch's activation rows four at a
// time for some weight types (its repacked gemm), rounding otherwise than a row alone, and a
// row of a decode batch must get the numbers of its sequence decoded alone. The weights are
// still read once for all the rows (the tile kernels share each block's decoding).
type rowKernels struct{ device.Kernels }

func (k rowKernels) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	k.Kernels.MatMulID(w, x, T, out)
}

// attend runs block i's attention on the rows of seqs in xn into out: in one call when the
// attention takes several sequences, else one call per sequence.
func (m *Model) attend(b models.Backend, i int, seqs []seqRows, xn, out []float32) {
	l := &m.arch.Layers[i]
	d := m.arch.Config.Embd
	if len(seqs) == 1 {
		s := seqs[0]
		l.Attn.Forward(b, &s.kv.Layers[i], xn, s.T, s.pos0, out)
		m.chargeAttention(i, s.T, s.pos0)
		return
	}
	sa, ok := l.Attn.(models.SeqAttention)
	if !ok {
		r := 0
		for _, s := range seqs {
			l.Attn.Forward(b, &s.kv.Layers[i], xn[r*d:(r+s.T)*d], s.T, s.pos0, out[r*d:(r+s.T)*d])
			m.chargeAttention(i, s.T, s.pos0)
			r += s.T
		}
		return
	}
	ms := m.seqScratch[:0] // passes of several sequences hold passMu
	for _, s := range seqs {
		ms = append(ms, models.Seq{Cache: &s.kv.Layers[i], T: s.T, Pos0: s.pos0})
	}
	m.seqScratch = ms
	sa.ForwardSeqs(b, ms, xn, out)
	for _, s := range seqs {
		m.chargeAttention(i, s.T, s.pos0)
	}
}

// endPass waits for the pass's work on the device and reports what failed in it.
func (m *Model) endPass(pa, la *arena) error {
	m.dev.Sync(m.dev.Compute().Record())
	if err := errors.Join(pa.err, la.err, m.deviceErr()); err != nil {
		return err
	}
	return m.flushCommitted()
}

// headRows bounds the rows of output logits a pass in device memory holds at once: a
// vocabulary of 152k takes 39 MB for 64 rows, where a whole prefill batch's would take 155
// MB of the device's budget (room for dozens of experts). 64 is the batched kernel's tile
// of tokens, so the output matrix is read no more often than in one product.
const headRows = 64

// head computes the output logits of the T normalised rows xn and returns them where the
// host reads them (to sample, or score every row): on a device, headRows rows at a time,
// each read back before the next is computed, one row into dst where it is not nil.
func (m *Model) head(b models.Backend, out quant.Matrix, xn []float32, T int, dst []float32) []float32 {
	if !m.resident {
		// Its own memory, not the arena's: the caller keeps the logits after the pass.
		logits := make([]float32, T*out.Rows)
		b.MatMul(out, xn, T, logits)
		return logits
	}
	if T <= headRows {
		logits := b.Floats(T * out.Rows)
		b.MatMul(out, xn, T, logits)
		if T == 1 && len(dst) == len(logits) {
			m.ops.Read(dst, logits)
			return dst
		}
		return m.toHost(logits)
	}
	d, V := m.arch.Config.Embd, out.Rows
	logits := make([]float32, T*V)
	dl := b.Floats(headRows * V)
	for t0 := 0; t0 < T; t0 += headRows {
		n := min(headRows, T-t0)
		b.MatMul(out, xn[t0*d:(t0+n)*d], n, dl[:n*V])
		m.ops.Read(logits[t0*V:(t0+n)*V], dl[:n*V])
	}
	return logits
}

// rmsNorm normalises the rows of x into dst.
func (m *Model) rmsNorm(dst, x []float32, n models.Norm) {
	d := m.arch.Config.Embd
	m.ops.RMSNorm(dst, x, d, n.Weight, n.Bias, m.arch.Config.NormEps)
	m.charge("norm", float64(8*len(x)+4*d), float64(4*len(x)))
}

// chargeAttention prices block i's attention over the cache (a recurrent layer's over its
// state), which the models compute outside the device's kernels: reading positions pos0+T
// keys and values (a sliding window's, the window and the pass), and for each of T queries
// and every head a dot product and a weighted sum per position. Its projections are priced
// by the device's MatMul.
func (m *Model) chargeAttention(i, T, pos0 int) {
	if m.charger == nil {
		return
	}
	c := m.arch.Config
	if r, ok := m.arch.Layers[i].Attn.(models.Recurrent); ok {
		// A recurrent layer reads and writes its states once a pass: the device's recurrence
		// (cuda's deltanet_rec_f32) keeps each row of a head's state in registers from the
		// pass's first token to its last. Each token's rows go through the convolution (qkv
		// in, conv out), the q and k norms (in place), the recurrence (conv in, the output
		// out) and the gated norm (the output and z in, the output out). About six operations
		// per state value a token: decay, the delta's and the output's dot products, the
		// update.
		conv, state := r.StateDims()
		bytes := 8 * float64(conv+state)
		if d, ok := r.(*models.DeltaNet); ok {
			vd := d.VHeads * d.HeadDim
			bytes += 4 * float64(T) * float64(3*d.Channels()+4*d.KHeads*d.HeadDim+4*vd)
		}
		m.charger.Charge("attention", bytes, 6*float64(T)*float64(state))
		return
	}
	kd, vd := m.arch.Layers[i].Attn.CacheDims()
	elem := 4.0
	if m.kvF16 {
		elem = 2
	}
	n := float64(pos0 + T)
	if w := models.SlidingWindow(m.arch.Layers[i].Attn); w > 0 {
		n = min(n, float64(w+T-1)) // the positions the pass's windows see
	}
	heads := float64(c.Heads[i]) / float64(max(c.HeadsKV[i], 1))
	m.charger.Charge("attention", n*float64(kd+vd)*elem+float64(8*T*(kd+vd)), 2*float64(T)*n*float64(kd+vd)*heads)
}

// ffn runs a dense SwiGLU block on T rows of x into out.
func (m *Model) ffn(b models.Backend, f *models.FFN, x []float32, T int, out []float32) {
	m.swiglu(b, b.MatMul, m.charger, f, x, T, out)
}

// swiglu runs a SwiGLU block with the given matrix product: MatMul for dense blocks, MatMulID
// for routed experts (llama.cpp's MUL_MAT_ID, whose kernels differ for some weight types).
// ch, when not nil, is charged for the activation.
func (m *Model) swiglu(b models.Backend, matMul func(quant.Matrix, []float32, int, []float32), ch device.Charger, f *models.FFN, x []float32, T int, out []float32) {
	nff := f.Gate.Rows
	g, u := b.Floats(T*nff), b.Floats(T*nff)
	matMul(f.Gate, x, T, g)
	matMul(f.Up, x, T, u)
	b.SwiGLU(g, u, nff)
	if ch != nil {
		bytes, flops := sim.ActivationCost(T * nff)
		ch.Charge("swiglu", bytes, flops)
	}
	matMul(f.Down, g, T, out)
}
