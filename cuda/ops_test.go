package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// TestGPUParamRing sums with mixing weights from the host far beyond the parameter ring's
// megabyte, its halves taken in turn: every sum reads its own weights.
func TestGPUParamRing(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	const k, d, rounds = 4000, 32, 150 // 16 KB of weights a round, 2.4 MB in all
	ys := deviceFloats(t, g, k*d, slices.Repeat([]float32{1}, k*d))
	out := deviceFloats(t, g, rounds*d, nil)
	w := make([]float32, k)
	for i := 0; i < rounds; i++ {
		var sum float32
		for j := range w {
			w[j] = float32((i + j) % 7) // small integers: the sums are exact
			sum += w[j]
		}
		g.Combine(out[i*d:(i+1)*d], ys, w, []int32{0, k}, d)
		want := slices.Repeat([]float32{sum}, d)
		if i%50 == 0 || i == rounds-1 {
			checkBits(t, "sum", hostFloats(g, out[i*d:(i+1)*d]), want)
		}
	}
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	if !g.ringUsed[0] || !g.ringUsed[1] {
		t.Errorf("the ring's halves used: %v", g.ringUsed)
	}
}

// TestGPUStepCapture captures a step of operations and replays it at other positions and
// tokens; an operation a graph cannot hold fails the capture and leaves the GPU working.
func TestGPUStepCapture(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	r := rand.New(rand.NewPCG(7, 7))
	const rows, d = 16, 32
	table := randF32(r, rows*d, 1)
	wf := deviceFloats(t, g, rows*d, table)
	emb := quant.Matrix{Type: quant.F32, Rows: rows, Cols: d, Data: floatBytes(wf)}
	dst := deviceFloats(t, g, d, nil)

	// A step of one embedding lookup: its token comes from the step's inputs.
	if err := g.BeginStep([]int32{3}, 5); err != nil {
		t.Fatal(err)
	}
	g.Embed(dst, emb, []int32{3})
	step, err := g.EndStep()
	if err != nil {
		t.Fatal(err)
	}
	defer g.ReleaseStep(step)
	for _, tok := range []int32{7, 0, 15} {
		if err := g.Replay(step, []int32{tok}, 9); err != nil {
			t.Fatal(err)
		}
		checkBits(t, "row", hostFloats(g, dst), table[int(tok)*d:int(tok+1)*d])
	}
	if err := g.Replay(step, []int32{1, 2}, 9); err == nil {
		t.Error("a replay with two tokens of a step captured with one")
	}
	if s := g.Stats(); s.GraphLaunches != 3 || s.Kernels < 3 {
		t.Errorf("after 3 replays: %+v", s)
	}

	// A read the host waits for cannot be captured: EndStep fails, nothing ran, the GPU goes on.
	if err := g.BeginStep([]int32{1}, 0); err != nil {
		t.Fatal(err)
	}
	g.Embed(dst, emb, []int32{1})
	g.Read(make([]float32, d), dst)
	if _, err := g.EndStep(); err == nil || !strings.Contains(err.Error(), "cannot be captured") {
		t.Errorf("EndStep after a read = %v", err)
	}
	if err := g.Err(); err != nil {
		t.Fatalf("a failed capture left the GPU failed: %v", err)
	}
	g.Embed(dst, emb, []int32{2})
	checkBits(t, "row after the failed capture", hostFloats(g, dst), table[2*d:3*d])
}

// TestAttnSplits sizes a decoded token's split attention: about four blocks an SM, chunks of
// at least 32 of the cache's rows, at most 64 blocks a head.
func TestAttnSplits(t *testing.T) {
	for _, c := range []struct{ heads, rows, sms, want int }{
		{16, 4096, 132, 33}, // OLMoE on an H200
		{32, 4096, 132, 17}, // Qwen3-30B-A3B, Mixtral
		{32, 32768, 68, 9},  // on a 2080 Ti
		{4, 64, 128, 2},     // the bundled model's tests: 64 rows
		{16, 8, 132, 1},     // one chunk's rows: attn_f32
		{64, 8192, 8, 1},    // as many heads as a card's blocks
		{1, 1 << 20, 132, 64},
		{0, 4096, 132, 1},
	} {
		if got := attnSplits(c.heads, c.rows, c.sms); got != c.want {
			t.Errorf("attnSplits(%d heads, %d rows, %d SMs) = %d, want %d", c.heads, c.rows, c.sms, got, c.want)
		}
	}
}

