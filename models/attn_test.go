package models

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// The host attention end to end (HostOps.StoreKV and Attend) against the implementation it
// replaced (attn_ref_test.go), bit for bit: one token and batches, F16 and F32 caches, GQA,
// MLA's latent form, caches filled to the last position, several threads.

// testKernels is a device.Kernels whose Parallel spreads the indices over threads
// goroutines in contiguous ranges, as cpu.Device does; with one thread it calls fn on the
// calling goroutine, which allocates nothing.
type testKernels struct{ threads int }

func (testKernels) MatMul(quant.Matrix, []float32, int, []float32)   { panic("not for attention") }
func (testKernels) MatMulID(quant.Matrix, []float32, int, []float32) { panic("not for attention") }
func (k testKernels) Threads() int                                   { return k.threads }

func (k testKernels) Parallel(n int, fn func(int)) {
	if k.threads <= 1 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	w := min(k.threads, n)
	for r := 0; r < w; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := n * r / w; i < n*(r+1)/w; i++ {
				fn(i)
			}
		}()
	}
	wg.Wait()
}

// dimsOnly is an Attention that only has cache dimensions, for NewKVCache.
type dimsOnly struct{ k, v int }

func (c dimsOnly) CacheDims() (int, int)                                      { return c.k, c.v }
func (dimsOnly) Forward(Backend, *LayerCache, []float32, int, int, []float32) {}

// attnCase is one layer's attention and the passes that fill its cache.
type attnCase struct {
	heads, kvHeads, dk, dv int
	latent                 bool // MLA: dk = rank+rope, dv = rank
	size                   int  // cache positions
	passes                 [][2]int
	qScale                 float64 // spread of the queries (large: scores beyond exp's range)
	window                 int     // a sliding window (0: none)
	sinks                  bool    // a sink logit per head
	maxPass                int     // with a window: the cache is a ring for passes of this many tokens
}

func (c attnCase) String() string {
	s := fmt.Sprintf("h%d/%d_dk%d_dv%d_latent%v_size%d_%v_q%g_w%d_sinks%v", c.heads, c.kvHeads, c.dk, c.dv, c.latent, c.size, c.passes, c.qScale, c.window, c.sinks)
	if c.maxPass > 0 {
		s = fmt.Sprintf("ring%d_%s", c.maxPass, s[:min(len(s), 80)])
	}
	return s
}

func (c attnCase) shape() *device.AttnShape {
	a := &device.AttnShape{Heads: c.heads, KVHeads: c.kvHeads, DK: c.dk, DV: c.dv, Scale: 1 / float32(math.Sqrt(float64(c.dk)))}
	if c.latent {
		a.KVHeads, a.Latent = 1, true
	} else {
		a.KHeadStride, a.VHeadStride = c.dk, c.dv
	}
	a.Window = c.window
	if c.sinks {
		// Sinks above, among and below the scores.
		for h := range c.heads {
			a.Sinks = append(a.Sinks, float32(h%3-1)*2.5+0.3)
		}
	}
	return a
}

// attention is an attention with the case's cache: one that takes a ring for a window with
// maxPass, else its dimensions alone.
func (c attnCase) attention() Attention {
	if c.maxPass > 0 {
		return &StdAttention{HeadsKV: c.kvHeads, HeadDK: c.dk, HeadDV: c.dv, Window: c.window}
	}
	kd, vd := c.cacheDims()
	return dimsOnly{kd, vd}
}

func (c attnCase) cacheDims() (int, int) {
	if c.latent {
		return c.dk, 0
	}
	return c.kvHeads * c.dk, c.kvHeads * c.dv
}

