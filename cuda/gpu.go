package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// GPUOptions configure Open.
type GPUOptions struct {
	// Ordinal is N in cuda:N.
	Ordinal int
	// Library is the driver library to load; "" finds libcuda.so.1.
	Library string
	// Host is the CPU's kernels: the host's work for cpu-miss, and the products the GPU has
	// no kernel for (counted in GPUStats.HostFallbacks).
	Host device.Kernels
	// Budget is the device memory the engine may use; 0 takes what is free on the card at
	// start, less a reserve for the context and the kernels' scratch.
	Budget int64
	// PTX is the kernels' module, which then stands alone; nil loads the embedded ones:
	// PTX(), and PTXSM80() beside it on a device of compute capability 8.0 or newer.
	PTX []byte
	// HostRates price Host's expert kernels (cpu-miss): what the device's Planner weighs a
	// copy against. Zero rates take the device package's defaults.
	HostRates device.HostRates
	// ProfileKernels times every kernel launched outside a captured step between timing
	// events of its own (KernelProfile): two events a launch, for finding where a token's
	// time goes, not for timing it.
	ProfileKernels bool
	// RowWarps is the warps that share one output row of an integer decode product (mmvq,
	// mmvq1 and the fused kernels' integer dots; kernels/mmvq.cu): 1, 2, 4 or 8; 0 is 1, a warp
	// a row. More warps a row keep more of a row's reads in flight, at the cost of a wait in
	// shared memory. The float sums' order depends on it, so a GPU's products all take the
	// same: a batch and a sequence alone, a graph and its eager launches agree to the bit for
	// any one value.
	RowWarps int
}

// RowWarpsChoices are the values GPUOptions.RowWarps takes.
var RowWarpsChoices = []int{1, 2, 4, 8}

// mmvKernels name the matrix-vector kernel of each weight type.
var mmvKernels = map[quant.Type]string{
	quant.F32: "mmv_f32", quant.F16: "mmv_f16", quant.BF16: "mmv_bf16",
	quant.Q4_0: "mmv_q4_0", quant.Q4_1: "mmv_q4_1", quant.Q5_0: "mmv_q5_0", quant.Q5_1: "mmv_q5_1", quant.Q8_0: "mmv_q8_0",
	quant.Q2_K: "mmv_q2_K", quant.Q3_K: "mmv_q3_K", quant.Q4_K: "mmv_q4_K", quant.Q5_K: "mmv_q5_K", quant.Q6_K: "mmv_q6_K",
	quant.IQ4_NL: "mmv_iq4_nl", quant.MXFP4: "mmv_mxfp4",
}

// The launch of a matrix-vector kernel (the ABI in kernels/mmv.cu): a warp per output row,
// 4 rows per block, and a block's pass over its rows serves up to 8 tokens.
const (
	mmvRowsPerBlock   = 4
	mmvTokensPerBlock = 8
)

// mmqKernels name the batched (prefill) product kernel of each weight type.
var mmqKernels = map[quant.Type]string{
	quant.F32: "mmq_f32", quant.F16: "mmq_f16", quant.BF16: "mmq_bf16",
	quant.Q4_0: "mmq_q4_0", quant.Q4_1: "mmq_q4_1", quant.Q5_0: "mmq_q5_0", quant.Q5_1: "mmq_q5_1", quant.Q8_0: "mmq_q8_0",
	quant.Q2_K: "mmq_q2_K", quant.Q3_K: "mmq_q3_K", quant.Q4_K: "mmq_q4_K", quant.Q5_K: "mmq_q5_K", quant.Q6_K: "mmq_q6_K",
	quant.IQ4_NL: "mmq_iq4_nl", quant.MXFP4: "mmq_mxfp4",
}

// The launch of a batched product kernel (the ABI in kernels/mmq.cu): 256 threads compute a
// tile of 64 rows by 64 tokens.
const (
	mmqRowsPerBlock   = 64
	mmqTokensPerBlock = 64
	mmqThreads        = 256
)

// mmqMinTokens is the token count from which a product runs on mmq instead of mmv. Up to 8
// tokens mmv reads the weights once, with wide coalesced loads and a warp per row, and is the
// better kernel: a product of so few tokens is bound by the weights' bandwidth. From 9 tokens
// mmv reads the weights again for every 8 more, while mmq reads them once per 64 tokens and
// reuses each decoded weight across its tile. The crossover has not been measured (no GPU where this was written: BenchmarkMMQ
// on a card is how to tune it); mmq wastes most of its 64-token tile at 9 tokens and has only
// rows/64 blocks to spread over the SMs, so the true crossover may well be higher.
const mmqMinTokens = mmvTokensPerBlock + 1

