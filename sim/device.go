package sim

import (
	"fmt"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// DeviceOptions configure NewDevice.
type DeviceOptions struct {
	// Numerics computes the numbers: the CPU device. Its own streams are not used.
	Numerics device.Kernels
	// TimingOnly charges every kernel and copy without computing or copying anything, and
	// takes no Numerics: the device of timing-only runs, whose weights are never read.
	TimingOnly bool
	// Memory is the budget; nil means the profile's memory.
	Memory *device.Memory
	// HostRates price the host's expert kernels (cpu-miss): measure them on the machine
	// being modelled. Zero rates take the device package's defaults.
	HostRates device.HostRates
	// Ops are the host's operations over Numerics (models.HostOps): the numbers of the
	// grouped experts' biases and activations (ExpertGroups), which the engine's one-by-one
	// path computes with them. Nil: the device does not group experts unless timing only.
	Ops device.Ops
}

// Device is the simulated GPU sim:<profile>: numbers computed on the CPU (or, timing only,
// not at all), every kernel and copy charged to a virtual-time timeline of the modelled card. Kernels run on a "compute"
// stream, copies on a "copy" stream and the host's expert kernels on a "cpu" stream beside
// the issuing thread. It is safe for concurrent use, but a timeline models one issuing
// thread: concurrent sessions interleave on it as they would on a real card.
type Device struct {
	mu                 sync.Mutex
	prof               *Profile
	num                device.Kernels // nil: timing only
	ops                device.Ops     // the host's operations over num (DeviceOptions.Ops)
	mem                *device.Memory
	tl                 *Timeline
	compute, copy, cpu *Stream
	link               *Stream // collectives with other devices (expert parallelism)
	host               device.HostRates
	kind, label        string
}

// NewDevice returns a simulated device of profile p.
func NewDevice(p *Profile, o DeviceOptions) (*Device, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if o.Numerics == nil && !o.TimingOnly {
		return nil, fmt.Errorf("sim device %s: no numerics device", p.Name)
	}
	host, err := o.HostRates.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("sim device %s: %w", p.Name, err)
	}
	d := &Device{prof: p, num: o.Numerics, ops: o.Ops, mem: o.Memory, tl: NewTimeline(), host: host}
	if d.mem == nil {
		if d.mem, err = device.NewMemory(p.MemoryBytes); err != nil {
			return nil, err
		}
	}
	if d.mem.Budget() > p.MemoryBytes {
		return nil, fmt.Errorf("sim device %s: a budget of %.2f GiB exceeds the card's %.2f GiB", p.Name, float64(d.mem.Budget())/(1<<30), float64(p.MemoryBytes)/(1<<30))
	}
	d.compute, d.copy, d.cpu = d.tl.NewStream("compute"), d.tl.NewStream("copy"), d.tl.NewStream("cpu")
	d.link = d.tl.NewStream("link")
	return d, nil
}

// Profile is the modelled card.
func (d *Device) Profile() *Profile { return d.prof }

// Name is "sim:<profile>".
func (d *Device) Name() string { return "sim:" + d.prof.Name }

// Memory is the device's budget.
func (d *Device) Memory() *device.Memory { return d.mem }

// Now is the issuing thread's virtual time.
func (d *Device) Now() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tl.Now()
}

// Stats are the totals of a device's timeline, in seconds.
type Stats struct {
	Now            float64
	ComputeBusy    float64 // kernel time on the compute stream
	ComputeStalled float64 // compute-stream time blocked on other streams' events
	CopyBusy       float64
	HostWaited     float64 // issuing-thread time blocked on the device
	HostCompute    float64 // time of the host's expert kernels
}

// Stats reports the timeline's totals so far.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{Now: d.tl.Now(), ComputeBusy: d.compute.Busy(), ComputeStalled: d.compute.Stalled(), CopyBusy: d.copy.Busy(),
		HostWaited: d.tl.HostWaited(), HostCompute: d.cpu.Busy()}
}

// Spans returns every span drawn so far, for WriteSVG.
func (d *Device) Spans() []Span {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tl.Spans()
}

// Label names the work enqueued next.
func (d *Device) Label(kind, label string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.kind, d.label = kind, label
}

func (d *Device) names(kind string) (string, string) {
	if d.kind != "" {
		kind = d.kind
	}
	return kind, d.label
}

// matMulCost is what a matrix product of T rows reads, writes and computes: the weights as
// stored, the activations in and out as float32.
func matMulCost(w quant.Matrix, T int) (bytes, flops float64) {
	return float64(len(w.Data)) + 4*float64(T)*float64(w.Rows+w.Cols), 2 * float64(T) * float64(w.Rows) * float64(w.Cols)
}

// MatMul computes on the CPU (unless timing only) and charges one kernel.
func (d *Device) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	if d.num != nil {
		d.num.MatMul(w, x, T, out)
	}
	d.charge("matmul", w, T)
}

// MatMulID computes on the CPU (unless timing only) and charges one kernel.
func (d *Device) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	if d.num != nil {
		d.num.MatMulID(w, x, T, out)
	}
	d.charge("expert", w, T)
}

// charge enqueues a product of T tokens with w, priced at the card's decode rate for w's type
// where the profile has one (Profile.ProductTime).
func (d *Device) charge(kind string, w quant.Matrix, T int) {
	b, f := matMulCost(w, T)
	d.enqueue(kind, d.prof.ProductTime(w.Type, T, b, f))
}