func attnCases() []attnCase {
	var cs []attnCase
	passes := [][][2]int{
		{{0, 1}, {1, 1}, {2, 1}},      // decode from the start
		{{0, 5}, {5, 1}, {6, 3}},      // a short prompt, then more
		{{0, 70}, {70, 1}, {71, 17}},  // across a 64-position boundary
		{{0, 129}},                    // one long prompt
		{{0, 33}, {33, 31}, {64, 64}}, // chunks ending on boundaries
	}
	for i, p := range passes {
		last := p[len(p)-1]
		full := last[0] + last[1]
		for _, size := range []int{full, full + 5 + 30*(i%2)} {
			if i == 2 {
				cs = append(cs, attnCase{heads: 2, dk: 576, dv: 512, latent: true, size: size, passes: p, qScale: 1})
			}
			cs = append(cs,
				attnCase{heads: 4, kvHeads: 4, dk: 16, dv: 16, size: size, passes: p, qScale: 1},
				attnCase{heads: 8, kvHeads: 2, dk: 64, dv: 64, size: size, passes: p, qScale: 1},
				attnCase{heads: 4, kvHeads: 2, dk: 128, dv: 128, size: size, passes: p, qScale: 3},
				attnCase{heads: 2, kvHeads: 2, dk: 48, dv: 32, size: size, passes: p, qScale: 1},
				attnCase{heads: 3, kvHeads: 1, dk: 100, dv: 72, size: size, passes: p, qScale: 1},
				attnCase{heads: 4, dk: 144, dv: 128, latent: true, size: size, passes: p, qScale: 1},
				attnCase{heads: 2, dk: 48, dv: 32, latent: true, size: size, passes: p, qScale: 1},
			)
		}
	}
	// gpt-oss's attention: sinks, with and without a sliding window shorter than the passes,
	// across 64-position boundaries.
	for _, p := range passes[1:] {
		for _, w := range []int{0, 4, 40} {
			cs = append(cs, attnCase{heads: 8, kvHeads: 2, dk: 64, dv: 64, size: 140, passes: p, qScale: 1.5, window: w, sinks: true})
		}
		cs = append(cs, attnCase{heads: 3, kvHeads: 1, dk: 100, dv: 72, size: 140, passes: p, qScale: 1, window: 9})
	}
	cs = append(cs, attnCase{heads: 2, kvHeads: 1, dk: 64, dv: 64, size: 300, passes: [][2]int{{0, 150}, {150, 1}, {151, 1}, {152, 100}, {252, 1}},
		qScale: 1, window: 70, sinks: true})
	// A sliding window's ring (RingPeriod), against the reference's cache of every position:
	// passes of up to maxPass tokens, decode steps between them, across the ring's end many
	// times over; windows shorter and longer than 64.
	for _, w := range []struct{ window, maxPass int }{{8, 16}, {70, 16}, {5, 1}} {
		var passes [][2]int
		for pos, i := 0, 0; pos < 700; i++ {
			T := []int{w.maxPass, 1, 1, 7, w.maxPass, 3, 1}[i%7]
			T = min(T, w.maxPass)
			passes = append(passes, [2]int{pos, T})
			pos += T
		}
		cs = append(cs, attnCase{heads: 8, kvHeads: 2, dk: 64, dv: 64, size: 2048, passes: passes, qScale: 1.5, window: w.window, sinks: true, maxPass: w.maxPass},
			attnCase{heads: 3, kvHeads: 1, dk: 100, dv: 72, size: 2048, passes: passes, qScale: 1, window: w.window, maxPass: w.maxPass})
	}
	// Scores far apart: most exponentials underflow (|n| > 192 and below).
	cs = append(cs,
		attnCase{heads: 2, kvHeads: 1, dk: 64, dv: 64, size: 200, passes: [][2]int{{0, 100}, {100, 1}}, qScale: 60},
		attnCase{heads: 2, dk: 144, dv: 128, latent: true, size: 200, passes: [][2]int{{0, 100}, {100, 1}}, qScale: 60})
	return cs
}

