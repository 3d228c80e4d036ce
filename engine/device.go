package engine

import (
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/sim"
)

// Devices lists the device names Open accepts, for help texts and errors.
func Devices() []string {
	out := []string{"cpu", "cuda:N", "auto"}
	for _, p := range sim.Profiles() {
		out = append(out, "sim:"+p)
	}
	return out
}

// CUDADevices lists the GPUs the CUDA driver sees (library "" finds libcuda.so.1). Without a
// driver the error wraps cuda.ErrNoDriver.
func CUDADevices(library string) ([]cuda.Info, error) {
	drv, err := cuda.Load(library)
	if err != nil {
		return nil, err
	}
	n, err := drv.Count()
	if err != nil {
		return nil, err
	}
	var out []cuda.Info
	for i := 0; i < n; i++ {
		dev, err := drv.Device(i)
		if err != nil {
			return out, err
		}
		in, err := dev.Info()
		if err != nil {
			return out, fmt.Errorf("cuda:%d: %w", i, err)
		}
		out = append(out, in)
	}
	return out, nil
}

// newDevice makes the device opts name. Its memory budget is the offload budget when
// offloading, otherwise the whole device (unlimited on the CPU).
func newDevice(opts Options) (dev device.Device, note string, err error) {
	budget := int64(math.MaxInt64)
	if opts.Offload != nil {
		if opts.Offload.GPUMem <= 0 {
			return nil, "", fmt.Errorf("offload: device memory budget %d bytes: want a positive size", opts.Offload.GPUMem)
		}
		budget = opts.Offload.GPUMem
	}
	if opts.EP != nil && opts.Threads == 0 {
		// The ranks of expert parallelism compute at once; each gets its share of the cores.
		opts.Threads = max(1, runtime.NumCPU()/max(opts.EP.Devices, 1))
	}
	name := strings.TrimSpace(opts.Device)
	switch {
	case name == "" || name == "cpu":
		mem, err := device.NewMemory(budget)
		if err != nil {
			return nil, "", err
		}
		return cpu.New(opts.Threads, cpu.WithMemory(mem)), "", nil
	case strings.HasPrefix(name, "sim:"):
		prof := opts.profile
		if prof == nil {
			var err error
			if prof, err = sim.LoadProfile(strings.TrimPrefix(name, "sim:")); err != nil {
				return nil, "", fmt.Errorf("device %s: %w", name, err)
			}
		}
		if opts.Offload == nil {
			budget = prof.MemoryBytes
		}
		// sim.NewDevice refuses a budget over the card.
		mem, err := device.NewMemory(budget)
		if err != nil {
			return nil, "", err
		}
		so := sim.DeviceOptions{Memory: mem, HostRates: opts.HostRates, TimingOnly: opts.TimingOnly != nil}
		if !so.TimingOnly {
			so.Numerics = cpu.New(opts.Threads)
		}
		dev, err := sim.NewDevice(prof, so)
		return dev, "", err
	case strings.HasPrefix(name, "cuda:"):
		n, err := strconv.Atoi(strings.TrimPrefix(name, "cuda:"))
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("device %q: want cuda:N with N the GPU's number from 0 (commit-run devices lists them)", opts.Device)
		}
		g, err := openGPU(opts, n)
		if err != nil {
			return nil, "", err
		}
		return g, "", nil
	case name == "auto":
		opts.Device = "cpu"
		if opts.EP != nil {
			return newDevice(opts)
		}
		g, gerr := openGPU(opts, 0)
		if gerr == nil {
			return g, "", nil
		}
		dev, _, err := newDevice(opts)
		why := gerr.Error()
		if errors.Is(gerr, cuda.ErrNoDriver) {
			why = "no CUDA driver found"
		}
		return dev, fmt.Sprintf("device auto: running on the CPU (%s)", why), err
	default:
		return nil, "", fmt.Errorf("device %q is not available: want cpu, cuda:N, auto or sim:<profile> (%s, or a profile JSON file)", opts.Device, strings.Join(sim.Profiles(), ", "))
	}
}

// openGPU opens cuda:n with the offload budget, or the card's free memory.
func openGPU(opts Options, n int) (*cuda.GPU, error) {
	var budget int64
	if opts.Offload != nil {
		budget = opts.Offload.GPUMem
	}
	return cuda.Open(cuda.GPUOptions{Ordinal: n, Library: opts.CUDALibrary, Host: cpu.New(opts.Threads), Budget: budget,
		HostRates: opts.HostRates})
}

// closeDevice releases a device that holds resources beyond Go memory (a GPU).
func closeDevice(dev device.Device) error {
	if c, ok := dev.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

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
