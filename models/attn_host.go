package models

import (
	"runtime"
	"sync"

	"github.com/commit-run/commit-run/device"
)

// The host's attention (HostOps.Attend) takes the (head, token) pairs of a pass in groups
// of up to three queries of one KV head (the heads that share it, the tokens of a prefill):
// their scores read each key once for the group, and MLA's weighted sums each latent row
// (attn_std.go, attn_mla.go). The groups are split into chunks of equal work, one per thread: under a
// causal mask token t of a pass sees pos0+t+1 positions, so equal numbers of pairs would
// leave the first threads idle in a prefill. Groups run KV head by KV head, so that a thread
// walks the same cache for consecutive tokens. Scratch comes from a pool, so that attention
// allocates nothing per token once warm.

// attnGroupMax is the most queries a group holds (the shared-key kernels take 2 or 3).
const attnGroupMax = 3

// attnGroup is a group of queries of one KV head.
type attnGroup struct {
	nq  int
	q   [attnGroupMax][]float32 // the queries
	n   [attnGroupMax]int       // their positions, in order
	out [attnGroupMax][]float32 // where their attention goes
}

// attnScratch is one worker's scratch memory.
type attnScratch struct {
	g     attnGroup
	q     []float32 // the group's queries, rounded to F16 with an F16 cache
	w     []float32 // their scores, then probabilities, zero-padded to a multiple of 64
	o     []float32 // their outputs of MLA's weighted sums
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

// probs computes the attention probabilities of the group's queries against the keys at
// kOff of each cached position: query i's are at w[i*ws:], its n[i] scores times scale,
// their softmax over the padded KV length, rounded to F16 values with an F16 cache, and
// zeros up to ws (a multiple of 64). With an F16 cache the queries are rounded to F16 first
// (in scratch). The positions that all the queries see are scored together.
func (s *attnScratch) probs(c *device.KVLayer, kOff int, scale float32) (w []float32, ws int) {
	g := &s.g
	nq, dk := g.nq, len(g.q[0])
	ws = (g.n[nq-1] + 63) &^ 63
	w = growCap(&s.w, nq*ws, attnGroupMax*((kvPositions(c)+63)&^63))
	q := grow(&s.q, nq*dk)
	for i := 0; i < nq; i++ {
		copy(q[i*dk:(i+1)*dk], g.q[i])
	}
	shared := g.n[0]
	if c.F16 {
		roundF16(q)
		dotsMultiF16(w, ws, q, dk, nq, dk, c.K16[kOff:], c.KDim, shared, scale)
		for i := 1; i < nq; i++ {
			if g.n[i] > shared {
				dotsF16(w[i*ws+shared:i*ws+g.n[i]], q[i*dk:(i+1)*dk], c.K16[kOff+shared*c.KDim:], c.KDim, scale)
			}
		}
	} else {
		dotsMultiF32(w, ws, q, dk, nq, dk, c.K[kOff:], c.KDim, shared, scale)
		for i := 1; i < nq; i++ {
			if g.n[i] > shared {
				dotsF32(w[i*ws+shared:i*ws+g.n[i]], q[i*dk:(i+1)*dk], c.K[kOff+shared*c.KDim:], c.KDim, scale)
			}
		}
	}
	for i := 0; i < nq; i++ {
		wi := w[i*ws : (i+1)*ws]
		softmaxBlocks(wi, g.n[i])
		if c.F16 {
			roundF16(wi[:g.n[i]])
		}
		clear(wi[g.n[i]:])
	}
	return w, ws
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
	if T <= 0 || a.Heads <= 0 || a.KVHeads <= 0 {
		return
	}
	j := attnJobPool.Get().(*attnJob)
	j.out, j.q, j.c, j.a, j.pos0, j.T = out, q, c, *a, pos0, T
	j.chunks = min(j.groups(), attnThreads(o.K))
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

// The pairs of KV head kvh are numbered i < T*group (group: the heads per KV head), token
// i/group of head kvh*group + i%group, and the groups take them three at a time; group u
// of the pass is group u%G of KV head u/G, G groups per KV head.

// pairs returns the number of pairs per KV head and of groups per KV head.
func (j *attnJob) pairs() (P, G int) {
	P = j.T * (j.a.Heads / j.a.KVHeads)
	return P, (P + attnGroupMax - 1) / attnGroupMax
}

// groups returns the number of groups of the pass.
func (j *attnJob) groups() int {
	_, G := j.pairs()
	return j.a.KVHeads * G
}

// work returns the work of a KV head's pairs before pair i: each pair's positions plus
// attnPairCost.
func (j *attnJob) work(i int) int64 {
	group := int64(j.a.Heads / j.a.KVHeads)
	t, r := int64(i)/group, int64(i)%group
	// the sum over pairs i' < i of i'/group
	tokens := group*t*(t-1)/2 + r*t
	return int64(i)*int64(j.pos0+1+attnPairCost) + tokens
}

// start returns the first group of chunk c: chunk c begins at the first group whose work
// before it reaches c/chunks of the whole.
func (j *attnJob) start(c int) int {
	P, G := j.pairs()
	groups := j.a.KVHeads * G
	if c >= j.chunks {
		return groups
	}
	perHead := j.work(P)
	target := perHead * int64(j.a.KVHeads) * int64(c) / int64(j.chunks)
	before := func(u int) int64 { return int64(u/G)*perHead + j.work(min(attnGroupMax*(u%G), P)) }
	lo, hi := 0, groups // the first u with before(u) >= target
	for lo < hi {
		mid := (lo + hi) / 2
		if before(mid) >= target {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// chunk computes the groups of chunk c.
func (j *attnJob) chunk(c int) {
	s := attnScratchPool.Get().(*attnScratch)
	a := &j.a
	group, qd := a.Heads/a.KVHeads, a.Heads*a.DK
	P, G := j.pairs()
	batched := j.T > 1
	for u, end := j.start(c), j.start(c+1); u < end; u++ {
		kvh, first := u/G, attnGroupMax*(u%G)
		g := &s.g
		g.nq = min(attnGroupMax, P-first)
		for k := 0; k < g.nq; k++ {
			i := first + k
			t, h := i/group, kvh*group+i%group
			g.q[k] = j.q[t*qd+h*a.DK : t*qd+(h+1)*a.DK]
			g.n[k] = j.pos0 + t + 1
			g.out[k] = j.out[(t*a.Heads+h)*a.DV : (t*a.Heads+h+1)*a.DV]
		}
		if a.Latent {
			attendLatent(s, j.c, a, batched)
		} else {
			attend(s, j.c, kvh, a, batched)
		}
	}
	g := &s.g
	for k := range g.q {
		g.q[k], g.out[k] = nil, nil
	}
	attnScratchPool.Put(s)
}