// TestGPUAttendSplits runs Attend on the GPU's Ops: a decoded token takes the split kernels
// (two launches) and a prompt's tokens attn_f32 (one), both within float32 rounding of the
// CPU's (HostOps; F16 probabilities may round to a neighbouring half); and a step captured at
// one position replays the split kernels at others with the bits of their eager launches.
// TestGPUAttendFlash checks which kernel GPU.Attend takes for a pass (the tensor-core
// kernels for 32 tokens or more of an F16 cache with heads of 64, 128 or 256, attn_f16kv or
// attn_f32 otherwise), and that each agrees with HostOps within a half's rounding of the
// probabilities.
func TestGPUAttendFlash(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{ProfileKernels: true})
	host := models.HostOps{K: cpu.New(2)}
	r := rand.New(rand.NewPCG(11, 3))
	const rows = 120
	for _, c := range []struct {
		heads, kvHeads, d, pos, T int
		f16                       bool
		window, ring              int
		want                      string
	}{
		{4, 2, 64, 0, 40, true, 0, 0, "attn_fa_f16kv_d64"},
		{2, 1, 128, 50, 70, true, 0, 0, "attn_fa_f16kv_d128"},
		{4, 4, 64, 30, 48, true, 20, 0, "attn_fa_f16kv_d64"},
		{4, 2, 64, 0, 31, true, 0, 0, "attn_f16kv"},  // too few tokens
		{4, 2, 64, 0, 40, false, 0, 0, "attn_f32"},   // an F32 cache
		{2, 1, 32, 10, 40, true, 0, 0, "attn_f16kv"}, // heads of 32
		{4, 2, 64, 60, 40, true, 20, 64, "attn_fa_f16kv_d64"},
		{2, 1, 256, 10, 40, true, 0, 0, "attn_fa_f16kv_d256"},
	} {
		name := fmt.Sprintf("heads=%d/%d,d=%d,pos=%d,T=%d,f16=%v,window=%d,ring=%d", c.heads, c.kvHeads, c.d, c.pos, c.T, c.f16, c.window, c.ring)
		t.Run(name, func(t *testing.T) {
			kd, n := c.kvHeads*c.d, c.pos+c.T
			a := device.AttnShape{Heads: c.heads, KVHeads: c.kvHeads, DK: c.d, DV: c.d, KHeadStride: c.d, VHeadStride: c.d,
				Scale: float32(1 / math.Sqrt(float64(c.d))), Window: c.window}
			slots := rows
			if c.ring > 0 {
				slots = c.ring
			}
			dkv, hkv := kvPair(t, g, slots, rows, kd, c.f16)
			dkv.Ring = c.ring
			kh, vh, qh := randF32(r, n*kd, 1), randF32(r, n*kd, 1), randF32(r, c.T*c.heads*c.d, 1)
			// The positions before the pass that its tokens see (a ring holds no more), then
			// the pass's own, as the engine stores them.
			if from := max(0, n-slots); from < c.pos {
				m := (c.pos - from) * kd
				g.StoreKV(&dkv, from, deviceFloats(t, g, m, kh[from*kd:c.pos*kd]), deviceFloats(t, g, m, vh[from*kd:c.pos*kd]))
			}
			g.StoreKV(&dkv, c.pos, deviceFloats(t, g, c.T*kd, kh[c.pos*kd:]), deviceFloats(t, g, c.T*kd, vh[c.pos*kd:]))
			host.StoreKV(&hkv, 0, kh, vh)
			q, out := deviceFloats(t, g, len(qh), qh), deviceFloats(t, g, len(qh), nil)
			before := kernelCalls(g)
			g.Attend(out, q, &dkv, c.pos, c.T, &a)
			got := hostFloats(g, out)
			if err := g.Err(); err != nil {
				t.Fatal(err)
			}
			after := kernelCalls(g)
			if after[c.want]-before[c.want] != 1 {
				t.Errorf("the pass launched %v, want %s", diffCalls(before, after), c.want)
			}
			want := make([]float32, len(got))
			host.Attend(want, qh, &hkv, c.pos, c.T, &a)
			tol := 1e-5
			if c.f16 {
				tol = 2e-3 // a probability's half, one ulp (2^-11) off
			}
			for i := range got {
				if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
					t.Fatalf("out[%d] = %v, the CPU's %v", i, got[i], want[i])
				}
			}
		})
	}
}

