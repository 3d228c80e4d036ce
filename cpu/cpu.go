// Package cpu is the CPU device: it computes on the host with every core, and it is the
// reference numerics every other device is tested against. Its matrix products round the
// activations to each weight type's dot type before the dot products and sum in the float
// order of llama.cpp's x86 CPU backend, so that our numbers agree with llama.cpp's on quantized
// models. The work of a product or a parallel region is split into chunks that a pool of
// worker goroutines, started with the device, claims alongside the caller (pool.go).
// MeasureHostRates times it on an expert's product, for the GPU planners that weigh computing
// an expert on the host against copying it.
package cpu

import (
	"math"
	"runtime"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// Device computes on the CPU with a fixed number of threads. It is safe for concurrent use.
// As a device.Device its streams are the calling thread: work is done when the call returns,
// so events have always happened.
type Device struct {
	threads int
	pool    *pool // nil with one thread
	scratch sync.Pool
	tiles   sync.Pool // *quant.TileScratch
	jobs    sync.Pool // *matMulJob
	each    sync.Pool // *eachJob
	multi   sync.Pool // *multiJob
	mem     *device.Memory
}

// Option configures New.
type Option func(*Device)

// WithMemory makes the device account its allocations against m (by default the budget is
// unlimited: host memory is the operating system's to manage).
func WithMemory(m *device.Memory) Option { return func(d *Device) { d.mem = m } }

// New returns a CPU device with the given number of threads (0 = every core).
func New(threads int, opts ...Option) *Device {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	d := &Device{threads: threads}
	for _, o := range opts {
		o(d)
	}
	if d.mem == nil {
		d.mem, _ = device.NewMemory(math.MaxInt64)
	}
	if threads > 1 {
		d.pool = newPool(threads - 1)
		// The workers reference the pool, not the device, so the device can become
		// unreachable; the workers end with it.
		runtime.AddCleanup(d, func(p *pool) { p.close() }, d.pool)
	}
	return d
}

// syncStream is a stream whose work is done by the time the call that enqueued it returns.
type syncStream struct{}

func (syncStream) Record() device.Event { return nil }
func (syncStream) Wait(device.Event)    {}

// Name is "cpu".
func (d *Device) Name() string { return "cpu" }

// Memory is the device's budget.
func (d *Device) Memory() *device.Memory { return d.mem }

// Compute and Copy are the calling thread.
func (d *Device) Compute() device.Stream { return syncStream{} }
func (d *Device) Copy() device.Stream    { return syncStream{} }

// CopyIn copies at once: host and device memory are the same memory.
func (d *Device) CopyIn(dst, src []byte) { copy(dst, src) }

// Sync returns at once: every event has happened.
func (d *Device) Sync(device.Event) {}

// Host is the device itself.
func (d *Device) Host() device.HostKernels { return hostKernels{d} }

type hostKernels struct{ *Device }

func (hostKernels) Record() device.Event { return nil }
func (hostKernels) Wait(device.Event)    {}

var (
	_ device.Device  = (*Device)(nil)
	_ device.Batcher = (*Device)(nil)
)

// Threads returns the number of compute threads.
func (d *Device) Threads() int { return d.threads }

// Parallel calls fn(i) for i in [0, n), in contiguous chunks over the device's threads.
func (d *Device) Parallel(n int, fn func(i int)) {
	j, _ := d.each.Get().(*eachJob)
	if j == nil {
		j = new(eachJob)
	}
	j.fn = fn
	d.parallelRange(n, 1, j)
	j.fn = nil
	d.each.Put(j)
}

// eachJob is Parallel's ranger, from a pool so that a call allocates nothing of its own.
type eachJob struct{ fn func(i int) }

func (j *eachJob) runRange(lo, hi int) {
	for i := lo; i < hi; i++ {
		j.fn(i)
	}
}

// parallelRange splits [0, n) into contiguous ranges whose bounds are multiples of align (but
// for n), and runs r on each from the device's threads.
func (d *Device) parallelRange(n, align int, r ranger) {
	parts := min(d.threads, (n+align-1)/align)
	if parts <= 1 {
		if n > 0 {
			r.runRange(0, n)
		}
		return
	}
	if d.pool.run(n, align, r) {
		return
	}
	// The pool is busy with another region: one range per thread, on goroutines of our
	// own.
	var wg sync.WaitGroup
	for w := 1; w < parts; w++ {
		wg.Go(func() { r.runRange(chunkBound(n, align, parts, w), chunkBound(n, align, parts, w+1)) })
	}
	r.runRange(0, chunkBound(n, align, parts, 1))
	wg.Wait()
}

// buffer returns a scratch buffer of the device's pool, which prepare grows as it needs.
func (d *Device) buffer() *[]byte {
	if p, ok := d.scratch.Get().(*[]byte); ok {
		return p
	}
	return new([]byte)
}

// MatMul computes out[t*w.Rows+o] = w row o · x row t for T rows of x. Each activation row is
// quantized once to the weight's dot type; the rows of w are then split across threads, and
// each thread walks its rows once for all T activations so each weight row is read once.
//
// The dot products are those llama.cpp's x86 CPU backend runs for a product of T rows (see
// quant.X86Dot), so that the results agree with llama.cpp's to the bit.
func (d *Device) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	d.matMul(w, x, T, out, T)
}

