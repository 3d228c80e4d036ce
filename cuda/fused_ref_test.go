package cuda

// Differential tests of kernels/fused.cu: each fused kernel against the unfused kernels whose
// work it does (themselves tested against Go references in kernels_ref_test.go), bit for bit,
// as the fused kernels promise; the routing against the engine's arithmetic in Go.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

func fusedCases() []kernelCase {
	var cs []kernelCase
	add := func(kernel, name string, run func(t *testing.T, k *kernelEnv, r *rand.Rand)) {
		cs = append(cs, kernelCase{kernel, name, run})
	}
	for _, c := range []struct {
		d, rows int
		bias    bool
	}{{128, 1, false}, {300, 3, true}, {4096, 1, true}} {
		add("add_rms_norm_f32", fmt.Sprintf("d=%d,rows=%d,bias=%v", c.d, c.rows, c.bias), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			checkAddNorm(t, k, c.d, c.rows, c.bias, r)
		})
	}
	for _, c := range []ropeKVCase{
		{ntok: 1, heads: 4, kvHeads: 2, dk: 64, dv: 64, nDims: 64, pos0: 9},
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 32, nDims: 32, neox: true, pos0: 2, f16: true}, // partial RoPE
		{ntok: 1, heads: 2, kvHeads: 1, dk: 128, dv: 128, nDims: 128, neox: true, dev: 40, f16: true, yarn: true},
		{ntok: 2, heads: 6, kvHeads: 2, dk: 48, dv: 48, nDims: 48, pos0: 1, dev: 5},
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 64, nDims: 64, pos0: 6, dev: 1, ring: 4, f16: true}, // wraps
		{ntok: 2, heads: 6, kvHeads: 2, dk: 48, dv: 48, nDims: 48, pos0: 9, ring: 5},
		// The q/k norms: OLMoE's over a token's 2048 queries and keys, at the engine's 1024
		// threads; Qwen3's head by head (32 query heads over 8 warps), with biases, and heads
		// shorter than a warp; a row longer than 8 values a thread.
		{ntok: 2, heads: 16, kvHeads: 16, dk: 128, dv: 128, nDims: 128, neox: true, pos0: 3, f16: true, norm: qkFull, threads: 1024},
		{ntok: 2, heads: 32, kvHeads: 4, dk: 128, dv: 128, nDims: 128, neox: true, pos0: 5, dev: 2, f16: true, norm: qkHead, bias: true},
		{ntok: 3, heads: 4, kvHeads: 2, dk: 24, dv: 24, nDims: 16, pos0: 1, norm: qkHead, threads: 1024},
		{ntok: 1, heads: 40, kvHeads: 8, dk: 64, dv: 64, nDims: 64, pos0: 2, norm: qkFull, bias: true},
	} {
		add("rope_kv_f32", c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkRopeKV(t, k, c, r) })
	}
	for _, c := range []struct {
		dim, ntok, pos0, dev, ring int
		f16                        bool
	}{{64, 1, 3, 0, 0, false}, {100, 3, 0, 7, 0, true}, {300, 2, 5, 2, 0, false}, {64, 3, 5, 1, 8, true}, {100, 4, 9, 0, 5, false}} {
		add("kv_store_f32", fmt.Sprintf("dim=%d,ntok=%d,pos0=%d,dev=%d,ring=%d,f16=%v", c.dim, c.ntok, c.pos0, c.dev, c.ring, c.f16), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			src := randF32(r, c.ntok*c.dim, 1)
			pos := c.pos0 + c.dev
			rows := pos + c.ntok + 2
			if c.ring > 0 {
				rows = c.ring + 2
			}
			size := rows * c.dim
			// tok[row] is the token stored there, -1 for none (the rows keep alloc's NaNs).
			tok := make([]int, rows)
			for i := range tok {
				tok[i] = -1
			}
			for t := 0; t < c.ntok; t++ {
				if c.ring > 0 {
					tok[(pos+t)%c.ring] = t
				} else {
					tok[pos+t] = t
				}
			}
			elem := 4
			if c.f16 {
				elem = 2
			}
			dc, ds, posp := k.alloc(t, size*elem), k.putF32(t, src), DevicePtr(0)
			if c.dev != 0 {
				posp = k.put(t, i32bytes([]int32{int32(c.dev)}))
			}
			var args Args
			k.run(t, "kv_store_f32", Dim3{X: 1}, Dim3{X: 256}, args.Ptr(dc).Ptr(ds).Int(b2i(c.f16)).Ptr(posp).Int(c.pos0).Int(c.dim).Int(c.ntok).Int(c.ring))
			got := k.get(t, dc, size*elem)
			for i := 0; i < size; i++ {
				tk := tok[i/c.dim]
				in := tk >= 0
				j := tk*c.dim + i%c.dim // the source value, where in
				if c.f16 {
					h := u16sOf(got)[i]
					if in && h != quant.FP32ToFP16(src[j]) || !in && h != 0xffff {
						t.Fatalf("half %d = %#x", i, h)
					}
				} else {
					v := f32sOf(got)[i]
					if in && math.Float32bits(v) != math.Float32bits(src[j]) || !in && !math.IsNaN(float64(v)) {
						t.Fatalf("float %d = %v", i, v)
					}
				}
			}
		})
	}
	for _, c := range []routeCase{
		{n: 16, k: 4, ntok: 1, gating: 0, shared: true, d: 128},
		{n: 60, k: 4, ntok: 3, gating: 0, normalize: true, d: 64},
		{n: 64, k: 8, ntok: 2, gating: 1, bias: true, normalize: true, scale: 2.5, d: 300},
		{n: 8, k: 2, ntok: 2, gating: 2, normalize: true, shared: true, d: 64},
		{n: 512, k: 16, ntok: 1, gating: 0, d: 32},
		{n: 37, k: 3, ntok: 1, gating: 0, nan: true, d: 32},
		// Group-limited (DeepSeek-V3's, GLM's with groups): 8 groups of 8, 4 used, sigmoid
		// with a bias; 4 groups of 4, 1 used, where every choice lies in one group.
		{n: 64, k: 6, ntok: 2, gating: 1, bias: true, normalize: true, scale: 2.5, d: 32, groups: 8, groupsUsed: 4},
		{n: 16, k: 3, ntok: 3, gating: 0, d: 32, groups: 4, groupsUsed: 1},
		{n: 16, k: 4, ntok: 2, gating: 0, normalize: true, shared: true, sigmoid: true, d: 128},
	} {
		add("moe_route_f32", c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkRoute(t, k, c, r) })
	}
	for _, typ := range mmvTypes {
		sfx, _ := fusedSuffix(typ)
		cols := mmvCols(typ)
		// The widest float rows take the vector path, the narrowest (odd) the scalar one.
		narrow, wide := cols[0], cols[min(1, len(cols)-1)]
		if typ.BlockSize() == 1 {
			wide = 64
		}
		_, integer := mmvqKernels[typ]
		for _, q := range []bool{false, true}[:1+b2i(integer)] {
			add("mmv3_"+sfx, fmt.Sprintf("rows=5,3,9,cols=%d,ntok=1,quantized=%v", wide, q), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				checkMMV3(t, k, typ, []int{5, 3, 9}, wide, 1, q, 1, r)
			})
			add("mmv3_"+sfx, fmt.Sprintf("rows=6,cols=%d,ntok=2,quantized=%v", narrow, q), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				checkMMV3(t, k, typ, []int{6}, narrow, 2, q, 1, r)
			})
		}
		if integer {
			// A row over several warps (GPUOptions.RowWarps), against mmvq with as many.
			add("mmv3_"+sfx, fmt.Sprintf("rows=5,3,cols=%d,ntok=2,quantized=true,warps=4", wide), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				checkMMV3(t, k, typ, []int{5, 3}, wide, 2, true, 4, r)
			})
		}
		// Another type for the ups, the downs and the shared expert, at a width both take.
		other := mmvTypes[1+(slices.Index(mmvTypes, typ)+5)%(len(mmvTypes)-1)] // F32 (0) stands for typ in moeCase
		for _, c := range []moeCase{
			{typ: typ, experts: 5, k: 2, ntok: 2, d: wide, ff: wide, shared: true, gated: true},
			{typ: typ, experts: 3, k: 3, ntok: 1, d: narrow, ff: wide},
			{typ: typ, experts: 4, k: 1, ntok: 1, d: wide, ff: narrow, shared: true},
			{typ: typ, experts: 4, k: 2, ntok: 2, d: 256, ff: 256, shared: true, gated: true, up: other, shTyp: other},
			{typ: typ, experts: 5, k: 2, ntok: 2, d: wide, ff: wide, biased: true},
			// More experts a token than moe_down has warps: some warps take two.
			{typ: typ, experts: 12, k: 10, ntok: 2, d: narrow, ff: narrow, shared: true, gated: true},
		} {
			for _, q := range []bool{false, true}[:1+b2i(integer)] {
				c.quantized = q
				add("moe_up_"+sfx, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMoE(t, k, c, r, true) })
				add("moe_down_"+sfx, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMoE(t, k, c, r, false) })
			}
		}
		if !integer {
			continue
		}
		// Rows over several warps: moe_down's groups take several rounds (k over its groups),
		// a shared expert's group waits with them, another type's launch keeps a warp a row;
		// at eight warps a row the shared expert takes a launch of its own (moeDownSplit).
		for _, c := range []moeCase{
			{typ: typ, experts: 6, k: 5, ntok: 2, d: narrow, ff: narrow, shared: true, gated: true, warps: 4},
			{typ: typ, experts: 5, k: 3, ntok: 2, d: narrow, ff: narrow, shared: true, gated: true, warps: 8},
			{typ: typ, experts: 4, k: 2, ntok: 1, d: 256, ff: 256, shared: true, up: other, shTyp: other, warps: 2},
			{typ: typ, experts: 3, k: 3, ntok: 1, d: narrow, ff: narrow, biased: true, warps: 8},
		} {
			c.quantized = true
			add("moe_up_"+sfx, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMoE(t, k, c, r, true) })
			add("moe_down_"+sfx, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMoE(t, k, c, r, false) })
		}
	}
	return cs
}

