package cuda

// Differential tests of every kernel of the PTX module against a Go reference, through the
// binding: device memory, copies, and launches with the grid and block each kernel's ABI
// comment (kernels/*.cu) prescribes. The module loaded is the real PTX(): on a machine with a
// CUDA device the driver compiles and runs it; elsewhere the fake driver's emulator runs the
// same CUDA sources compiled for the host.
//
// Where a kernel's comment promises the CPU's arithmetic (get_rows, the norms, the
// element-wise kernels, the router) the check is bit for bit, with inputs chosen so that the
// one freedom the comments allow (the order of float64 additions) cannot change a result.
// Where it promises agreement to float32 rounding (mmv, rope, attention) the reference is
// float64 and the tolerance is a rounding-error bound derived from the kernel's arithmetic,
// stated beside each check.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/internal/fakecuda"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// ---- the device ----

// kernelEnv runs kernels of the PTX module on one stream.
type kernelEnv struct {
	real     bool // a CUDA device, not the fake driver
	info     Info // the device's, on a real one
	ctx      *Context
	s        *Stream
	mod      *kernelSet
	fns      map[string]*Function
	launched map[string]bool
}

// kernelDriver returns the machine's CUDA driver when it sees a device, else the fake driver
// (skipping without a C compiler to build it).
func kernelDriver(tb testing.TB) (*Driver, bool) {
	tb.Helper()
	if d, err := Load(""); err == nil {
		if n, err := d.Count(); err == nil && n > 0 {
			return d, true
		}
	}
	d, err := Load(fakecuda.ForTests(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return d, false
}

// openKernels loads the kernels into device 0's primary context as a GPU does (PTX(), and
// PTXSM80() beside it on compute capability 8.0 and newer); tb's cleanup releases it all.
func openKernels(tb testing.TB) *kernelEnv { return openKernelModules(tb, PTXSM80()) }

// openKernelModules is openKernels with sm80 for the sm_80 module (nil: the base module
// alone).
func openKernelModules(tb testing.TB, sm80 []byte) *kernelEnv {
	tb.Helper()
	d, real := kernelDriver(tb)
	dev, err := d.Device(0)
	if err != nil {
		tb.Fatal(err)
	}
	info, err := dev.Info()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, err := dev.Retain()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ctx.Release() })
	s, err := ctx.NewStream()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Destroy() })
	mod, err := loadKernels(ctx, info, PTX(), sm80)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { mod.Unload() })
	if real {
		tb.Logf("kernels on %s, the sm_80 module loaded: %v", info, mod.sm80 != nil)
	}
	return &kernelEnv{real: real, info: info, ctx: ctx, s: s, mod: mod, fns: map[string]*Function{}, launched: map[string]bool{}}
}

// alloc returns n bytes of device memory, freed when tb ends, filled with 0xff bytes: NaN
// floats and NaN halves, so an output the kernel does not write shows.
func (k *kernelEnv) alloc(tb testing.TB, n int) DevicePtr {
	tb.Helper()
	n = max(n, 1)
	p, err := k.ctx.Alloc(int64(n))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { k.ctx.Free(p) })
	if err := k.s.Memset(p, 0xff, int64(n)); err != nil {
		tb.Fatal(err)
	}
	return p
}

// put copies b to new device memory.
func (k *kernelEnv) put(tb testing.TB, b []byte) DevicePtr {
	tb.Helper()
	p := k.alloc(tb, len(b))
	if err := k.s.CopyHtoD(p, b); err != nil {
		tb.Fatal(err)
	}
	return p
}

func (k *kernelEnv) putF32(tb testing.TB, v []float32) DevicePtr {
	tb.Helper()
	return k.put(tb, f32bytes(v))
}

// get copies n bytes at p back once the stream is done.
func (k *kernelEnv) get(tb testing.TB, p DevicePtr, n int) []byte {
	tb.Helper()
	b := make([]byte, n)
	if err := errors.Join(k.s.CopyDtoH(b, p), k.s.Synchronize()); err != nil {
		tb.Fatal(err)
	}
	return b
}

func (k *kernelEnv) getF32(tb testing.TB, p DevicePtr, n int) []float32 {
	tb.Helper()
	return f32sOf(k.get(tb, p, 4*n))
}

// moeGroupCase is one launch of moe_group_ids: ntok tokens choosing k experts each of
// experts, in blocks of block threads.
type moeGroupCase struct{ experts, ntok, k, block int }

func (c moeGroupCase) String() string {
	return fmt.Sprintf("experts=%d,ntok=%d,k=%d,block=%d", c.experts, c.ntok, c.k, c.block)
}

// checkMoEGroupIDs draws a routing (each token's k distinct experts, the low ones likelier, so
// that some have no token) and requires moe_group_ids's offsets, rows and slots' rows to be
// groupByExpert's: each expert's slots in slot order, the experts one after another.
func checkMoEGroupIDs(t *testing.T, k *kernelEnv, c moeGroupCase, r *rand.Rand) {
	t.Helper()
	n := c.ntok * c.k
	ids := make([]int32, 0, n)
	for range c.ntok {
		for j := 0; j < c.k; {
			e := int32(r.Float64() * r.Float64() * float64(c.experts))
			if !slices.Contains(ids[len(ids)-j:], e) {
				ids, j = append(ids, e), j+1
			}
		}
	}
	doff, drows, dinv := k.alloc(t, 4*(c.experts+1)), k.alloc(t, 4*max(n, 1)), k.alloc(t, 4*max(n, 1))
	var args Args
	k.run(t, "moe_group_ids", Dim3{X: c.experts}, Dim3{X: c.block}, args.Ptr(k.put(t, i32bytes(ids))).Int(n).Int(c.k).Ptr(doff).Ptr(drows).Ptr(dinv))
	off, rows, inv := make([]int32, c.experts+1), make([]int32, 0, n), make([]int32, n)
	for e := range c.experts {
		for s, id := range ids {
			if int(id) == e {
				inv[s] = int32(len(rows))
				rows = append(rows, int32(s/c.k))
			}
		}
		off[e+1] = int32(len(rows))
	}
	for _, v := range []struct {
		what      string
		got, want []int32
	}{{"off", k.getI32(t, doff, len(off)), off}, {"rows", k.getI32(t, drows, n), rows}, {"inv", k.getI32(t, dinv, n), inv}} {
		if !slices.Equal(v.got, v.want) {
			t.Fatalf("%s: %v, want %v", v.what, v.got, v.want)
		}
	}
}

// FuzzMoEGroupIDs draws routings for moe_group_ids (checkMoEGroupIDs): up to 256 experts,
// 300 tokens and 8 experts a token, blocks of 1 to 16 warps.
func FuzzMoEGroupIDs(f *testing.F) {
	f.Add(uint8(63), uint16(36), uint8(7), uint8(15), uint64(1))
	f.Add(uint8(4), uint16(299), uint8(1), uint8(0), uint64(2))
	k := openKernels(f)
	f.Fuzz(func(t *testing.T, experts uint8, ntok uint16, used, warps uint8, seed uint64) {
		c := moeGroupCase{experts: 1 + int(experts), ntok: 1 + int(ntok)%300, block: 32 * (1 + int(warps)%16)}
		c.k = 1 + int(used)%min(8, c.experts)
		t.Log(c)
		checkMoEGroupIDs(t, k, c, rand.New(rand.NewPCG(seed, 11)))
	})
}

func (k *kernelEnv) getI32(tb testing.TB, p DevicePtr, n int) []int32 {
	tb.Helper()
	b := k.get(tb, p, 4*n)
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func (k *kernelEnv) getU16(tb testing.TB, p DevicePtr, n int) []uint16 {
	tb.Helper()
	return u16sOf(k.get(tb, p, 2*n))
}

// run launches the kernel called name and waits for it.
func (k *kernelEnv) run(tb testing.TB, name string, grid, block Dim3, a *Args) {
	tb.Helper()
	if err := errors.Join(k.s.Launch(k.function(tb, name), grid, block, 0, a), k.s.Synchronize()); err != nil {
		tb.Fatal(err)
	}
	k.launched[name] = true
}

// function returns the kernel called name, found once.
func (k *kernelEnv) function(tb testing.TB, name string) *Function {
	tb.Helper()
	f := k.fns[name]
	if f == nil {
		var err error
		if f, err = k.mod.Function(name); err != nil {
			tb.Fatal(err)
		}
		k.fns[name] = f
	}
	return f
}

// ---- the cases ----

// kernelCase is one differential test: kernel's launch on one shape.
type kernelCase struct {
	kernel string
	name   string
	run    func(t *testing.T, k *kernelEnv, r *rand.Rand)
}

func allKernelCases() []kernelCase {
	var cs []kernelCase
	for _, f := range []func() []kernelCase{mmvCases, mmvqCases, mmqCases, mmqiCases, mmqiGroupCases, getRowsCases, normCases, elementwiseCases, routerCases, commitCases, ropeCases, attnCases, mmvHeadsCases, moeCases, fusedCases, deltaNetCases} {
		cs = append(cs, f()...)
	}
	return cs
}

// TestKernelCasesCoverEveryKernel checks that every kernel of the module has cases below.
func TestKernelCasesCoverEveryKernel(t *testing.T) {
	have := map[string]bool{}
	for _, c := range allKernelCases() {
		if !slices.Contains(KernelNames, c.kernel) {
			t.Errorf("case %s/%s tests %s, which KernelNames does not list", c.kernel, c.name, c.kernel)
		}
		have[c.kernel] = true
	}
	for _, name := range KernelNames {
		if !have[name] {
			t.Errorf("kernel %s has no differential test", name)
		}
	}
}

// TestKernels runs every case: test names are kernel/shape.
func TestKernels(t *testing.T) {
	runKernelCases(t, openKernels(t), func(kernelCase) bool { return true })
}

// TestKernelsSM75 runs the cases of the kernels the sm_80 module replaces (mmqi's and the
// flash attention's) on the base module alone: what a device older than compute capability
// 8.0 runs, the products as four m8n8k16 each where TestKernels ran sm_80's m16n8k32, the
// flash attention with one tile of keys and values where sm_80's keeps two. On the fake
// driver, under the reverse schedule too (TestKernelsAnySchedule's run the sm_80 module's).
func TestKernelsSM75(t *testing.T) {
	k := openKernelModules(t, nil)
	if k.info.Major < 8 {
		t.Skipf("the device has compute capability %d.%d: TestKernels ran the base module's kernels", k.info.Major, k.info.Minor)
	}
	replaced := map[string]bool{}
	for _, m := range entryRE.FindAllSubmatch(PTXSM80(), -1) {
		replaced[string(m[1])] = true
	}
	pick := func(c kernelCase) bool { return replaced[c.kernel] }
	if k.real {
		runKernelCases(t, k, pick)
		return
	}
	for _, sched := range []string{"forward", "reverse"} {
		t.Run(sched, func(t *testing.T) {
			t.Setenv("FAKECUDA_SCHEDULE", sched)
			runKernelCases(t, k, pick)
		})
	}
}

// runKernelCases runs the cases that pick chooses, each as the subtest kernel/shape.
func runKernelCases(t *testing.T, k *kernelEnv, pick func(kernelCase) bool) {
	for _, c := range allKernelCases() {
		if !pick(c) {
			continue
		}
		t.Run(c.kernel+"/"+c.name, func(t *testing.T) {
			delete(k.launched, c.kernel)
			h := fnv.New64a()
			h.Write([]byte(c.kernel + "/" + c.name))
			c.run(t, k, rand.New(rand.NewPCG(h.Sum64(), 1)))
			if !t.Failed() && !k.launched[c.kernel] {
				t.Errorf("the case did not launch %s", c.kernel)
			}
		})
	}
}

// ---- comparisons ----

// unit is float32's unit roundoff.
const unit = 0x1p-24

// gamma is the bound n*u/(1-n*u) on the relative error of n float32 roundings in a row
// (Higham, Accuracy and Stability of Numerical Algorithms, lemma 3.1): a float32 sum or dot
// product whose every term passes through at most n roundings (additions, multiplications or
// fused multiply-adds) differs from the exact one by at most gamma(n) times the sum of the
// terms' absolute values, whatever the order of the additions.
func gamma(n int) float64 { return float64(n) * unit / (1 - float64(n)*unit) }

// checkBits compares float32s to the bit; two NaNs match whatever their payloads.
func checkBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	bad := 0
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) == math.Float32bits(w) || g != g && w != w {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s[%d] = %v (%#08x), want %v (%#08x)", what, i, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d values differ", what, bad, len(want))
	}
}

