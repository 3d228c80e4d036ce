package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/quant"
)

// fakeModule stands for the kernels' PTX on the fake driver, whose kernels are C functions.
var fakeModule = []byte("// fake module")

func openFakeGPU(t *testing.T, o GPUOptions) *GPU {
	t.Helper()
	fakeDriver(t)
	o.Library, o.PTX = fake.path, fakeModule
	if o.Host == nil {
		o.Host = cpu.New(2)
	}
	g, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g
}

func randMatrix(t *testing.T, typ quant.Type, rows, cols int, r *rand.Rand) quant.Matrix {
	t.Helper()
	f := make([]float32, rows*cols)
	for i := range f {
		f[i] = float32(r.NormFloat64())
	}
	rb, err := typ.RowBytes(cols)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, rows*rb)
	for i := 0; i < rows; i++ {
		quant.QuantizeRow(typ, f[i*cols:(i+1)*cols], data[i*rb:(i+1)*rb])
	}
	return quant.Matrix{Type: typ, Rows: rows, Cols: cols, Data: data}
}

func TestGPUOpen(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	if g.Name() != "cuda:0" || g.Info().Name != "Fake GPU" {
		t.Errorf("%s %+v", g.Name(), g.Info())
	}
	// 1 GiB free, less the reserve of 256 MiB.
	if b := g.Memory().Budget(); b != 768<<20 {
		t.Errorf("default budget %d", b)
	}
	g2 := openFakeGPU(t, GPUOptions{Budget: 100 << 20})
	if b := g2.Memory().Budget(); b != 100<<20 {
		t.Errorf("budget %d", b)
	}

	bad := []struct {
		o    GPUOptions
		want string
	}{
		{GPUOptions{Ordinal: 3, Host: cpu.New(1)}, "device cuda:3: no CUDA device 3: the driver"},
		{GPUOptions{Budget: 2 << 30, Host: cpu.New(1)}, "a device memory budget of 2.00 GiB: 1.00 GiB of the card's 1.00 GiB are free"},
		{GPUOptions{Budget: -1, Host: cpu.New(1)}, "device memory budget"},
		{GPUOptions{}, "no host kernels"},
		{GPUOptions{Host: cpu.New(1), PTX: []byte("syntax error")}, "CUDA_ERROR_INVALID_PTX"},
	}
	for _, c := range bad {
		c.o.Library = fake.path
		if c.o.PTX == nil {
			c.o.PTX = fakeModule
		}
		if _, err := Open(c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%+v) = %v, want %q", c.o, err, c.want)
		}
	}
	if _, err := Open(GPUOptions{Library: "/nonexistent/libcuda.so.1", Host: cpu.New(1)}); !errors.Is(err, ErrNoDriver) ||
		!strings.HasPrefix(err.Error(), "device cuda:0: no CUDA driver found") {
		t.Errorf("Open without a driver = %v", err)
	}
}

// TestGPUKernelModules opens the embedded kernels as the engine does on devices of several
// compute capabilities: from 8.0 on, mmqi's kernels come from the sm_80 module and the rest
// from the base module; on 7.5 everything comes from the base module, and the sm_80 module
// does not load there at all (the fake's JIT refuses a newer .target, as a driver's does).
func TestGPUKernelModules(t *testing.T) {
	fakeDriver(t)
	for _, c := range []struct {
		cc   string
		sm80 bool
	}{{"75", false}, {"80", true}, {"90", true}} {
		t.Run("cc"+c.cc, func(t *testing.T) {
			t.Setenv("FAKECUDA_CC", c.cc)
			g, err := Open(GPUOptions{Library: fake.path, Host: cpu.New(1)})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if (g.mod.sm80 != nil) != c.sm80 || g.mod.sm80Err != nil {
				t.Fatalf("sm_80 module loaded: %v (%v), want %v", g.mod.sm80 != nil, g.mod.sm80Err, c.sm80)
			}
			from := g.mod.base
			if c.sm80 {
				from = g.mod.sm80
			}
			for typ, name := range mmqiKernels {
				want, err := from.Function(name)
				if err != nil {
					t.Fatal(err)
				}
				if f := g.mmqi[typ]; f == nil || f.h != want.h {
					t.Errorf("%s: %v, want the handle %#x of its module", name, f, want.h)
				}
			}
			norm, err1 := g.mod.Function("rms_norm_f32")
			base, err2 := g.mod.base.Function("rms_norm_f32")
			if err := errors.Join(err1, err2); err != nil || norm.h != base.h {
				t.Errorf("rms_norm_f32 not from the base module: %v", err)
			}
			if !c.sm80 {
				if _, err := g.ctx.LoadModule(PTXSM80()); err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_PTX") {
					t.Errorf("the sm_80 module on compute capability 7.5: %v, want CUDA_ERROR_INVALID_PTX", err)
				}
			}
		})
	}
}

