package engine

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/devices"
	"github.com/commit-run/commit-run/sim"
)

// Devices lists the device names Open accepts, for help texts and errors.
func Devices() []string { return devices.Names() }

// CUDADevices lists the GPUs the CUDA driver sees (library "" finds libcuda.so.1). Without a
// driver the error wraps cuda.ErrNoDriver.
func CUDADevices(library string) ([]cuda.Info, error) { return devices.CUDA(library) }

// newDevice makes the device opts name (devices.Open). Its memory budget is the offload
// budget when offloading, otherwise the whole device (unlimited on the CPU).
func newDevice(opts Options) (dev device.Device, note string, err error) {
	s := devices.Spec{Name: opts.Device, Threads: opts.Threads, Profile: opts.profile, HostRates: opts.HostRates,
		TimingOnly: opts.TimingOnly != nil, CUDALibrary: opts.CUDALibrary, ProfileKernels: opts.ProfileKernels, CPUForAuto: opts.EP != nil,
		RowWarps: opts.GPURowWarps}
	if opts.Offload != nil {
		if opts.Offload.GPUMem < 0 {
			return nil, "", fmt.Errorf("offload: device memory budget %d bytes: want a positive size, or 0 for a card's whole memory", opts.Offload.GPUMem)
		}
		s.Budget = opts.Offload.GPUMem
	}
	if opts.EP != nil && opts.Threads == 0 {
		// The ranks of expert parallelism compute at once; each gets its share of the cores.
		s.Threads = max(1, runtime.NumCPU()/max(opts.EP.Devices, 1))
	}
	return devices.Open(s)
}

// hasCardMemory says whether dev is a card, real or simulated, whose memory is its own and
// finite: the CPU's "device memory" is the host's, with no size but a budget's.
func hasCardMemory(dev device.Device) bool {
	switch dev.(type) {
	case *sim.Device, *cuda.GPU:
		return true
	}
	return false
}

// offloadBudget returns opts with the offload budget made the card's whole memory (a GPU's
// free memory, a simulated card's size) where it is 0, as llama.cpp's --n-cpu-moe takes
// what the card has; the CPU has no such size, so there it needs one.
func offloadBudget(opts Options, dev device.Device) (Options, error) {
	if opts.Offload == nil || opts.Offload.GPUMem != 0 {
		return opts, nil
	}
	if !hasCardMemory(dev) {
		return opts, fmt.Errorf("offload on %s: no card's memory to fill: give a device memory budget (--gpu-mem)", dev.Name())
	}
	o := *opts.Offload // the caller's options stay as they were
	o.GPUMem = dev.Memory().Budget()
	opts.Offload = &o
	return opts, nil
}

// closeDevice releases a device that holds resources beyond Go memory (a GPU).
func closeDevice(dev device.Device) error { return devices.Close(dev) }

// upload puts the weights that stay on the device there, on devices with memory of their
// own: every tensor; with offloading every tensor but the routed experts; with expert
// parallelism every tensor but the routed experts, and the experts the rank holds.
func (m *Model) upload() error {
	r, ok := m.dev.(device.Resident)
	if !ok {
		return nil
	}
	for _, t := range m.file.Tensors {
		if m.arch.Config.Skipped(t.Name) {
			continue // a block no pass runs
		}
		if (m.off != nil || m.ep != nil) && strings.HasSuffix(t.Name, "_exps.weight") {
			continue
		}
		if err := r.Upload(t.Data, t.Name); err != nil {
			return err
		}
	}
	if m.ep != nil {
		return m.ep.UploadExperts(m.rank)
	}
	return nil
}

// deviceErr is the first failure of the device's asynchronous work, if it reports them.
func (m *Model) deviceErr() error {
	if f, ok := m.dev.(device.Faulter); ok {
		return f.Err()
	}
	return nil
}

// DeviceNote says how the device was chosen when it is not the one asked for: --device auto
// without a GPU runs on the CPU.
func (m *Model) DeviceNote() string { return m.devNote }

// GPUStats are the CUDA device's counters: kernel launches, products left to the host, and
// the expert copies measured on the copy stream.
type GPUStats = cuda.GPUStats

// GPUStats reports the CUDA device's counters; ok is false on other devices.
func (m *Model) GPUStats() (GPUStats, bool) {
	if g, ok := m.dev.(*cuda.GPU); ok {
		return g.Stats(), true
	}
	return GPUStats{}, false
}

// KernelProfile is a CUDA GPU's time by kernel since it opened (Options.ProfileKernels),
// waiting for what it has enqueued; ok is false on other devices and without the option.
func (m *Model) KernelProfile() (p []cuda.KernelTime, ok bool) {
	if g, ok := m.dev.(*cuda.GPU); ok && m.opts.ProfileKernels {
		return g.KernelProfile(), true
	}
	return nil, false
}

// Device is the name of the device the model runs on.
func (m *Model) Device() string { return m.dev.Name() }

// Timeline returns the spans of the simulated GPU's timeline so far (for sim.WriteSVG), or
// false on a device whose time is the wall clock.
func (m *Model) Timeline() ([]sim.Span, bool) {
	if d, ok := m.dev.(*sim.Device); ok {
		return d.Spans(), true
	}
	return nil, false
}

// Clock returns the time the model's device keeps, in seconds: the simulated GPU's virtual
// time, or false on a device whose time is the wall clock.
func (m *Model) Clock() (float64, bool) {
	if c, ok := m.dev.(device.Clock); ok {
		return c.Now(), true
	}
	return 0, false
}

// DeviceMemory reports the device memory budget, the bytes in use and the peak.
func (m *Model) DeviceMemory() (budget, used, peak int64) {
	mem := m.dev.Memory()
	return mem.Budget(), mem.Used(), mem.Peak()
}

// charge prices work the engine computes itself on devices that keep time.
func (m *Model) charge(kind string, bytes, flops float64) {
	if m.charger != nil {
		m.charger.Charge(kind, bytes, flops)
	}
}

// label names the device work enqueued next, on devices that draw it: name, then "L<layer>"
// and "E<expert>" where they are not negative. Plain arguments rather than a format, so that
// devices that draw nothing pay nothing on the hot path.
func (m *Model) label(kind, name string, layer, expert int) {
	if m.labeler == nil {
		return
	}
	text := name
	if layer >= 0 {
		text = strings.TrimSpace(fmt.Sprintf("%s L%d", name, layer))
	}
	if expert >= 0 {
		text = fmt.Sprintf("%s E%d", text, expert)
	}
	m.labeler.Label(kind, text)
}