// Charge enqueues a kernel priced by the profile's roofline.
func (d *Device) Charge(kind string, bytes, flops float64) {
	d.enqueue(kind, d.prof.KernelTime(bytes, flops))
}

// enqueue puts a kernel of kind taking seconds on the compute stream.
func (d *Device) enqueue(kind string, seconds float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, l := d.names(kind)
	d.compute.Enqueue(k, l, seconds)
}

// Parallel spreads host work over the numerics device's threads (in turn when timing only);
// it is not device time.
func (d *Device) Parallel(n int, fn func(i int)) { parallel(d.num, n, fn) }

func parallel(k device.Kernels, n int, fn func(i int)) {
	if k != nil {
		k.Parallel(n, fn)
		return
	}
	for i := 0; i < n; i++ {
		fn(i)
	}
}

// CopyIn copies at once (unless timing only) and charges the copy to the copy stream.
func (d *Device) CopyIn(dst, src []byte) {
	if d.num != nil {
		copy(dst, src)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, l := d.names("copy") // a copy is drawn as a copy whatever the label's kind
	d.copy.Enqueue("copy", l, d.prof.CopyTime(float64(len(src))))
}

// Sync advances the issuing thread to ev.
func (d *Device) Sync(ev device.Event) {
	if ev == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tl.HostWait(ev.(Event))
}

// CopyDone is when a copy of n bytes enqueued now would land.
func (d *Device) CopyDone(n int64) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.copy.Tail(), d.tl.Now()) + d.prof.CopyTime(float64(n))
}

// HostDone is when the host would finish work w started now, behind its kernels enqueued
// before.
func (d *Device) HostDone(w device.HostWork) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.cpu.Tail(), d.tl.Now()) + d.host.Seconds(w)
}

// Ready is when the compute stream's work issued so far is done, or the host's time if later.
func (d *Device) Ready() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.compute.Record().At
}

// Transfer draws a collective on the "link" row from start to end (never before the host
// issued it or the link's previous collective ended) and makes the compute stream wait for
// it. start and end come from every member of the collective, so they agree on its timing.
func (d *Device) Transfer(start, end float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !(end >= start) {
		panic(fmt.Sprintf("sim: transfer from %v to %v", start, end)) // a caller's bug
	}
	d.link.Wait(Event{At: start, Stream: "peers"})
	_, l := d.names("link")
	sp := d.link.Enqueue("link", l, end-start)
	d.compute.Wait(Event{At: sp.End, Stream: "link"})
}

// Compute, Copy: the device's streams.
func (d *Device) Compute() device.Stream { return stream{d, d.compute} }
func (d *Device) Copy() device.Stream    { return stream{d, d.copy} }

// Host is the host CPU's kernels on the "cpu" stream, priced at DeviceOptions.HostRates.
func (d *Device) Host() device.HostKernels { return host{stream{d, d.cpu}} }

type stream struct {
	d *Device
	s *Stream
}

func (s stream) Record() device.Event {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	return s.s.Record()
}

func (s stream) Wait(ev device.Event) {
	if ev == nil {
		return
	}
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.s.Wait(ev.(Event))
}

type host struct{ stream }

func (h host) MatMul(w quant.Matrix, x []float32, T int, out []float32) {
	if h.d.num != nil {
		h.d.num.MatMul(w, x, T, out)
	}
	h.charge(w, T)
}

func (h host) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	if h.d.num != nil {
		h.d.num.MatMulID(w, x, T, out)
	}
	h.charge(w, T)
}

// MatMulIDs implements device.Batcher as the CPU does: the products in one parallel region,
// charged as one host kernel (its fixed cost once) that reads every product's weights.
func (h host) MatMulIDs(ps []device.BatchProduct) {
	if b, ok := h.d.num.(device.Batcher); ok {
		b.MatMulIDs(ps)
	} else if h.d.num != nil {
		for _, p := range ps {
			h.d.num.MatMulID(p.W, p.X, p.T, p.Out)
		}
	}
	var w device.HostWork
	for _, p := range ps {
		w = w.Plus(p.W, p.T)
	}
	w.Kernels = min(w.Kernels, 1)
	h.enqueue(w)
}

func (h host) Parallel(n int, fn func(i int)) { parallel(h.d.num, n, fn) }

// charge prices a host kernel of T tokens at the host's rates: its weights read once, and
// the arithmetic of its tokens after the first.
func (h host) charge(w quant.Matrix, T int) { h.enqueue(device.HostWork{}.Plus(w, T)) }

// enqueue puts work w on the host's stream, priced at the host's rates.
func (h host) enqueue(w device.HostWork) {
	d := h.d
	d.mu.Lock()
	defer d.mu.Unlock()
	_, l := d.names("cpu")
	d.cpu.Enqueue("cpu", l, d.host.Seconds(w))
}

var _ device.Batcher = host{}

var (
	_ device.Device  = (*Device)(nil)
	_ device.Clock   = (*Device)(nil)
	_ device.Charger = (*Device)(nil)
	_ device.Labeler = (*Device)(nil)
)

var (
	_ device.Planner = (*Device)(nil)
	_ device.Linker  = (*Device)(nil)
)