// checkAddNorm: add_rms_norm_f32 against add_f32 then rms_norm_f32.
func checkAddNorm(t *testing.T, k *kernelEnv, d, rows int, bias bool, r *rand.Rand) {
	x, a, w := randF32(r, rows*d, 1), randF32(r, rows*d, 1), randUniform(r, d, 0.5, 1.5)
	var b []float32
	if bias {
		b = randF32(r, d, 0.1)
	}
	dw, db := k.putF32(t, w), DevicePtr(0)
	if bias {
		db = k.putF32(t, b)
	}
	// Fused.
	dx, da, dd := k.putF32(t, x), k.putF32(t, a), k.alloc(t, 4*rows*d)
	var args Args
	k.run(t, "add_rms_norm_f32", Dim3{X: rows}, Dim3{X: 256}, args.Ptr(dx).Ptr(da).Ptr(dd).Ptr(dw).Ptr(db).Int(d).Float(1e-6))
	// Unfused.
	rx, ra, rd := k.putF32(t, x), k.putF32(t, a), k.alloc(t, 4*rows*d)
	k.run(t, "add_f32", Dim3{X: ceilDiv(rows*d, 256)}, Dim3{X: 256}, args.Reset().Ptr(rx).Ptr(ra).Int(rows*d))
	k.run(t, "rms_norm_f32", Dim3{X: rows}, Dim3{X: 256}, args.Reset().Ptr(rd).Ptr(rx).Ptr(dw).Ptr(db).Int(d).Float(1e-6))
	checkBits(t, "x", k.getF32(t, dx, rows*d), k.getF32(t, rx, rows*d))
	checkBits(t, "dst", k.getF32(t, dd, rows*d), k.getF32(t, rd, rows*d))
}

