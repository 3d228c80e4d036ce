package models

import (
	"math"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// DeltaNet is a gated DeltaNet linear-attention layer (Qwen3.5/3.6's, llama.cpp's
// qwen35moe): no KV cache, but a recurrent state per sequence (RecState) that every token
// updates: a short causal convolution over the q/k/v projection, then per value head a
// matrix S (HeadDim x HeadDim) decayed by e^g and corrected towards the token's value by
// the delta rule, read out by the query, normalised and gated by silu(z).
//
// It computes as llama.cpp's CPU backend does with its fused gated_delta_net op, token after
// token for a prompt too: llama.cpp's chunked form is the graph its other backends take,
// and the CPU's numbers are the reference.
type DeltaNet struct {
	QKV   quant.Matrix // attn_qkv {n_embd, 2*KHeads*HeadDim + VHeads*HeadDim}: q, k, v
	Gate  quant.Matrix // attn_gate {n_embd, VHeads*HeadDim}: z
	Beta  quant.Matrix // ssm_beta {n_embd, VHeads}
	Alpha quant.Matrix // ssm_alpha {n_embd, VHeads}
	Out   quant.Matrix // ssm_out {VHeads*HeadDim, n_embd}
	// The rest, as the Ops' GatedDeltaNet reads it: ssm_conv1d {ConvK, channels} (Conv),
	// ssm_dt.bias (DtBias) and ssm_a (A, -e^A_log), ssm_norm (NormW), the head counts.
	device.DeltaNetLayer
}

// CacheDims implements Attention: a DeltaNet layer keeps no keys or values.
func (d *DeltaNet) CacheDims() (int, int) { return 0, 0 }

// StateDims implements Recurrent.
func (d *DeltaNet) StateDims() (conv, state int) {
	return (d.ConvK - 1) * d.Channels(), d.VHeads * d.HeadDim * d.HeadDim
}

// OnDevice implements OnDevice: the layer computes with Ops alone, its state in the cache's
// memory.
func (d *DeltaNet) OnDevice() {}

// Forward implements Attention. The layer's state must be at pos0 (the engine checks it
// with KVCache.CheckPass); pos0 0 starts it afresh. A pass of several tokens leaves a
// snapshot of the state before its last token, from which a later prompt that shares all
// but the last token can resume (KVCache.Rewind).
func (d *DeltaNet) Forward(b Backend, c *LayerCache, x []float32, T, pos0 int, out []float32) {
	st := c.Rec
	if pos0 == 0 {
		st.reset(b)
	}
	ch, vd, hv := d.Channels(), d.VHeads*d.HeadDim, d.VHeads
	qkv, z := b.Floats(T*ch), b.Floats(T*vd)
	beta, g := b.Floats(T*hv), b.Floats(T*hv)
	b.MatMul(d.QKV, x, T, qkv)
	b.MatMul(d.Gate, x, T, z)
	b.MatMul(d.Beta, x, T, beta)
	b.MatMul(d.Alpha, x, T, g)
	o := b.Floats(T * vd)
	var snap *device.DeltaNetState
	if T > 1 {
		snap = st.snapshot(pos0 + T - 1)
	}
	b.GatedDeltaNet(&d.DeltaNetLayer, &st.DeltaNetState, snap, qkv, z, beta, g, T, b.Floats(T*ch), o)
	b.MatMul(d.Out, o, T, out)
	st.Pos = pos0 + T
}

// GatedDeltaNet implements device.Ops, as llama.cpp's CPU backend computes a gated DeltaNet
// layer with its fused gated_delta_net op: beta's sigmoid and the decay g, the convolution
// (convolve) and its SiLU, q and k to unit length as its L2 norm (an RMSNorm with eps/n, then
// 1/sqrt(n)), the value heads in parallel (deltaJob), then each head's RMSNorm times silu(z).
func (o HostOps) GatedDeltaNet(l *device.DeltaNetLayer, st, snap *device.DeltaNetState, qkv, z, beta, g []float32, T int, conv, out []float32) {
	ch, hv, n := l.Channels(), l.VHeads, l.HeadDim
	for t := 0; t < T; t++ {
		bt, gt := beta[t*hv:(t+1)*hv], g[t*hv:(t+1)*hv]
		for h := range bt {
			bt[h] = Sigmoid(bt[h])
			gt[h] = softplus(gt[h]+l.DtBias[h]) * l.A[h]
		}
	}
	convolve(l, st, snap, qkv, conv, T)
	for t := 0; t < T; t++ {
		SiLU(conv[t*ch:(t+1)*ch], conv[t*ch:(t+1)*ch])
	}
	eps, inv := l.Eps/float32(n), 1/float32(math.Sqrt(float64(n)))
	for t := 0; t < T; t++ {
		qk := conv[t*ch : t*ch+2*l.KHeads*n]
		for i := 0; i < len(qk); i += n {
			h := qk[i : i+n]
			RMSNorm(h, h, Norm{}, eps)
			for j := range h {
				h[j] *= inv
			}
		}
	}
	j := deltaJobPool.Get().(*deltaJob)
	j.l, j.st, j.snap, j.conv, j.beta, j.g, j.out, j.T = l, st, snap, conv, beta, g, out, T
	o.K.Parallel(hv, j.run)
	*j = deltaJob{run: j.run}
	deltaJobPool.Put(j)
	norm := Norm{Weight: l.NormW, Bias: l.NormB}
	for t := 0; t < T; t++ {
		for h := 0; h < hv; h++ {
			oh, zh := out[(t*hv+h)*n:][:n], z[(t*hv+h)*n:][:n]
			RMSNorm(oh, oh, norm, l.Eps)
			SiLU(zh, zh)
			for i := range oh {
				oh[i] *= zh[i]
			}
		}
	}
}

// convolve writes the causal convolution of the T rows of qkv, after the state's last
// ConvK-1 rows, to conv, and moves the state (and snap's, to the input before its last
// token) on. Each output is ggml_ssm_conv's sum, tap by tap in float32, contracted to fused
// multiply-adds.
func convolve(l *device.DeltaNetLayer, st, snap *device.DeltaNetState, qkv, conv []float32, T int) {
	convolveOut(l, st.Conv, qkv, conv, T)
	ch, K := l.Channels(), l.ConvK
	// in returns input j of channel c: the state's K-1 rows, then qkv's.
	in := func(c, j int) float32 {
		if j < K-1 {
			return st.Conv[c*(K-1)+j]
		}
		return qkv[(j-(K-1))*ch+c]
	}
	// The last K-1 inputs before position end (a snapshot's, then the new state's).
	keep := func(dst []float32, end int) {
		for c := 0; c < ch; c++ {
			for j := 0; j < K-1; j++ {
				dst[c*(K-1)+j] = in(c, end+j)
			}
		}
	}
	if snap != nil {
		keep(snap.Conv, T-1)
	}
	if T >= K-1 {
		keep(st.Conv, T)
		return
	}
	// Fewer new rows than the state holds: shift the old ones down, in place (value by value:
	// a copy call per channel cost a decoded token more than its sums).
	for c := 0; c < ch; c++ {
		row := st.Conv[c*(K-1) : (c+1)*(K-1)]
		for j := 0; j < K-1-T; j++ {
			row[j] = row[j+T]
		}
		for j := K - 1 - T; j < K-1; j++ {
			row[j] = qkv[(j-(K-1-T))*ch+c]
		}
	}
}

// convolveOutGo is convolveOut output by output: channel c's taps are l.Conv[c*K:], its
// inputs the state's K-1 values (state[c*(K-1):], oldest first), then qkv's rows.
func convolveOutGo(l *device.DeltaNetLayer, state, qkv, conv []float32, T int) {
	ch, K := l.Channels(), l.ConvK
	for t := 0; t < T; t++ {
		for c := 0; c < ch; c++ {
			w := l.Conv[c*K : (c+1)*K]
			var sum float32
			for k := 0; k < K; k++ {
				var x float32
				if j := t + k; j < K-1 {
					x = state[c*(K-1)+j]
				} else {
					x = qkv[(j-(K-1))*ch+c]
				}
				sum = fma32(x, w[k], sum)
			}
			conv[t*ch+c] = sum
		}
	}
}

// deltaJob is one GatedDeltaNet's recurrence, one value head per call of run.
type deltaJob struct {
	l                  *device.DeltaNetLayer
	st, snap           *device.DeltaNetState
	conv, beta, g, out []float32
	T                  int
	run                func(h int) // bound once, so that passing it allocates nothing
}

var deltaJobPool = sync.Pool{New: func() any {
	j := new(deltaJob)
	j.run = j.head
	return j
}}

// head runs value head h over the job's tokens: ggml's gated_delta_net on the CPU, with the
// state kept transposed (row j of M is column j of S) and its sums as ggml_vec_dot_f32's.
func (j *deltaJob) head(h int) {
	l := j.l
	n, ch, hv := l.HeadDim, l.Channels(), l.VHeads
	kh := h % l.KHeads
	M := j.st.S[h*n*n : (h+1)*n*n]
	scale := 1 / float32(math.Sqrt(float64(n)))
	for t := 0; t < j.T; t++ {
		row := j.conv[t*ch : (t+1)*ch]
		q := row[kh*n : (kh+1)*n]
		k := row[(l.KHeads+kh)*n : (l.KHeads+kh+1)*n]
		v := row[(2*l.KHeads+h)*n : (2*l.KHeads+h+1)*n]
		deltaStep(M, k, q, v, j.out[(t*hv+h)*n:][:n], expf(j.g[t*hv+h]), j.beta[t*hv+h], scale)
		if j.snap != nil && t == j.T-2 {
			copy(j.snap.S[h*n*n:(h+1)*n*n], M)
		}
	}
}

// softplus is ggml's: x above 20, else log(1 + e^x).
func softplus(x float32) float32 {
	if x > 20 {
		return x
	}
	return logf(1 + expf(x))
}

// SiLU writes silu(x) to dst (which may be x) as ggml_vec_silu_f32: 16-wide vectors, then
// the scalar SiLU for the rest.
func SiLU(dst, x []float32) {
	n := len(x)
	dst = dst[:n]
	nv := n &^ 15
	siluBlocks(dst[:nv], x[:nv])
	for i := nv; i < n; i++ {
		dst[i] = siluScalar(x[i])
	}
}
