package predictor

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func TestForward(t *testing.T) {
	w := []float32{1, 2, 3, 4, 5, 6}
	x := []float32{1, -1, 2}
	tests := []struct {
		name string
		net  Net
		want []float32
	}{
		// [1 2 3; 4 5 6] [1 -1 2] + [0.5 -1] = [5+0.5, 11-1]
		{"linear", Net{In: 3, Out: 2, W1: w, B1: []float32{0.5, -1}}, []float32{5.5, 10}},
		// hidden: relu([5.5, 11-20]) = [5.5, 0]; out: [1 2; -1 3] [5.5 0] + [0 1] = [5.5, -4.5]
		{"mlp", Net{In: 3, Hidden: 2, Out: 2, W1: w, B1: []float32{0.5, -20}, W2: []float32{1, 2, -1, 3}, B2: []float32{0, 1}}, []float32{5.5, -4.5}},
		// both hidden units off: only b2 is left
		{"mlp all off", Net{In: 3, Hidden: 2, Out: 2, W1: w, B1: []float32{-6, -20}, W2: []float32{1, 2, -1, 3}, B2: []float32{0.25, 1}}, []float32{0.25, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := make([]float32, 2)
			tc.net.Forward(x, out, make([]float32, tc.net.Hidden))
			if !slices.Equal(out, tc.want) {
				t.Errorf("Forward = %v, want %v", out, tc.want)
			}
			if got, want := tc.net.Params(), len(tc.net.W1)+len(tc.net.B1)+len(tc.net.W2)+len(tc.net.B2); got != want {
				t.Errorf("Params = %d, want %d", got, want)
			}
		})
	}
}

func testIdentity(m, e, k, d int) Identity {
	return synth{m: m, e: e, k: k, d: d}.identity()
}

func (s synth) identity() Identity { return IdentityOf(s.header()) }

// The warm-started MLP is the linear map it was started from: relu(x) - relu(-x) = x.
func TestWarmStartMLPIsLinear(t *testing.T) {
	const e, d = 5, 7
	rng := rand.New(rand.NewPCG(3, 4))
	init := make([][]float32, 3)
	for j := range init {
		init[j] = make([]float32, e*d)
		for i := range init[j] {
			init[j][i] = float32(rng.NormFloat64())
		}
	}
	r, err := NewRouter(testIdentity(3, e, 2, d), init, 1)
	if err != nil {
		t.Fatal(err)
	}
	for j, n := range r.Nets {
		if want := map[bool]int{true: 2 * d, false: 0}[j == 2]; n.Hidden != want {
			t.Fatalf("net %d: hidden %d, want %d", j, n.Hidden, want)
		}
	}
	params := 2*(e*d+e) + (2*d*d + 2*d + e*2*d + e)
	if r.Params() != params || r.Bytes() != 4*int64(params) {
		t.Errorf("Params = %d, Bytes = %d, want %d and %d", r.Params(), r.Bytes(), params, 4*params)
	}
	for trial := range 20 {
		x := make([]float32, d)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 3)
		}
		for j := range r.Nets {
			got := make([]float32, e)
			r.Predict(j, x, got)
			for o := range got {
				var want float64
				for i := range x {
					want += float64(init[j][o*d+i]) * float64(x[i])
				}
				if math.Abs(float64(got[o])-want) > 1e-5*max(1, math.Abs(want)) {
					t.Fatalf("trial %d, net %d, logit %d: %v, want %v", trial, j, o, got[o], want)
				}
			}
		}
	}
}

