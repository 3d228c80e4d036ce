package models

import (
	"runtime"
	"sync"

	"github.com/commit-run/commit-run/device"
)

// The host's attention (HostOps.Attend) computes each (head, token) pair on its own: scores,
// softmax and weighted sum, with the kernels of attn_kernels.go. The pairs are split into
// chunks of equal work, one per thread: under a causal mask token t of a pass sees pos0+t+1
// positions, so equal numbers of pairs would leave the first threads idle in a prefill.
// Pairs run head by head, so that a thread walks the same KV head's cache for consecutive
// tokens. Scratch comes from a pool, so that attention allocates nothing per token once warm.

// attnScratch is one worker's scratch memory.
type attnScratch struct {
	q     []float32 // the query rounded to F16 (F16 caches)
	w     []float32 // the scores, then the probabilities, zero-padded to a multiple of 64
	acc   []float32 // the lane-major accumulators of MLA's weighted sum
	row32 []float32 // a value row copied with its padding (wsumTransposed)
	row16 []uint16
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

// grow returns (*b)[:n], reallocating *b when it is shorter.
func grow[E float32 | uint16](b *[]E, n int) []E { return growCap(b, n, n) }

// growCap is grow that reallocates to room for c (at least n), so that a buffer sized for
// the whole cache grows once.
func growCap[E float32 | uint16](b *[]E, n, c int) []E {
	if cap(*b) < n {
		*b = make([]E, max(n, c))
	}
	*b = (*b)[:n]
	return *b
}

// probs returns the attention probabilities of query q against the keys at kOff of each of
// the first n cached positions: the scores times scale, their softmax over the padded KV
// length, rounded to F16 values with an F16 cache, and zeros up to a multiple of 64. With an
// F16 cache q is rounded to F16 first (in scratch; q is left alone).
func (s *attnScratch) probs(c *device.KVLayer, q []float32, kOff, n int, scale float32) []float32 {
	pad := (n + 63) &^ 63
	w := growCap(&s.w, pad, (kvPositions(c)+63)&^63)
	if c.F16 {
		qr := grow(&s.q, len(q))
		copy(qr, q)
		roundF16(qr)
		dotsF16(w[:n], qr, c.K16[kOff:], c.KDim, scale)
	} else {
		dotsF32(w[:n], q, c.K[kOff:], c.KDim, scale)
	}
	softmaxBlocks(w, n)
	if c.F16 {
		roundF16(w[:n])
	}
	clear(w[n:])
	return w
}

// attnJob is one Attend call, shared by its chunks.
type attnJob struct {
	out, q  []float32
	c       *device.KVLayer
	a       device.AttnShape
	pos0, T int
	chunks  int
	run     func(chunk int) // chunk, bound once so that passing it allocates nothing
}

var attnJobPool = sync.Pool{New: func() any {
	j := new(attnJob)
	j.run = j.chunk
	return j
}}

// attnPairCost is the work of a (head, token) pair besides its positions', in positions:
// the query's rounding, the softmax and the reduction of every value's lanes.
const attnPairCost = 64

// Attend implements device.Ops: softmax(scale * q·K) · V for every head of every token over
// its causal prefix of the cache, which holds keys in rows and values transposed (see
// putV), or for MLA's absorbed form (a.Latent) the latent rows alone.
func (o HostOps) Attend(out, q []float32, c *device.KVLayer, pos0, T int, a *device.AttnShape) {
	if T <= 0 || a.Heads <= 0 {
		return
	}
	j := attnJobPool.Get().(*attnJob)
	j.out, j.q, j.c, j.a, j.pos0, j.T = out, q, c, *a, pos0, T
	j.chunks = min(T*a.Heads, attnThreads(o.K))
	o.K.Parallel(j.chunks, j.run)
	j.out, j.q, j.c = nil, nil, nil
	attnJobPool.Put(j)
}

// attnThreads is the number of threads k computes with: its own count where it tells it
// (cpu.Device), else GOMAXPROCS. More chunks than threads would do no harm: every chunk
// has the same work.
func attnThreads(k device.Kernels) int {
	if t, ok := k.(interface{ Threads() int }); ok && t.Threads() > 0 {
		return t.Threads()
	}
	return runtime.GOMAXPROCS(0)
}

// start returns the first pair of chunk c, pairs being numbered h*T+t: chunk c begins at the
// first pair whose work before it reaches c/chunks of the whole.
func (j *attnJob) start(c int) int {
	if c >= j.chunks {
		return j.a.Heads * j.T
	}
	b, T := int64(j.pos0+1+attnPairCost), int64(j.T)
	before := func(t int64) int64 { return t*b + t*(t-1)/2 } // a head's work before token t
	perHead := before(T)
	target := perHead * int64(j.a.Heads) * int64(c) / int64(j.chunks)
	h := target / perHead
	rem := target - h*perHead
	lo, hi := int64(0), T // the first t with before(t) >= rem
	for lo < hi {
		mid := (lo + hi) / 2
		if before(mid) >= rem {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return int(h*T + lo)
}

// chunk computes the pairs of chunk c.
func (j *attnJob) chunk(c int) {
	s := attnScratchPool.Get().(*attnScratch)
	a := &j.a
	group, qd := a.Heads/a.KVHeads, a.Heads*a.DK
	batched := j.T > 1
	for p, end := j.start(c), j.start(c+1); p < end; p++ {
		h, t := p/j.T, p%j.T
		n := j.pos0 + t + 1
		qh := j.q[t*qd+h*a.DK : t*qd+(h+1)*a.DK]
		dst := j.out[(t*a.Heads+h)*a.DV : (t*a.Heads+h+1)*a.DV]
		if a.Latent {
			attendLatent(s, j.c, qh, a, n, batched, dst)
		} else {
			attend(s, j.c, qh, h/group, a, n, batched, dst)
		}
	}
	attnScratchPool.Put(s)
}