// GPU is the device cuda:N. Weights the engine uploads and the buffers it asks for live in
// device memory; kernels run on a compute stream and expert copies on a copy stream, ordered
// by events. With its Ops (ops.go) a whole forward pass runs in device memory and only
// returns to the host where the host reads a result; a product of host activations (a model
// whose attention has no device Ops) copies them in and out synchronously.
type GPU struct {
	drv  *Driver
	ctx  *Context
	info Info
	host device.Kernels
	mem  *device.Memory

	compute, copy *Stream
	streams       [2]device.Stream // Compute's and Copy's, made once: an interface made per call allocates
	mod           *kernelSet
	mmv, mmq      map[quant.Type]*Function // products by weight type: few tokens, many (prefill)
	mmvq          map[quant.Type]*Function // few tokens' integer products (ops_quant.go)
	mmvq1         map[quant.Type]*Function // one token's
	mmqi          map[quant.Type]*Function // many tokens' integer products on the tensor cores (ops_quant.go)
	qscr          qscratch                 // their quantized activations (under mu)
	attnCnt       DevicePtr                // the split attention's counters, attnCounters of them at 0 (ops.go)
	rowWarps      int                      // GPUOptions.RowWarps, 1 for 0

	// mu orders the synchronous products: one staging area, one sequence on the stream.
	mu       sync.Mutex
	args     Args
	in, out  *HostBuffer
	dx, dy   DevicePtr
	dxN, dyN int64
	spansMu  sync.RWMutex
	spans    []span // sorted by host address
	pinned   []*HostBuffer
	recorded recordEvents

	copyMu    sync.Mutex
	timers    []*Event // timing events of drained copies, for reuse
	copies    []timedCopy
	copyBytes int64
	copySec   float64

	opened    time.Time        // the Planner's time origin
	hostRates device.HostRates // the Planner's, defaults filled

	timing computeTimer   // the compute stream's marks and waits for copies (timing.go)
	prof   kernelProfiler // every launch's device time, with GPUOptions.ProfileKernels (profile.go)

	fns      map[string]*Function // the Ops' kernels, found on first use (under mu)
	ring     DevicePtr            // the Ops' parameters (under mu; ops.go)
	ringHost *HostBuffer          // their pinned staging
	ringEv   [2]*Event            // recorded when the writes leave a half of the ring
	ringUsed [2]bool              // whether a half's event was recorded
	ringOff  int64
	ringHalf int

	// step is the decode step being captured (step.go), nil when none is (under mu).
	step *stepCapture
	op   opCall // the operation in progress (under mu; ops.go)
	// Experts' scratch and plans (ops_fused.go, under mu).
	tabScratch []uint64
	idScratch  []int32
	moePlans   map[[3]quant.Type]moePlan

	launches, fallbacks, mmqLaunches, reads  atomic.Int64
	kernels, graphLaunches, writes, pageable atomic.Int64
	err                                      atomic.Pointer[error] // the first failure
}

// span maps a range of host addresses to device memory: an uploaded tensor (whose host copy
// stays readable) or a buffer (whose host range is reserved but inaccessible).
type span struct {
	host   uintptr
	n      int64
	dev    DevicePtr
	shadow []byte // the reservation of a buffer, unmapped on Close
}

type timedCopy struct {
	start, end *Event
	n          int64
}

// Open makes cuda:N: loads the driver, retains the device's primary context, creates the
// streams and loads the kernels.
func Open(o GPUOptions) (*GPU, error) {
	name := fmt.Sprintf("cuda:%d", o.Ordinal)
	if o.Host == nil {
		return nil, fmt.Errorf("device %s: no host kernels", name)
	}
	warps := max(o.RowWarps, 1)
	if o.RowWarps != 0 && !slices.Contains(RowWarpsChoices, o.RowWarps) {
		return nil, fmt.Errorf("device %s: %d warps a row for the integer decode products: want one of %v", name, o.RowWarps, RowWarpsChoices)
	}
	drv, err := Load(o.Library)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	dev, err := drv.Device(o.Ordinal)
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	info, err := dev.Info()
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	if info.Major < 7 || info.Major == 7 && info.Minor < 5 {
		return nil, fmt.Errorf("device %s (%s) has compute capability %d.%d: the kernels need 7.5 or newer", name, info.Name, info.Major, info.Minor)
	}
	ctx, err := dev.Retain()
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	rates, err := o.HostRates.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	g := &GPU{drv: drv, ctx: ctx, info: info, host: o.Host, mmv: map[quant.Type]*Function{}, mmq: map[quant.Type]*Function{}, mmvq: map[quant.Type]*Function{},
		mmvq1: map[quant.Type]*Function{}, mmqi: map[quant.Type]*Function{},
		fns: map[string]*Function{}, opened: time.Now(), hostRates: rates, rowWarps: warps, recorded: recordEvents{pool: eventPool{plain: true}}}
	g.prof.on = o.ProfileKernels
	if err := g.open(o); err != nil {
		g.Close()
		return nil, fmt.Errorf("device %s (%s): %w", name, info.Name, err)
	}
	return g, nil
}