// kvPair returns an empty KV cache of slots rows on g and one of rows rows on the host, of kd
// values a row, F16 or F32.
func kvPair(t *testing.T, g *GPU, slots, rows, kd int, f16 bool) (dev, host device.KVLayer) {
	dev, host = device.KVLayer{KDim: kd, VDim: kd, F16: f16}, device.KVLayer{KDim: kd, VDim: kd, F16: f16}
	if !f16 {
		dev.K, dev.V = deviceFloats(t, g, slots*kd, nil), deviceFloats(t, g, slots*kd, nil)
		host.K, host.V = make([]float32, rows*kd), make([]float32, rows*kd)
		return dev, host
	}
	half := func() []uint16 {
		b := deviceFloats(t, g, slots*kd/2, nil)
		return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), slots*kd)
	}
	dev.K16, dev.V16 = half(), half()
	host.K16, host.V16 = make([]uint16, rows*kd), make([]uint16, rows*kd)
	return dev, host
}

// kernelCalls is g's kernel profile as calls by name.
func kernelCalls(g *GPU) map[string]int64 {
	m := map[string]int64{}
	for _, k := range g.KernelProfile() {
		m[k.Name] = k.Calls
	}
	return m
}

// diffCalls lists the kernels that ran between two kernelCalls.
func diffCalls(before, after map[string]int64) []string {
	var ran []string
	for n, c := range after {
		if c > before[n] {
			ran = append(ran, fmt.Sprintf("%s x%d", n, c-before[n]))
		}
	}
	slices.Sort(ran)
	return ran
}

