package sim

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/commit-run/commit-run/device"
)

// HostProfile is the data that describes a host to the simulator: the rates at which its CPU
// computes the experts that stay in host memory (cpu-miss, static), the counterpart of a
// GPU's Profile. All rates are per second and all times are seconds.
type HostProfile struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Threads is the number of threads the host's expert kernels run on.
	Threads int `json:"threads"`
	// MemoryBandwidth is the host DRAM's measured (STREAM-like) read rate in bytes/s: the
	// physical limit of what the host reads (DESIGN.md §6).
	MemoryBandwidth float64 `json:"memory_bandwidth"`
	// ExpertBandwidth is the rate at which an expert's matrix-vector products read a
	// quantized weight matrix for one token at Threads threads, bytes/s; at most
	// MemoryBandwidth.
	ExpertBandwidth float64 `json:"expert_bandwidth"`
	// ExpertFLOPS is the rate of the arithmetic each further token of a batch adds to a
	// host expert's products, flop/s.
	ExpertFLOPS float64 `json:"expert_flops"`
	// KernelOverhead is one host product's fixed cost: dispatching it to the threads and
	// moving its activations between host and device.
	KernelOverhead float64 `json:"kernel_overhead"`
	// Sources says where each number comes from.
	Sources []string `json:"sources"`
	// Calibrated is true when a number was set from a published end-to-end measurement
	// (the sources say which).
	Calibrated bool `json:"calibrated"`
}

func (h *HostProfile) name() string { return h.Name }

// Hosts lists the names of the embedded host profiles, sorted.
func Hosts() []string { return embeddedNames("hosts") }

// LoadHost returns a validated host profile: an embedded one by its plain name, or a JSON
// file, so users can describe their own machine.
func LoadHost(name string) (*HostProfile, error) {
	return load[HostProfile](name, "hosts", "host profile")
}

// Rates are the profile's rates as the devices price host kernels with them.
func (h *HostProfile) Rates() device.HostRates {
	return device.HostRates{Bandwidth: h.ExpertBandwidth, FLOPS: h.ExpertFLOPS, Overhead: h.KernelOverhead, Memory: h.MemoryBandwidth}
}

// maxThreads bounds Threads: more is a typo.
const maxThreads = 1 << 14

// Validate checks that every number is finite, positive and within physical reason, and that
// the expert kernels do not read faster than the memory. Errors name the profile and the
// field by its JSON key.
func (h *HostProfile) Validate() error {
	if strings.TrimSpace(h.Name) == "" {
		return errors.New("host profile: name is empty")
	}
	fail := func(field string, v any, why string) error {
		return fmt.Errorf("host profile %q: %s = %v %s", h.Name, field, v, why)
	}
	if h.Threads <= 0 || h.Threads > maxThreads {
		return fail("threads", h.Threads, fmt.Sprintf("wants 1 to %d", maxThreads))
	}
	for _, r := range []struct {
		field string
		v     float64
		max   float64
		what  string
	}{
		{"memory_bandwidth", h.MemoryBandwidth, maxBandwidth, "more than 100 TB/s"},
		{"expert_bandwidth", h.ExpertBandwidth, maxBandwidth, "more than 100 TB/s"},
		{"expert_flops", h.ExpertFLOPS, maxFLOPS, "more than 1e18 FLOP/s"},
		{"kernel_overhead", h.KernelOverhead, maxLatency, "more than one second"},
	} {
		switch {
		case math.IsNaN(r.v) || math.IsInf(r.v, 0):
			return fail(r.field, r.v, "must be finite")
		case r.v <= 0:
			return fail(r.field, r.v, "must be positive")
		case r.v > r.max:
			return fail(r.field, r.v, "is "+r.what)
		}
	}
	if h.ExpertBandwidth > h.MemoryBandwidth {
		return fail("expert_bandwidth", h.ExpertBandwidth,
			fmt.Sprintf("exceeds memory_bandwidth %v: a kernel cannot read faster than the memory", h.MemoryBandwidth))
	}
	return nil
}