func (g *GPU) open(o GPUOptions) error {
	free, total, err := g.ctx.MemInfo()
	if err != nil {
		return err
	}
	budget := o.Budget
	if budget == 0 {
		// The context, the module and the staging buffers take some of what is free now.
		budget = free - max(256<<20, total/32)
	}
	if budget <= 0 || budget > free {
		return fmt.Errorf("a device memory budget of %.2f GiB: %.2f GiB of the card's %.2f GiB are free",
			float64(budget)/(1<<30), float64(free)/(1<<30), float64(total)/(1<<30))
	}
	if g.mem, err = device.NewMemory(budget); err != nil {
		return err
	}
	if g.compute, err = g.ctx.NewStream(); err != nil {
		return err
	}
	if g.copy, err = g.ctx.NewStream(); err != nil {
		return err
	}
	g.streams = [2]device.Stream{gpuStream{g, g.compute}, gpuStream{g, g.copy}}
	ptx := o.PTX
	if ptx == nil {
		ptx = PTX()
	}
	if len(ptx) == 0 {
		return fmt.Errorf("this binary has no CUDA kernels")
	}
	// A caller's own module stands alone; the embedded one has its sm_80 companion.
	var sm80 []byte
	if o.PTX == nil {
		sm80 = PTXSM80()
	}
	if g.mod, err = loadKernels(g.ctx, g.info, ptx, sm80); err != nil {
		return err
	}
	if g.attnCnt, err = g.ctx.Alloc(4 * attnCounters); err != nil {
		return err
	}
	if err := errors.Join(g.compute.Memset(g.attnCnt, 0, 4*attnCounters), g.compute.Synchronize()); err != nil {
		return err
	}
	// A type whose kernel the module lacks takes another path: the host for mmv, mmv for mmq,
	// mmv's float products for mmvq, mmq's float tiles for mmqi.
	for _, k := range []struct {
		names map[quant.Type]string
		fns   map[quant.Type]*Function
	}{{mmvKernels, g.mmv}, {mmqKernels, g.mmq}, {mmvqKernels, g.mmvq}, {mmvq1Kernels, g.mmvq1}, {mmqiKernels, g.mmqi}} {
		for t, name := range k.names {
			f, err := g.mod.Function(name)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			k.fns[t] = f
		}
	}
	return nil
}

// Close frees the device memory, the pinned host memory, the streams and the module, and
// releases the context.
func (g *GPU) Close() error {
	var errs []error
	g.spansMu.Lock()
	for _, s := range g.spans {
		errs = append(errs, g.ctx.Free(s.dev))
		if s.shadow != nil {
			errs = append(errs, syscall.Munmap(s.shadow))
		}
	}
	g.spans = nil
	g.spansMu.Unlock()
	for _, b := range g.pinned {
		errs = append(errs, b.Free())
	}
	g.pinned = nil
	g.mu.Lock()
	errs = append(errs, g.ctx.Free(g.dx), g.ctx.Free(g.dy), g.ctx.Free(g.ring), g.ctx.Free(g.qscr.p), g.ctx.Free(g.attnCnt))
	for _, p := range g.qscr.old {
		errs = append(errs, g.ctx.Free(p))
	}
	g.dx, g.dy, g.dxN, g.dyN, g.ring, g.qscr, g.attnCnt = 0, 0, 0, 0, 0, qscratch{}, 0
	if g.ringHost != nil {
		errs = append(errs, g.ringHost.Free(), g.ringEv[0].Destroy(), g.ringEv[1].Destroy())
		g.ringHost = nil
	}
	for _, b := range []*HostBuffer{g.in, g.out} {
		if b != nil {
			errs = append(errs, b.Free())
		}
	}
	g.in, g.out = nil, nil
	g.mu.Unlock()
	g.copyMu.Lock()
	for _, c := range g.copies {
		g.timers = append(g.timers, c.start, c.end)
	}
	for _, ev := range g.timers {
		errs = append(errs, ev.Destroy())
	}
	g.copies, g.timers = nil, nil
	g.copyMu.Unlock()
	errs = append(errs, g.closeTiming()...)
	errs = append(errs, g.closeProfile()...)
	errs = append(errs, g.recorded.destroy()...)
	for _, s := range []*Stream{g.compute, g.copy} {
		if s != nil {
			errs = append(errs, s.Destroy())
		}
	}
	if g.mod != nil {
		errs = append(errs, g.mod.Unload())
	}
	errs = append(errs, g.ctx.Release())
	return errors.Join(errs...)
}