// MatMulID is MatMul with the kernels llama.cpp's MUL_MAT_ID uses for expert weights, which
// take the activation rows one at a time whatever their number.
func (d *Device) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	d.matMul(w, x, T, out, 1)
}

// Serial returns the device's kernels computing on the calling goroutine alone, with the
// same numbers: for work spread over the threads a level up, several small products at once,
// where splitting each product's rows would cost more in waking and waiting than it saves.
func (d *Device) Serial() device.Kernels { return serial{d} }

type serial struct{ d *Device }

func (s serial) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	s.d.product(w, x, T, out, T, false)
}

func (s serial) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	s.d.product(w, x, T, out, 1, false)
}

func (serial) Parallel(n int, fn func(i int)) {
	for i := range n {
		fn(i)
	}
}

// matMul computes MatMul choosing the kernels as for a product over batch rows (T, or 1 for
// row-by-row products). The rows are split over the threads in multiples of 8, the groups in
// which llama.cpp repacks (and quant.X86Rows tiles) them.
func (d *Device) matMul(w quant.Matrix, x []float32, T int, out []float32, batch int) {
	d.product(w, x, T, out, batch, true)
}

// product is matMul over the device's threads (spread) or on the calling goroutine.
func (d *Device) product(w quant.Matrix, x []float32, T int, out []float32, batch int, spread bool) {
	if T == 0 {
		return
	}
	buf := d.buffer()
	job, _ := d.jobs.Get().(*matMulJob)
	if job == nil {
		job = &matMulJob{d: d}
	}
	job.out, job.ldo = out, w.Rows
	*buf = prepare(&job.p, w, x, T, batch, *buf)
	if spread {
		d.parallelRange(w.Rows, 8, job)
	} else {
		job.runRange(0, w.Rows)
	}
	job.out = nil
	job.p.Prepare(quant.Matrix{}, nil, 0, 0, 1) // drop the references, keep the memory
	d.jobs.Put(job)
	d.scratch.Put(buf)
}

// prepare rounds T rows of x to w's dot type in buf (grown when short, and returned) and
// sets p up for the product over batch rows.
func prepare(p *quant.X86Product, w quant.Matrix, x []float32, T, batch int, buf []byte) []byte {
	dt := w.Type.DotType()
	xrow, err := dt.RowBytes(w.Cols)
	if err != nil {
		panic("cpu: " + err.Error()) // shapes are validated at load; this is a bug
	}
	if cap(buf) < xrow*T {
		buf = make([]byte, xrow*T)
	}
	xq := buf[:xrow*T]
	for t := 0; t < T; t++ {
		quant.QuantizeRow(dt, x[t*w.Cols:(t+1)*w.Cols], xq[t*xrow:(t+1)*xrow])
	}
	p.Prepare(w, xq, xrow, T, batch)
	return xq
}