// runAttnCase fills both caches pass by pass and compares every pass's output.
func runAttnCase(t *testing.T, c attnCase, f16 bool, threads int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, uint64(c.dk)))
	kd, vd := c.cacheDims()
	kv, err := NewKVCache(&Model{Layers: []Layer{{Attn: c.attention()}}}, KVOptions{Positions: c.size, MaxPass: c.maxPass, F16: f16}, HostAlloc)
	if err != nil {
		t.Fatal(err)
	}
	lc := &kv.Layers[0].KVLayer
	if want := RingPeriod(c.window, c.size, c.maxPass); lc.Ring != want || c.maxPass > 0 && (want == 0 || kvPositions(lc) != 2*want) {
		t.Fatalf("ring of %d slots (%d positions), want %d", lc.Ring, kvPositions(lc), want)
	}
	ref := newRefCache(kd, vd, c.size, f16)
	ops := HostOps{K: testKernels{threads}}
	a := c.shape()
	randn := func(n int, s float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * s)
		}
		return x
	}
	for _, p := range c.passes {
		pos0, T := p[0], p[1]
		k, q := randn(T*kd, 1), randn(T*c.heads*c.dk, c.qScale)
		var v []float32
		if vd > 0 {
			v = randn(T*vd, 1)
		}
		ops.StoreKV(lc, pos0, k, v)
		ref.store(pos0, k, v)
		got := make([]float32, T*c.heads*c.dv)
		want := make([]float32, len(got))
		ops.Attend(got, q, lc, pos0, T, a)
		ref.attendAll(want, q, pos0, T, a)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("pass %v: out[%d] (token %d, head %d, value %d) = %g (%08x), want %g (%08x)", p, i,
					i/(c.heads*c.dv), i/c.dv%c.heads, i%c.dv, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
}

func TestAttendMatchesReference(t *testing.T) {
	cases := attnCases()
	if testing.Short() {
		cases = cases[:len(cases)/3]
	}
	for i, c := range cases {
		for _, f16 := range []bool{true, false} {
			threads := 1 + i%4
			t.Run(fmt.Sprintf("%v/f16=%v/threads=%d", c, f16, threads), func(t *testing.T) {
				runAttnCase(t, c, f16, threads, uint64(i))
			})
		}
	}
}

// TestAttendDecodeAllocs holds decode attention (and its StoreKV) to no allocation once its
// scratch is warm, on a device whose Parallel allocates nothing itself.
func TestAttendDecodeAllocs(t *testing.T) {
	for _, c := range []attnCase{
		{heads: 8, kvHeads: 2, dk: 128, dv: 128, size: 300},
		{heads: 4, dk: 576, dv: 512, latent: true, size: 300},
		{heads: 8, kvHeads: 2, dk: 64, dv: 64, size: 300, window: 70, sinks: true},
		{heads: 8, kvHeads: 2, dk: 64, dv: 64, size: 2048, window: 70, sinks: true, maxPass: 1}, // a ring
	} {
		for _, f16 := range []bool{true, false} {
			kd, vd := c.cacheDims()
			kv, err := NewKVCache(&Model{Layers: []Layer{{Attn: c.attention()}}}, KVOptions{Positions: c.size, MaxPass: c.maxPass, F16: f16}, HostAlloc)
			if err != nil {
				t.Fatal(err)
			}
			lc := &kv.Layers[0].KVLayer
			ops := HostOps{K: testKernels{1}}
			k, q, out := make([]float32, kd), make([]float32, c.heads*c.dk), make([]float32, c.heads*c.dv)
			var v []float32
			if vd > 0 {
				v = make([]float32, vd)
			}
			for i := range q {
				q[i] = float32(i%7) * 0.1
			}
			pos := 0
			a := c.shape()
			step := func() {
				ops.StoreKV(lc, pos, k, v)
				ops.Attend(out, q, lc, pos, 1, a)
				pos = (pos + 1) % c.size
			}
			for i := 0; i < c.size; i++ { // scratch grown to the whole cache
				step()
			}
			if n := testing.AllocsPerRun(100, step); n != 0 {
				t.Errorf("%v f16=%v: %g allocations per decode step", c, f16, n)
			}
		}
	}
}

// TestHostOpsDecodeAllocs holds the other Ops of a decode step that used to allocate (the
// rotation, MLA's per-head products) to no allocation once warm.
func TestHostOpsDecodeAllocs(t *testing.T) {
	ops := HostOps{K: testKernels{1}}
	r := &device.RoPE{Dims: 64, ThetaScale: 0.9, FreqScale: 1, MScale: 1}
	x := make([]float32, 4*128)
	w := make([]quant.Matrix, 4)
	for h := range w {
		w[h] = quant.Matrix{Type: quant.F32, Rows: 8, Cols: 16, Data: make([]byte, 8*16*4)}
	}
	in, out := make([]float32, 4*16), make([]float32, 4*8)
	l := &device.HeadLayout{XTok: 64, XHead: 16, OutTok: 32, OutHead: 8}
	step := func() {
		ops.Rope(x, 7, 1, 4, 128, 512, r)
		ops.MatMulHeads(w, in, 1, out, l)
	}
	step()
	if n := testing.AllocsPerRun(100, step); n != 0 {
		t.Errorf("%g allocations per decode step", n)
	}
}

// TestAttnChunks checks that the chunks of a pass cover its groups in order and split
// their work evenly: no chunk exceeds an even share by more than one group's work.
func TestAttnChunks(t *testing.T) {
	for _, hk := range [][2]int{{1, 1}, {3, 3}, {16, 16}, {8, 2}, {16, 1}} {
		for _, T := range []int{1, 2, 7, 256} {
			for _, pos0 := range []int{0, 5, 1000} {
				for _, chunks := range []int{1, 2, 3, 8} {
					j := &attnJob{a: device.AttnShape{Heads: hk[0], KVHeads: hk[1]}, pos0: pos0, T: T}
					j.chunks = min(chunks, j.groups())
					P, G := j.pairs()
					group := hk[0] / hk[1]
					cost := func(u int) int64 { // the work of group u
						var w int64
						for i := attnGroupMax * (u % G); i < min(attnGroupMax*(u%G+1), P); i++ {
							w += int64(pos0 + i/group + 1 + attnPairCost)
						}
						return w
					}
					var total, most int64
					for u := 0; u < j.groups(); u++ {
						total += cost(u)
						most = max(most, cost(u))
					}
					name := fmt.Sprintf("heads %v T%d pos0 %d chunks %d", hk, T, pos0, j.chunks)
					if j.start(0) != 0 || j.start(j.chunks) != j.groups() {
						t.Fatalf("%s: chunks span [%d, %d) of %d groups", name, j.start(0), j.start(j.chunks), j.groups())
					}
					for c := 0; c < j.chunks; c++ {
						lo, hi := j.start(c), j.start(c+1)
						if hi < lo {
							t.Fatalf("%s: chunk %d is [%d, %d)", name, c, lo, hi)
						}
						var w int64
						for u := lo; u < hi; u++ {
							w += cost(u)
						}
						if limit := total/int64(j.chunks) + most; w > limit {
							t.Errorf("%s: chunk %d has work %d, more than %d", name, c, w, limit)
						}
					}
				}
			}
		}
	}
}

func TestSwiGLUMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, n := range []int{1, 8, 15, 16, 17, 31, 32, 40, 1000, 1024} {
		for _, s := range []float64{1, 10, 200} {
			g, u := make([]float32, n), make([]float32, n)
			for i := range g {
				g[i], u[i] = float32(r.NormFloat64()*s), float32(r.NormFloat64())
			}
			got, want := make([]float32, n), make([]float32, n)
			SwiGLU(got, g, u)
			refSwiGLU(want, g, u)
			for i := range got {
				if !sameFloat(got[i], want[i]) {
					t.Fatalf("n=%d: [%d] silu(%g)*%g = %g, want %g", n, i, g[i], u[i], got[i], want[i])
				}
			}
			SwiGLU(g, g, u) // in place
			for i := range g {
				if !sameFloat(g[i], want[i]) {
					t.Fatalf("n=%d in place: [%d] = %g, want %g", n, i, g[i], want[i])
				}
			}
		}
	}
}