// Info describes the card.
func (g *GPU) Info() Info { return g.info }

// Name is "cuda:N".
func (g *GPU) Name() string { return fmt.Sprintf("cuda:%d", g.info.Ordinal) }

// Memory is the engine's budget on the card.
func (g *GPU) Memory() *device.Memory { return g.mem }

// Err is the first failure of a kernel or copy. A failed product is computed on the host,
// so the numbers stay right, but the engine stops at the end of the pass.
func (g *GPU) Err() error {
	if p := g.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (g *GPU) fail(err error) {
	err = fmt.Errorf("device %s: %w", g.Name(), err)
	g.err.CompareAndSwap(nil, &err)
}

// find returns the span holding the host bytes b, if any.
func (g *GPU) find(b []byte) (span, bool) {
	if len(b) == 0 {
		return span{}, false
	}
	a := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	g.spansMu.RLock()
	defer g.spansMu.RUnlock()
	// The last span starting at or before a.
	i := sort.Search(len(g.spans), func(i int) bool { return g.spans[i].host > a })
	if i == 0 {
		return span{}, false
	}
	s := g.spans[i-1]
	if int64(a-s.host)+int64(len(b)) > s.n {
		return span{}, false
	}
	return s, true
}

// lookup translates host bytes that stand for device memory into their device address.
func (g *GPU) lookup(b []byte) (DevicePtr, bool) {
	s, ok := g.find(b)
	if !ok {
		return 0, false
	}
	return s.dev.Add(int64(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - s.host)), true
}

func (g *GPU) addSpan(s span) {
	g.spansMu.Lock()
	defer g.spansMu.Unlock()
	i := sort.Search(len(g.spans), func(i int) bool { return g.spans[i].host > s.host })
	g.spans = slices.Insert(g.spans, i, s)
}

// Upload implements device.Resident.
func (g *GPU) Upload(b []byte, what string) error {
	if len(b) == 0 {
		return nil
	}
	if _, ok := g.lookup(b); ok {
		return nil // already there (a tied output matrix is the embedding)
	}
	p, err := g.ctx.Alloc(int64(len(b)))
	if err != nil {
		return fmt.Errorf("%s: uploading %s: %w", g.Name(), what, err)
	}
	if err := errors.Join(g.copy.CopyHtoD(p, b), g.copy.Synchronize()); err != nil {
		g.ctx.Free(p)
		return fmt.Errorf("%s: uploading %s: %w", g.Name(), what, err)
	}
	g.addSpan(span{host: uintptr(unsafe.Pointer(unsafe.SliceData(b))), n: int64(len(b)), dev: p})
	return nil
}

// Buffer implements device.Resident: device memory, and a reservation of as many host
// addresses (no memory, no access) for the engine to hold it by.
func (g *GPU) Buffer(n int64, what string) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%s: a buffer of %d bytes for %s", g.Name(), n, what)
	}
	p, err := g.ctx.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", g.Name(), what, err)
	}
	shadow, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		g.ctx.Free(p)
		return nil, fmt.Errorf("%s: reserving addresses for %s: %w", g.Name(), what, err)
	}
	g.addSpan(span{host: uintptr(unsafe.Pointer(unsafe.SliceData(shadow))), n: n, dev: p, shadow: shadow})
	return shadow, nil
}

// Release implements device.Resident: it frees a buffer, or the device copy of an upload
// (b as it was uploaded: an expert that moves to another device), once the compute stream is
// done with it (cuMemFree waits for the device's work). Anything else, or memory of a closed
// GPU, is left alone.
func (g *GPU) Release(b []byte) {
	s, ok := g.find(b)
	if !ok || uintptr(unsafe.Pointer(unsafe.SliceData(b))) != s.host || s.shadow == nil && int64(len(b)) != s.n {
		return
	}
	g.spansMu.Lock()
	i := sort.Search(len(g.spans), func(i int) bool { return g.spans[i].host >= s.host })
	if i < len(g.spans) && g.spans[i].host == s.host {
		g.spans = slices.Delete(g.spans, i, i+1)
	} else {
		ok = false
	}
	g.spansMu.Unlock()
	if !ok {
		return
	}
	err := g.ctx.Free(s.dev)
	if s.shadow != nil {
		err = errors.Join(err, syscall.Munmap(s.shadow))
	}
	if err != nil {
		g.fail(err)
	}
}