// checkClose requires |got[i] - want[i]| <= tol[i] (so NaN fails; tol 0 asks for equality).
func checkClose(t *testing.T, what string, got []float32, want, tol []float64) {
	t.Helper()
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); d <= tol[i] {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s[%d] = %v, want %v ± %.3g (off by %.3g)", what, i, got[i], want[i], tol[i], math.Abs(float64(got[i])-want[i]))
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d of %d values out of tolerance", what, bad, len(want))
	}
}

// ---- host data ----

func f32sOf(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)), b)
	return v
}

func u16sOf(b []byte) []uint16 {
	v := make([]uint16, len(b)/2)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 2*len(v)), b)
	return v
}

func u16bytes(v []uint16) []byte {
	return slices.Clone(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 2*len(v)))
}

func i32sOf(b []byte) []int32 {
	v := make([]int32, len(b)/4)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)), b)
	return v
}

func i32bytes(v []int32) []byte {
	return slices.Clone(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)))
}

// randF32 returns n normal values times scale.
func randF32(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// randUniform returns n values uniform in [lo, hi).
func randUniform(r *rand.Rand, n int, lo, hi float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(lo + (hi-lo)*r.Float64())
	}
	return v
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// ---- mmv ----

// mmvTypes are the weight types with an mmv kernel, in KernelNames' order.
var mmvTypes = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0,
	quant.IQ4_NL, quant.MXFP4, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K}

// mmvCols are the row lengths tested for a type: whole blocks, and for the float types odd
// ones (the scalar path) and multiples of 16 (the vector path). The last is wide enough for a
// lane to take several steps of the warp's loop over the blocks (a step covers 32/LPB blocks:
// 256 values of F32, 512 of F16, BF16 and the 32-value types, 1024 of the K-quants), where the
// next blocks are loaded while the current ones are used.
func mmvCols(typ quant.Type) []int {
	switch typ.BlockSize() {
	case 1:
		return []int{7, 33, 64, 96, 528}
	case 32:
		return []int{32, 96, 256, 1056}
	default:
		return []int{256, 768, 2304}
	}
}

// mmvCase is a product of rows x cols weights (starting off whole rows into their
// allocation) with ntok tokens on grid.y = gridY: of mmv's kernels, or of mmq's.
type mmvCase struct {
	typ                          quant.Type
	rows, cols, ntok, gridY, off int
}

func (c mmvCase) String() string {
	return fmt.Sprintf("rows=%d,cols=%d,ntok=%d,grid.y=%d,off=%d", c.rows, c.cols, c.ntok, c.gridY, c.off)
}

func mmvCases() []kernelCase {
	var cs []kernelCase
	add := func(c mmvCase) {
		cs = append(cs, kernelCase{mmvKernels[c.typ], c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMMV(t, k, c, r) }})
	}
	for _, typ := range mmvTypes {
		cols := mmvCols(typ)
		for _, n := range cols {
			for _, rows := range []int{1, 5, 37} {
				for _, ntok := range []int{1, 3, 8, 9, 17} {
					add(mmvCase{typ, rows, n, ntok, 1, 0})
					if g := ceilDiv(ntok, 8); g > 1 {
						add(mmvCase{typ, rows, n, ntok, g, 0})
					}
				}
			}
		}
		// Matrices at whole-row offsets inside their allocation (odd ones: the 2-byte-aligned
		// layouts then start at 2 mod 4), the second at its end, with more blocks in grid.y
		// than tokens need.
		add(mmvCase{typ, 5, cols[0], 3, 1, 1})
		add(mmvCase{typ, 6, cols[len(cols)-1], 9, 3, 3})
	}
	return cs
}

// checkMMV runs one product against the float64 product of quant.DequantizeRow's weights.
//
// Tolerance: the kernels compute in float32 with fused multiply-adds; a product w*x passes
// through at most 8+8 roundings inside a block's partial dot (two dot8 chains), a few more
// where the partial sums pair up and a block scale multiplies them (<= 4), one per block the
// lane accumulates (<= cols/32), and 5 in the warp's butterfly. The kernels decode the
// weights with fused multiply-adds (d*q - m rounded once) where DequantizeRow rounds twice, a
// difference of a couple of roundings per weight. So gamma(64 + cols/32) times sum |w*x| bounds
// the error with margin (about 4e-6 of sum |w*x| at 768 columns), while a single wrong weight
// or dropped block would be off by about sum |w*x| / cols or more.
func checkMMV(t *testing.T, k *kernelEnv, c mmvCase, r *rand.Rand) {
	t.Helper()
	w := randMatrix(t, c.typ, c.off+c.rows, c.cols, r)
	x := randF32(r, c.ntok*c.cols, 1)
	rb := w.RowBytes()
	dw, dx, dy := k.put(t, w.Data), k.putF32(t, x), k.alloc(t, 4*c.ntok*c.rows)
	var args Args
	k.run(t, mmvKernels[c.typ], Dim3{X: ceilDiv(c.rows, mmvRowsPerBlock), Y: c.gridY}, Dim3{X: 32, Y: mmvRowsPerBlock},
		args.Ptr(dw.Add(int64(c.off*rb))).Ptr(dx).Ptr(dy).Int(c.rows).Int(c.cols).Int(c.ntok))
	got := k.getF32(t, dy, c.ntok*c.rows)

	want, tol := make([]float64, len(got)), make([]float64, len(got))
	g := gamma(64 + c.cols/32)
	row := make([]float32, c.cols)
	for o := 0; o < c.rows; o++ {
		quant.DequantizeRow(c.typ, w.Row(c.off+o), row)
		for tk := 0; tk < c.ntok; tk++ {
			var s, a float64
			for j, v := range row {
				p := float64(v) * float64(x[tk*c.cols+j])
				s += p
				a += math.Abs(p)
			}
			want[tk*c.rows+o], tol[tk*c.rows+o] = s, g*a
		}
	}
	checkClose(t, "y", got, want, tol)
}

// FuzzMMV checks mmv on shapes from the fuzzer: a type, rows, a number of blocks of columns
// (any count for the float types), tokens, grid.y, and a seed for the values and the offset
// of the matrix in whole rows.
func FuzzMMV(f *testing.F) {
	for i := range mmvTypes {
		f.Add(uint8(i), uint8(4+i), uint8(i), uint8(2*i), uint8(i), uint64(i))
	}
	f.Add(uint8(0), uint8(0), uint8(32), uint8(16), uint8(2), uint64(99)) // F32, 33 columns, 17 tokens
	k := openKernels(f)
	f.Fuzz(func(t *testing.T, typ, rows, blocks, ntok, gy uint8, seed uint64) {
		c := mmvCase{typ: mmvTypes[int(typ)%len(mmvTypes)], rows: 1 + int(rows)%24, ntok: 1 + int(ntok)%20,
			gridY: 1 + int(gy)%4, off: int(seed % 3)}
		c.cols = fuzzCols(c.typ, blocks)
		t.Log(mmvKernels[c.typ], c)
		checkMMV(t, k, c, rand.New(rand.NewPCG(seed, 2)))
	})
}

// fuzzCols is a fuzzed product's column count from its blocks byte: whole blocks of the
// type, up to 3 super-blocks, 8 blocks of 32 or 130 single values.
func fuzzCols(typ quant.Type, blocks uint8) int {
	switch typ.BlockSize() {
	case 1:
		return 1 + int(blocks)%130
	case 32:
		return 32 * (1 + int(blocks)%8)
	}
	return 256 * (1 + int(blocks)%3)
}

// ---- get_rows ----

type getRowsCase struct {
	typ                     quant.Type
	cols, gridY, block, off int // off: bytes before the matrix in its allocation
}

func getRowsCases() []kernelCase {
	var cs []kernelCase
	add := func(c getRowsCase) {
		cs = append(cs, kernelCase{"get_rows_" + mmvKernels[c.typ][len("mmv_"):],
			fmt.Sprintf("cols=%d,grid.y=%d,block=%d,off=%d", c.cols, c.gridY, c.block, c.off),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkGetRows(t, k, c, r) }})
	}
	for _, typ := range mmvTypes {
		cols := mmvCols(typ)
		if typ.BlockSize() == 1 {
			cols = append(cols, 300)
		}
		for _, n := range cols {
			add(getRowsCase{typ, n, ceilDiv(n, 32*256), 256, 0})
		}
		// Any grid.y, any block and any alignment of w.
		add(getRowsCase{typ, cols[len(cols)-1], 2, 32, 1})
		add(getRowsCase{typ, cols[0], 3, 64, 3})
	}
	return cs
}