// sameFloat reports whether a and b have the same bits, or are both NaN (whose payloads
// the kernels do not promise).
func sameFloat(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// The benchmarks time one thread; "old" is the implementation this one replaced
// (attn_ref_test.go).

func BenchmarkAttendDecode(b *testing.B) {
	for _, n := range []int{256, 2048} {
		for _, c := range []attnCase{
			{heads: 16, kvHeads: 16, dk: 128, dv: 128},
			{heads: 16, dk: 576, dv: 512, latent: true},
		} {
			c.size = n
			for _, old := range []bool{false, true} {
				name := fmt.Sprintf("%s/n=%d/%s", map[bool]string{false: "std", true: "mla"}[c.latent], n, map[bool]string{false: "new", true: "old"}[old])
				b.Run(name, func(b *testing.B) { benchAttend(b, c, n-1, 1, old) })
			}
		}
	}
}

func BenchmarkAttendPrefill(b *testing.B) {
	for _, T := range []int{256, 1024} {
		c := attnCase{heads: 16, kvHeads: 16, dk: 128, dv: 128, size: T}
		for _, old := range []bool{false, true} {
			if old && T > 256 {
				continue // minutes
			}
			b.Run(fmt.Sprintf("std/T=%d/%s", T, map[bool]string{false: "new", true: "old"}[old]), func(b *testing.B) { benchAttend(b, c, 0, T, old) })
		}
	}
}

// benchAttend times Attend of T tokens at pos0 over an F16 cache on one thread.
func benchAttend(b *testing.B, c attnCase, pos0, T int, old bool) {
	kd, vd := c.cacheDims()
	kv, err := NewKVCache(&Model{Layers: []Layer{{Attn: dimsOnly{kd, vd}}}}, KVOptions{Positions: c.size, F16: true}, HostAlloc)
	if err != nil {
		b.Fatal(err)
	}
	lc := &kv.Layers[0].KVLayer
	ref := newRefCache(kd, vd, c.size, true)
	ops := HostOps{K: testKernels{1}}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	k := fill(c.size * kd)
	var v []float32
	if vd > 0 {
		v = fill(c.size * vd)
	}
	ops.StoreKV(lc, 0, k, v)
	ref.store(0, k, v)
	q, out := fill(T*c.heads*c.dk), make([]float32, T*c.heads*c.dv)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if old {
			ref.attendAll(out, q, pos0, T, c.shape())
		} else {
			ops.Attend(out, q, lc, pos0, T, c.shape())
		}
	}
}