// HostAlloc implements device.HostAllocator with pinned memory, freed on Close.
func (g *GPU) HostAlloc(n int64) ([]byte, error) {
	b, err := g.ctx.HostAlloc(int(n))
	if err != nil {
		return nil, err
	}
	g.spansMu.Lock()
	g.pinned = append(g.pinned, b)
	g.spansMu.Unlock()
	return b.Bytes, nil
}

// gpuEvent is a recorded event; it goes back to the pool when the engine drops it.
type gpuEvent struct {
	ev   *Event
	from *Stream // where it was recorded: a wait of the compute stream on the copy stream is timed
}

func (g *GPU) record(s *Stream) device.Event {
	ev, err := g.recorded.get(g.ctx)
	if err != nil {
		g.fail(err)
		return nil
	}
	if err := ev.Record(s); err != nil {
		g.recorded.put(ev)
		g.fail(err)
		return nil
	}
	e := &gpuEvent{ev: ev, from: s}
	runtime.AddCleanup(e, g.recorded.put, ev)
	return e
}

// recordEvents are the events behind the device.Events that Record returns, in a pool of
// plain events: one goes back once the engine has dropped its device.Event (a cleanup, on a
// goroutine of its own: hence the lock), and is reused; Close destroys them. (A sync.Pool
// would drop them at a garbage collection without destroying them: a driver event lost at
// every collection, hundreds a second while decoding.)
type recordEvents struct {
	mu     sync.Mutex
	pool   eventPool // made: in free, or behind a device.Event not yet collected
	closed bool      // Close destroyed them: an event coming back is the context's, gone with it
}

// get returns a free event, or a new one.
func (r *recordEvents) get(c *Context) (*Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("cuda: the GPU is closed")
	}
	return r.pool.event(c)
}

// put takes ev back for reuse.
func (r *recordEvents) put(ev *Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed {
		r.pool.release(ev)
	}
}

// destroy destroys the free events and takes none back after.
func (r *recordEvents) destroy() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return r.pool.destroy()
}

type gpuStream struct {
	g *GPU
	s *Stream
}

func (s gpuStream) Record() device.Event { return s.g.record(s.s) }

// Wait makes the stream wait for ev. The compute stream's waits for the copy stream (an
// expert being copied in) are timed, for the stall in GPUStats; other waits are not.
func (s gpuStream) Wait(ev device.Event) {
	if e, ok := ev.(*gpuEvent); ok && e != nil {
		if s.s == s.g.compute && e.from == s.g.copy {
			s.g.waitForCopy(e.ev)
		} else if err := s.s.Wait(e.ev); err != nil {
			s.g.fail(err)
		}
	}
}

// Compute is the stream the kernels run on.
func (g *GPU) Compute() device.Stream { return g.streams[0] }

// Copy is the stream expert copies run on.
func (g *GPU) Copy() device.Stream { return g.streams[1] }

// Sync blocks the host until ev has happened.
func (g *GPU) Sync(ev device.Event) {
	if e, ok := ev.(*gpuEvent); ok && e != nil {
		if err := e.ev.Synchronize(); err != nil {
			g.fail(err)
		}
	}
}

// CopyIn copies host bytes into a device buffer on the copy stream, timed with events so that
// Stats can report the link's measured bandwidth. A destination in host memory is copied at
// once. Like copy, it copies as many bytes as the shorter of the two holds: an expert slot is
// sized for the largest expert, and a smaller one fills only its start.
func (g *GPU) CopyIn(dst, src []byte) {
	p, ok := g.lookup(dst)
	if !ok {
		copy(dst, src)
		return
	}
	n := min(len(dst), len(src))
	g.copyMu.Lock()
	defer g.copyMu.Unlock()
	start, err1 := g.timer()
	end, err2 := g.timer()
	if err := errors.Join(err1, err2); err != nil {
		g.fail(err)
		return
	}
	if err := errors.Join(start.Record(g.copy), g.copy.CopyHtoD(p, src[:n]), end.Record(g.copy)); err != nil {
		g.fail(err)
		return
	}
	g.copies = append(g.copies, timedCopy{start, end, int64(n)})
	if len(g.copies) >= 256 {
		g.drainCopies(len(g.copies) / 2)
	}
}

// timer returns a timing event, reused from a drained copy when there is one. The caller
// holds g.copyMu.
func (g *GPU) timer() (*Event, error) {
	if n := len(g.timers); n > 0 {
		ev := g.timers[n-1]
		g.timers = g.timers[:n-1]
		return ev, nil
	}
	return g.ctx.NewEvent(true)
}

// drainCopies adds the time of the n oldest copies to the totals, waiting for them. The
// caller holds g.copyMu.
func (g *GPU) drainCopies(n int) {
	for _, c := range g.copies[:n] {
		if err := c.end.Synchronize(); err != nil {
			g.fail(err)
		} else if sec, err := Elapsed(c.start, c.end); err == nil {
			g.copySec += sec
			g.copyBytes += c.n
		}
		g.timers = append(g.timers, c.start, c.end)
	}
	g.copies = slices.Delete(g.copies, 0, n)
}