// TestKernelsWithoutTheSM80Module: a sm_80 module the driver refuses leaves the base module's
// kernels serving alone, with the reason kept, where the base module's failure is an error.
func TestKernelsWithoutTheSM80Module(t *testing.T) {
	ctx := fakeContext(t)
	info := Info{Major: 8, Minor: 9}
	k, err := loadKernels(ctx, info, []byte("// fake module"), []byte("syntax error"))
	if err != nil {
		t.Fatal(err)
	}
	defer k.Unload()
	if k.sm80 != nil || k.sm80Err == nil || !strings.Contains(k.sm80Err.Error(), "CUDA_ERROR_INVALID_PTX") {
		t.Errorf("sm_80 module %v, error %v: want none, and CUDA_ERROR_INVALID_PTX", k.sm80, k.sm80Err)
	}
	if _, err := k.Function("fake_axpy"); err != nil {
		t.Errorf("the base module's kernel: %v", err)
	}
	if _, err := loadKernels(ctx, info, []byte("syntax error"), nil); err == nil {
		t.Error("a base module the driver refuses loaded")
	}
}

// TestGPURowWarps: a GPU opened with RowWarps deals its integer products' rows over that many
// warps: a decoded token's product is mmvq1's launched so, to the bit, and not a warp a row's,
// whose float sums add in another order (the data tell the two apart). Values the kernels do
// not take are refused.
func TestGPURowWarps(t *testing.T) {
	const rows, cols = 3, 2048 // every one of four warps reads a part of each row
	r := rand.New(rand.NewPCG(7, 7))
	w := randMatrix(t, quant.Q8_0, rows, cols, r)
	x := randF32(r, cols, 1)
	k := openKernels(t)
	dw, dx := k.put(t, w.Data), k.putF32(t, x)
	xq := k.quantized(t, dx, 1, cols, quant.Q8_0, true)
	var direct [2][]float32
	for i, warps := range []int{1, 4} {
		g := openFakeGPU(t, GPUOptions{RowWarps: warps})
		if err := g.Upload(w.Data, "q8_0"); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, rows)
		g.MatMul(w, x, 1, got)
		gx, block := rowDims(rows, warps)
		dy := k.alloc(t, 4*rows)
		var args Args
		k.run(t, mmvq1Kernels[quant.Q8_0], Dim3{X: gx, Y: 1}, block, args.Ptr(dw).Ptr(xq.q).Ptr(xq.d).Ptr(xq.s).Ptr(dy).Int(rows).Int(cols).Int(1))
		direct[i] = k.getF32(t, dy, rows)
		checkBits(t, fmt.Sprintf("%d warps a row", warps), got, direct[i])
	}
	if slices.EqualFunc(direct[0], direct[1], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
		t.Fatal("one warp a row and four give the same bits: the data do not tell them apart")
	}
	fakeDriver(t)
	for _, warps := range []int{-1, 3, 16} {
		_, err := Open(GPUOptions{Library: fake.path, PTX: fakeModule, Host: cpu.New(1), RowWarps: warps})
		if want := fmt.Sprintf("%d warps a row", warps); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("RowWarps %d: error %v, want one naming %q", warps, err, want)
		}
	}
}