type ropeKVCase struct {
	ntok, heads, kvHeads, dk, dv, nDims int
	neox, f16, yarn                     bool
	pos0, dev                           int // positions pos0 + dev + t, dev from device memory
	ring                                int // the cache is a ring of this many rows (0: none)
	// norm: the q/k norms first, over a token's every head (qkFull, OLMoE's) or head by
	// head (qkHead, Qwen3's); threads: the block (0: 256); bias: the norms have biases.
	norm, threads int
	bias          bool
}

// The q/k norms of ropeKVCase.
const (
	qkNone = iota
	qkFull
	qkHead
)

func (c ropeKVCase) String() string {
	s := fmt.Sprintf("ntok=%d,heads=%d/%d,dk=%d,dv=%d,n_dims=%d,neox=%v,f16=%v,yarn=%v,pos0=%d,dev=%d,ring=%d",
		c.ntok, c.heads, c.kvHeads, c.dk, c.dv, c.nDims, c.neox, c.f16, c.yarn, c.pos0, c.dev, c.ring)
	if c.norm != qkNone {
		s += fmt.Sprintf(",norm=%s,bias=%v", [...]string{"", "full", "head"}[c.norm], c.bias)
	}
	if c.threads != 0 {
		s += fmt.Sprintf(",threads=%d", c.threads)
	}
	return s
}