// GPUStats count what the GPU did.
type GPUStats struct {
	// Launches are what the host issued: kernel launches, and graph launches (a replayed
	// decode step is one, GraphLaunches of them); Kernels the kernels that ran, each of a
	// replayed step counted.
	Launches      int64
	Kernels       int64
	GraphLaunches int64
	MMQLaunches   int64 // of the Launches, products of mmqMinTokens or more tokens on the batched kernels (prefill)
	HostFallbacks int64 // products computed on the host: no kernel for the type, or weights not on the device
	// Reads are the host's synchronous read-backs (Ops.Read): each holds the host until the
	// compute stream has run everything enqueued before it.
	Reads int64
	// Writes are the host's writes of activations to the device (Ops.Write: the outputs of
	// the experts the host computed). Pageable counts the reads and writes whose host memory
	// is not pinned: the driver stages each through a buffer of its own, holding the host,
	// where from pinned memory the copy is the link's DMA and a write does not wait.
	Writes, Pageable int64
	CopyBytes        int64 // host-to-device expert copies, measured
	CopySeconds      float64
	// StallSeconds is the compute stream's time in waits for the copy stream, from when its
	// earlier work was done to when the awaited copy landed: the time offloading cost the
	// kernels, measured by the device itself rather than inferred from the host's clock. A
	// gap in which the host had not yet enqueued the wait counts too.
	StallSeconds float64
	// DeviceSeconds is the compute stream's time from the first Mark to the last, summed
	// over consecutive Marks: what the device itself took for the marked work (a decode
	// token each), beside the host's wall clock, which adds the host's work before the first
	// kernel and after the last. Gaps in which the stream waited for the host count.
	DeviceSeconds float64
	Marks         int64 // the Marks that DeviceSeconds spans (intervals: Marks - 1)
}

// CopyBandwidth is the measured bandwidth of the copy stream in bytes/s.
func (s GPUStats) CopyBandwidth() float64 {
	if s.CopySeconds == 0 {
		return 0
	}
	return float64(s.CopyBytes) / s.CopySeconds
}

// Stats waits for the copies in flight and the compute stream's waits for them, and reports
// the totals.
func (g *GPU) Stats() GPUStats {
	g.copyMu.Lock()
	g.drainCopies(len(g.copies))
	s := GPUStats{CopyBytes: g.copyBytes, CopySeconds: g.copySec}
	g.copyMu.Unlock()
	g.readTiming(&s)
	g.counters(&s)
	return s
}

// counters adds the launch counters to s.
func (g *GPU) counters(s *GPUStats) {
	s.Launches, s.MMQLaunches, s.HostFallbacks = g.launches.Load(), g.mmqLaunches.Load(), g.fallbacks.Load()
	s.Kernels, s.GraphLaunches, s.Reads = g.kernels.Load(), g.graphLaunches.Load(), g.reads.Load()
	s.Writes, s.Pageable = g.writes.Load(), g.pageable.Load()
}

// countPageable counts a read or write of host bytes b that do not lie in pinned memory the
// GPU allocated (GPUStats.Pageable).
func (g *GPU) countPageable(b []byte) {
	if !g.isPinned(b) {
		g.pageable.Add(1)
	}
}

// isPinned says whether the host bytes b lie in pinned memory the GPU allocated (HostAlloc).
func (g *GPU) isPinned(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	a := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	g.spansMu.RLock()
	defer g.spansMu.RUnlock()
	for _, p := range g.pinned {
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(p.Bytes)))
		if a >= lo && a+uintptr(len(b)) <= lo+uintptr(len(p.Bytes)) {
			return true
		}
	}
	return false
}

// Parallel spreads host work over the host's threads.
func (g *GPU) Parallel(n int, fn func(i int)) { g.host.Parallel(n, fn) }

// MatMul computes the product on the GPU when the weights are on it and the type has a
// kernel, else on the host.
func (g *GPU) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	if !g.matMul(w, x, T, out) {
		g.onHost(g.host.MatMul, w, x, T, out)
	}
}

// MatMulID is MatMul for a routed expert's weights: the GPU's kernels are the same.
func (g *GPU) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	if !g.matMul(w, x, T, out) {
		g.onHost(g.host.MatMulID, w, x, T, out)
	}
}