// BenchmarkStoreKV times storing a pass's keys and values (F16, 2048 of each per token).
func BenchmarkStoreKV(b *testing.B) {
	for _, T := range []int{1, 256} {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			kv, err := NewKVCache(&Model{Layers: []Layer{{Attn: dimsOnly{2048, 2048}}}}, KVOptions{Positions: 512, F16: true}, HostAlloc)
			if err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(5, 6))
			k, v := randFloats(r, T*2048, 1, false), randFloats(r, T*2048, 1, false)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				HostOps{}.StoreKV(&kv.Layers[0].KVLayer, 7, k, v)
			}
		})
	}
}

// TestRingReplayedFromStart: a decode step replayed as a graph at position 0 (a one-token
// prompt after a long conversation) starts the ring afresh as Forward's pass would: the next
// pass may run, and no snapshot of the earlier tokens is offered for reuse.
func TestRingReplayedFromStart(t *testing.T) {
	a := &StdAttention{HeadsKV: 1, HeadDK: 8, HeadDV: 8, Window: 8}
	kv, err := NewKVCache(&Model{Layers: []Layer{{Attn: a}}}, KVOptions{Positions: 4096, MaxPass: 16}, HostAlloc)
	if err != nil {
		t.Fatal(err)
	}
	l := &kv.Layers[0]
	if l.Win == nil {
		t.Fatal("no ring")
	}
	ops := HostOps{K: testKernels{1}}
	for pos := 0; pos < 400; pos += 16 { // prompt passes, each leaving a snapshot
		l.Win.wrote(ops, &l.KVLayer, pos, 16)
	}
	kv.Replayed(1) // the step at position 0, replayed
	if err := kv.CheckPass(1, 1); err != nil {
		t.Errorf("after a replayed step at 0: %v", err)
	}
	if q := kv.Resumable(300); q != 1 {
		t.Errorf("Resumable(300) = %d after starting afresh, want 1 (the ring's one token)", q)
	}
}