func TestGPUAttendSplits(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	host := models.HostOps{K: cpu.New(2)}
	r := rand.New(rand.NewPCG(9, 9))
	const heads, kvHeads, dk, rows = 4, 2, 32, 100
	kd := kvHeads * dk
	a := device.AttnShape{Heads: heads, KVHeads: kvHeads, DK: dk, DV: dk, KHeadStride: dk, VHeadStride: dk, Scale: float32(1 / math.Sqrt(dk))}
	for _, f16 := range []bool{false, true} {
		t.Run(fmt.Sprintf("f16=%v", f16), func(t *testing.T) {
			kh, vh, qh := randF32(r, rows*kd, 1), randF32(r, rows*kd, 1), randF32(r, 2*heads*dk, 1)
			dkv, hkv := kvPair(t, g, rows, rows, kd, f16)
			g.StoreKV(&dkv, 0, deviceFloats(t, g, rows*kd, kh), deviceFloats(t, g, rows*kd, vh))
			host.StoreKV(&hkv, 0, kh, vh)
			q, out := deviceFloats(t, g, 2*heads*dk, qh), deviceFloats(t, g, 2*heads*dk, nil)
			tol := 1e-5
			if f16 {
				tol = 2e-3 // a probability's half, one ulp (2^-11) off
			}
			attend := func(pos, T, launches int) []float32 {
				t.Helper()
				before := g.Stats().Kernels
				g.Attend(out[:T*heads*dk], q[:T*heads*dk], &dkv, pos, T, &a)
				if n := g.Stats().Kernels - before; n != int64(launches) {
					t.Errorf("%d tokens at %d: %d kernels, want %d", T, pos, n, launches)
				}
				got := hostFloats(g, out[:T*heads*dk])
				want := make([]float32, len(got))
				host.Attend(want, qh[:T*heads*dk], &hkv, pos, T, &a)
				for i := range got {
					if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
						t.Fatalf("%d tokens at %d: out[%d] = %v, the CPU's %v", T, pos, i, got[i], want[i])
					}
				}
				return got
			}
			eager := map[int][]float32{}
			for _, pos := range []int{0, 17, 60, 99} {
				eager[pos] = attend(pos, 1, 2)
			}
			attend(40, 2, 1)

			if err := g.BeginStep([]int32{0}, 17); err != nil {
				t.Fatal(err)
			}
			g.Attend(out[:heads*dk], q[:heads*dk], &dkv, 17, 1, &a)
			step, err := g.EndStep()
			if err != nil {
				t.Fatal(err)
			}
			defer g.ReleaseStep(step)
			for _, pos := range []int{60, 0, 99} {
				if err := g.Replay(step, []int32{0}, pos); err != nil {
					t.Fatal(err)
				}
				checkBits(t, fmt.Sprintf("replayed at %d", pos), hostFloats(g, out[:heads*dk]), eager[pos])
			}
			if err := g.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMoEDownBlocks: every moe_down launch moeLaunches plans, for every choice of warps a row
// and up to routeMaxUsed experts a token, with and without a shared expert, takes a block
// within moeDownMaxThreads (which TestPTXAssembles holds the kernels' registers to), and the
// shared expert takes a launch of its own only where the joined block would not fit: at eight
// warps a row of integer products, not for float ones, whose rows keep a warp.
func TestMoEDownBlocks(t *testing.T) {
	threads := func(b Dim3) int { return b.X * b.Y * b.Z }
	for _, w := range RowWarpsChoices {
		for k := 1; k <= routeMaxUsed; k++ {
			// The routed experts' launch and the shared expert's alone, and the joined one
			// where moeDownSplit keeps it.
			_, routed := moeDownDims(2048, 1, k, true, false, w)
			_, shared := moeDownDims(2048, 1, k, false, true, w)
			blocks := []Dim3{routed, shared}
			if !moeDownSplit(k, w) {
				_, joined := moeDownDims(2048, 1, k, true, true, w)
				blocks = append(blocks, joined)
			}
			for _, b := range blocks {
				if n := threads(b); n > maxBlockThreads("moe_down_q4_K") {
					t.Errorf("%d warps a row, %d experts: a block %+v of %d threads, more than %d", w, k, b, n, moeDownMaxThreads)
				}
			}
		}
	}
	if !moeDownSplit(8, 8) || moeDownSplit(8, 4) || moeDownSplit(8, 1) {
		t.Errorf("moeDownSplit(8 experts): %v at 8 warps a row, %v at 4, %v at 1; want only at 8",
			moeDownSplit(8, 8), moeDownSplit(8, 4), moeDownSplit(8, 1))
	}
	experts := func(typ quant.Type) device.ExpertMatrices {
		m := func(rows, cols int) quant.Matrix { return quant.Matrix{Type: typ, Rows: rows, Cols: cols} }
		return device.ExpertMatrices{Gate: m(512, 256), Up: m(512, 256), Down: m(256, 512)}
	}
	for _, c := range []struct {
		typ         quant.Type
		warps, want int // moe_down launches
	}{{quant.Q8_0, 8, 2}, {quant.Q8_0, 4, 1}, {quant.Q4_K, 8, 2}, {quant.F16, 8, 1}} {
		e := experts(c.typ)
		_, down, err := moeLaunches(e, &e, 8, c.warps)
		if err != nil {
			t.Fatal(err)
		}
		if len(down) != c.want {
			t.Errorf("%s experts and shared expert, %d warps a row: %d moe_down launches, want %d", c.typ, c.warps, len(down), c.want)
		}
	}
}

// TestFlashKernel: which flash kernel a pass takes, and its grid, from the heads, the cache's
// layout and alignment (flashKernel), where GPU.Attend's other tests cannot reach each
// condition.
func TestFlashKernel(t *testing.T) {
	std := func(heads, kvHeads, dk, dv int) (device.KVLayer, device.AttnShape) {
		return device.KVLayer{KDim: kvHeads * dk, VDim: kvHeads * dv, F16: true},
			device.AttnShape{Heads: heads, KVHeads: kvHeads, DK: dk, DV: dv, KHeadStride: dk, VHeadStride: dv}
	}
	latent := func(heads int) (device.KVLayer, device.AttnShape) {
		return device.KVLayer{KDim: 576, F16: true}, device.AttnShape{Heads: heads, KVHeads: 1, DK: 576, DV: 512, Latent: true}
	}
	const kp, vp = DevicePtr(0x10000), DevicePtr(0x20000)
	for _, c := range []struct {
		name      string
		T         int
		kp, vp    DevicePtr // 0: kp, vp
		vstride   int       // 0: kv.VDim
		want      string
		wantGrid  Dim3
		transform func(*device.KVLayer, *device.AttnShape)
	}{
		{name: "qwen3", T: 100, want: "attn_fa_f16kv_d128", wantGrid: Dim3{X: 2, Y: 32}},
		{name: "qwen3,T=31", T: 31},
		{name: "qwen3,f32", T: 100, transform: func(kv *device.KVLayer, _ *device.AttnShape) { kv.F16 = false }},
		// A ring must hold a pass's window and its tokens: 29 + 100 - 1 positions.
		{name: "qwen3,ring", T: 100, want: "attn_fa_f16kv_d128", wantGrid: Dim3{X: 2, Y: 32},
			transform: func(kv *device.KVLayer, a *device.AttnShape) { kv.Ring, a.Window = 128, 29 }},
		{name: "qwen3,short_ring", T: 100, transform: func(kv *device.KVLayer, a *device.AttnShape) { kv.Ring, a.Window = 128, 30 }},
		{name: "qwen3,misaligned", T: 100, kp: kp + 8},
		{name: "d256", T: 40, want: "attn_fa_f16kv_d256", wantGrid: Dim3{X: 2, Y: 32},
			transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = std(32, 4, 256, 256) }},
		{name: "dsv2-legacy", T: 100, want: "attn_fa_f16kv_d192v128", wantGrid: Dim3{X: 2, Y: 16},
			transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = std(16, 16, 192, 128) }},
		{name: "dk192,dv192", T: 100, transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = std(16, 16, 192, 192) }},
		{name: "dsv2-latent", T: 100, vp: kp, vstride: 576, want: "attn_fa_f16kv_latent576", wantGrid: Dim3{X: 100, Y: 1},
			transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = latent(16) }},
		{name: "latent,5_heads", T: 33, vp: kp, vstride: 576, want: "attn_fa_f16kv_latent576", wantGrid: Dim3{X: 11, Y: 1},
			transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = latent(5) }},
		{name: "latent,values_apart", T: 100, vstride: 576,
			transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = latent(16) }},
		{name: "latent,two_kv_heads", T: 100, vp: kp, vstride: 576,
			transform: func(kv *device.KVLayer, a *device.AttnShape) { *kv, *a = latent(16); a.KVHeads = 2 }},
		{name: "latent,rank_256", T: 100, vp: kp, vstride: 320,
			transform: func(kv *device.KVLayer, a *device.AttnShape) {
				*kv, *a = latent(16)
				kv.KDim, a.DK, a.DV = 320, 320, 256
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			kv, a := std(32, 4, 128, 128)
			if c.transform != nil {
				c.transform(&kv, &a)
			}
			k, v := kp, vp
			if c.kp != 0 {
				k = c.kp
			}
			if c.vp != 0 {
				v = c.vp
			}
			vs := kv.VDim
			if c.vstride != 0 {
				vs = c.vstride
			}
			name, grid := flashKernel(c.T, &kv, k, v, vs, &a)
			if name != c.want || c.want != "" && grid != c.wantGrid {
				t.Errorf("flashKernel = %q, grid %+v; want %q, grid %+v", name, grid, c.want, c.wantGrid)
			}
		})
	}
}