// onHost computes a product the GPU cannot on the host, reading back whatever of weights,
// input and output lives in device memory. Slow, but the numbers stay right.
func (g *GPU) onHost(mm func(quant.Matrix, []float32, int, []float32), w quant.Matrix, x []float32, T int, out []float32) {
	g.mu.Lock()
	capturing := g.step != nil
	if capturing {
		g.failCompute(errCapture("a product on the host"))
	}
	g.mu.Unlock()
	if capturing {
		return
	}
	g.fallbacks.Add(1)
	x, out = x[:T*w.Cols], out[:T*w.Rows]
	_, xDev := g.lookup(floatBytes(x))
	_, yDev := g.lookup(floatBytes(out))
	xh, yh := x, out
	if xDev {
		xh = make([]float32, len(x))
		g.Read(xh, x)
	}
	if yDev {
		yh = make([]float32, len(out))
	}
	mm(g.hostCopy(w), xh, T, yh)
	if yDev {
		g.Write(out, yh)
	}
}

// hostCopy returns weights the host can read: w itself, or for weights in a device buffer
// (an expert slot, whose host addresses are inaccessible) a copy read back from the device.
// Reading back is slow, but a product the GPU cannot run still gets the right numbers.
func (g *GPU) hostCopy(w quant.Matrix) quant.Matrix {
	s, ok := g.find(w.Data)
	if !ok || s.shadow == nil {
		return w // host memory, or an upload whose host copy is still there
	}
	p, _ := g.lookup(w.Data)
	buf := make([]byte, len(w.Data))
	g.mu.Lock()
	err := errors.Join(g.compute.CopyDtoH(buf, p), g.compute.Synchronize())
	g.mu.Unlock()
	if err != nil {
		g.fail(err)
		clear(buf) // the pass fails at its end with the device's error
	}
	w.Data = buf
	return w
}

func (g *GPU) matMul(w quant.Matrix, x []float32, T int, out []float32) bool {
	fn := g.mmv[w.Type]
	mmq := T >= mmqMinTokens && g.mmq[w.Type] != nil
	if mmq {
		fn = g.mmq[w.Type]
	}
	if fn == nil || g.err.Load() != nil || T <= 0 {
		return false
	}
	wp, ok := g.lookup(w.Data)
	if !ok {
		return false
	}
	nx, ny := int64(4*T*w.Cols), int64(4*T*w.Rows)
	xb, yb := floatBytes(x[:T*w.Cols]), floatBytes(out[:T*w.Rows])
	// Activations in device memory stay there; host ones travel through the staging buffers.
	xp, xDev := g.lookup(xb)
	yp, yDev := g.lookup(yb)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !xDev || !yDev {
		if g.step != nil {
			g.failCompute(errCapture("a product of host activations"))
			return true // the capture fails; nothing is computed
		}
		if err := g.stage(nx, ny); err != nil {
			g.fail(err)
			return false
		}
	}
	// No slice of errors: a product allocates nothing.
	var err error
	if !xDev {
		copy(g.in.Bytes, xb)
		err = g.compute.CopyHtoD(g.dx, g.in.Bytes[:nx])
		xp = g.dx
	}
	if !yDev {
		yp = g.dy
	}
	if err == nil {
		err = g.launchMatMul(fn, mmq, w, wp, xp, yp, T)
	}
	if !yDev && err == nil {
		if err = g.compute.CopyDtoH(g.out.Bytes[:ny], g.dy); err == nil {
			err = g.compute.Synchronize()
		}
	}
	if err != nil {
		if g.step != nil {
			g.failCompute(err)
			return true
		}
		g.fail(err)
		return false
	}
	g.launched(mmq)
	if !yDev {
		copy(yb, g.out.Bytes[:ny])
	}
	return true
}