// checkGetRows gathers rows of a 6-row matrix, repeats included; bit-exact with
// quant.DequantizeRow, as getrows.cu promises.
func checkGetRows(t *testing.T, k *kernelEnv, c getRowsCase, r *rand.Rand) {
	w := randMatrix(t, c.typ, 6, c.cols, r)
	ids := []int32{3, 0, 5, 3, 1}
	buf := make([]byte, c.off+len(w.Data))
	copy(buf[c.off:], w.Data)
	dw, dids, dout := k.put(t, buf), k.put(t, i32bytes(ids)), k.alloc(t, 4*len(ids)*c.cols)
	var args Args
	k.run(t, "get_rows_"+mmvKernels[c.typ][len("mmv_"):], Dim3{X: len(ids), Y: c.gridY}, Dim3{X: c.block},
		args.Ptr(dw.Add(int64(c.off))).Ptr(dids).Ptr(dout).Int(c.cols).Int(len(ids)))
	got := k.getF32(t, dout, len(ids)*c.cols)
	want := make([]float32, len(got))
	for i, id := range ids {
		quant.DequantizeRow(c.typ, w.Row(int(id)), want[i*c.cols:(i+1)*c.cols])
	}
	checkBits(t, "out", got, want)
}

// ---- norms ----

// exactGrid returns n values k/64 with |k| <= 256: their float32 squares are exact and any sum
// of them is exact in float64, so the float64 sum of squares does not depend on the order of
// the additions, the one liberty norm.cu takes with models.RMSNorm's arithmetic, and the
// kernel must then match it bit for bit.
func exactGrid(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.IntN(513)-256) / 64
	}
	return v
}

type normCase struct {
	d, rows, block        int
	weight, bias, inPlace bool
	eps                   float32
	xStride, dstStride    int // rms_norm_strided_f32; 0 for rms_norm_f32
}

func normCases() []kernelCase {
	var cs []kernelCase
	for _, c := range []normCase{
		{d: 64, rows: 3, block: 256, eps: 1e-6},
		{d: 64, rows: 3, block: 256, weight: true, eps: 1e-5},
		{d: 100, rows: 4, block: 256, weight: true, bias: true, eps: 1e-6},
		{d: 300, rows: 2, block: 256, weight: true, bias: true, inPlace: true, eps: 1e-6},
		{d: 7, rows: 3, block: 32, bias: true, eps: 1e-6},
		{d: 1000, rows: 2, block: 1024, weight: true, eps: 1e-6},
		{d: 100, rows: 3, block: 64, weight: true, eps: 1e-6},
		// MLA's kv_a rows: the first rank values of rank+rope normalised, in place or not.
		{d: 64, rows: 3, block: 256, weight: true, eps: 1e-6, xStride: 80, dstStride: 96},
		{d: 48, rows: 2, block: 256, weight: true, inPlace: true, eps: 1e-6, xStride: 64, dstStride: 64},
	} {
		kernel := "rms_norm_f32"
		if c.xStride != 0 {
			kernel = "rms_norm_strided_f32"
		}
		name := fmt.Sprintf("d=%d,rows=%d,block=%d,weight=%v,bias=%v,in_place=%v", c.d, c.rows, c.block, c.weight, c.bias, c.inPlace)
		if c.xStride != 0 {
			name += fmt.Sprintf(",x_stride=%d,dst_stride=%d", c.xStride, c.dstStride)
		}
		cs = append(cs, kernelCase{kernel, name, func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkNorm(t, k, kernel, c, r) }})
	}
	return cs
}

// checkNorm compares with models.RMSNorm bit for bit (its bias needs a weight; a bias alone
// is added after RMSNorm without one, as norm.cu does).
func checkNorm(t *testing.T, k *kernelEnv, kernel string, c normCase, r *rand.Rand) {
	xs, ds := c.xStride, c.dstStride
	if xs == 0 {
		xs, ds = c.d, c.d
	}
	x := exactGrid(r, c.rows*xs)
	var w, b []float32
	dw, db := DevicePtr(0), DevicePtr(0)
	if c.weight {
		w = randF32(r, c.d, 1)
		dw = k.putF32(t, w)
	}
	if c.bias {
		b = randF32(r, c.d, 1)
		db = k.putF32(t, b)
	}
	dx := k.putF32(t, x)
	dst, before := dx, slices.Clone(x) // what dst holds before the kernel
	if !c.inPlace {
		dst = k.alloc(t, 4*c.rows*ds)
		before = f32sOf(k.get(t, dst, 4*c.rows*ds))
	}
	var args Args
	args.Ptr(dst).Ptr(dx).Ptr(dw).Ptr(db).Int(c.d).Float(c.eps)
	if c.xStride != 0 {
		args.Int(ds).Int(xs)
	}
	k.run(t, kernel, Dim3{X: c.rows}, Dim3{X: c.block}, &args)
	got := k.getF32(t, dst, c.rows*ds)

	want := slices.Clone(before) // values past d in each row stay as they were
	for i := 0; i < c.rows; i++ {
		out, in := want[i*ds:i*ds+c.d], x[i*xs:i*xs+c.d]
		models.RMSNorm(out, in, models.Norm{Weight: w, Bias: b}, c.eps)
		if w == nil && b != nil {
			for j := range out {
				out[j] += b[j]
			}
		}
	}
	checkBits(t, "dst", got, want)
}

// ---- element-wise ----

// ewValues are values of every magnitude, specials included.
func ewValues(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Ldexp(2*r.Float64()-1, r.IntN(40)-20))
	}
	return v
}

// halfSpecials are float32 inputs at the edges of float16: zeros, the largest half and the
// overflow threshold, subnormal halves and what underflows, ties to even, infinities, NaNs
// and float32 subnormals.
var halfSpecials = []float32{
	0, float32(math.Copysign(0, -1)), 1, -1, 65504, 65519.996, 65520, -65520, 1e10,
	0x1p-24, 0x1p-25, 0x1.8p-25, 0x1.0000002p-25, 3 * 0x1p-26, 0x1p-14, 0x1.ffcp-15, 6.1e-5, 1e-8,
	1 + 0x1p-11, 1 + 3*0x1p-11, 1 + 0x1.0002p-11, 2049, 2051, -2051,
	float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), math.Float32frombits(0xffc12345), math.Float32frombits(0x7f800001),
	math.Float32frombits(1), math.Float32frombits(0x807fffff), math.MaxFloat32,
}

