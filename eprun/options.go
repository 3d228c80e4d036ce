package eprun

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/commit-run/commit-run/multigpu"
)

// Options run a model with expert parallelism (engine.Options.EP, whose EPOptions they are):
// Devices ranks, each a device of the model's device's kind holding a copy of the non-expert
// weights and its share of the experts. A forward pass runs on every rank at once, each on its
// own tokens; at every MoE layer the ranks exchange their tokens' routing, plan the same
// schedule with Policy, dispatch the tokens to the devices computing their experts and combine
// the results, all through a transport: NCCL between CUDA GPUs, in-process copies otherwise. A
// session's tokens live on rank 0; a perplexity evaluation spreads its windows over the ranks.
//
// On CUDA, rank r runs on cuda:(N+r) for the model's device cuda:N, one GPU per rank.
type Options struct {
	// Devices is the number of ranks: 2 to the model's experts.
	Devices int
	// Policy plans each MoE layer's batch: one of Policies() ("" = round-robin).
	Policy string
	// Gamma, Metric and Seed are the capacity-aware policies' capacity factor (0: 1.5), drop
	// metric and random seed.
	Gamma  float64
	Metric multigpu.DropMetric
	Seed   uint64
	// HarMoEnyThreshold is HarMoEny's token threshold q; 0: eq. 4 from a simulated
	// device's profile, or the authors' default of 150 tokens on the CPU.
	HarMoEnyThreshold int
	// LinkBandwidth (bytes/s) and LinkLatency (s) model simulated devices' all-to-all; 0:
	// the profile's PCIe rate and copy latency (consumer cards exchange through PCIe).
	LinkBandwidth, LinkLatency float64
	// Transport moves the tokens between the ranks: "nccl" (CUDA GPUs only), "local" (the
	// in-process transport: host memory copies), or "" for NCCL on GPUs when the library
	// loads and in-process otherwise (Stats.Transport says which, and why).
	Transport string
	// NCCLLibrary is the NCCL library to load; "" finds libnccl.so.2.
	NCCLLibrary string
	// Rendezvous, when set, runs one rank per process, on one machine or several: this
	// process is rank Rank of Devices, on the model's device (a CUDA GPU; NCCL moves the
	// tokens), and the processes meet at Rendezvous, the host:port where rank 0 listens. Rank
	// 0 runs the passes (sessions, perplexity, with its own tokens); every other rank calls
	// engine.Model.ServeEP, which serves its experts until rank 0 closes the model.
	Rendezvous string
	Rank       int
	// RendezvousTimeout bounds the wait for the other processes at Open; 0: 5 minutes.
	RendezvousTimeout time.Duration
	// MACSEta is the weight of semantic affinity against the gating score when the MACS
	// planners reroute a token its expert has no room for (seeds/001 eq. 10), 0 to 1; the
	// paper gives no value. Above 0 it needs MACSCalibration.
	MACSEta float64
	// MACSCalibration is text whose routing gives every expert its semantic centroid, the
	// mean router input of the tokens that chose it (seeds/001 appendix A.3). Open runs its
	// first MACSCalibrationTokens tokens (0: 4096) through the model on the CPU, in windows
	// of up to 512; each rank then sends, with its tokens' routing, their cosine with every
	// centroid.
	MACSCalibration       string
	MACSCalibrationTokens int
}

// defaultHarMoEnyQ is the token threshold of HarMoEny's published code (eq_tokens=150), used
// where no device profile gives eq. 4 its numbers.
const defaultHarMoEnyQ = 150

// Policies lists the planners expert parallelism plans each MoE layer's batch with
// (Options.Policy).
func Policies() []string { return multigpu.PolicyNames() }