func TestNewRouterRandomInit(t *testing.T) {
	id := testIdentity(2, 4, 2, 9)
	a, err := NewRouter(id, nil, 7)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewRouter(id, [][]float32{nil, nil}, 7)
	c, _ := NewRouter(id, nil, 8)
	if !slices.Equal(a.Nets[1].W1, b.Nets[1].W1) || slices.Equal(a.Nets[1].W1, c.Nets[1].W1) {
		t.Error("random init is not a function of the seed")
	}
	for _, n := range a.Nets {
		for _, s := range [][]float32{n.W1, n.B1} {
			bound := 1 / math.Sqrt(float64(n.In))
			for _, v := range s {
				if math.Abs(float64(v)) > bound {
					t.Fatalf("first layer value %v outside ±%v", v, bound)
				}
			}
		}
	}
	if n := a.Nets[1]; n.Hidden != 18 || len(n.W2) != 4*18 {
		t.Errorf("cross-token net: hidden %d, %d second-layer weights", n.Hidden, len(n.W2))
	}
	for _, bad := range []struct {
		name string
		id   Identity
		init [][]float32
	}{
		{"no moe layers", Identity{Layers: 2, Experts: 4, Used: 2, Embd: 3}, nil},
		{"used > experts", testIdentity(2, 4, 5, 3), nil},
		{"init count", id, [][]float32{nil}},
		{"init size", id, [][]float32{make([]float32, 3), nil}},
		{"init NaN", id, [][]float32{append(make([]float32, 35), float32(math.NaN())), nil}},
	} {
		if _, err := NewRouter(bad.id, bad.init, 1); err == nil {
			t.Errorf("%s: no error", bad.name)
		}
	}
}

func TestPredictConcurrent(t *testing.T) {
	r, err := NewRouter(testIdentity(2, 8, 2, 16), nil, 5)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 16)
	for i := range x {
		x[i] = float32(i) / 8
	}
	want := make([]float32, 8)
	r.Predict(1, x, want)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			got := make([]float32, 8)
			for range 200 {
				r.Predict(1, x, got)
				if !slices.Equal(got, want) {
					t.Error("concurrent Predict differs")
					return
				}
			}
		})
	}
	wg.Wait()
	if allocs := testing.AllocsPerRun(100, func() { r.Predict(1, x, want) }); allocs > 0 {
		t.Errorf("Predict allocates %v times", allocs)
	}
	if got := r.Predicted(1, x, 2); !slices.Equal(got, topK(want, 2, nil)) {
		t.Errorf("Predicted = %v", got)
	}
}

func TestTopK(t *testing.T) {
	tests := []struct {
		v    []float32
		k    int
		want []int
	}{
		{[]float32{1, 3, 2}, 2, []int{1, 2}},
		{[]float32{2, 2, 2, 1}, 2, []int{0, 1}}, // ties to the lower index
		{[]float32{-1, -5, 4, 4}, 3, []int{2, 3, 0}},
		{[]float32{0}, 1, []int{0}},
	}
	for _, tc := range tests {
		if got := topK(tc.v, tc.k, nil); !slices.Equal(got, tc.want) {
			t.Errorf("topK(%v, %d) = %v, want %v", tc.v, tc.k, got, tc.want)
		}
	}
}

func TestKL(t *testing.T) {
	ln3 := float32(math.Log(3))
	tests := []struct {
		name     string
		t, y     []float32
		want     float64
		wantGrad []float64 // softmax(y) - softmax(t)
	}{
		// p = [1/2 1/2], q = [3/4 1/4]: 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
		{"hand", []float32{0, 0}, []float32{ln3, 0}, 0.5 * math.Log(4.0/3), []float64{0.25, -0.25}},
		{"equal", []float32{1, 2, 3}, []float32{1, 2, 3}, 0, []float64{0, 0, 0}},
		{"shift invariant", []float32{1, 2, 3}, []float32{101, 102, 103}, 0, []float64{0, 0, 0}},
		// p = [1 0] (to within e^-1000), q = [1/2 1/2]: ln 2
		{"one-hot target", []float32{1000, 0}, []float32{0, 0}, math.Ln2, []float64{-0.5, 0.5}},
	}
	for _, tc := range tests {
		g := make([]float32, len(tc.y))
		got := klGrad(tc.t, tc.y, g, 0.5, make([]float64, 2*len(tc.y)))
		if math.Abs(got-tc.want) > 1e-7 {
			t.Errorf("%s: KL = %.9f, want %.9f", tc.name, got, tc.want)
		}
		for i := range g {
			if math.Abs(float64(g[i])-0.5*tc.wantGrad[i]) > 1e-7 {
				t.Errorf("%s: gradient %v, want 0.5 x %v", tc.name, g, tc.wantGrad)
				break
			}
		}
	}
	// KL(p || uniform) of p = [1/2 1/2 0 0] (to within e^-100) over 4 experts: ln 4 - ln 2.
	if got := certainty([]float32{0, 0, -100, -100}, make([]float64, 4)); math.Abs(got-math.Ln2) > 1e-9 {
		t.Errorf("certainty = %v, want ln 2", got)
	}
}