// TestGPUMatMul runs products of uploaded weights and of a device buffer filled on the copy
// stream, against the CPU; weights not on the device are computed on the host and counted.
func TestGPUMatMul(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	host := cpu.New(2)
	r := rand.New(rand.NewPCG(1, 2))
	// checkRef compares a product of w with the exact one of ref's dequantised weights
	// (tol > 0), which the GPU's F32 arithmetic approximates, or with the CPU's product of
	// ref to the bit (tol 0: a product the GPU leaves to the host). A quantized type's
	// products quantize the activation, as the CPU's do: their reference is the CPU's, within
	// tol.
	checkRef := func(name string, w, ref quant.Matrix, T int, tol float64) {
		t.Helper()
		x := make([]float32, T*w.Cols)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		got, want := make([]float32, T*w.Rows), make([]float32, T*w.Rows)
		g.MatMul(w, x, T, got)
		_, integer := mmvqKernels[w.Type]
		if tol == 0 || integer {
			host.MatMul(ref, x, T, want)
		} else {
			exactProduct(ref, x, T, want)
		}
		for i := range got {
			if math.Abs(float64(got[i]-want[i])) > tol*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("%s T=%d: out[%d] = %v, want %v", name, T, i, got[i], want[i])
			}
		}
	}
	check := func(name string, w quant.Matrix, T int, tol float64) {
		t.Helper()
		checkRef(name, w, w, T, tol)
	}
	w32 := randMatrix(t, quant.F32, 70, 96, r)
	w16 := randMatrix(t, quant.F16, 33, 128, r)
	w8 := randMatrix(t, quant.Q8_0, 16, 64, r)
	for _, w := range []quant.Matrix{w32, w16, w8} {
		if err := g.Upload(w.Data, w.Type.String()); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.Upload(w32.Data[:10], "a part of it"); err != nil {
		t.Fatal(err)
	}
	for _, T := range []int{1, 3} {
		check("f32", w32, T, 1e-5)
		check("f16", w16, T, 1e-5)
	}
	if s := g.Stats(); s.Launches != 4 || s.HostFallbacks != 0 {
		t.Errorf("after 4 products on the device: %+v", s)
	}
	check("q8_0", w8, 2, 1e-5) // two launches: the activation's quantization, the integer product
	check("not uploaded", randMatrix(t, quant.F32, 8, 32, r), 1, 0)
	// Rows of an uploaded matrix are on the device too.
	check("rows of f32", quant.Matrix{Type: quant.F32, Rows: 10, Cols: 96, Data: w32.Data[20*96*4 : 30*96*4]}, 2, 1e-5)
	if s := g.Stats(); s.Launches != 7 || s.HostFallbacks != 1 {
		t.Errorf("after 1 host product: %+v", s)
	}

	// An expert slot: a device buffer the host cannot touch, filled on the copy stream.
	w := randMatrix(t, quant.F16, 40, 64, r)
	slot, err := g.Buffer(int64(len(w.Data))+100, "a slot")
	if err != nil {
		t.Fatal(err)
	}
	g.CopyIn(slot[100:], w.Data)
	g.Compute().Wait(g.Copy().Record())
	// The host reading the slot would fault: the reference reads the weights' host copy.
	checkRef("slot", quant.Matrix{Type: w.Type, Rows: w.Rows, Cols: w.Cols, Data: slot[100:]}, w, 2, 1e-5)
	g.Sync(g.Compute().Record())
	g.Host().Wait(g.Copy().Record())
	s := g.Stats()
	if s.CopyBytes != int64(len(w.Data)) || s.Launches != 8 || s.HostFallbacks != 1 || s.CopySeconds < 0 {
		t.Errorf("after the slot: %+v", s)
	}
	if err := g.Err(); err != nil {
		t.Error(err)
	}

	// A copy into host memory is a plain copy.
	dst := make([]byte, 4)
	g.CopyIn(dst, []byte{1, 2, 3, 4})
	if dst[3] != 4 {
		t.Errorf("host CopyIn: %v", dst)
	}
	if _, err := g.Buffer(0, "nothing"); err == nil {
		t.Error("a buffer of 0 bytes")
	}
	if _, err := g.Buffer(2<<30, "too much"); !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "too much") {
		t.Errorf("a buffer over the card = %v", err)
	}
	pinned, err := g.HostAlloc(1000)
	if err != nil || len(pinned) != 1000 {
		t.Errorf("HostAlloc = %d bytes, %v", len(pinned), err)
	}
}

// exactProduct is the product of the dequantised weights, summed in float64.
func exactProduct(w quant.Matrix, x []float32, T int, out []float32) {
	row := make([]float32, w.Cols)
	rb := w.RowBytes()
	for o := 0; o < w.Rows; o++ {
		quant.DequantizeRow(w.Type, w.Data[o*rb:(o+1)*rb], row)
		for t := 0; t < T; t++ {
			var s float64
			for c, v := range row {
				s += float64(v) * float64(x[t*w.Cols+c])
			}
			out[t*w.Rows+o] = float32(s)
		}
	}
}

// TestRecordedEventsReused records events the engine drops, garbage collection after
// garbage collection: each comes back to be reused, so that the GPU creates no more driver
// events than are alive at once (a sync.Pool had dropped them at every collection without
// destroying them), and Close destroys them.
func TestRecordedEventsReused(t *testing.T) {
	fakeDriver(t)
	g, err := Open(GPUOptions{Library: fake.path, PTX: fakeModule, Host: cpu.New(1)})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const n = 50
	free := func() int {
		g.recorded.mu.Lock()
		defer g.recorded.mu.Unlock()
		return len(g.recorded.pool.free)
	}
	for round := 0; round < 5; round++ {
		for i := 0; i < n; i++ {
			if ev := g.Compute().Record(); ev == nil {
				t.Fatal(g.Err())
			}
		}
		// The events' cleanups run after a collection, on a goroutine of their own.
		for deadline := time.Now().Add(5 * time.Second); free() < n && time.Now().Before(deadline); {
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
	}
	if made, f := g.recorded.pool.made, free(); made != n || f != n {
		t.Errorf("%d rounds of %d events dropped: %d driver events made, %d free; want %d and %d", 5, n, made, f, n, n)
	}
	if errs := g.recorded.destroy(); errors.Join(errs...) != nil || free() != 0 {
		t.Errorf("destroy: %v, %d left free", errs, free())
	}
}