func elementwiseCases() []kernelCase {
	var cs []kernelCase
	add := func(kernel, name string, run func(t *testing.T, k *kernelEnv, r *rand.Rand)) {
		cs = append(cs, kernelCase{kernel, name, run})
	}
	// grid: ceil(n/256) as the ABI suggests, and a smaller one for the grid-stride loop.
	for _, sh := range []struct{ n, grid int }{{1000, 4}, {1000, 1}, {1, 1}} {
		n, grid := sh.n, sh.grid
		shape := fmt.Sprintf("n=%d,grid=%d", n, grid)
		binary := func(kernel string, op func(d, s float32) float32) {
			add(kernel, shape, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				d, s := ewValues(r, n), ewValues(r, n)
				dd, dsrc := k.putF32(t, d), k.putF32(t, s)
				var args Args
				k.run(t, kernel, Dim3{X: grid}, Dim3{X: 256}, args.Ptr(dd).Ptr(dsrc).Int(n))
				want := make([]float32, n)
				for i := range want {
					want[i] = op(d[i], s[i])
				}
				checkBits(t, "dst", k.getF32(t, dd, n), want)
			})
		}
		binary("add_f32", func(d, s float32) float32 { return d + s })
		binary("mul_f32", func(d, s float32) float32 { return d * s })
		binary("copy_f32", func(d, s float32) float32 { return s })
		add("scale_f32", shape, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			x := ewValues(r, n)
			const s = float32(-0.3)
			dx := k.putF32(t, x)
			var args Args
			k.run(t, "scale_f32", Dim3{X: grid}, Dim3{X: 256}, args.Ptr(dx).Float(s).Int(n))
			want := make([]float32, n)
			for i, v := range x {
				want[i] = v * s
			}
			checkBits(t, "x", k.getF32(t, dx, n), want)
		})
		add("scale_add_f32", shape, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			d, s := ewValues(r, n), ewValues(r, n)
			const w = float32(0.7071)
			dd, dsrc := k.putF32(t, d), k.putF32(t, s)
			var args Args
			k.run(t, "scale_add_f32", Dim3{X: grid}, Dim3{X: 256}, args.Ptr(dd).Ptr(dsrc).Float(w).Int(n))
			want := make([]float32, n)
			for i := range want {
				want[i] = d[i] + float32(w*s[i]) // the product rounded first
			}
			checkBits(t, "dst", k.getF32(t, dd, n), want)
		})
		add("sigmoid_f32", shape, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			x := randF32(r, n, 8)
			copy(x, []float32{100, -100, 88.8, -104, 0, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())})
			dx := k.putF32(t, x)
			var args Args
			k.run(t, "sigmoid_f32", Dim3{X: grid}, Dim3{X: 256}, args.Ptr(dx).Int(n))
			want := make([]float32, n)
			for i, v := range x {
				want[i] = models.Sigmoid(v)
			}
			checkBits(t, "x", k.getF32(t, dx, n), want)
		})
	}

	for _, c := range []struct{ rows, d, grid int }{{7, 37, 2}, {3, 300, 1}} {
		n := c.rows * c.d
		add("add_rows_f32", fmt.Sprintf("n=%d,d=%d,grid=%d", n, c.d, c.grid), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			x, b := ewValues(r, n), ewValues(r, c.d)
			dx, db := k.putF32(t, x), k.putF32(t, b)
			var args Args
			k.run(t, "add_rows_f32", Dim3{X: c.grid}, Dim3{X: 256}, args.Ptr(dx).Ptr(db).Int(n).Int(c.d))
			want := make([]float32, n)
			for i, v := range x {
				want[i] = v + b[i%c.d]
			}
			checkBits(t, "x", k.getF32(t, dx, n), want)
		})
	}

	// swiglu_f32 is models.SwiGLU bit for bit on its 16-wide vectors; models computes a row's
	// last len%16 values with glibc's expf where the kernel keeps ggml_v_expf, so those are
	// compared within 8 roundings (both exps are within 2 ulps; a division and a product).
	for _, c := range []struct{ n, grid int }{{272, 2}, {1024, 1}, {37, 1}} {
		add("swiglu_f32", fmt.Sprintf("n=%d,grid=%d", c.n, c.grid), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			g, u := randF32(r, c.n, 4), randF32(r, c.n, 1)
			copy(g, []float32{100, -100, 90, -90, 0, 1e-30, -1e-30, 30})
			dg, du := k.putF32(t, g), k.putF32(t, u)
			var args Args
			k.run(t, "swiglu_f32", Dim3{X: c.grid}, Dim3{X: 256}, args.Ptr(dg).Ptr(du).Int(c.n))
			got := k.getF32(t, dg, c.n)
			want := make([]float32, c.n)
			models.SwiGLU(want, g, u)
			vec := c.n &^ 15
			checkBits(t, "g", got[:vec], want[:vec])
			wt, tol := make([]float64, c.n-vec), make([]float64, c.n-vec)
			for i := range wt {
				wt[i], tol[i] = float64(want[vec+i]), gamma(8)*math.Abs(float64(want[vec+i]))
			}
			checkClose(t, "g tail", got[vec:], wt, tol)
		})
	}

	// swiglu_oai_f32: models.SwiGLUOAI to the bit (glibc's expf on both sides), with gates and
	// ups beyond gpt-oss's limit of 7 on either side, zeros and NaN.
	for _, c := range []struct{ n, grid int }{{272, 2}, {37, 1}} {
		add("swiglu_oai_f32", fmt.Sprintf("n=%d,grid=%d", c.n, c.grid), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			g, u := randF32(r, c.n, 12), randF32(r, c.n, 12)
			copy(g, []float32{100, -100, 7, -7, 0, float32(math.Copysign(0, -1)), 1e-30, float32(math.NaN()), 90})
			copy(u, []float32{-100, 100, 6.5, -8, 0, 0, 1, 1, float32(math.NaN())})
			dg, du := k.putF32(t, g), k.putF32(t, u)
			var args Args
			k.run(t, "swiglu_oai_f32", Dim3{X: c.grid}, Dim3{X: 256}, args.Ptr(dg).Ptr(du).Int(c.n).Float(1.702).Float(7))
			want := make([]float32, c.n)
			models.SwiGLUOAI(want, g, u, 1.702, 7)
			checkBits(t, "g", k.getF32(t, dg, c.n), want)
		})
	}

	// read_u4: the xor of every word, whichever thread and loop read it (the four-load loop, the
	// tail; more threads than words).
	for _, c := range []struct{ n, grid, block int }{{1000, 2, 64}, {37, 1, 32}, {5, 2, 64}} {
		add("read_u4", fmt.Sprintf("n=%d,grid=%d,block=%d", c.n, c.grid, c.block), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			words := make([]byte, 16*c.n)
			for i := range words {
				words[i] = byte(r.Uint32())
			}
			warps := c.grid * c.block / 32
			dp, dout := k.put(t, words), k.alloc(t, 4*warps)
			var args Args
			k.run(t, "read_u4", Dim3{X: c.grid}, Dim3{X: c.block}, args.Ptr(dp).Int64(int64(c.n)).Ptr(dout))
			var got, want uint32
			for _, v := range i32sOf(k.get(t, dout, 4*warps)) {
				got ^= uint32(v)
			}
			for i := 0; i < len(words); i += 4 {
				want ^= binary.LittleEndian.Uint32(words[i:])
			}
			if got != want {
				t.Errorf("xor %#x, want %#x", got, want)
			}
		})
	}

	// mul_sigmoid_f32: models.HostOps.MulSigmoid to the bit, gates past expf's range included.
	for _, c := range []struct{ n, grid int }{{272, 2}, {37, 1}} {
		add("mul_sigmoid_f32", fmt.Sprintf("n=%d,grid=%d", c.n, c.grid), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			x, g := randF32(r, c.n, 3), randF32(r, c.n, 8)
			copy(g, []float32{200, -200, 0, float32(math.NaN()), 1e-30})
			dx, dg := k.putF32(t, x), k.putF32(t, g)
			var args Args
			k.run(t, "mul_sigmoid_f32", Dim3{X: c.grid}, Dim3{X: 256}, args.Ptr(dx).Ptr(dg).Int(c.n))
			want := slices.Clone(x)
			models.HostOps{}.MulSigmoid(want, g)
			checkBits(t, "x", k.getF32(t, dx, c.n), want)
		})
	}

	for _, c := range []struct{ k, d, ntok, grid int }{{4, 300, 3, 2}, {1, 17, 2, 1}, {8, 64, 1, 1}} {
		add("combine_f32", fmt.Sprintf("k=%d,d=%d,ntok=%d,grid=(%d,%d)", c.k, c.d, c.ntok, c.grid, c.ntok), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			out, ys, w := ewValues(r, c.ntok*c.d), randF32(r, c.ntok*c.k*c.d, 1), randUniform(r, c.ntok*c.k, 0, 1)
			dout, dys, dw := k.putF32(t, out), k.putF32(t, ys), k.putF32(t, w)
			var args Args
			k.run(t, "combine_f32", Dim3{X: c.grid, Y: c.ntok}, Dim3{X: 256}, args.Ptr(dout).Ptr(dys).Ptr(dw).Int(c.k).Int(c.d))
			want := make([]float32, len(out))
			for tk := 0; tk < c.ntok; tk++ {
				for i := 0; i < c.d; i++ {
					var s float32
					for j := 0; j < c.k; j++ {
						s += float32(w[tk*c.k+j] * ys[(tk*c.k+j)*c.d+i])
					}
					want[tk*c.d+i] = out[tk*c.d+i] + s
				}
			}
			checkBits(t, "out", k.getF32(t, dout, len(out)), want)
		})
	}

	// Halves: quant.FP32ToFP16 and FP16ToFP32 to the bit; a NaN must stay a NaN (payloads may
	// differ, as common.cuh says).
	for _, grid := range []int{4, 1} {
		add("f32_to_f16", fmt.Sprintf("n=1000,grid=%d", grid), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			x := append(slices.Clone(halfSpecials), ewValues(r, 1000-len(halfSpecials))...)
			for i := len(halfSpecials); i < len(x); i += 3 {
				x[i] = float32(math.Ldexp(2*r.Float64()-1, r.IntN(48)-30)) // subnormal halves to overflow
			}
			dx, dh := k.putF32(t, x), k.alloc(t, 2*len(x))
			var args Args
			k.run(t, "f32_to_f16", Dim3{X: grid}, Dim3{X: 256}, args.Ptr(dh).Ptr(dx).Int(len(x)))
			checkHalves(t, k.getU16(t, dh, len(x)), x)
		})
	}
	for _, grid := range []int{256, 7} {
		add("f16_to_f32", fmt.Sprintf("n=65536,grid=%d", grid), func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			h := make([]uint16, 1<<16)
			want := make([]float32, len(h))
			for i := range h {
				h[i] = uint16(i)
				want[i] = quant.FP16ToFP32(h[i])
			}
			dh, dx := k.put(t, u16bytes(h)), k.alloc(t, 4*len(h))
			var args Args
			k.run(t, "f16_to_f32", Dim3{X: grid}, Dim3{X: 256}, args.Ptr(dx).Ptr(dh).Int(len(h)))
			checkBits(t, "dst", k.getF32(t, dx, len(h)), want)
		})
	}

	for _, c := range []struct{ rows, cols, dstStride, srcStride, gx, gy int }{{5, 300, 310, 305, 2, 5}, {5, 300, 300, 301, 1, 2}, {3, 1, 4, 2, 1, 3}} {
		shape := fmt.Sprintf("rows=%d,cols=%d,dst_stride=%d,src_stride=%d,grid=(%d,%d)", c.rows, c.cols, c.dstStride, c.srcStride, c.gx, c.gy)
		add("copy2d_f32", shape, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			src := ewValues(r, c.rows*c.srcStride)
			dsrc, ddst := k.putF32(t, src), k.alloc(t, 4*c.rows*c.dstStride)
			var args Args
			k.run(t, "copy2d_f32", Dim3{X: c.gx, Y: c.gy}, Dim3{X: 256},
				args.Ptr(ddst).Ptr(dsrc).Int(c.rows).Int(c.cols).Int(c.dstStride).Int(c.srcStride))
			want := make([]float32, c.rows*c.dstStride)
			for i := range want {
				want[i] = math.Float32frombits(0xffffffff) // the gaps are left alone
			}
			for i := 0; i < c.rows; i++ {
				copy(want[i*c.dstStride:i*c.dstStride+c.cols], src[i*c.srcStride:])
			}
			got := k.getF32(t, ddst, len(want))
			for i := range got { // NaN-tolerant checkBits would not see a gap overwritten by a NaN
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("dst[%d] = %#08x, want %#08x", i, math.Float32bits(got[i]), math.Float32bits(want[i]))
				}
			}
		})
		add("copy2d_f32_f16", shape, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			src := ewValues(r, c.rows*c.srcStride)
			copy(src, halfSpecials)
			dsrc, ddst := k.putF32(t, src), k.alloc(t, 2*c.rows*c.dstStride)
			var args Args
			k.run(t, "copy2d_f32_f16", Dim3{X: c.gx, Y: c.gy}, Dim3{X: 256},
				args.Ptr(ddst).Ptr(dsrc).Int(c.rows).Int(c.cols).Int(c.dstStride).Int(c.srcStride))
			got := k.getU16(t, ddst, c.rows*c.dstStride)
			for i := 0; i < c.rows; i++ {
				for j := c.cols; j < c.dstStride; j++ {
					if h := got[i*c.dstStride+j]; h != 0xffff {
						t.Fatalf("dst[%d] = %#04x in a gap, want it untouched (0xffff)", i*c.dstStride+j, h)
					}
				}
				checkHalves(t, got[i*c.dstStride:i*c.dstStride+c.cols], src[i*c.srcStride:i*c.srcStride+c.cols])
			}
		})
	}
	return cs
}

