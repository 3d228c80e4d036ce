// Package devices opens a device by the name a user gives it: the CPU, a CUDA GPU (cuda:N), a
// simulated GPU (sim:<profile>), or auto (cuda:0 where the driver sees a GPU, else the CPU),
// with the memory budget the engine may use on it; and lists the names and the GPUs.
package devices

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/sim"
)

// Names lists the device names Open accepts, for help texts and errors.
func Names() []string {
	out := []string{"cpu", "cuda:N", "auto"}
	for _, p := range sim.Profiles() {
		out = append(out, "sim:"+p)
	}
	return out
}

// CUDA lists the GPUs the CUDA driver sees (library "" finds libcuda.so.1). Without a driver
// the error wraps cuda.ErrNoDriver.
func CUDA(library string) ([]cuda.Info, error) {
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

// Spec is a device to open and what it is opened with.
type Spec struct {
	// Name is "" or "cpu", "cuda:N", "sim:<profile>" (a profile's name or JSON file), or
	// "auto".
	Name string
	// Threads are the host's compute threads (0: all cores).
	Threads int
	// Budget is the device memory the engine may use, in bytes; 0: the whole device (the
	// card's memory, its free memory on a CUDA GPU, unlimited on the CPU).
	Budget int64
	// Profile, when set, is the simulated GPU's in place of the one Name names.
	Profile   *sim.Profile
	HostRates device.HostRates
	// TimingOnly makes a simulated GPU charge its work without computing.
	TimingOnly  bool
	CUDALibrary string
	// ProfileKernels times a CUDA GPU's every launch (cuda.GPUOptions.ProfileKernels).
	ProfileKernels bool
	// RowWarps is a CUDA GPU's warps a row of its integer decode products
	// (cuda.GPUOptions.RowWarps); 0 is 1.
	RowWarps int
	// CPUForAuto makes auto the CPU without looking for a GPU.
	CPUForAuto bool
}

// Open makes the device s names, and for auto says which it chose where that is not a GPU.
func Open(s Spec) (dev device.Device, note string, err error) {
	budget := int64(math.MaxInt64)
	if s.Budget > 0 {
		budget = s.Budget
	}
	name := strings.TrimSpace(s.Name)
	switch {
	case name == "" || name == "cpu":
		mem, err := device.NewMemory(budget)
		if err != nil {
			return nil, "", err
		}
		return cpu.New(s.Threads, cpu.WithMemory(mem)), "", nil
	case strings.HasPrefix(name, "sim:"):
		dev, err := openSim(s, name, budget)
		return dev, "", err
	case strings.HasPrefix(name, "cuda:"):
		n, err := strconv.Atoi(strings.TrimPrefix(name, "cuda:"))
		if err != nil || n < 0 {
			return nil, "", fmt.Errorf("device %q: want cuda:N with N the GPU's number from 0 (commit-run devices lists them)", s.Name)
		}
		g, err := openGPU(s, n)
		if err != nil {
			return nil, "", err
		}
		return g, "", nil
	case name == "auto":
		s.Name = "cpu"
		if s.CPUForAuto {
			return Open(s)
		}
		g, gerr := openGPU(s, 0)
		if gerr == nil {
			return g, "", nil
		}
		dev, _, err := Open(s)
		why := gerr.Error()
		if errors.Is(gerr, cuda.ErrNoDriver) {
			why = "no CUDA driver found"
		}
		return dev, fmt.Sprintf("device auto: running on the CPU (%s)", why), err
	default:
		return nil, "", fmt.Errorf("device %q is not available: want cpu, cuda:N, auto or sim:<profile> (%s, or a profile JSON file)", s.Name, strings.Join(sim.Profiles(), ", "))
	}
}

// openSim opens the simulated GPU name names (or s.Profile) with the budget, or without one
// the card's memory.
func openSim(s Spec, name string, budget int64) (device.Device, error) {
	prof := s.Profile
	if prof == nil {
		var err error
		if prof, err = sim.LoadProfile(strings.TrimPrefix(name, "sim:")); err != nil {
			return nil, fmt.Errorf("device %s: %w", name, err)
		}
	}
	if s.Budget <= 0 {
		budget = prof.MemoryBytes
	}
	// sim.NewDevice refuses a budget over the card.
	mem, err := device.NewMemory(budget)
	if err != nil {
		return nil, err
	}
	so := sim.DeviceOptions{Memory: mem, HostRates: s.HostRates, TimingOnly: s.TimingOnly}
	if !so.TimingOnly {
		num := cpu.New(s.Threads)
		so.Numerics, so.Ops = num, models.HostOps{K: num}
	}
	return sim.NewDevice(prof, so)
}

// openGPU opens cuda:n with the budget, or the card's free memory.
func openGPU(s Spec, n int) (*cuda.GPU, error) {
	return cuda.Open(cuda.GPUOptions{Ordinal: n, Library: s.CUDALibrary, Host: cpu.New(s.Threads), Budget: s.Budget,
		HostRates: s.HostRates, ProfileKernels: s.ProfileKernels, RowWarps: s.RowWarps})
}

// Close releases a device that holds resources beyond Go memory (a GPU).
func Close(dev device.Device) error {
	if c, ok := dev.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