// launchMatMul launches the product of the weights at wp and T activations at xp into yp: when
// mmq is set, on mmqi's tensor-core tiles where w's type has them, else on mmq's (fn); else on
// mmvq's integer product where w's type has one, else on mmv (fn). The quantized kernels
// multiply the activation quantized as the CPU quantizes it, so quantizing comes first, and
// its error stops the launch. The caller holds g.mu.
func (g *GPU) launchMatMul(fn *Function, mmq bool, w quant.Matrix, wp, xp, yp DevicePtr, T int) error {
	grid := Dim3{X: (w.Rows + mmvRowsPerBlock - 1) / mmvRowsPerBlock, Y: (T + mmvTokensPerBlock - 1) / mmvTokensPerBlock}
	block := Dim3{X: 32, Y: mmvRowsPerBlock}
	args := func() *Args { return g.args.Reset().Ptr(wp).Ptr(xp).Ptr(yp).Int(w.Rows).Int(w.Cols).Int(T) }
	if mmq {
		grid = Dim3{X: (w.Rows + mmqRowsPerBlock - 1) / mmqRowsPerBlock, Y: (T + mmqTokensPerBlock - 1) / mmqTokensPerBlock}
		block = Dim3{X: mmqThreads}
		var off int64
		a, err := g.quantizeLocked(xp, T, w.Cols, w.Type, &off)
		if err != nil {
			return err
		}
		_, qb, _ := q8Kind(w.Type)
		args = func() *Args {
			return g.args.Reset().Ptr(wp).Ptr(xp).Ptr(yp).Int(w.Rows).Int(w.Cols).Int(T).Ptr(a.q).Ptr(a.d).Ptr(a.s).Int(qb)
		}
		if f := g.mmqi[w.Type]; f != nil && a.q != 0 {
			fn, block = f, Dim3{X: mmqiThreads}
			args = func() *Args {
				return g.args.Reset().Ptr(wp).Ptr(a.q).Ptr(a.d).Ptr(a.s).Ptr(yp).Int(w.Rows).Int(w.Cols).Int(T)
			}
		}
	} else if f := g.mmvq[w.Type]; f != nil {
		var off int64
		a, err := g.quantizeLocked(xp, T, w.Cols, w.Type, &off)
		if err != nil {
			return err
		}
		if a.q != 0 {
			grid.X, block = g.rowDims(w.Rows, true)
			fn = f
			if f1 := g.mmvq1[w.Type]; f1 != nil && T == 1 {
				fn = f1
			}
			args = func() *Args {
				return g.args.Reset().Ptr(wp).Ptr(a.q).Ptr(a.d).Ptr(a.s).Ptr(yp).Int(w.Rows).Int(w.Cols).Int(T)
			}
		}
	}
	return g.launch(fn, grid, block, args())
}

// RowWarps is the warps a row of the integer decode products (GPUOptions.RowWarps, 1 for 0).
func (g *GPU) RowWarps() int { return g.rowWarps }

// rowDims are grid.x and the block of a product kernel with a warp per row (mmv's ABI) over
// rows rows: mmvRowsPerBlock rows a block, or, for an integer product (mmvq.cu) where the GPU
// deals a row over several warps (GPUOptions.RowWarps), a row a block of that many warps.
func (g *GPU) rowDims(rows int, integer bool) (x int, block Dim3) {
	if !integer {
		return rowDims(rows, 1)
	}
	return rowDims(rows, g.rowWarps)
}

// rowDims are grid.x and the block of rows rows of an mmvq kernel with warps warps a row.
func rowDims(rows, warps int) (x int, block Dim3) {
	if warps > 1 {
		return max(rows, 1), Dim3{X: 32, Y: 1, Z: warps}
	}
	return blocks(rows, mmvRowsPerBlock), Dim3{X: 32, Y: mmvRowsPerBlock}
}

// stage grows the staging buffers to nx input and ny output bytes. The caller holds g.mu.
func (g *GPU) stage(nx, ny int64) error {
	grow := func(buf **HostBuffer, dev *DevicePtr, have *int64, n int64) error {
		if *have >= n {
			return nil
		}
		n = max(n, 2**have, 1<<20)
		if *buf != nil {
			(*buf).Free()
			*buf = nil
		}
		g.ctx.Free(*dev)
		*dev, *have = 0, 0
		b, err := g.ctx.HostAlloc(int(n))
		if err != nil {
			return err
		}
		p, err := g.ctx.Alloc(n)
		if err != nil {
			b.Free()
			return err
		}
		*buf, *dev, *have = b, p, n
		return nil
	}
	return errors.Join(grow(&g.in, &g.dx, &g.dxN, nx), grow(&g.out, &g.dy, &g.dyN, ny))
}

// Host is the host CPU seen from the GPU: its kernels finish before the call returns, and it
// waits for the GPU's events by blocking.
func (g *GPU) Host() device.HostKernels { return gpuHost{g} }

type gpuHost struct{ g *GPU }

func (h gpuHost) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	h.g.host.MatMul(w, x, T, out)
}
func (h gpuHost) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	h.g.host.MatMulID(w, x, T, out)
}
func (h gpuHost) Parallel(n int, fn func(i int)) { h.g.host.Parallel(n, fn) }
func (h gpuHost) Record() device.Event           { return nil }
func (h gpuHost) Wait(ev device.Event)           { h.g.Sync(ev) }

// Kernels returns the host's own kernels, for their optional capabilities (the CPU's
// several products in one parallel region): they too finish before the call returns.
func (h gpuHost) Kernels() device.Kernels { return h.g.host }

var (
	_ device.Device        = (*GPU)(nil)
	_ device.Resident      = (*GPU)(nil)
	_ device.HostAllocator = (*GPU)(nil)
	_ device.Faulter       = (*GPU)(nil)
)