// checkHalves compares halves with quant.FP32ToFP16 of x; a NaN only needs to stay a NaN.
func checkHalves(t *testing.T, got []uint16, x []float32) {
	t.Helper()
	isNaN := func(h uint16) bool { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
	bad := 0
	for i, v := range x {
		want := quant.FP32ToFP16(v)
		if got[i] == want || isNaN(got[i]) && isNaN(want) {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("half of %v (%#08x) = %#04x, want %#04x", v, math.Float32bits(v), got[i], want)
		}
	}
	if bad > 5 {
		t.Errorf("%d of %d halves differ", bad, len(x))
	}
}

// ---- router ----

func routerCases() []kernelCase {
	var cs []kernelCase
	// softmax_rows_f32: models.Softmax (not the padded variant: the last n%16 go through
	// glibc's expf) bit for bit. The logits lie within 12 of each other, so every exp is at
	// least e^-12 > 2^-18: the float32 terms of the float64 sum are multiples of 2^-41, and
	// their sums (about n/12 here) are exact in float64 whatever the order of the additions.
	for _, c := range []struct{ n, rows, block int }{{5, 3, 256}, {16, 3, 256}, {60, 3, 256}, {64, 2, 256}, {300, 3, 32}, {5000, 2, 256}} {
		cs = append(cs, kernelCase{"softmax_rows_f32", fmt.Sprintf("n=%d,rows=%d,block=%d", c.n, c.rows, c.block),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				x := randUniform(r, c.n*c.rows, -6, 6)
				dx := k.putF32(t, x)
				var args Args
				k.run(t, "softmax_rows_f32", Dim3{X: c.rows}, Dim3{X: c.block}, args.Ptr(dx).Int(c.n).Int(c.rows))
				want := slices.Clone(x)
				for i := 0; i < c.rows; i++ {
					models.Softmax(want[i*c.n : (i+1)*c.n])
				}
				checkBits(t, "x", k.getF32(t, dx, len(x)), want)
			}})
	}

	// topk_f32: probabilities on a coarse grid (many ties, broken to the lower index), NaNs,
	// and a last row with fewer than k numbers.
	for _, c := range []struct {
		n, k, rows int
		bias       bool
	}{{8, 2, 3, false}, {8, 8, 2, true}, {60, 6, 4, true}, {64, 8, 3, false}, {160, 4, 3, true}, {33, 1, 2, false}} {
		cs = append(cs, kernelCase{"topk_f32", fmt.Sprintf("n=%d,k=%d,rows=%d,bias=%v", c.n, c.k, c.rows, c.bias),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				p := make([]float32, c.n*c.rows)
				for i := range p {
					p[i] = float32(r.IntN(8)) / 8
					if r.IntN(10) == 0 {
						p[i] = float32(math.NaN())
					}
				}
				last := p[(c.rows-1)*c.n:]
				for i := range last {
					if i%(c.n/2+1) != 1 {
						last[i] = float32(math.NaN()) // two numbers left in the row
					}
				}
				var bias []float32
				dbias := DevicePtr(0)
				if c.bias {
					bias = make([]float32, c.n)
					for i := range bias {
						bias[i] = float32(r.IntN(4)) / 16
					}
					dbias = k.putF32(t, bias)
				}
				dp, dids, dw := k.putF32(t, p), k.alloc(t, 4*c.k*c.rows), k.alloc(t, 4*c.k*c.rows)
				var args Args
				k.run(t, "topk_f32", Dim3{X: c.rows}, Dim3{X: 32}, args.Ptr(dp).Ptr(dbias).Int(c.n).Int(c.k).Int(c.rows).Ptr(dids).Ptr(dw))
				gotIDs := i32sOf(k.get(t, dids, 4*c.k*c.rows))
				gotW := k.getF32(t, dw, c.k*c.rows)
				for i := 0; i < c.rows; i++ {
					ids, w := topkRef(p[i*c.n:(i+1)*c.n], bias, c.k)
					if got := gotIDs[i*c.k : (i+1)*c.k]; !slices.Equal(got, ids) {
						t.Errorf("row %d: ids %v, want %v", i, got, ids)
					}
					checkBits(t, fmt.Sprintf("row %d: w", i), gotW[i*c.k:(i+1)*c.k], w)
				}
			}})
	}

	// norm_weights_f32: the engine's gateWeights; one thread per row, rows over two blocks.
	for _, c := range []struct {
		k                  int
		softmax, normalize bool
		scale              float32
		tiny               bool // weights summing below the 6.1e-5 floor
	}{{1, true, true, 0, false}, {6, true, true, 0, false}, {8, false, true, 2.5, false}, {20, true, false, 0, false},
		{8, false, false, 16, false}, {6, false, true, 0, true}, {20, true, true, 1.5, false}} {
		const rows = 300
		cs = append(cs, kernelCase{"norm_weights_f32", fmt.Sprintf("k=%d,rows=%d,softmax=%v,normalize=%v,scale=%v,tiny=%v", c.k, rows, c.softmax, c.normalize, c.scale, c.tiny),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				// Logits within 8 of each other (exps above 2^-12) and weights above 2^-10, or
				// all within [1e-6, 1e-5], make the float64 sums of at most 20 float32 terms
				// exact, so the order of the additions does not matter.
				var w []float32
				switch {
				case c.softmax:
					w = randUniform(r, rows*c.k, -4, 4)
				case c.tiny:
					w = randUniform(r, rows*c.k, 1e-6, 1e-5)
				default:
					w = randUniform(r, rows*c.k, 0x1p-10, 1)
				}
				dw := k.putF32(t, w)
				var args Args
				k.run(t, "norm_weights_f32", Dim3{X: ceilDiv(rows, 256)}, Dim3{X: 256},
					args.Ptr(dw).Int(c.k).Int(rows).Int(b2i(c.softmax)).Int(b2i(c.normalize)).Float(c.scale))
				want := slices.Clone(w)
				for i := 0; i < rows; i++ {
					gateWeightsRef(want[i*c.k:(i+1)*c.k], c.softmax, c.normalize, c.scale)
				}
				checkBits(t, "w", k.getF32(t, dw, len(w)), want)
			}})
	}
	return cs
}

// topkRef is the engine's topK on the scores p+bias, reporting the chosen experts' p.
// gateWeightsRef finishes chosen experts' weights w in place as the engine's gateWeights
// does: softmax (gating softmax_weight), renormalisation by their float64 sum (floored at
// 6.1e-5), scale.
func gateWeightsRef(w []float32, softmax, normalize bool, scale float32) {
	if softmax {
		models.Softmax(w)
	}
	if normalize {
		var s float64
		for _, v := range w {
			s += float64(v)
		}
		sum := max(float32(s), 6.103515625e-5)
		for j := range w {
			w[j] /= sum
		}
	}
	if scale != 0 {
		for j := range w {
			w[j] *= scale
		}
	}
}

func topkRef(p, bias []float32, k int) ([]int32, []float32) {
	taken := make([]bool, len(p))
	var ids []int32
	var w []float32
	for j := 0; j < k; j++ {
		bi, best := -1, float32(0)
		for i, v := range p {
			s := v
			if bias != nil {
				s = v + bias[i]
			}
			if s != s || taken[i] {
				continue
			}
			if bi < 0 || s > best {
				bi, best = i, s
			}
		}
		id := j // fewer than k numbers: the choice is j itself
		if bi >= 0 {
			id = bi
			taken[bi] = true
		}
		ids = append(ids, int32(id))
		w = append(w, p[id])
	}
	return ids, w
}

// ---- rope ----

type ropeCase struct {
	name                               string
	ntok, heads, headStride, tokStride int
	off                                int // floats before head 0 of token 0 (MLA: nope or rank)
	nDims, block                       int
	neox, freqFactors                  bool
	freqBase, freqScale, extFactor     float32
	attnFactor, corrLo, corrHi         float32
	// Token t is at position pos0 + dev + t, dev read from device memory (0: posp NULL).
	pos0, dev int
}

func ropeCases() []kernelCase {
	yarn := func(c ropeCase) ropeCase {
		c.freqScale, c.extFactor, c.corrLo, c.corrHi = 0.25, 1, 2, 11
		return c
	}
	var cs []kernelCase
	for _, c := range []ropeCase{
		{name: "normal", ntok: 3, heads: 4, headStride: 64, tokStride: 256, nDims: 64, block: 32, pos0: 4998},
		{name: "normal,first", ntok: 2, heads: 4, headStride: 64, tokStride: 256, nDims: 64, block: 32},
		{name: "neox,partial", ntok: 2, heads: 2, headStride: 64, tokStride: 128, nDims: 32, block: 32, neox: true, pos0: 129},
		{name: "neox,freq_factors,device_pos", ntok: 3, heads: 2, headStride: 48, tokStride: 96, nDims: 48, block: 64, neox: true, freqFactors: true, pos0: 1, dev: 897},
		yarn(ropeCase{name: "normal,yarn", ntok: 3, heads: 2, headStride: 32, tokStride: 64, nDims: 32, block: 32, pos0: 4095}),
		yarn(ropeCase{name: "neox,yarn,freq_factors,loop,device_pos", ntok: 2, heads: 3, headStride: 128, tokStride: 384, nDims: 128, block: 32, neox: true, freqFactors: true, dev: 76}),
		// MLA: q_pe of 4 heads of nope 16 + rope 16, and k_pe of one rank-32 latent row.
		yarn(ropeCase{name: "mla_q_pe", ntok: 3, heads: 4, headStride: 32, tokStride: 128, off: 16, nDims: 16, block: 32, pos0: 62}),
		yarn(ropeCase{name: "mla_k_pe", ntok: 3, heads: 1, headStride: 48, tokStride: 48, off: 32, nDims: 16, block: 32, pos0: 2, dev: 60}),
	} {
		c.freqBase, c.attnFactor = 10000, 1
		if c.freqScale == 0 {
			c.freqScale = 1
		}
		name := fmt.Sprintf("%s,ntok=%d,heads=%d,n_dims=%d", c.name, c.ntok, c.heads, c.nDims)
		cs = append(cs, kernelCase{"rope_f32", name, func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkRope(t, k, c, r) }})
	}
	return cs
}

// checkRope compares with a float64 rotation. The angle follows the schedule the ABI
// prescribes in float32 (theta advanced by repeated float32 products, the frequency factor's
// division, YaRN's ramp), which makes it the kernel's angle exactly; cos, sin, the attention
// factor and the rotation are then float64. The kernel's sincosf is within an ulp (2u
// relative), and cos*mscale, sin*mscale, x1*sin and the fused rotation round once each, so
// each output is within 8u * mscale * (|x0| + |x1|) of the reference; values outside the
// rotated dimensions must not change at all.
func checkRope(t *testing.T, k *kernelEnv, c ropeCase, r *rand.Rand) {
	x := randF32(r, c.ntok*c.tokStride, 1)
	var ff []float32
	dff := DevicePtr(0)
	if c.freqFactors {
		ff = randUniform(r, c.nDims/2, 1, 8)
		dff = k.putF32(t, ff)
	}
	thetaScale := float32(math.Pow(float64(c.freqBase), float64(-2/float32(c.nDims))))
	mscale := c.attnFactor
	if c.extFactor != 0 {
		mscale *= quant.FMA32(float32(math.Log(float64(1/c.freqScale))), 0.1, 1)
	}
	dx, dpos := k.putF32(t, x), DevicePtr(0)
	if c.dev != 0 {
		dpos = k.put(t, i32bytes([]int32{int32(c.dev)}))
	}
	var args Args
	k.run(t, "rope_f32", Dim3{X: c.ntok}, Dim3{X: c.block},
		args.Ptr(dx.Add(int64(4*c.off))).Ptr(dpos).Int(c.pos0).Int(c.ntok).Int(c.heads).Int(c.headStride).Int(c.tokStride).Int(c.nDims).
			Int(b2i(c.neox)).Float(thetaScale).Float(c.freqScale).Float(c.extFactor).Float(mscale).
			Float(c.corrLo).Float(c.corrHi).Ptr(dff))
	got := k.getF32(t, dx, len(x))

	want, tol := make([]float64, len(x)), make([]float64, len(x))
	for i, v := range x {
		want[i] = float64(v)
	}
	npairs := c.nDims / 2
	for tk := 0; tk < c.ntok; tk++ {
		theta := float32(c.pos0 + c.dev + tk)
		for i := 0; i < npairs; i++ {
			te := theta
			if ff != nil {
				te = theta / ff[i]
			}
			ti := c.freqScale * te
			th := ti
			if c.extFactor != 0 {
				y := (float32(i) - c.corrLo) / max(c.corrHi-c.corrLo, 0.001)
				ramp := (1 - min(1, max(0, y))) * c.extFactor
				th = quant.FMA32(ti, 1-ramp, float32(te*ramp))
			}
			sn, cs := math.Sincos(float64(th))
			sn, cs = sn*float64(mscale), cs*float64(mscale)
			i0, i1 := 2*i, 2*i+1
			if c.neox {
				i0, i1 = i, i+npairs
			}
			for h := 0; h < c.heads; h++ {
				b := tk*c.tokStride + c.off + h*c.headStride
				x0, x1 := float64(x[b+i0]), float64(x[b+i1])
				want[b+i0], want[b+i1] = x0*cs-x1*sn, x0*sn+x1*cs
				e := 8 * unit * float64(mscale) * (math.Abs(x0) + math.Abs(x1))
				tol[b+i0], tol[b+i1] = e, e
			}
			theta *= thetaScale
		}
	}
	checkClose(t, "x", got, want, tol)
}