// checkRopeKV: rope_kv_f32 against rms_norm_f32 on the queries and on the keys (with
// c.norm), rope_f32 on both, then kv_store_f32 of the keys and the values.
func checkRopeKV(t *testing.T, k *kernelEnv, c ropeKVCase, r *rand.Rand) {
	qd, kd, vd := c.heads*c.dk, c.kvHeads*c.dk, c.kvHeads*c.dv
	q, kk, v := randF32(r, c.ntok*qd, 1), randF32(r, c.ntok*kd, 1), randF32(r, c.ntok*vd, 1)
	qdim, kdim := 0, 0
	switch c.norm {
	case qkFull:
		qdim, kdim = qd, kd
	case qkHead:
		qdim, kdim = c.dk, c.dk
	}
	var qnw, qnb, knw, knb DevicePtr
	if c.norm != qkNone {
		qnw, knw = k.putF32(t, randF32(r, qdim, 1)), k.putF32(t, randF32(r, kdim, 1))
		if c.bias {
			qnb, knb = k.putF32(t, randF32(r, qdim, 1)), k.putF32(t, randF32(r, kdim, 1))
		}
	}
	const eps = 1e-6
	npos := c.pos0 + c.dev + c.ntok + 2
	elem := 4
	if c.f16 {
		elem = 2
	}
	posp := DevicePtr(0)
	if c.dev != 0 {
		posp = k.put(t, i32bytes([]int32{int32(c.dev)}))
	}
	thetaScale := float32(math.Pow(10000, float64(-2/float32(c.nDims))))
	freqScale, ext, mscale, lo, hi := float32(1), float32(0), float32(1), float32(0), float32(0)
	if c.yarn {
		freqScale, ext, lo, hi = 0.25, 1, 2, 11
		mscale = quant.FMA32(float32(math.Log(4)), 0.1, 1)
	}
	rope := func(a *Args) *Args {
		return a.Int(c.nDims).Int(b2i(c.neox)).Float(thetaScale).Float(freqScale).Float(ext).Float(mscale).Float(lo).Float(hi).Ptr(0)
	}
	// Fused.
	dq, dk, dv := k.putF32(t, q), k.putF32(t, kk), k.putF32(t, v)
	kc, vc := k.alloc(t, npos*kd*elem), k.alloc(t, npos*vd*elem)
	var args Args
	threads := c.threads
	if threads == 0 {
		threads = 256
	}
	k.run(t, "rope_kv_f32", Dim3{X: c.ntok}, Dim3{X: threads}, rope(args.Ptr(dq).Ptr(dk).Ptr(dv).Ptr(kc).Ptr(vc).Int(b2i(c.f16)).Ptr(posp).
		Int(c.pos0).Int(c.ntok).Int(c.heads).Int(c.kvHeads).Int(c.dk).Int(c.dv)).Int(c.ring).
		Ptr(qnw).Ptr(qnb).Int(qdim).Ptr(knw).Ptr(knb).Int(kdim).Float(eps))
	// Unfused.
	rq, rk, rv := k.putF32(t, q), k.putF32(t, kk), k.putF32(t, v)
	rkc, rvc := k.alloc(t, npos*kd*elem), k.alloc(t, npos*vd*elem)
	if c.norm != qkNone {
		k.run(t, "rms_norm_f32", Dim3{X: c.ntok * qd / qdim}, Dim3{X: 256}, args.Reset().Ptr(rq).Ptr(rq).Ptr(qnw).Ptr(qnb).Int(qdim).Float(eps))
		k.run(t, "rms_norm_f32", Dim3{X: c.ntok * kd / kdim}, Dim3{X: 256}, args.Reset().Ptr(rk).Ptr(rk).Ptr(knw).Ptr(knb).Int(kdim).Float(eps))
		// The keys rope_kv_f32 leaves in place: normalised, not rotated.
		kk = k.getF32(t, rk, len(kk))
	}
	block := Dim3{X: min(max((c.nDims/2+31)&^31, 32), 1024)}
	k.run(t, "rope_f32", Dim3{X: c.ntok}, block, rope(args.Reset().Ptr(rq).Ptr(posp).Int(c.pos0).Int(c.ntok).Int(c.heads).Int(c.dk).Int(qd)))
	k.run(t, "rope_f32", Dim3{X: c.ntok}, block, rope(args.Reset().Ptr(rk).Ptr(posp).Int(c.pos0).Int(c.ntok).Int(c.kvHeads).Int(c.dk).Int(kd)))
	k.run(t, "kv_store_f32", Dim3{X: 2}, Dim3{X: 256}, args.Reset().Ptr(rkc).Ptr(rk).Int(b2i(c.f16)).Ptr(posp).Int(c.pos0).Int(kd).Int(c.ntok).Int(c.ring))
	k.run(t, "kv_store_f32", Dim3{X: 2}, Dim3{X: 256}, args.Reset().Ptr(rvc).Ptr(rv).Int(b2i(c.f16)).Ptr(posp).Int(c.pos0).Int(vd).Int(c.ntok).Int(c.ring))
	checkBits(t, "q", k.getF32(t, dq, len(q)), k.getF32(t, rq, len(q)))
	checkBits(t, "k (unchanged)", k.getF32(t, dk, len(kk)), kk)
	if got, want := k.get(t, kc, npos*kd*elem), k.get(t, rkc, npos*kd*elem); !slices.Equal(got, want) {
		t.Errorf("the key caches differ")
	}
	if got, want := k.get(t, vc, npos*vd*elem), k.get(t, rvc, npos*vd*elem); !slices.Equal(got, want) {
		t.Errorf("the value caches differ")
	}
}

type routeCase struct {
	n, k, ntok, gating, d int
	bias, normalize, nan  bool
	shared                bool
	scale                 float32
	groups, groupsUsed    int
	sigmoid               bool // the shared expert's gate is a sigmoid (Qwen3.5)
}

func (c routeCase) String() string {
	s := fmt.Sprintf("n=%d,k=%d,ntok=%d,gating=%d,bias=%v,normalize=%v,scale=%g,shared=%v,nan=%v", c.n, c.k, c.ntok, c.gating, c.bias, c.normalize, c.scale, c.shared, c.nan)
	if c.groups > 1 {
		s += fmt.Sprintf(",groups=%d/%d", c.groupsUsed, c.groups)
	}
	if c.sigmoid {
		s += ",sigmoid"
	}
	return s
}