// Check checks o against a model of experts routed experts. conflict, when not nil, is the
// caller's objection to the other options it runs with (expert parallelism does not offload,
// commit or drop tokens on one device as well); it is reported after the model's and the
// ranks' count and before the rest, so that the first objection is always the same.
func Check(o Options, experts int, conflict error) error {
	switch {
	case experts == 0:
		return fmt.Errorf("expert parallelism: the model is dense")
	case o.Devices < 2 || o.Devices > min(experts, 1024):
		return fmt.Errorf("expert parallelism over %d devices: want 2 to the model's %d experts", o.Devices, min(experts, 1024))
	case conflict != nil:
		return conflict
	case !(o.Gamma >= 0) || math.IsInf(o.Gamma, 0):
		return fmt.Errorf("capacity factor %v: want more than 0", o.Gamma)
	case !o.Metric.Valid():
		return fmt.Errorf("expert parallelism: unknown drop metric %v", o.Metric)
	case o.HarMoEnyThreshold < 0:
		return fmt.Errorf("HarMoEny threshold %d tokens: want 0 (the default) or more", o.HarMoEnyThreshold)
	case !(o.LinkBandwidth >= 0) || math.IsInf(o.LinkBandwidth, 0) || !(o.LinkLatency >= 0) || math.IsInf(o.LinkLatency, 0):
		return fmt.Errorf("link of %v bytes/s and %v s latency: want positive values, or 0 for the profile's", o.LinkBandwidth, o.LinkLatency)
	case o.Rendezvous == "" && o.Rank != 0:
		return fmt.Errorf("expert parallelism: rank %d of a group of processes needs the rendezvous address of rank 0", o.Rank)
	case o.Rendezvous != "" && (o.Rank < 0 || o.Rank >= o.Devices):
		return fmt.Errorf("expert parallelism: rank %d of %d processes: want 0 to %d", o.Rank, o.Devices, o.Devices-1)
	case o.RendezvousTimeout < 0:
		return fmt.Errorf("expert parallelism: a rendezvous timeout of %v", o.RendezvousTimeout)
	}
	return checkMACS(o)
}

// checkMACS checks MACS's semantic rerouting options.
func checkMACS(o Options) error {
	switch {
	case !(o.MACSEta >= 0 && o.MACSEta <= 1):
		return fmt.Errorf("MACS eta %v: want 0 to 1", o.MACSEta)
	case o.MACSCalibrationTokens < 0 || o.MACSCalibrationTokens > 1<<24:
		return fmt.Errorf("MACS calibration of %d tokens: want 0 (4096) to %d", o.MACSCalibrationTokens, 1<<24)
	case (o.MACSEta > 0 || o.MACSCalibration != "") && !strings.HasPrefix(strings.TrimSpace(o.Policy), "macs"):
		return fmt.Errorf("MACS eta and calibration apply to the macs planners, not %q", o.Policy)
	case o.MACSEta > 0 && o.MACSCalibration == "":
		return fmt.Errorf("MACS eta %v weighs the affinity to each expert's centroid: give a calibration text for the centroids", o.MACSEta)
	case o.MACSEta == 0 && o.MACSCalibration != "":
		return fmt.Errorf("a MACS calibration gives the centroids that rerouting weighs by eta: give eta above 0 too")
	}
	return nil
}

// Stats are an expert-parallel model's figures since it was opened.
type Stats struct {
	Policy  string
	Devices int
	// Transport names what moves the tokens ("in-process", "NCCL 2.23.4"), and why when
	// the default could not be had.
	Transport string
	// Steps are the forward passes run on all ranks at once; Seconds their time on the
	// devices' clocks (virtual on simulated GPUs, wall on the CPU), from the last rank ready
	// to start to the last one done.
	Steps   int
	Seconds float64
	Layers  []LayerStats
	// Replans counts placements an EPLB policy changed; MovedBytes the expert weights it
	// copied to their new devices.
	Replans    int
	MovedBytes int64
	// CalibrationTokens are the tokens MACS's expert centroids came from (0: rerouting by
	// gating score alone).
	CalibrationTokens int
}

// LayerStats are one MoE layer's figures summed over its passes (divide by Passes for the
// mean of a pass).
type LayerStats struct {
	Layer, Passes int
	// Tokens routed; Choices their top-k choices, Dropped those not computed, Extra the
	// experts computed beyond the top-k; Fetches the expert copies HarMoEny made.
	Tokens, Choices, Dropped, Extra, Fetches int64
	// Bytes are the hidden states and results moved between different ranks.
	Bytes int64
	// MaxLoad is the busiest device's computed tokens, Balancedness the mean over the max.
	MaxLoad, Balancedness float64
	// Straggler is the slowest rank's expert computation from the dispatch's end; Time the
	// layer on the slowest rank, from its router to its combine; both in seconds.
	Straggler, Time float64
}