// matMulJob is one product's rows as a ranger: a struct from a pool rather than a closure, so
// that a product allocates nothing.
type matMulJob struct {
	d   *Device
	p   quant.X86Product
	out []float32
	ldo int
}

func (j *matMulJob) runRange(lo, hi int) {
	s, _ := j.d.tiles.Get().(*quant.TileScratch)
	if s == nil {
		s = new(quant.TileScratch)
	}
	j.p.Rows(lo, hi, j.out, j.ldo, s)
	j.d.tiles.Put(s)
}

// A Product is one matrix product of MatMulIDs: Out = W times the T rows of X, row by row.
type Product = device.BatchProduct

// MatMulIDs computes several MatMulID products in one parallel region: their rows, end to
// end and weighed by their activation rows, are split over the threads, so that a layer's experts are waited for once rather than
// once per product (llama.cpp's MUL_MAT_ID takes all of a layer's experts in one operation),
// and a thread that finishes its part of one product goes on with the next instead of
// waiting. The numbers are MatMulID's: each output is one kernel's whichever thread
// computes it. The products must not write where others read.
func (d *Device) MatMulIDs(ps []Product) {
	j, _ := d.multi.Get().(*multiJob)
	if j == nil {
		j = &multiJob{d: d}
	}
	if cap(j.ps) < len(ps) {
		j.ps = make([]quant.X86Product, len(ps))
		j.bufs = make([][]byte, len(ps))
		j.outs = make([][]float32, len(ps))
		j.end = make([]int, len(ps))
	}
	j.ps, j.bufs, j.outs, j.end = j.ps[:len(ps)], j.bufs[:len(ps)], j.outs[:len(ps)], j.end[:len(ps)]
	units := 0
	for i, p := range ps {
		if p.T == 0 {
			j.ps[i].Prepare(quant.Matrix{}, nil, 0, 0, 1)
			j.end[i] = units
			continue
		}
		j.bufs[i] = prepare(&j.ps[i], p.W, p.X, p.T, 1, j.bufs[i])
		j.outs[i] = p.Out
		units += (p.W.Rows + 7) / 8 * p.T
		j.end[i] = units
	}
	j.prods = ps
	d.parallelRange(units, 1, j)
	for i := range j.ps {
		j.ps[i].Prepare(quant.Matrix{}, nil, 0, 0, 1) // drop the references, keep the memory
		j.outs[i] = nil
	}
	j.prods = nil
	d.multi.Put(j)
}

// multiJob is MatMulIDs's region: the products end to end, in units of work: a group of 8
// rows (the tiles' and llama.cpp's repacked groups) times the product's activation rows, so
// that the threads' shares are of equal work when the experts of a prompt have very different
// numbers of tokens. Product i's units end at end[i].
type multiJob struct {
	d     *Device
	prods []Product
	ps    []quant.X86Product
	bufs  [][]byte // the products' activations, rounded to their weights' dot types
	outs  [][]float32
	end   []int
}

func (j *multiJob) runRange(lo, hi int) {
	s, _ := j.d.tiles.Get().(*quant.TileScratch)
	if s == nil {
		s = new(quant.TileScratch)
	}
	start := 0
	for i, end := range j.end {
		if a, b := max(lo, start), min(hi, end); a < b {
			// The groups whose first unit lies in [a, b): neighbouring ranges split a
			// product's groups between them without overlap.
			p := &j.prods[i]
			g0, g1 := (a-start+p.T-1)/p.T, (b-start+p.T-1)/p.T
			if r0, r1 := 8*g0, min(8*g1, p.W.Rows); r0 < r1 {
				j.ps[i].Rows(r0, r1, j.outs[i], p.W.Rows, s)
			}
		}
		start = end
	}
	j.d.tiles.Put(s)
}