// checkRoute: moe_route_f32 against the engine's routing (engine/moe.go's route) written with
// the CPU's Softmax and Sigmoid and the router tests' top-k and gate weights, to the bit (the
// group-limited choice models.MoE.Choose's); the shared expert's gate against gated_add_f32.
func checkRoute(t *testing.T, k *kernelEnv, c routeCase, r *rand.Rand) {
	logits := randF32(r, c.ntok*c.n, 3)
	if c.nan {
		logits[3], logits[10] = float32(math.NaN()), float32(math.NaN())
	}
	var bias []float32
	dbias := DevicePtr(0)
	if c.bias {
		bias = randF32(r, c.n, 0.5)
		dbias = k.putF32(t, bias)
	}
	x, gw := randF32(r, c.ntok*c.d, 1), randF32(r, c.d, 0.2)
	dl, dids, dw := k.putF32(t, logits), k.alloc(t, 4*c.ntok*c.k), k.alloc(t, 4*c.ntok*c.k)
	dgw, dx, dsg := DevicePtr(0), k.putF32(t, x), k.alloc(t, 4*c.ntok)
	if c.shared {
		dgw = k.putF32(t, gw)
	}
	var args Args
	k.run(t, "moe_route_f32", Dim3{X: c.ntok}, Dim3{X: 256}, args.Ptr(dl).Int(c.n).Int(c.k).Int(c.ntok).Int(c.gating).Ptr(dbias).
		Int(b2i(c.normalize)).Float(c.scale).Ptr(dids).Ptr(dw).Ptr(dgw).Ptr(dx).Int(c.d).Ptr(dsg).Int(c.groups).Int(c.groupsUsed).Int(b2i(c.sigmoid)))
	ids, w := i32sOf(k.get(t, dids, 4*c.ntok*c.k)), k.getF32(t, dw, c.ntok*c.k)
	for tk := 0; tk < c.ntok; tk++ {
		p := slices.Clone(logits[tk*c.n : (tk+1)*c.n])
		switch c.gating {
		case 0:
			models.Softmax(p)
		case 1:
			for i, v := range p {
				p[i] = models.Sigmoid(v)
			}
		}
		wantIDs, _ := topkRef(p, bias, c.k)
		if c.groups > 1 {
			wantIDs = groupedRef(p, bias, c.k, c.groups, c.groupsUsed)
		}
		wantW := make([]float32, c.k)
		for j, e := range wantIDs {
			wantW[j] = p[e]
		}
		gateWeightsRef(wantW, c.gating == 2, c.normalize, c.scale)
		if got := ids[tk*c.k : (tk+1)*c.k]; !slices.Equal(got, wantIDs) {
			t.Errorf("token %d: experts %v, want %v", tk, got, wantIDs)
		}
		checkBits(t, fmt.Sprintf("token %d's weights", tk), w[tk*c.k:(tk+1)*c.k], wantW)
	}
	if !c.shared {
		return
	}
	// gated_add_f32 adds gate*1 to 0: the gate itself.
	out, ones := k.putF32(t, make([]float32, c.ntok*c.d)), k.putF32(t, slices.Repeat([]float32{1}, c.ntok*c.d))
	k.run(t, "gated_add_f32", Dim3{X: c.ntok}, Dim3{X: 256}, args.Reset().Ptr(out).Ptr(ones).Ptr(dx).Ptr(dgw).Int(c.d).Int(b2i(c.sigmoid)))
	gates := k.getF32(t, out, c.ntok*c.d)
	want := make([]float32, c.ntok)
	for tk := range want {
		want[tk] = gates[tk*c.d]
	}
	checkBits(t, "shared gates", k.getF32(t, dsg, c.ntok), want)
}

// checkMMV3: mmv3 against mmv (mmvq, with warps warps a row) and add_rows_f32 of each product.
func checkMMV3(t *testing.T, k *kernelEnv, typ quant.Type, rows []int, cols, ntok int, quantize bool, warps int, r *rand.Rand) {
	sfx, _ := fusedSuffix(typ)
	x := randF32(r, ntok*cols, 1)
	dx := k.putF32(t, x)
	xq := k.quantized(t, dx, ntok, cols, typ, quantize)
	var w, y, ref, b [3]DevicePtr
	var rs [3]int
	var args Args
	maxRows := 0
	for i, n := range rows {
		m := randMatrix(t, typ, n, cols, r)
		w[i], y[i], ref[i], rs[i] = k.put(t, m.Data), k.alloc(t, 4*ntok*n), k.alloc(t, 4*ntok*n), n
		if i != 1 { // the second product has no bias
			b[i] = k.putF32(t, randF32(r, n, 1))
		}
		maxRows = max(maxRows, n)
		for tk := 0; tk < ntok; tk++ {
			k.product(t, typ, w[i], dx.Add(int64(4*tk*cols)), xq, tk, ref[i].Add(int64(4*tk*n)), n, cols, warps)
		}
		if b[i] != 0 {
			k.run(t, "add_rows_f32", Dim3{X: ceilDiv(ntok*n, 256)}, Dim3{X: 256}, args.Reset().Ptr(ref[i]).Ptr(b[i]).Int(ntok*n).Int(n))
		}
	}
	gx, block := rowDims(maxRows, 1)
	if xq.q != 0 {
		gx, block = rowDims(maxRows, warps)
	}
	k.run(t, "mmv3_"+sfx, Dim3{X: gx, Z: len(rows)}, block,
		args.Reset().Ptr(w[0]).Ptr(w[1]).Ptr(w[2]).Ptr(y[0]).Ptr(y[1]).Ptr(y[2]).Ptr(b[0]).Ptr(b[1]).Ptr(b[2]).
			Int(rs[0]).Int(rs[1]).Int(rs[2]).Ptr(dx).Int(cols).Int(ntok).Ptr(xq.q).Ptr(xq.d).Ptr(xq.s))
	for i, n := range rows {
		checkBits(t, fmt.Sprintf("product %d", i), k.getF32(t, y[i], ntok*n), k.getF32(t, ref[i], ntok*n))
	}
}