// One and two Adam steps, against torch.optim.Adam's update worked out by hand:
// step 1: m = 0.1 g, v = 0.001 g², w -= lr x (m / 0.1) / (sqrt(v / 0.001) + eps) = lr x sign(g);
// step 2: m̂ = m / 0.19, v̂ = v / (1 - 0.999²).
func TestAdam(t *testing.T) {
	w := []float32{1, -2, 0.5}
	m, v := make([]float32, 3), make([]float32, 3)
	steps := []struct {
		g    []float32
		want []float64
	}{
		{[]float32{0.5, -0.1, 0}, []float64{0.9, -1.9, 0.5}},
		// element 0: m = 0.095, v = 0.00049975, m̂ = 0.5, sqrt(v̂) = 0.5: w -= 0.1;
		// element 1: m = 0.021, v = 0.00009999, m̂ = 0.1105263, sqrt(v̂) = 0.2236509: w -= 0.0494190.
		{[]float32{0.5, 0.3, 0}, []float64{0.8, -1.949418991, 0.5}},
	}
	for i, st := range steps {
		newAdamStep(0.1, i+1).apply(w, m, v, st.g)
		for c := range w {
			if math.Abs(float64(w[c])-st.want[c]) > 2e-7 {
				t.Fatalf("step %d: w = %v, want %v", i+1, w, st.want)
			}
		}
	}
	// apply1 is the same update.
	w1, m1, v1 := float32(-2), float32(0), float32(0)
	newAdamStep(0.1, 1).apply1(&w1, &m1, &v1, -0.1)
	newAdamStep(0.1, 2).apply1(&w1, &m1, &v1, 0.3)
	if w1 != w[1] || m1 != m[1] || v1 != v[1] {
		t.Errorf("apply1: w %v m %v v %v, apply: %v %v %v", w1, m1, v1, w[1], m[1], v[1])
	}
}

func TestHalf(t *testing.T) {
	// Every finite half comes back exactly.
	for h := range 1 << 16 {
		if h&0x7c00 == 0x7c00 {
			continue
		}
		if got := toHalf(fromHalf(uint16(h))); got != uint16(h) {
			t.Fatalf("toHalf(fromHalf(%#04x)) = %#04x (%v)", h, got, fromHalf(uint16(h)))
		}
	}
	tests := []struct {
		f float32
		h uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {1e9, 0x7c00},
		{1 + 1.0/2048, 0x3c00},           // half way: to even
		{1 + 3.0/2048, 0x3c02},           // half way: to even (up)
		{float32(math.Ldexp(1, -24)), 1}, // smallest subnormal
		{float32(math.Ldexp(1, -25)), 0}, // half way to it: to even
		{float32(math.Ldexp(1.5, -25)), 1},
		{float32(math.Ldexp(1, -14)), 0x0400}, // smallest normal
	}
	for _, tc := range tests {
		if got := toHalf(tc.f); got != tc.h {
			t.Errorf("toHalf(%v) = %#04x, want %#04x", tc.f, got, tc.h)
		}
	}
}
