// Package runstats turns a timed run's counters into the figures a benchmark reports: each
// decode step's latency, stall, compute, bytes moved and physical limit from snapshots of the
// clock and the counters (Step), and a run's row (Report): latency percentiles, time to first
// token, hit rate, bytes moved, stalls and the limit. The engine's Model.Time takes the
// snapshots; package bench prints the rows.
package runstats

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/autoplace"
	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
)

// Report is one run's figures, a policy's row of a benchmark's table; times in seconds.
type Report struct {
	Policy         string
	Predictor      string // what prefetch or commit predicted with ("" for the others)
	Slots          int
	Mean, P50, P90 float64 // per-token latency
	TTFT           float64 // time to first token, mean over prompts (real-model runs)
	// TTFTLimit is the prompt pass's physical limit, as LimitPerToken a decode step's.
	TTFTLimit       float64
	TokensPerSecond float64
	HitRate         float64 // experts found on the device when needed
	MovedPerToken   float64 // bytes
	StallPerToken   float64
	Accuracy        float64 // |predicted ∩ chosen| / k; NaN without a predictor
	OnCPUPerToken   float64 // experts computed on the host (cpu-miss, static)
	// Auto is auto placement's decision, in the row of policy auto: what it chose, what it
	// weighed and the figures it predicted for each.
	Auto          *autoplace.Plan `json:",omitempty"`
	LimitPerToken float64         // the physical limit (DESIGN.md §6), mean
	OverLimit     float64         // mean latency / mean limit
	// DeviceTimePerToken is the mean time a CUDA GPU's compute stream took per decode token,
	// between events recorded at consecutive tokens: set apart from the wall-clock latency,
	// it shows how much of a token the host's own work and its waits added. 0 (absent from
	// JSON) on other devices, whose time is the wall clock or the simulator's.
	DeviceTimePerToken float64 `json:",omitempty"`
	// GPU is the CUDA device's counters over the run, nil on other devices: its copy
	// stream's measured bandwidth, and products it left to the host.
	GPU *cuda.GPUStats `json:",omitempty"`
	// GPUPerToken is what a CUDA GPU did for a decoded token, the mean over the timed ones;
	// nil on other devices.
	GPUPerToken *GPUTokenStats `json:",omitempty"`
	// GPUPerPrompt is the same for a prompt's passes, up to its first token, the mean over
	// the timed prompts; nil on other devices.
	GPUPerPrompt *GPUTokenStats `json:",omitempty"`
	// Kernels is where a profiled CUDA GPU's time went, kernel by kernel (engine's
	// Options.ProfileKernels); nil otherwise.
	Kernels *KernelReport `json:",omitempty"`
}

// KernelReport is a profiled GPU's device time by kernel: per prompt pass (up to its first
// token) and per timed decode token, the longest first.
type KernelReport struct {
	Prefill, Decode []KernelShare
}

// KernelShare is one kernel's launches and device seconds in a unit of work.
type KernelShare struct {
	Name    string
	Calls   float64
	Seconds float64
}

// KernelSum adds up kernel profiles' differences by name.
type KernelSum map[string]cuda.KernelTime

// Add adds what ran between profiles a and b (b taken after a).
func (s KernelSum) Add(a, b []cuda.KernelTime) {
	before := make(map[string]cuda.KernelTime, len(a))
	for _, k := range a {
		before[k.Name] = k
	}
	for _, k := range b {
		d := s[k.Name]
		d.Name = k.Name
		d.Calls += k.Calls - before[k.Name].Calls
		d.Seconds += k.Seconds - before[k.Name].Seconds
		s[k.Name] = d
	}
}

