package models

import (
	"math"
	"runtime"
	"sync"

	"github.com/commit-run/commit-run/device"
)

// The host's attention (HostOps.Attend) takes the (head, token) pairs of a pass in groups
// of up to three queries of one KV head (the heads that share it, the tokens of a prefill):
// their scores read each key once for the group, and MLA's weighted sums each latent row
// (attn_std.go, attn_mla.go). The groups are split into chunks of equal work, one per
// thread: under a causal mask token t of a pass sees pos0+t+1 positions, so equal numbers
// of pairs would leave the first threads idle in a prefill. Groups run KV head by KV head,
// so that a thread walks the same cache for consecutive tokens; a one-token pass scores a
// few positions at a time across all its groups, and a prefill copies each KV head's keys
// into rows of their own (see decode and copyKeys). Scratch comes from a pool, so that
// attention allocates nothing per token once warm.

// attnGroupMax is the most queries a group holds (the shared-key kernels take 2 or 3).
const attnGroupMax = 3

// attnGroup is a group of queries of one KV head.
type attnGroup struct {
	nq  int
	kvh int
	h   [attnGroupMax]int       // the queries' heads
	q   [attnGroupMax][]float32 // the queries
	n   [attnGroupMax]int       // their positions, in order
	out [attnGroupMax][]float32 // where their attention goes
}