// ---- attention ----

type attnCase struct {
	ntok, heads, kvHeads, dk, dv, pos0 int
	mla                                bool // absorbed MLA: k = v = the latent cache
	dev                                bool // pos0 given in device memory (posp), not as an int
	window                             int  // a sliding window, 0 = none
	sinks                              bool // a sink logit per head
	ring                               int  // the cache is a ring of this many rows (0: none)
}

func (c attnCase) String() string {
	s := fmt.Sprintf("heads=%d,kv_heads=%d,dk=%d,dv=%d,ntok=%d,pos0=%d", c.heads, c.kvHeads, c.dk, c.dv, c.ntok, c.pos0)
	if c.mla {
		s = "mla," + s
	}
	if c.dev {
		s += ",device_pos"
	}
	if c.window != 0 {
		s += fmt.Sprintf(",window=%d", c.window)
	}
	if c.sinks {
		s += ",sinks"
	}
	if c.ring != 0 {
		s += fmt.Sprintf(",ring=%d", c.ring)
	}
	return s
}

func attnCases() []kernelCase {
	var cs []kernelCase
	for _, c := range []attnCase{
		{ntok: 1, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 0},
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 5},
		{ntok: 1, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 7, dev: true},
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 20},           // two groups of 16 scores
		{ntok: 2, heads: 4, kvHeads: 4, dk: 48, dv: 32, pos0: 3},            // MLA legacy: dk != dv
		{ntok: 3, heads: 4, kvHeads: 1, dk: 80, dv: 64, pos0: 9, mla: true}, // rank 64 + rope 16
		{ntok: 1, heads: 4, kvHeads: 1, dk: 80, dv: 64, pos0: 12, mla: true, dev: true},
		// ATT_SMAX = 4096 positions and past them (the running (max, sum) path, which needs
		// more than 8 positions past it for a warp to take two): cheap on the emulator with
		// one small KV head, about 0.1 s a launch.
		{ntok: 2, heads: 2, kvHeads: 1, dk: 32, dv: 32, pos0: 4095},
		{ntok: 1, heads: 2, kvHeads: 1, dk: 32, dv: 32, pos0: 4140},
		// gpt-oss: sinks above, among and below the scores, with and without a window that
		// starts inside a group of 16 (and after the first), or covers every position.
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 20, sinks: true},
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 40, window: 7, sinks: true},
		{ntok: 1, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 40, window: 19, dev: true},
		{ntok: 2, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 3, window: 64, sinks: true},
		{ntok: 1, heads: 2, kvHeads: 1, dk: 32, dv: 32, pos0: 4140, window: 4110, sinks: true},
		// A sliding window's ring (device.KVLayer.Ring): the positions wrap around its rows, in
		// the tokens' windows and between the tokens.
		{ntok: 3, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 40, window: 7, sinks: true, ring: 16},
		{ntok: 1, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 100, window: 19, dev: true, ring: 32},
		{ntok: 4, heads: 2, kvHeads: 1, dk: 32, dv: 48, pos0: 61, window: 20, ring: 64},
		// The head sizes the split kernels weigh values of with loads unguarded (32 and 64
		// above): Mixtral's and Qwen3's 128, 256, and DeepSeek-V2's absorbed MLA (rank 512
		// plus rope 64).
		{ntok: 1, heads: 2, kvHeads: 1, dk: 128, dv: 128, pos0: 70},
		{ntok: 1, heads: 2, kvHeads: 2, dk: 96, dv: 256, pos0: 45, window: 30},
		{ntok: 1, heads: 2, kvHeads: 1, dk: 576, dv: 512, pos0: 40, mla: true, dev: true},
	} {
		for _, f16 := range []bool{false, true} {
			kv := "f32"
			if f16 {
				kv = "f16kv"
			}
			cs = append(cs, kernelCase{"attn_" + kv, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkAttn(t, k, c, f16, 0, r) }})
			// The split kernels, each case launching both: 3 splits, and 16 of which the short
			// contexts fill one or two.
			for _, sp := range []struct {
				kernel string
				splits int
			}{{"attn_split_scores_" + kv, 3}, {"attn_split_pv_" + kv, 16}} {
				cs = append(cs, kernelCase{sp.kernel, fmt.Sprintf("%v,splits=%d", c, sp.splits),
					func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkAttn(t, k, c, f16, sp.splits, r) }})
			}
		}
	}
	// The tensor-core prompt kernels (flash.cu): several blocks of 64 tokens and rows past the
	// last token, several tiles of positions (64 for heads of 64, 32 for 128 and 192, 16 for 256
	// and the latent cache), grouped queries, windows that start inside a tile, rings, sinks, a
	// position in device memory.
	for _, c := range []attnCase{
		{ntok: 70, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 0},
		{ntok: 20, heads: 2, kvHeads: 1, dk: 128, dv: 128, pos0: 90},
		{ntok: 37, heads: 4, kvHeads: 2, dk: 64, dv: 64, pos0: 40, window: 19, sinks: true, ring: 64},
		{ntok: 33, heads: 2, kvHeads: 2, dk: 128, dv: 128, pos0: 5, dev: true, sinks: true},
		{ntok: 16, heads: 8, kvHeads: 1, dk: 64, dv: 64, pos0: 130, window: 70},
		{ntok: 40, heads: 4, kvHeads: 1, dk: 128, dv: 128, pos0: 50, window: 37, sinks: true, ring: 80},
		// Heads of 256 (Qwen3.6's full attention): blocks of 32 tokens, two warps a row's values.
		{ntok: 45, heads: 4, kvHeads: 2, dk: 256, dv: 256, pos0: 20},
		{ntok: 33, heads: 2, kvHeads: 1, dk: 256, dv: 256, pos0: 40, window: 25, sinks: true, ring: 64},
		// DeepSeek's MLA, legacy layout: 192 keys, 128 values.
		{ntok: 40, heads: 2, kvHeads: 2, dk: 192, dv: 128, pos0: 30},
		{ntok: 35, heads: 4, kvHeads: 2, dk: 192, dv: 128, pos0: 9, window: 21, dev: true, sinks: true, ring: 64},
		// The absorbed layout's latent cache: blocks of 16 rows (token, head), the warps
		// splitting the scores' and the values' sums; 5 heads put rows of two tokens in a
		// lane and leave the last block 3 rows.
		{ntok: 40, heads: 4, kvHeads: 1, dk: 576, dv: 512, pos0: 20, mla: true},
		{ntok: 7, heads: 5, kvHeads: 1, dk: 576, dv: 512, pos0: 33, mla: true, dev: true, sinks: true},
		{ntok: 9, heads: 3, kvHeads: 1, dk: 576, dv: 512, pos0: 50, mla: true, window: 20, ring: 48},
	} {
		kernel, _ := flashLaunch(c.dk, c.dv, c.mla, c.ntok, c.heads)
		cs = append(cs, kernelCase{kernel, c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkAttn(t, k, c, true, attnFlash, r) }})
	}
	// Heads of another size than the entry point's, and a latent cache whose values are not
	// its keys, give NaN outputs.
	for _, c := range []struct {
		kernel, name string
		grid         Dim3
		dk, dv       int
		apart        bool // values in a cache of their own
	}{
		{"attn_fa_f16kv_d64", "bad,dk=32", Dim3{X: 1, Y: 2}, 32, 32, false},
		{"attn_fa_f16kv_d192v128", "bad,dk=dv=128", Dim3{X: 1, Y: 2}, 128, 128, false},
		{"attn_fa_f16kv_latent576", "bad,dv=576", Dim3{X: 1, Y: 1}, 576, 576, false},
		{"attn_fa_f16kv_latent576", "bad,values_apart", Dim3{X: 1, Y: 1}, 576, 512, true},
	} {
		cs = append(cs, kernelCase{c.kernel, c.name, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			const ntok, heads = 3, 2
			dq, dkv := k.putF32(t, randF32(r, ntok*heads*c.dk, 1)), k.put(t, make([]byte, 2*ntok*c.dk))
			dvc := dkv
			if c.apart {
				dvc = k.put(t, make([]byte, 2*ntok*c.dk))
			}
			out := k.alloc(t, 4*ntok*heads*c.dv)
			var a Args
			k.run(t, c.kernel, c.grid, Dim3{X: 128},
				a.Ptr(dq).Ptr(dkv).Ptr(dvc).Ptr(out).Int(ntok).Int(heads).Int(1).Int(c.dk).Int(c.dv).Int(c.dk).Int(c.dk).Int(0).Int(0).
					Ptr(0).Int(0).Float(0.125).Int(0).Ptr(0).Int(0))
			for i, v := range k.getF32(t, out, ntok*heads*c.dv) {
				if !math.IsNaN(float64(v)) {
					t.Fatalf("output %d is %v, want NaN", i, v)
				}
			}
		}})
	}
	// Shapes the split kernels do not take give NaN outputs and leave the counters at 0.
	for _, c := range []struct {
		name                      string
		heads, kvHeads, dk, dv, n int
		sstride                   int
	}{
		{"scores_past_sstride", 2, 1, 32, 32, 40, 39},
		{"dk_over_1024", 2, 1, 1056, 32, 5, 64},
		{"dv_over_512", 2, 1, 32, 544, 5, 64},
		{"heads_not_a_multiple", 3, 2, 32, 32, 5, 64},
	} {
		cs = append(cs, kernelCase{"attn_split_pv_f32", "bad," + c.name, func(t *testing.T, k *kernelEnv, r *rand.Rand) {
			const splits = 2
			rows := c.heads
			dq := k.putF32(t, randF32(r, rows*c.dk, 1))
			kvd := max(c.kvHeads*c.dk, c.kvHeads*c.dv)
			dkv := k.putF32(t, randF32(r, c.n*kvd, 1))
			sc, st := k.alloc(t, 4*rows*c.sstride), k.alloc(t, 4*rows*(splits+2))
			part, out := k.alloc(t, 4*rows*splits*c.dv), k.alloc(t, 4*rows*c.dv)
			cnt := k.put(t, make([]byte, 4*rows))
			var a1, a2 Args
			k.run(t, "attn_split_scores_f32", Dim3{X: c.heads, Y: splits, Z: 1}, Dim3{X: 256},
				a1.Ptr(dq).Ptr(dkv).Ptr(sc).Ptr(st).Ptr(cnt).Int(1).Int(c.heads).Int(c.kvHeads).Int(c.dk).Int(kvd).Int(c.dk).
					Ptr(0).Int(c.n-1).Float(0.125).Int(0).Ptr(0).Int(0).Int(c.sstride).Int(splits))
			k.run(t, "attn_split_pv_f32", Dim3{X: c.heads, Y: splits, Z: 1}, Dim3{X: 256},
				a2.Ptr(sc).Ptr(st).Ptr(dkv).Ptr(part).Ptr(cnt).Ptr(out).Int(1).Int(c.heads).Int(c.kvHeads).Int(c.dv).Int(kvd).Int(c.dv).
					Ptr(0).Int(c.n-1).Int(0).Int(0).Int(c.sstride).Int(splits))
			for i, v := range k.getF32(t, out, rows*c.dv) {
				if !math.IsNaN(float64(v)) {
					t.Fatalf("output %d is %v, want NaN", i, v)
				}
			}
			if b := k.get(t, cnt, 4*rows); slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) {
				t.Errorf("counters % x after the launches, want 0", b)
			}
		}})
	}
	return cs
}