type moeCase struct {
	typ                     quant.Type
	experts, k, ntok, d, ff int
	shared, gated           bool
	// The up matrices', the down matrices' and the shared expert's types where they are not
	// typ: the launches moe_up takes with modes 1 and 2, and moe_down's with acc.
	up, down, shTyp quant.Type
	// quantized gives the products their input quantized: the integer products.
	quantized bool
	// biased gives the routed experts gpt-oss's biases and activation.
	biased bool
	// warps is the warps a row of the integer products (GPUOptions.RowWarps; 0 is 1).
	warps int
}

func (c moeCase) String() string {
	s := fmt.Sprintf("experts=%d,k=%d,ntok=%d,d=%d,ff=%d,shared=%v,gated=%v", c.experts, c.k, c.ntok, c.d, c.ff, c.shared, c.gated)
	for _, o := range []struct {
		name string
		t    quant.Type
	}{{"up", c.up}, {"down", c.down}, {"shared_type", c.shTyp}} {
		if o.t != 0 && o.t != c.typ {
			s += fmt.Sprintf(",%s=%s", o.name, o.t)
		}
	}
	if c.biased {
		s += ",biased"
	}
	if c.warps > 1 {
		s += fmt.Sprintf(",warps=%d", c.warps)
	}
	return s + fmt.Sprintf(",quantized=%v", c.quantized)
}