// Shares are the sum's kernels that ran, their figures divided by n, the longest first (by
// name among equals).
func (s KernelSum) Shares(n float64) []KernelShare {
	var out []KernelShare
	for _, k := range s {
		if k.Calls > 0 {
			out = append(out, KernelShare{Name: k.Name, Calls: float64(k.Calls) / n, Seconds: k.Seconds / n})
		}
	}
	slices.SortFunc(out, func(a, b KernelShare) int {
		if c := cmp.Compare(b.Seconds, a.Seconds); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// GPUTokenStats are a CUDA GPU's counters for one decoded token (or one prompt).
type GPUTokenStats struct {
	// Launches are what the host issued: kernels, or one graph for a replayed decode step.
	Launches float64
	// Kernels are the kernels that ran, those of a replayed step included.
	Kernels float64
	// Reads are the host's waits for results of the device (the logits, and on the paths
	// that route on the host each MoE layer's router logits).
	Reads float64
	// Writes are the activations the host writes to the device (the experts it computed);
	// Pageable the reads and writes from host memory that is not pinned, which the driver
	// stages itself, holding the host.
	Writes, Pageable float64
}

// Add adds to s the counters of what the GPU did between its stats from and to.
func (s *GPUTokenStats) Add(from, to cuda.GPUStats) {
	s.Launches += float64(to.Launches - from.Launches)
	s.Kernels += float64(to.Kernels - from.Kernels)
	s.Reads += float64(to.Reads - from.Reads)
	s.Writes += float64(to.Writes - from.Writes)
	s.Pageable += float64(to.Pageable - from.Pageable)
}

// Over is s's mean over n units of work (tokens, prompts).
func (s GPUTokenStats) Over(n float64) *GPUTokenStats {
	return &GPUTokenStats{Launches: s.Launches / n, Kernels: s.Kernels / n, Reads: s.Reads / n, Writes: s.Writes / n, Pageable: s.Pageable / n}
}

// MarshalJSON writes the figures that do not apply (NaN: no predictor, no simulated clock)
// as null, which JSON can hold and NaN it cannot.
func (r Report) MarshalJSON() ([]byte, error) {
	type plain Report
	nullable := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		plain
		StallPerToken, Accuracy, LimitPerToken, OverLimit, TTFTLimit *float64
	}{plain(r), nullable(r.StallPerToken), nullable(r.Accuracy), nullable(r.LimitPerToken), nullable(r.OverLimit), nullable(r.TTFTLimit)})
}

// Summarise is the figures of a run's timed decode steps st.
func Summarise(policy string, slots int, st []offload.TokenStats) Report {
	r := Report{Policy: policy, Slots: slots}
	lat := make([]float64, len(st))
	var hits, needed, correct, predicted int
	var sumLimit float64
	for i, s := range st {
		lat[i] = s.Latency
		r.Mean += s.Latency
		r.MovedPerToken += s.Moved
		r.StallPerToken += s.Stall
		r.OnCPUPerToken += float64(s.OnCPU)
		sumLimit += s.Limit
		hits += s.Hits
		needed += s.Hits + s.Misses
		correct += s.Correct
		predicted += s.Predicted
	}
	k := float64(len(st))
	r.Mean /= k
	r.MovedPerToken /= k
	r.StallPerToken /= k
	r.OnCPUPerToken /= k
	r.LimitPerToken = sumLimit / k
	r.OverLimit = r.Mean / r.LimitPerToken
	r.TokensPerSecond = 1 / r.Mean
	slices.Sort(lat)
	r.P50 = lat[int(0.5*float64(len(lat)-1)+0.5)]
	r.P90 = lat[int(0.9*float64(len(lat)-1)+0.5)]
	r.HitRate = float64(hits) / float64(max(needed, 1))
	r.Accuracy = math.NaN()
	if predicted > 0 {
		r.Accuracy = float64(correct) / float64(predicted)
	}
	return r
}

// Snapshot is the clock and the counters at one moment of a timed run.
type Snapshot struct {
	T   float64       // seconds: the device's clock, or the wall clock
	Off offload.Stats // the offloader's counters
	Dev sim.Stats     // a simulated device's
	// GPU are a CUDA GPU's counters at a point marked on its compute stream, where Timed.
	GPU   cuda.GPUStats
	Timed bool
}

// Step is the figures of the decode step between snapshots a and b; pcie is the
// simulated link's rate (0 on other devices), hostMem the host memory's when the host
// computes experts on a GPU's behalf (0: it does not).
func Step(a, b Snapshot, pcie, hostMem float64) offload.TokenStats {
	st := offload.TokenStats{
		Latency:   b.T - a.T,
		Stall:     b.Dev.ComputeStalled - a.Dev.ComputeStalled,
		Compute:   b.Dev.ComputeBusy - a.Dev.ComputeBusy,
		Moved:     float64(b.Off.BytesCopied - a.Off.BytesCopied),
		Needed:    float64(b.Off.NeededBytes - a.Off.NeededBytes),
		Hits:      int(b.Off.Hits - a.Off.Hits),
		Misses:    int(b.Off.Misses - a.Off.Misses),
		OnCPU:     int(b.Off.OnCPU - a.Off.OnCPU),
		HostRead:  float64(b.Off.HostBytes - a.Off.HostBytes),
		Correct:   int(b.Off.Correct - a.Off.Correct),
		Predicted: int(b.Off.Predicted - a.Off.Predicted),
	}
	if b.Timed {
		// The token's device time is compute and stall; the bytes move at the rate the copy
		// stream has shown so far (none yet: the limit is the compute).
		st.Stall = max(b.GPU.StallSeconds-a.GPU.StallSeconds, 0)
		st.Compute = max(b.GPU.DeviceSeconds-a.GPU.DeviceSeconds-st.Stall, 0)
		pcie = b.GPU.CopyBandwidth()
	}
	st.Limit = st.Compute
	if pcie > 0 {
		st.Limit = max(st.Limit, st.Needed/pcie)
	}
	if hostMem > 0 {
		st.Limit = max(st.Limit, st.HostRead/hostMem)
	}
	return st
}