// checkAttn compares with float64 softmax attention over the same (F16-rounded, for
// attn_f16kv) queries, keys and values. The tolerance of output d of a head is derived from the
// kernel's float32 arithmetic (u = 2^-24):
//
//   - a score is a warp's dot product, each lane chaining dk/32 fused multiply-adds, a 5-level
//     butterfly, then the scale: its error is at most E = gamma(dk/32 + 6) * scale * sum |q k|,
//     and the maximum's too;
//   - exp(s - m) then errs relatively by 2E + u|s - m| (the subtraction) + 4u (ggml_v_expf is
//     within 2 ulps); the sum of the exps by as much again plus gamma(n/8 + 4) (16-wide sums and,
//     past ATT_SMAX, the warps' running sums); a probability by delta = twice the former, plus
//     the sum's, plus u for 1/sum and u for the product;
//   - the output sums prob * v over positions, each warp chaining n/8 fused multiply-adds and 7
//     additions across warps: delta + gamma(n/8 + 8), relative to A = sum prob |v|;
//   - attn_f16kv rounds each probability to a half before it weighs the values, and so does
//     the reference. The kernel's float32 probability lies within pr(1 ± delta), so where both
//     ends round to the same half that half is the kernel's, exactly; where they do not (pr
//     next to a rounding boundary) the kernel may take either, and the gap between the two
//     halves times |v| joins the tolerance. The halves then weigh exact values: the error is
//     gamma(n/8 + 8) relative to A, plus those gaps.
//
// The cache holds NaNs past the last position, which a causal read never touches, and at the
// positions no token's window sees. A ring holds the last c.ring positions at their rows,
// and NaNs in the rows of none.
//
// With splits == attnFlash it launches the tensor-core kernel of the heads (flashLaunch) and
// holds it to the exact probabilities, unrounded: its probabilities are exp(s - m) against a
// running maximum, rounded to halves (half an ulp, 2^-11 relative, or 2^-25 absolute among the
// subnormals) and rescaled as the maximum grows (once a tile, of 16 positions or more), and its
// sums are the tensor cores' (exact products, float32 sums in an order of their own, counted
// here as twice as many roundings as a chain would take).
//
// With splits > 0 it launches attn_split_scores and attn_split_pv instead, twice over the same
// scratch, and requires the second outputs to be the first's to the bit and the counters
// back at 0: a replayed graph's launches. Their chunks' last additions and shorter chains of
// fused multiply-adds keep them within the same bounds.
// attnFlash, as checkAttn's splits, selects the tensor-core prompt kernels.
const attnFlash = -1

func checkAttn(t *testing.T, k *kernelEnv, c attnCase, f16 bool, splits int, r *rand.Rand) {
	npos := c.pos0 + c.ntok // positions the cache holds
	capPos := npos + 3      // and room past them, filled with NaN
	kstride, vstride, khs, vhs := c.kvHeads*c.dk, c.kvHeads*c.dv, c.dk, c.dv
	if c.mla {
		kstride, vstride, khs, vhs = c.dk, c.dk, 0, 0
	}
	q := randF32(r, c.ntok*c.heads*c.dk, 1)
	kc := randF32(r, capPos*kstride, 1)
	vc := kc
	if !c.mla {
		vc = randF32(r, capPos*vstride, 1)
	}
	// Past ATT_SMAX = 4096 positions, keys 4 times larger: those positions then dominate the
	// softmax, so an error in the kernel's running (max, sum) of them shows.
	for i := 4096 * kstride; i < npos*kstride; i++ {
		kc[i] *= 4
	}
	for i := npos * kstride; i < len(kc); i++ {
		kc[i] = float32(math.NaN())
	}
	for i := npos * vstride; i < len(vc); i++ {
		vc[i] = float32(math.NaN())
	}
	scale := float32(1 / math.Sqrt(float64(c.dk)))

	// The keys and values of the positions no token's window sees (the first token's masked
	// ones) are NaN: the kernel must not read them.
	if c.window > 0 {
		masked := max(0, c.pos0+1-c.window)
		for i := 0; i < masked*kstride; i++ {
			kc[i] = float32(math.NaN())
		}
		for i := 0; i < masked*vstride; i++ {
			vc[i] = float32(math.NaN())
		}
	}
	if f16 { // what the kernel and the reference read
		for _, x := range [][]float32{kc, vc} {
			for i, v := range x {
				x[i] = quant.FP16ToFP32(quant.FP32ToFP16(v))
			}
		}
	}
	upload := func(x []float32, stride int) DevicePtr {
		if c.ring > 0 {
			ring := make([]float32, c.ring*stride)
			for i := range ring {
				ring[i] = float32(math.NaN())
			}
			for p := max(0, npos-c.ring); p < npos; p++ {
				copy(ring[p%c.ring*stride:(p%c.ring+1)*stride], x[p*stride:])
			}
			x = ring
		}
		if !f16 {
			return k.putF32(t, x)
		}
		h := make([]uint16, len(x))
		for i, v := range x {
			h[i] = quant.FP32ToFP16(v)
		}
		return k.put(t, u16bytes(h))
	}
	kernel := "attn_f32"
	if f16 {
		kernel = "attn_f16kv"
	}
	dk := upload(kc, kstride)
	dv := dk
	if !c.mla {
		dv = upload(vc, vstride)
	}
	var sinks []float32
	var dsinks DevicePtr
	if c.sinks {
		for h := range c.heads {
			sinks = append(sinks, float32(h%3-1)*2.5+0.3)
		}
		dsinks = k.putF32(t, sinks)
	}
	dq, dout := k.putF32(t, q), k.alloc(t, 4*c.ntok*c.heads*c.dv)
	posp, pos0 := DevicePtr(0), c.pos0
	if c.dev {
		posp, pos0 = k.put(t, i32bytes([]int32{int32(c.pos0)})), 0
	}
	var got []float32
	flash := splits == attnFlash
	if flash {
		var args Args
		name, grid := flashLaunch(c.dk, c.dv, c.mla, c.ntok, c.heads)
		if name == "" {
			t.Fatalf("no flash kernel takes %v", c)
		}
		k.run(t, name, grid, Dim3{X: 128},
			args.Ptr(dq).Ptr(dk).Ptr(dv).Ptr(dout).Int(c.ntok).Int(c.heads).Int(c.kvHeads).Int(c.dk).Int(c.dv).
				Int(kstride).Int(vstride).Int(khs).Int(vhs).Ptr(posp).Int(pos0).Float(scale).Int(c.window).Ptr(dsinks).Int(c.ring))
		got = k.getF32(t, dout, c.ntok*c.heads*c.dv)
	} else if splits == 0 {
		var args Args
		k.run(t, kernel, Dim3{X: c.heads, Y: c.ntok}, Dim3{X: 256},
			args.Ptr(dq).Ptr(dk).Ptr(dv).Ptr(dout).Int(c.ntok).Int(c.heads).Int(c.kvHeads).Int(c.dk).Int(c.dv).
				Int(kstride).Int(vstride).Int(khs).Int(vhs).Ptr(posp).Int(pos0).Float(scale).Int(c.window).Ptr(dsinks).Int(c.ring))
		got = k.getF32(t, dout, c.ntok*c.heads*c.dv)
	} else {
		rows, sstride := c.ntok*c.heads, capPos+16
		if c.ring > 0 {
			sstride = c.ring + 16
		}
		sc, st := k.alloc(t, 4*rows*sstride), k.alloc(t, 4*rows*(splits+2))
		part, cnt := k.alloc(t, 4*rows*splits*c.dv), k.put(t, make([]byte, 4*rows))
		suffix := strings.TrimPrefix(kernel, "attn_")
		grid := Dim3{X: c.heads, Y: splits, Z: c.ntok}
		for i := range 2 {
			var a1, a2 Args
			k.run(t, "attn_split_scores_"+suffix, grid, Dim3{X: 256},
				a1.Ptr(dq).Ptr(dk).Ptr(sc).Ptr(st).Ptr(cnt).Int(c.ntok).Int(c.heads).Int(c.kvHeads).Int(c.dk).Int(kstride).Int(khs).
					Ptr(posp).Int(pos0).Float(scale).Int(c.window).Ptr(dsinks).Int(c.ring).Int(sstride).Int(splits))
			k.run(t, "attn_split_pv_"+suffix, grid, Dim3{X: 256},
				a2.Ptr(sc).Ptr(st).Ptr(dv).Ptr(part).Ptr(cnt).Ptr(dout).Int(c.ntok).Int(c.heads).Int(c.kvHeads).Int(c.dv).Int(vstride).Int(vhs).
					Ptr(posp).Int(pos0).Int(c.window).Int(c.ring).Int(sstride).Int(splits))
			out := k.getF32(t, dout, c.ntok*c.heads*c.dv)
			if b := k.get(t, cnt, 4*rows); slices.ContainsFunc(b, func(x byte) bool { return x != 0 }) {
				t.Fatalf("launch %d: counters % x after it, want 0", i+1, b)
			}
			if i == 1 {
				checkBits(t, "out, launched again", out, got)
			}
			got = out
		}
	}

	want, tol := make([]float64, len(got)), make([]float64, len(got))
	for tk := 0; tk < c.ntok; tk++ {
		n := c.pos0 + tk + 1
		for h := 0; h < c.heads; h++ {
			g := h / (c.heads / c.kvHeads)
			qh := slices.Clone(q[(tk*c.heads+h)*c.dk : (tk*c.heads+h+1)*c.dk])
			if f16 {
				for i, v := range qh {
					qh[i] = quant.FP16ToFP32(quant.FP32ToFP16(v))
				}
			}
			lo := 0
			if c.window > 0 {
				lo = max(0, n-c.window)
			}
			s, sabs := make([]float64, n), 0.0
			m := math.Inf(-1)
			for p := 0; p < n; p++ {
				if p < lo {
					s[p] = math.Inf(-1)
					continue
				}
				kr := kc[p*kstride+g*khs:]
				var d, a float64
				for i, v := range qh {
					d += float64(v) * float64(kr[i])
					a += math.Abs(float64(v) * float64(kr[i]))
				}
				s[p] = d * float64(scale)
				sabs = max(sabs, a*float64(scale))
				m = max(m, s[p])
			}
			if sinks != nil {
				m = max(m, float64(sinks[h]))
			}
			var sum, spread float64
			for p := lo; p < n; p++ {
				spread = max(spread, m-s[p])
				s[p] = math.Exp(s[p] - m)
				sum += s[p]
			}
			if sinks != nil {
				sum += math.Exp(float64(sinks[h]) - m)
			}
			e := gamma(ceilDiv(c.dk, 32)+6) * sabs
			if flash {
				e = gamma(2*c.dk+2) * sabs
			}
			perExp := 2*e + unit*spread + 4*unit
			delta := 2*perExp + gamma(ceilDiv(n, 8)+4) + 2*unit
			if flash { // the sums and rescalings of the tiles (of 16 positions or more), and the halves
				delta = 2*perExp + gamma(2*n+4*ceilDiv(n, 16)+8) + 0x1p-11
			}
			// The probabilities; for attn_f16kv the halves the kernel rounds them to, and where
			// the kernel's float32 probability may round to either of two halves, the gap.
			prs, gap := make([]float64, n), make([]float64, n)
			for p := lo; p < n; p++ {
				prs[p] = s[p] / sum
				if f16 && !flash {
					lo, hi := roundHalf(prs[p]*(1-delta)), roundHalf(prs[p]*(1+delta))
					prs[p], gap[p] = roundHalf(prs[p]), hi-lo
				}
			}
			rel := gamma(ceilDiv(n, 8) + 8)
			if !f16 || flash {
				rel += delta
			}
			if flash {
				rel += gamma(2*n + 8)
			}
			o := (tk*c.heads + h) * c.dv
			for d := 0; d < c.dv; d++ {
				var out, a, b float64
				for p := lo; p < n; p++ {
					v := float64(vc[p*vstride+g*vhs+d])
					out += prs[p] * v
					a += prs[p] * math.Abs(v)
					b += gap[p] * math.Abs(v)
					if flash {
						b += 0x1p-24 * math.Abs(v)
					}
				}
				want[o+d], tol[o+d] = out, rel*a+b
			}
		}
	}
	checkClose(t, "out", got, want, tol)
}