// checkMoE: moe_up (up) or moe_down (!up) of a layer's experts, found through a table by the
// ids of the routing, against the unfused kernels: mmv (or on quantized inputs mmvq) of each
// expert's gate and up, then swiglu_f32; of each down, combine_off_f32, and the shared
// expert's down product added as gated_add_f32 (with the gate given) or add_f32 would. Where
// the types differ the fused kernels take the launches PrepareMoE plans (moeLaunches). A
// biased case's experts add their biases to each product (add_rows_f32) and take
// swiglu_oai_f32 for their activation, as the engine's host-routed path computes gpt-oss's.
func checkMoE(t *testing.T, k *kernelEnv, c moeCase, r *rand.Rand, up bool) {
	for _, p := range []*quant.Type{&c.up, &c.down, &c.shTyp} {
		if *p == 0 {
			*p = c.typ
		}
	}
	sfx := func(typ quant.Type) string { s, _ := fusedSuffix(typ); return s }
	var tab []uint64
	var gates, ups, downs []DevicePtr
	var gbs, ubs, dbs []DevicePtr     // a biased case's experts' biases
	for e := 0; e <= c.experts; e++ { // the last is the shared expert
		gt, ut, dt := c.typ, c.up, c.down
		if e == c.experts {
			gt, ut, dt = c.shTyp, c.shTyp, c.shTyp
		}
		g, u, d := randMatrix(t, gt, c.ff, c.d, r), randMatrix(t, ut, c.ff, c.d, r), randMatrix(t, dt, c.d, c.ff, r)
		gates, ups, downs = append(gates, k.put(t, g.Data)), append(ups, k.put(t, u.Data)), append(downs, k.put(t, d.Data))
		var gb, ub, db DevicePtr
		if c.biased {
			// Large enough to take gates and ups past the limit.
			gb, ub, db = k.putF32(t, randF32(r, c.ff, 6)), k.putF32(t, randF32(r, c.ff, 6)), k.putF32(t, randF32(r, c.d, 1))
		}
		gbs, ubs, dbs = append(gbs, gb), append(ubs, ub), append(dbs, db)
		tab = append(tab, uint64(gates[e]), uint64(ups[e]), uint64(downs[e]), uint64(gb), uint64(ub), uint64(db))
	}
	tab = tab[:moeTabStride*c.experts]
	ids := make([]int32, c.ntok*c.k)
	for tk := 0; tk < c.ntok; tk++ {
		perm := r.Perm(c.experts)
		for j := 0; j < c.k; j++ {
			ids[tk*c.k+j] = int32(perm[j])
		}
	}
	sh := c.experts
	dtab := k.put(t, u64bytes(tab))
	dids := k.put(t, i32bytes(ids))
	var sg, su, sd DevicePtr
	if c.shared {
		sg, su, sd = gates[sh], ups[sh], downs[sh]
	}
	var args Args
	warps := max(c.warps, 1)
	// A launch's warps a row, as the GPU chooses them: several only for integer dots.
	warpsOf := func(integer bool) int {
		if integer {
			return warps
		}
		return 1
	}
	const alpha, limit = 1.702, 7
	addBias := func(y, bias DevicePtr, n int) {
		if bias != 0 {
			k.run(t, "add_rows_f32", Dim3{X: ceilDiv(n, 256)}, Dim3{X: 256}, args.Reset().Ptr(y).Ptr(bias).Int(n).Int(n))
		}
	}
	if up {
		x := randF32(r, c.ntok*c.d, 1)
		dx, dg, dsh := k.putF32(t, x), k.alloc(t, 4*c.ntok*c.k*c.ff), k.alloc(t, 4*c.ntok*c.ff)
		xq := func(typ quant.Type) q8 { return k.quantized(t, dx, c.ntok, c.d, typ, c.quantized) }
		launch := func(typ quant.Type, tab, sg, su DevicePtr, entries, mode int) {
			q := xq(typ)
			gx, block := rowDims(c.ff, warpsOf(q.q != 0))
			k.run(t, "moe_up_"+sfx(typ), Dim3{X: gx, Z: entries}, block,
				args.Reset().Ptr(tab).Ptr(dids).Int(c.k).Int(c.ntok).Ptr(dx).Int(c.d).Ptr(dg).Int(c.ff).Ptr(sg).Ptr(su).Ptr(dsh).Int(c.ff).Int(mode).
					Ptr(q.q).Ptr(q.d).Ptr(q.s).Int(b2i(c.biased)).Float(alpha).Float(limit))
		}
		routed := func(tab, sg, su DevicePtr, entries int) {
			if c.up == c.typ {
				launch(c.typ, tab, sg, su, entries, 0)
			} else {
				launch(c.typ, tab, sg, su, entries, 1)
				launch(c.up, tab, sg, su, entries, 2)
			}
		}
		switch {
		case !c.shared:
			routed(dtab, 0, 0, c.ntok*c.k)
		case c.shTyp == c.typ && c.up == c.typ:
			routed(dtab, sg, su, c.ntok*c.k+c.ntok)
		default:
			routed(dtab, 0, 0, c.ntok*c.k)
			launch(c.shTyp, 0, sg, su, c.ntok, 0)
		}
		got := k.getF32(t, dg, c.ntok*c.k*c.ff)
		var gotSh []float32
		if c.shared {
			gotSh = k.getF32(t, dsh, c.ntok*c.ff)
		}
		for tk := 0; tk < c.ntok; tk++ {
			xt := dx.Add(int64(4 * tk * c.d))
			one := func(gt, ut quant.Type, g, u DevicePtr, e int32) []float32 {
				rg, ru := k.alloc(t, 4*c.ff), k.alloc(t, 4*c.ff)
				k.product(t, gt, g, xt, xq(gt), tk, rg, c.ff, c.d, warps)
				k.product(t, ut, u, xt, xq(ut), tk, ru, c.ff, c.d, warps)
				if e >= 0 && c.biased {
					addBias(rg, gbs[e], c.ff)
					addBias(ru, ubs[e], c.ff)
					k.run(t, "swiglu_oai_f32", Dim3{X: ceilDiv(c.ff, 256)}, Dim3{X: 256}, args.Reset().Ptr(rg).Ptr(ru).Int(c.ff).Float(alpha).Float(limit))
				} else {
					k.run(t, "swiglu_f32", Dim3{X: ceilDiv(c.ff, 256)}, Dim3{X: 256}, args.Reset().Ptr(rg).Ptr(ru).Int(c.ff))
				}
				return k.getF32(t, rg, c.ff)
			}
			for j := 0; j < c.k; j++ {
				e := ids[tk*c.k+j]
				z := tk*c.k + j
				checkBits(t, fmt.Sprintf("token %d expert %d", tk, e), got[z*c.ff:(z+1)*c.ff], one(c.typ, c.up, gates[e], ups[e], e))
			}
			if c.shared {
				checkBits(t, fmt.Sprintf("token %d shared", tk), gotSh[tk*c.ff:(tk+1)*c.ff], one(c.shTyp, c.shTyp, sg, su, -1))
			}
		}
		return
	}
	g, shg := randF32(r, c.ntok*c.k*c.ff, 1), randF32(r, c.ntok*c.ff, 1)
	w, gate := randUniform(r, c.ntok*c.k, 0, 1), randF32(r, c.ntok, 1)
	dg, dshg, dw, dgate, dout := k.putF32(t, g), k.putF32(t, shg), k.putF32(t, w), DevicePtr(0), k.alloc(t, 4*c.ntok*c.d)
	if c.gated {
		dgate = k.putF32(t, gate)
	}
	gq := k.quantized(t, dg, c.ntok*c.k, c.ff, c.down, c.quantized)
	hq := k.quantized(t, dshg, c.ntok, c.ff, c.shTyp, c.quantized)
	down := func(typ quant.Type, tab, sd DevicePtr, acc int) {
		grid, block := moeDownDims(c.d, c.ntok, c.k, tab != 0, sd != 0, warpsOf((tab == 0 || gq.q != 0) && (sd == 0 || hq.q != 0)))
		k.run(t, "moe_down_"+sfx(typ), grid, block,
			args.Reset().Ptr(tab).Ptr(dids).Ptr(dw).Int(c.k).Int(c.ntok).Ptr(dg).Int(c.ff).Ptr(dout).Int(c.d).Ptr(sd).Ptr(dshg).Int(c.ff).Ptr(dgate).Int(acc).
				Ptr(gq.q).Ptr(gq.d).Ptr(gq.s).Ptr(hq.q).Ptr(hq.d).Ptr(hq.s))
	}
	if !c.shared || c.shTyp == c.down && !moeDownSplit(c.k, warpsOf(gq.q != 0 && hq.q != 0)) {
		down(c.down, dtab, sd, 0)
	} else {
		down(c.down, dtab, 0, 0)
		down(c.shTyp, 0, sd, 1)
	}
	got := k.getF32(t, dout, c.ntok*c.d)
	for tk := 0; tk < c.ntok; tk++ {
		ys := k.alloc(t, 4*c.k*c.d)
		for j := 0; j < c.k; j++ {
			z := tk*c.k + j
			k.product(t, c.down, downs[ids[z]], dg.Add(int64(4*z*c.ff)), gq, z, ys.Add(int64(4*j*c.d)), c.d, c.ff, warps)
			addBias(ys.Add(int64(4*j*c.d)), dbs[ids[z]], c.d)
		}
		out := k.alloc(t, 4*c.d)
		k.run(t, "combine_off_f32", Dim3{X: ceilDiv(c.d, 256)}, Dim3{X: 256},
			args.Reset().Ptr(out).Ptr(ys).Ptr(k.putF32(t, w[tk*c.k:(tk+1)*c.k])).Ptr(k.put(t, i32bytes([]int32{0, int32(c.k)}))).Ptr(0).Int(0).Int(c.d))
		want := k.getF32(t, out, c.d)
		if c.shared {
			s := k.alloc(t, 4*c.d)
			k.product(t, c.shTyp, sd, dshg.Add(int64(4*tk*c.ff)), hq, tk, s, c.d, c.ff, warps)
			for i, v := range k.getF32(t, s, c.d) {
				if c.gated {
					v = float32(gate[tk] * v)
				}
				want[i] = float32(want[i] + v)
			}
		}
		checkBits(t, fmt.Sprintf("token %d", tk), got[tk*c.d:(tk+1)*c.d], want)
	}
}