// attnScratch is one worker's scratch memory.
type attnScratch struct {
	gs    []attnGroup // the groups at hand: a one-token pass's chunk, or one
	q     []float32   // the groups' queries, rounded to F16 with an F16 cache
	w     []float32   // their scores, then probabilities, zero-padded to a multiple of 64
	o     []float32   // their outputs of MLA's weighted sums
	acc   []float32   // the lane-major accumulators of MLA's weighted sum
	row32 []float32   // a value row copied with its padding (wsumTransposed)
	row16 []uint16
	keys  device.KVLayer // one KV head's keys, copied into rows of their own (prefill)
	kfrom int            // the position of the first of them
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

// groups returns n groups of scratch.
func (s *attnScratch) groups(n int) []attnGroup {
	if cap(s.gs) < n {
		s.gs = make([]attnGroup, n)
	}
	s.gs = s.gs[:n]
	return s.gs
}

// clearRefs drops the groups' references to the pass's memory before s goes back to the
// pool.
func (s *attnScratch) clearRefs() {
	for k := range s.gs {
		g := &s.gs[k]
		for i := range g.q {
			g.q[i], g.out[i] = nil, nil
		}
	}
}

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

// queries copies the nq queries of the groups gs into scratch, dk values each, rounded to
// F16 with an F16 cache (as llama.cpp's matmuls against F16 K round their other operand).
func (s *attnScratch) queries(c *device.KVLayer, gs []attnGroup, nq int) []float32 {
	dk := len(gs[0].q[0])
	q := grow(&s.q, nq*dk)
	i := 0
	for k := range gs {
		for _, qi := range gs[k].q[:gs[k].nq] {
			copy(q[i*dk:(i+1)*dk], qi)
			i++
		}
	}
	if c.F16 {
		roundF16(q)
	}
	return q
}

// attnSpan is where a group's positions from from on are: position p's score at index
// p-from of its query's scores, its key and value at slot p-from+at of the cache (at: the
// cache's RingSlot(from), or from of a cache of every position; for a copy of one KV head's
// keys, where the copy begins).
type attnSpan struct{ from, at int }

// slot returns the slot of position p.
func (sp attnSpan) slot(p int) int { return p - sp.from + sp.at }

// scores writes the scores times scale of group g's queries q (dk values each) against the
// keys at kOff of positions [p0, p1) to w[i*ws+p-sp.from] for query i, for the positions
// each query sees; the positions all of them see are scored together.
func scores(c *device.KVLayer, g *attnGroup, q []float32, w []float32, ws, kOff int, sp attnSpan, p0, p1 int, scale float32) {
	nq, dk := g.nq, len(g.q[0])
	shared := min(g.n[0], p1) // positions every query sees, the group's being in order
	if shared > p0 {
		k := kOff + sp.slot(p0)*c.KDim
		if c.F16 {
			dotsMultiF16(w[p0-sp.from:], ws, q, dk, nq, dk, c.K16[k:], c.KDim, shared-p0, scale)
		} else {
			dotsMultiF32(w[p0-sp.from:], ws, q, dk, nq, dk, c.K[k:], c.KDim, shared-p0, scale)
		}
	}
	for i := 1; i < nq; i++ {
		from, to := max(p0, shared), min(p1, g.n[i])
		if to <= from {
			continue
		}
		wi, k := w[i*ws+from-sp.from:i*ws+to-sp.from], kOff+sp.slot(from)*c.KDim
		if c.F16 {
			dotsF16(wi, q[i*dk:(i+1)*dk], c.K16[k:], c.KDim, scale)
		} else {
			dotsF32(wi, q[i*dk:(i+1)*dk], c.K[k:], c.KDim, scale)
		}
	}
}

// softmaxes turns the scores of group g's queries at w[i*ws:], those of positions from..
// g.n[i]-1 each, into the probabilities of llama.cpp's soft_max over the padded KV length,
// rounded to F16 values with an F16 cache, and zeros up to ws (a multiple of 64) for the
// weighted sums.
//
// A sliding window masks the positions before it to -Inf, as llama.cpp's mask does, rather
// than leaving them out: the weighted sums then add their zero weights in the same lanes as
// llama.cpp, which walks every cached position. Only the positions from from on (a multiple
// of 64 before which all are masked) are touched: the zeros before them would add nothing
// to the softmax's sums of 16 lanes, nor to the weighted sums (attendValues).
func softmaxes(c *device.KVLayer, w []float32, ws int, g *attnGroup, a *device.AttnShape, from int) {
	for i, ni := range g.n[:g.nq] {
		wi, n := w[i*ws:(i+1)*ws], ni-from
		if a.Window > 0 && ni > a.Window {
			for p := 0; p < ni-a.Window-from; p++ {
				wi[p] = float32(math.Inf(-1))
			}
		}
		if a.Sinks != nil {
			softmaxSink(wi[:n], a.Sinks[g.h[i]])
		} else {
			softmaxBlocks(wi, n)
		}
		if c.F16 {
			roundF16(wi[:n])
		}
		clear(wi[n:])
	}
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

// fill sets g to group u's queries.
func (j *attnJob) fill(g *attnGroup, u int) {
	a := &j.a
	group, qd := a.Heads/a.KVHeads, a.Heads*a.DK
	P, G := j.pairs()
	first := attnGroupMax * (u % G)
	g.kvh, g.nq = u/G, min(attnGroupMax, P-first)
	for k := 0; k < g.nq; k++ {
		i := first + k
		t, h := i/group, g.kvh*group+i%group
		g.h[k] = h
		g.q[k] = j.q[t*qd+h*a.DK : t*qd+(h+1)*a.DK]
		g.n[k] = j.pos0 + t + 1
		g.out[k] = j.out[(t*a.Heads+h)*a.DV : (t*a.Heads+h+1)*a.DV]
	}
}

// kOff is the offset of group g's keys in a cached row.
func (j *attnJob) kOff(g *attnGroup) int {
	if j.a.Latent {
		return 0
	}
	return g.kvh * j.a.KHeadStride
}

// values computes group g's weighted sums from its probabilities, query i's at w[i*ws:].
func (j *attnJob) values(s *attnScratch, g *attnGroup, w []float32, ws, from int) {
	if j.a.Latent {
		attendLatentValues(s, j.c, g, w, ws, j.T > 1)
		return
	}
	attendValues(s, j.c, g, w, ws, g.kvh, &j.a, j.T > 1, from)
}

// chunk computes the groups of chunk c.
func (j *attnJob) chunk(c int) {
	s := attnScratchPool.Get().(*attnScratch)
	lo, hi := j.start(c), j.start(c+1)
	if j.T == 1 {
		j.decode(s, lo, hi)
	} else {
		gs := s.groups(1)
		g := &gs[0]
		keys := -1 // the KV head whose keys s.keys holds
		for u := lo; u < hi; u++ {
			j.fill(g, u)
			from := windowStart(&j.a, g.n[0]) // the group's first query sees the fewest
			if g.kvh != keys && !j.a.Latent {
				j.copyKeys(s, g.kvh, from, hi)
				keys = g.kvh
			}
			ws := (g.n[g.nq-1] - from + 63) &^ 63
			w := growCap(&s.w, g.nq*ws, attnGroupMax*((kvPositions(j.c)+63)&^63))
			q := s.queries(j.c, gs, g.nq)
			kc, sp := &s.keys, attnSpan{from, from - s.kfrom}
			if j.a.Latent { // MLA's keys are whole cached rows, read in place
				kc, sp = j.c, attnSpan{from, j.c.RingSlot(from)}
			}
			scores(kc, g, q, w, ws, 0, sp, from, g.n[g.nq-1], j.a.Scale)
			softmaxes(j.c, w, ws, g, &j.a, from)
			j.values(s, g, w, ws, from)
		}
	}
	s.clearRefs()
	attnScratchPool.Put(s)
}

// copyKeys copies KV head kvh's keys of the positions from from on that its groups before
// group hi see into s.keys, a row of DK keys per position: a cached row holds every KV
// head's keys, so one head's keys are a strided walk that misses the TLB at every position,
// for every group of a prefill that reads them again.
func (j *attnJob) copyKeys(s *attnScratch, kvh, from, hi int) {
	P, G := j.pairs()
	last := min(hi, (kvh+1)*G) - 1                    // the KV head's last group in the chunk
	end := min(P, attnGroupMax*(last%G)+attnGroupMax) // and the pair after its last
	t := (end - 1) / (j.a.Heads / j.a.KVHeads)        // whose token sees the most
	n, dk, c := j.pos0+t+1-from, j.a.DK, j.c
	k := &s.keys
	k.KDim, k.F16, s.kfrom = dk, c.F16, from
	off := kvh*j.a.KHeadStride + c.RingSlot(from)*c.KDim
	if c.F16 {
		k.K16 = growCap(&k.K16, n*dk, kvPositions(c)*dk)
		for p := 0; p < n; p++ {
			copy(k.K16[p*dk:(p+1)*dk], c.K16[p*c.KDim+off:])
		}
		return
	}
	k.K = growCap(&k.K, n*dk, kvPositions(c)*dk)
	for p := 0; p < n; p++ {
		copy(k.K[p*dk:(p+1)*dk], c.K[p*c.KDim+off:])
	}
}

// windowStart is where the scores and sums of queries that see n positions or more begin: a
// sliding window's positions before it weigh nothing, and whole blocks of 64 of them are
// neither scored nor summed (softmaxes, attendValues).
func windowStart(a *device.AttnShape, n int) int {
	if a.Window <= 0 || n <= a.Window || a.Latent {
		return 0
	}
	return (n - a.Window) &^ 63
}

// attnBlock is how many positions a one-token pass scores across all the groups of a chunk
// before the next positions.
const attnBlock = 16

// decode computes the groups [lo, hi) of a one-token pass. Their scores go attnBlock
// positions at a time across all the groups: a cached row holds every KV head's keys, so
// one head's keys are a strided walk that misses the TLB at every position, and walking the
// heads over the same few rows in turn reads them while they are at hand (2.2x on the scores
// of 16 heads of 128 at 2048 positions).
func (j *attnJob) decode(s *attnScratch, lo, hi int) {
	gs := s.groups(hi - lo)
	nq := 0
	for k := range gs {
		j.fill(&gs[k], lo+k)
		nq += gs[k].nq
	}
	n := j.pos0 + 1
	from := windowStart(&j.a, n)
	ws := (n - from + 63) &^ 63
	w := growCap(&s.w, nq*ws, j.a.Heads*((kvPositions(j.c)+63)&^63))
	q := s.queries(j.c, gs, nq)
	dk := j.a.DK
	sp := attnSpan{from, j.c.RingSlot(from)}
	for p0 := from; p0 < n; p0 += attnBlock {
		i := 0
		for k := range gs {
			scores(j.c, &gs[k], q[i*dk:], w[i*ws:], ws, j.kOff(&gs[k]), sp, p0, min(p0+attnBlock, n), j.a.Scale)
			i += gs[k].nq
		}
	}
	i := 0
	for k := range gs {
		g := &gs[k]
		softmaxes(j.c, w[i*ws:], ws, g, &j.a, from)
		j.values(s, g, w[i*ws:], ws, from)
		i += g.nq
	}
}