// roundHalf rounds x to the nearest float16 through float32, as the kernel rounds a float32
// probability; both roundings are monotonic.
func roundHalf(x float64) float64 { return float64(quant.FP16ToFP32(quant.FP32ToFP16(float32(x)))) }

// ---- the MoE block ----

func moeCases() []kernelCase {
	var cs []kernelCase
	// combine_off_f32: models.HostOps.Combine to the bit; tokens with 2, 0 and 4 experts.
	for _, c := range []struct {
		d, grid int
		off     []int32
	}{{300, 2, []int32{0, 2, 2, 6}}, {17, 1, []int32{0, 1}}, {64, 1, []int32{0, 8, 9}}} {
		ntok := len(c.off) - 1
		cs = append(cs, kernelCase{"combine_off_f32", fmt.Sprintf("d=%d,off=%v,grid=(%d,%d)", c.d, c.off, c.grid, ntok),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				n := int(c.off[ntok])
				ys, w := randF32(r, n*c.d, 1), randUniform(r, n, 0, 1)
				dout, dys, dw, doff := k.alloc(t, 4*ntok*c.d), k.putF32(t, ys), k.putF32(t, w), k.put(t, i32bytes(c.off))
				var args Args
				k.run(t, "combine_off_f32", Dim3{X: c.grid, Y: ntok}, Dim3{X: 256}, args.Ptr(dout).Ptr(dys).Ptr(dw).Ptr(doff).Ptr(0).Int(0).Int(c.d))
				want := make([]float32, ntok*c.d)
				models.HostOps{}.Combine(want, ys, w, c.off, c.d)
				checkBits(t, "out", k.getF32(t, dout, len(want)), want)
			}})
	}
	// add_rows_id_f32: each group's bias added to its rows as add_rows_f32 adds it (a float
	// sum, so the CPU's to the bit): outputs from at's rows (in reverse of the groups'), or
	// beside the inputs' (no at), a group without a bias left alone, an empty group, and more
	// rows than the grid's y; a table of the biases alone, or of a moe table's 6 entries a
	// group (ts).
	for _, c := range []struct {
		d, gridY int
		off      []int32
		at       []int32
		ts       int
	}{{300, 4, []int32{0, 3, 3, 8}, []int32{5, 5, 0}, 1}, {37, 2, []int32{0, 5, 6}, nil, 1}, {37, 2, []int32{0, 5, 5, 6}, nil, moeTabStride}} {
		groups := len(c.off) - 1
		cs = append(cs, kernelCase{"add_rows_id_f32", fmt.Sprintf("d=%d,off=%v,at=%v,gridY=%d,ts=%d", c.d, c.off, c.at, c.gridY, c.ts),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				rows := int(c.off[groups])
				y := ewValues(r, rows*c.d)
				tab := make([]uint64, groups*c.ts)
				biases := make([][]float32, groups)
				for z := range groups {
					if z == 1 {
						continue // no bias
					}
					biases[z] = ewValues(r, c.d)
					tab[z*c.ts] = uint64(k.putF32(t, biases[z]))
				}
				tb := make([]byte, 8*len(tab))
				for z, p := range tab {
					binary.LittleEndian.PutUint64(tb[8*z:], p)
				}
				dy, dtab, doff := k.putF32(t, y), k.put(t, tb), k.put(t, i32bytes(c.off))
				var dat DevicePtr
				if c.at != nil {
					dat = k.put(t, i32bytes(c.at))
				}
				var args Args
				k.run(t, "add_rows_id_f32", Dim3{X: ceilDiv(c.d, 256), Y: c.gridY, Z: groups}, Dim3{X: 256},
					args.Ptr(dy).Ptr(dtab).Int(c.ts).Ptr(doff).Ptr(dat).Int(c.d))
				want := slices.Clone(y)
				for z := 0; z < groups; z++ {
					if biases[z] == nil {
						continue
					}
					r0 := c.off[z]
					if c.at != nil {
						r0 = c.at[z]
					}
					n := int(c.off[z+1] - c.off[z])
					models.HostOps{}.AddRows(want[int(r0)*c.d:][:n*c.d], biases[z])
				}
				checkBits(t, "y", k.getF32(t, dy, len(want)), want)
			}})
	}
	// combine_off_f32 through each slot's row (inv) with k experts a token (no off), as
	// GPU.MoEGrouped sums its groups' outputs: HostOps.Combine of the rows gathered.
	for _, c := range []struct{ d, ntok, k int }{{300, 3, 2}, {64, 5, 8}} {
		cs = append(cs, kernelCase{"combine_off_f32", fmt.Sprintf("d=%d,ntok=%d,k=%d,inv", c.d, c.ntok, c.k),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				n := c.ntok * c.k
				ys, w, inv := randF32(r, n*c.d, 1), randUniform(r, n, 0, 1), r.Perm(n)
				inv32, off := make([]int32, n), make([]int32, c.ntok+1)
				gathered := make([]float32, n*c.d)
				for j, i := range inv {
					inv32[j] = int32(i)
					copy(gathered[j*c.d:(j+1)*c.d], ys[i*c.d:])
				}
				for tk := range off {
					off[tk] = int32(tk * c.k)
				}
				dout := k.alloc(t, 4*c.ntok*c.d)
				var args Args
				k.run(t, "combine_off_f32", Dim3{X: ceilDiv(c.d, 256), Y: c.ntok}, Dim3{X: 256},
					args.Ptr(dout).Ptr(k.putF32(t, ys)).Ptr(k.putF32(t, w)).Ptr(0).Ptr(k.put(t, i32bytes(inv32))).Int(c.k).Int(c.d))
				want := make([]float32, c.ntok*c.d)
				models.HostOps{}.Combine(want, gathered, w, off, c.d)
				checkBits(t, "out", k.getF32(t, dout, len(want)), want)
			}})
	}
	// moe_group_ids: a prompt's routing grouped by expert as the engine's groupByExpert groups
	// it (checkMoEGroupIDs): experts no token chose, more slots than a block's width, one
	// expert a token, and blocks of one warp.
	for _, c := range []moeGroupCase{{64, 37, 8, 512}, {5, 1000, 2, 512}, {128, 3, 1, 512}, {16, 40, 4, 32}} {
		cs = append(cs, kernelCase{"moe_group_ids", c.String(), func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkMoEGroupIDs(t, k, c, r) }})
	}
	// gated_add_f32: models.HostOps.GatedAdd to the bit. The gate and x are multiples of 1/16
	// below 2 in magnitude: their products are multiples of 2^-8 below 4, and sums of a few
	// hundred of them need fewer than 24 bits, so the CPU's float32 lanes and the kernel's
	// float64 sum both give the exact v, the one place where the ABI allows them to differ.
	for _, c := range []struct {
		d, ntok, block int
		sigmoid        bool
	}{{64, 3, 256, false}, {300, 2, 256, false}, {100, 3, 64, false}, {64, 3, 256, true}, {100, 3, 64, true}} {
		cs = append(cs, kernelCase{"gated_add_f32", fmt.Sprintf("d=%d,ntok=%d,block=%d,sigmoid=%v", c.d, c.ntok, c.block, c.sigmoid),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) {
				grid16 := func(n int) []float32 {
					v := make([]float32, n)
					for i := range v {
						v[i] = float32(r.IntN(65)-32) / 16
					}
					return v
				}
				out, sh, x, gate := randF32(r, c.ntok*c.d, 1), randF32(r, c.ntok*c.d, 1), grid16(c.ntok*c.d), grid16(c.d)
				dout, dsh, dx, dgate := k.putF32(t, out), k.putF32(t, sh), k.putF32(t, x), k.putF32(t, gate)
				var args Args
				k.run(t, "gated_add_f32", Dim3{X: c.ntok}, Dim3{X: c.block}, args.Ptr(dout).Ptr(dsh).Ptr(dx).Ptr(dgate).Int(c.d).Int(b2i(c.sigmoid)))
				want := slices.Clone(out)
				models.HostOps{}.GatedAdd(want, sh, x, gate, c.d, c.sigmoid)
				checkBits(t, "out", k.getF32(t, dout, len(want)), want)
			}})
	}
	return cs
}