// quantized returns rows rows of cols floats at x quantized on the device for the integer
// products of weights of type w (quantize_q8_f32, checked against quant by checkQuantizeQ8), or
// zero planes where w's products are float ones or quant is false.
func (k *kernelEnv) quantized(t testing.TB, x DevicePtr, rows, cols int, w quant.Type, quant bool) q8 {
	kind, block, ok := q8Kind(w)
	if !quant || !ok || cols%block != 0 {
		return q8{}
	}
	nb := rows * cols / block
	a := q8{q: k.alloc(t, rows*cols), d: k.alloc(t, 4*nb), s: k.alloc(t, 4*nb)}
	var args Args
	k.run(t, "quantize_q8_f32", Dim3{X: ceilDiv(nb, 8)}, Dim3{X: 256}, args.Ptr(x).Ptr(a.q).Ptr(a.d).Ptr(a.s).Int(cols).Int(rows).Int(kind))
	return a
}

// product runs the unfused product of rows rows of w (of type typ) with one token's input: mmvq
// on the quantized input xq (row r of its planes) with warps warps a row when it is, else mmv
// on x.
func (k *kernelEnv) product(t *testing.T, typ quant.Type, w, x DevicePtr, xq q8, r int, y DevicePtr, rows, cols, warps int) {
	var args Args
	block, grid := Dim3{X: 32, Y: mmvRowsPerBlock}, Dim3{X: ceilDiv(rows, mmvRowsPerBlock), Y: 1}
	if xq.q != 0 {
		grid.X, block = rowDims(rows, warps)
	}
	if xq.q == 0 {
		k.run(t, mmvKernels[typ], grid, block, args.Ptr(w).Ptr(x).Ptr(y).Int(rows).Int(cols).Int(1))
		return
	}
	_, qb, _ := q8Kind(typ)
	s := DevicePtr(0)
	if xq.s != 0 {
		s = xq.s.Add(int64(4 * r * cols / 32))
	}
	k.run(t, mmvqKernels[typ], grid, block, args.Ptr(w).Ptr(xq.q.Add(int64(r*cols))).Ptr(xq.d.Add(int64(4*r*cols/qb))).Ptr(s).Ptr(y).
		Int(rows).Int(cols).Int(1))
}

func u64bytes(v []uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		for j := 0; j < 8; j++ {
			b[8*i+j] = byte(x >> (8 * j))
		}
	}
	return b
}
