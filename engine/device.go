package engine

import (
	"fmt"
	"math"
	"runtime"
	"strings"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/sim"
)

// Devices lists the device names Open accepts, for help texts and errors.
func Devices() []string {
	out := []string{"cpu"}
	for _, p := range sim.Profiles() {
		out = append(out, "sim:"+p)
	}
	return out
}

// newDevice makes the device opts name. Its memory budget is the offload budget when
// offloading, otherwise the whole device (unlimited on the CPU).
func newDevice(opts Options) (device.Device, error) {
	budget := int64(math.MaxInt64)
	if opts.Offload != nil {
		if opts.Offload.GPUMem <= 0 {
			return nil, fmt.Errorf("offload: device memory budget %d bytes: want a positive size", opts.Offload.GPUMem)
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
			return nil, err
		}
		return cpu.New(opts.Threads, cpu.WithMemory(mem)), nil
	case strings.HasPrefix(name, "sim:"):
		prof, err := sim.LoadProfile(strings.TrimPrefix(name, "sim:"))
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", name, err)
		}
		if opts.Offload == nil {
			budget = prof.MemoryBytes
		}
		// sim.NewDevice refuses a budget over the card.
		mem, err := device.NewMemory(budget)
		if err != nil {
			return nil, err
		}
		return sim.NewDevice(prof, sim.DeviceOptions{Numerics: cpu.New(opts.Threads), Memory: mem, HostBandwidth: opts.HostBandwidth})
	default:
		return nil, fmt.Errorf("device %q is not available: want cpu or sim:<profile> (%s, or a profile JSON file)", opts.Device, strings.Join(sim.Profiles(), ", "))
	}
}

// Device is the name of the device the model runs on.
func (m *Model) Device() string { return m.dev.Name() }

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
