package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/nccl"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/sim"
)

// EPOptions run the model with expert parallelism (Options.EP): Devices ranks, each a device
// of Options.Device's kind holding a copy of the non-expert weights and its share of the
// experts. A forward pass runs on every rank at once, each on its own tokens; at every MoE
// layer the ranks exchange their tokens' routing, plan the same schedule with Policy,
// dispatch the tokens to the devices computing their experts and combine the results, all
// through a transport: NCCL between CUDA GPUs, in-process copies otherwise. A session's tokens
// live on rank 0; a perplexity evaluation spreads its windows over the ranks.
//
// On CUDA, rank r runs on cuda:(N+r) for Options.Device cuda:N, one GPU per rank.
type EPOptions struct {
	// Devices is the number of ranks: 2 to the model's experts.
	Devices int
	// Policy plans each MoE layer's batch: one of EPPolicies ("" = round-robin).
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
	// loads and in-process otherwise (EPStats.Transport says which, and why).
	Transport string
	// NCCLLibrary is the NCCL library to load; "" finds libnccl.so.2.
	NCCLLibrary string
	// Rendezvous, when set, runs one rank per process, on one machine or several: this
	// process is rank Rank of Devices, on Options.Device (a CUDA GPU; NCCL moves the tokens),
	// and the processes meet at Rendezvous, the host:port where rank 0 listens. Rank 0 runs
	// the passes (sessions, perplexity, with its own tokens); every other rank calls
	// Model.ServeEP, which serves its experts until rank 0 closes the model.
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

// EPPolicies lists the planners expert parallelism plans each MoE layer's batch with
// (EPOptions.Policy).
func EPPolicies() []string { return multigpu.PolicyNames() }

// epGroup is the ranks of an expert-parallel model and what they share. Each rank plans with
// its own policy and placement, as separate processes would: they agree because every rank
// plans the same batches in the same order.
type epGroup struct {
	policy string
	// ranks are every rank's model, by rank; in a group of processes only this process's
	// rank (local) is here, the others are nil.
	ranks  []*Model
	local  []int
	multi  bool
	tr     epTransport
	how    string // what the transport is, for EPStats
	comms  []multigpu.Comm
	clocks []func() float64
	pols   []multigpu.Policy
	place  [][]multigpu.Placement // [rank][MoE layer]
	start  multigpu.Placement     // every layer's first placement (round-robin)
	// moeIdx maps a block to its MoE layer's index (-1: dense); expertBytes is one expert's
	// weights per MoE layer; held the expert bytes each rank has allocated.
	moeIdx      []int
	expertBytes []int64
	held        []int64
	// needProbs: the policy chooses experts beyond the top-k by gating score; needEntropy:
	// it weighs tokens by their hidden state's entropy (MACS).
	needProbs, needEntropy bool
	// centroids are MACS's expert centroids by MoE layer (nil: no semantic rerouting), from
	// calibrated tokens of the calibration text, and their norms; each rank sends its
	// tokens' affinities.
	centroids     [][]float32
	centroidNorms [][]float64
	calibrated    int
	// pending is each rank's copies of experts newly placed on it (EPLB), which that layer's
	// next experts wait for; scratch the slot fetched and moved weights land in on a device
	// without memory of its own, fetch a GPU's slots for fetched experts.
	pending [][]device.Event
	scratch [][]byte
	fetch   []epFetch

	mu      sync.Mutex // one step at a time
	lastCmd int64      // rank 0's last command to a group of processes (under mu)

	smu   sync.Mutex
	pass  []epPass
	stats EPStats
}

// epTransport is a group's transport: its ranks' ends, and the way a failing rank releases
// the others and the group is readied again.
type epTransport interface {
	Comm(r int) multigpu.Comm
	Abort(err error)
	Reset() error
	Close() error
}

// localTransport is the in-process group as an epTransport.
type localTransport struct{ *multigpu.LocalGroup }

func (l localTransport) Reset() error { l.LocalGroup.Reset(); return nil }
func (l localTransport) Close() error { return nil }

// epPass gathers one MoE layer pass's figures from every rank.
type epPass struct {
	n              int
	compute, total float64
}

// EPStats are an expert-parallel model's figures since it was opened.
type EPStats struct {
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
	Layers  []EPLayerStats
	// Replans counts placements an EPLB policy changed; MovedBytes the expert weights it
	// copied to their new devices.
	Replans    int
	MovedBytes int64
	// CalibrationTokens are the tokens MACS's expert centroids came from (0: rerouting by
	// gating score alone).
	CalibrationTokens int
}

// EPLayerStats are one MoE layer's figures summed over its passes (divide by Passes for the
// mean of a pass).
type EPLayerStats struct {
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

// EPStats reports expert parallelism's figures; ok is false when the model runs on one
// device.
func (m *Model) EPStats() (EPStats, bool) {
	g := m.ep
	if g == nil {
		return EPStats{}, false
	}
	g.smu.Lock()
	defer g.smu.Unlock()
	st := g.stats
	st.Layers = slices.Clone(st.Layers)
	return st, true
}

// openEP makes the ranks of Options.EP: rank 0 is m on its device, the others copies of m on
// devices of the same kind. Each allocates the non-expert weights and its experts. The steps:
// check the options, lay out the group (its MoE layers, MACS's centroids), open the ranks,
// connect each to the transport and place its weights, and make each rank's planner.
func (m *Model) openEP(path string) error {
	o := *m.opts.EP
	if err := m.checkEP(o); err != nil {
		return err
	}
	if o.Gamma == 0 {
		o.Gamma = 1.5
	}
	policy := strings.TrimSpace(o.Policy)
	if policy == "" {
		policy = "round-robin"
	}
	g, err := m.newEPGroup(path, policy, o)
	if err != nil {
		return err
	}
	// From here on the group owns the other ranks' devices and the transport: closeEP
	// releases them if opening fails.
	m.ep = g
	N := o.Devices
	g.ranks = make([]*Model, N)
	if o.Rendezvous != "" {
		if err := g.openProcess(m, o); err != nil {
			return err
		}
	} else if err := g.openLocal(m, o); err != nil {
		return err
	}
	c := m.arch.Config
	env := multigpu.PolicyEnv{Experts: c.Experts, Devices: N, Gamma: o.Gamma, Metric: o.Metric, Seed: o.Seed, HarMoEnyQ: o.HarMoEnyThreshold, Eta: o.MACSEta}
	g.comms, g.clocks = make([]multigpu.Comm, N), make([]func() float64, N)
	g.place, g.pending, g.scratch = make([][]multigpu.Placement, N), make([][]device.Event, N), make([][]byte, N)
	g.fetch = make([]epFetch, N)
	g.held = make([]int64, N)
	wall := time.Now()
	for _, r := range g.local {
		if err := g.connect(r, o, wall, &env); err != nil {
			return err
		}
		if err := g.placeWeights(m, r); err != nil {
			return err
		}
	}
	return g.makePlanners(m, policy, env)
}

// checkEP checks the options of expert parallelism against the model and the other options.
func (m *Model) checkEP(o EPOptions) error {
	c := m.arch.Config
	switch {
	case c.Experts == 0:
		return fmt.Errorf("expert parallelism: the model is dense")
	case o.Devices < 2 || o.Devices > min(c.Experts, 1024):
		return fmt.Errorf("expert parallelism over %d devices: want 2 to the model's %d experts", o.Devices, min(c.Experts, 1024))
	case m.opts.Offload != nil:
		return fmt.Errorf("expert parallelism spreads the experts over devices; it does not offload them to host memory too")
	case m.opts.Commit != nil:
		return fmt.Errorf("expert parallelism with the Commit Router is not supported")
	case m.opts.Drop != nil:
		return fmt.Errorf("expert parallelism plans token drop with its policy (token-drop, expanded-drop, ...); do not ask for single-device token drop too")
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

// newEPGroup lays out the group of the model at path: its MoE layers and their experts'
// bytes, the experts' first placement (round-robin), and MACS's centroids from the
// calibration text where eta asks for them.
func (m *Model) newEPGroup(path, policy string, o EPOptions) (*epGroup, error) {
	c := m.arch.Config
	g := &epGroup{policy: policy, moeIdx: make([]int, c.Layers)}
	for i, l := range m.arch.Layers {
		g.moeIdx[i] = -1
		if l.MoE == nil {
			continue
		}
		g.moeIdx[i] = len(g.expertBytes)
		var b int64
		for _, t := range []*models.Tensor{l.MoE.GateExps, l.MoE.UpExps, l.MoE.DownExps} {
			b += int64(len(t.Expert(0).Data))
		}
		g.expertBytes = append(g.expertBytes, b)
	}
	var err error
	if g.start, err = multigpu.RoundRobin(c.Experts, o.Devices); err != nil {
		return nil, err
	}
	if o.MACSEta > 0 {
		mu, ran, err := macsCentroids(path, m.opts, o.MACSCalibration, cmp.Or(o.MACSCalibrationTokens, defaultMACSCalibrationTokens), g.moeIdx)
		if err != nil {
			return nil, err
		}
		g.centroids, g.calibrated = mu, ran
		for _, mj := range mu {
			g.centroidNorms = append(g.centroidNorms, multigpu.CentroidNorms(mj, c.Embd))
		}
	}
	return g, nil
}

// connect gives local rank r its end of the transport and its clock: on a device that models
// its link (a simulated GPU), a modelled end and the device's time, and on rank 0 the
// cluster the cost-model planners weigh (env.Cluster).
func (g *epGroup) connect(r int, o EPOptions, wall time.Time, env *multigpu.PolicyEnv) error {
	rm := g.ranks[r]
	rm.ep, rm.rank = g, r
	comm := g.tr.Comm(r)
	clock := func() float64 { return time.Since(wall).Seconds() }
	if lk, ok := rm.dev.(device.Linker); ok {
		link := multigpu.Link{Bandwidth: o.LinkBandwidth, Latency: o.LinkLatency}
		if sd, ok := rm.dev.(*sim.Device); ok {
			p := sd.Profile()
			if link.Bandwidth == 0 {
				link.Bandwidth = p.PCIeEffective
			}
			if link.Latency == 0 {
				link.Latency = p.CopyLatency
			}
			if r == 0 {
				env.Cluster = multigpu.Cluster{Devices: len(g.ranks), FLOPS: p.PeakFLOPS, MemBW: p.MemoryBandwidth, LinkBW: link.Bandwidth,
					LinkLatency: link.Latency, HostBW: p.PCIeEffective, Launch: 3 * p.LaunchOverhead}
			}
		}
		var err error
		if comm, err = multigpu.Modelled(comm, lk, link); err != nil {
			return fmt.Errorf("expert parallelism on %s: %w", rm.dev.Name(), err)
		}
		clock = lk.Ready
	}
	g.comms[r], g.clocks[r] = comm, clock
	return nil
}

// placeWeights gives local rank r its first placement of every MoE layer's experts, and
// allocates (and, beside the first local rank, which uploads with the model, uploads) the
// non-expert weights and its experts.
func (g *epGroup) placeWeights(m *Model, r int) error {
	rm := g.ranks[r]
	layers := len(g.expertBytes)
	place := make([]multigpu.Placement, layers)
	for j := range place {
		place[j] = g.start
	}
	g.place[r] = place
	g.pending[r] = make([]device.Event, layers)
	if err := rm.dev.Memory().Alloc(m.info.NonExpertBytes, "the non-expert weights"); err != nil {
		return fmt.Errorf("expert parallelism, rank %d on %s: %.2f GiB of non-expert weights do not fit: %w", r, rm.dev.Name(), float64(m.info.NonExpertBytes)/(1<<30), err)
	}
	if err := g.hold(r); err != nil {
		return err
	}
	if r != g.local[0] {
		// The first local rank uploads its weights with the model's own (Open).
		if err := rm.upload(); err != nil {
			return fmt.Errorf("expert parallelism, rank %d: %w", r, err)
		}
	}
	return nil
}

// makePlanners makes every rank's planner of policy, HarMoEny's cost model from the first
// MoE layer's experts, and the group's statistics.
func (g *epGroup) makePlanners(m *Model, policy string, env multigpu.PolicyEnv) error {
	c := m.arch.Config
	if policy == "harmoeny" && env.HarMoEnyQ == 0 && env.Cluster.Devices == 0 {
		env.HarMoEnyQ = defaultHarMoEnyQ
	}
	if env.Cluster.Devices > 0 {
		// HarMoEny's eq. 4 needs the bytes of one weight element: the first MoE layer's.
		var firstMoE *models.MoE
		for _, l := range m.arch.Layers {
			if l.MoE != nil {
				firstMoE = l.MoE
				break
			}
		}
		params := 3 * float64(firstMoE.GateExps.Expert(0).Rows) * float64(firstMoE.GateExps.Expert(0).Cols)
		env.Cost = multigpu.ExpertCost{WeightBytes: float64(g.expertBytes[0]), FLOPsPerToken: 2 * params,
			TokenBytes: 4 * float64(c.Embd), ElementBytes: float64(g.expertBytes[0]) / params}
	}
	for range len(g.ranks) {
		pol, err := multigpu.NewPolicy(policy, env)
		if err != nil {
			return err
		}
		g.pols = append(g.pols, pol)
	}
	layers := len(g.expertBytes)
	g.needProbs = strings.HasPrefix(policy, "expanded") || strings.HasPrefix(policy, "macs")
	g.needEntropy = strings.HasPrefix(policy, "macs")
	g.pass = make([]epPass, layers)
	g.stats = EPStats{Policy: policy, Devices: len(g.ranks), Transport: g.how, Layers: make([]EPLayerStats, layers), CalibrationTokens: g.calibrated}
	for i, j := range g.moeIdx {
		if j >= 0 {
			g.stats.Layers[j].Layer = i
		}
	}
	return nil
}

// openLocal makes every rank in this process: rank 0 is m on its device, the others copies
// of m on devices of the same kind; on CUDA, one GPU per rank from m's.
func (g *epGroup) openLocal(m *Model, o EPOptions) error {
	N := o.Devices
	g.ranks[0] = m
	g.local = []int{0}
	for r := 1; r < N; r++ {
		opts := m.opts
		if gpu, ok := m.dev.(*cuda.GPU); ok {
			opts.Device = fmt.Sprintf("cuda:%d", gpu.Info().Ordinal+r)
		}
		dev, _, err := newDevice(opts)
		if err != nil {
			if gpu, ok := m.dev.(*cuda.GPU); ok {
				o := gpu.Info().Ordinal
				err = fmt.Errorf("one GPU per rank, cuda:%d to cuda:%d: %w", o, o+N-1, err)
			}
			return fmt.Errorf("expert parallelism over %d devices, rank %d: %w", N, r, err)
		}
		g.ranks[r] = m.rankModel(dev)
		g.local = append(g.local, r)
	}
	tr, how, err := newEPTransport(o, g.ranks)
	if err != nil {
		return fmt.Errorf("expert parallelism over %d devices: %w", N, err)
	}
	g.tr, g.how = tr, how
	return nil
}

// openProcess makes this process's rank of a group of processes: m on its GPU, with NCCL
// communicators made from the id the rendezvous hands out.
func (g *epGroup) openProcess(m *Model, o EPOptions) error {
	N, r := o.Devices, o.Rank
	gpu, ok := m.dev.(*cuda.GPU)
	if !ok {
		return fmt.Errorf("expert parallelism over processes runs on CUDA GPUs, with NCCL; %s is not one", m.dev.Name())
	}
	if t := strings.TrimSpace(o.Transport); t != "" && t != "auto" && t != "nccl" {
		return fmt.Errorf("expert parallelism over processes: transport %q: the processes exchange tokens with NCCL", o.Transport)
	}
	g.multi = true
	g.ranks[r] = m
	g.local = []int{r}
	lib, err := nccl.Load(o.NCCLLibrary)
	if err != nil {
		return fmt.Errorf("expert parallelism over processes: %w", err)
	}
	// Processes that disagree on what they run would exchange garbage: the rendezvous
	// refuses them.
	fp := fmt.Sprintf("%s %d bytes, %d experts, planner %s, capacity %g, metric %v, seed %d, q %d, eta %g",
		m.info.Name, m.info.NonExpertBytes+m.info.ExpertBytes, m.arch.Config.Experts, g.policy, o.Gamma, o.Metric, o.Seed, o.HarMoEnyThreshold, o.MACSEta)
	rv := multigpu.Rendezvous{Addr: o.Rendezvous, Ranks: N, Rank: r, Fingerprint: fp, Timeout: o.RendezvousTimeout}
	id, err := rv.Run(context.Background(), lib.NewUniqueID)
	if err != nil {
		return fmt.Errorf("expert parallelism over processes: %w", err)
	}
	tr, err := multigpu.NewNCCLRank(lib, gpu, id, N, r)
	if err != nil {
		return fmt.Errorf("expert parallelism over processes: %w", err)
	}
	g.tr, g.how = tr, fmt.Sprintf("NCCL %s, %d processes", lib.VersionString(), N)
	return nil
}

// newEPTransport makes what moves the tokens between the ranks, and says what it is.
func newEPTransport(o EPOptions, ranks []*Model) (epTransport, string, error) {
	var gpus []*cuda.GPU
	for _, rm := range ranks {
		if g, ok := rm.dev.(*cuda.GPU); ok {
			gpus = append(gpus, g)
		}
	}
	local := func() (epTransport, error) {
		l, err := multigpu.NewLocal(len(ranks))
		return localTransport{l}, err
	}
	switch strings.TrimSpace(o.Transport) {
	case "", "auto":
		if len(gpus) < len(ranks) {
			tr, err := local()
			return tr, "in-process", err
		}
		tr, name, nerr := newNCCL(o.NCCLLibrary, gpus)
		if nerr == nil {
			return tr, name, nil
		}
		l, err := local()
		return l, fmt.Sprintf("in-process, through host memory (%v)", nerr), err
	case "local":
		tr, err := local()
		return tr, "in-process", err
	case "nccl":
		if len(gpus) < len(ranks) {
			return nil, "", fmt.Errorf("the nccl transport moves tokens between CUDA GPUs; the ranks are on %s", ranks[0].dev.Name())
		}
		return newNCCL(o.NCCLLibrary, gpus)
	default:
		return nil, "", fmt.Errorf("transport %q: want nccl, local or auto", o.Transport)
	}
}

// newNCCL loads NCCL and makes a group of the GPUs.
func newNCCL(lib string, gpus []*cuda.GPU) (epTransport, string, error) {
	l, err := nccl.Load(lib)
	if err != nil {
		return nil, "", err
	}
	g, err := multigpu.NewNCCL(l, gpus)
	if err != nil {
		return nil, "", err
	}
	return g, "NCCL " + l.VersionString(), nil
}

// closeEP releases what the group holds beyond rank 0's device: the transport and the other
// ranks' devices.
func (m *Model) closeEP() error {
	g := m.ep
	if g == nil || len(g.local) == 0 || m.rank != g.local[0] {
		return nil
	}
	var errs []error
	if g.multi && g.tr != nil && m.rank == 0 {
		// Release the other processes from ServeEP; a group that failed has released them.
		errs = append(errs, g.control(epStop))
	}
	if g.tr != nil {
		errs = append(errs, g.tr.Close())
		g.tr = nil
	}
	for _, r := range g.local {
		if rm := g.ranks[r]; rm != m {
			errs = append(errs, closeDevice(rm.dev))
		}
	}
	g.local = []int{m.rank}
	return errors.Join(errs...)
}

// The commands rank 0 of a group of processes sends the others before each pass.
const (
	epStop = iota
	epStep
)

// control sends rank 0's command to every process of the group (the others send nothing of
// use) and returns it.
func (g *epGroup) control(cmd int64) error {
	r := g.local[0]
	if r != 0 {
		cmd = 0
	}
	all, err := multigpu.AllGatherInt(g.comms[r], cmd)
	if err != nil {
		g.tr.Abort(err)
		return fmt.Errorf("expert parallelism over processes: %w", err)
	}
	if all[0] != cmd && r == 0 {
		return fmt.Errorf("expert parallelism over processes: rank 0 sent %d and received %d", cmd, all[0])
	}
	g.lastCmd = all[0]
	return nil
}

// ErrNotServing is ServeEP's error on a model that is not a serving rank of a group of
// processes.
var ErrNotServing = errors.New("engine: not a serving rank of expert parallelism over processes")

// ServeEP runs this process's rank of a group of processes (EPOptions.Rendezvous with a rank
// above 0): it takes part in every pass rank 0 runs, computing the experts it holds for the
// tokens it is sent, and returns nil when rank 0 closes its model. ctx is looked at between
// passes only: a pass under way waits for the others. An error of any rank ends the group.
func (m *Model) ServeEP(ctx context.Context) error {
	g := m.ep
	if g == nil || !g.multi || m.rank == 0 {
		return ErrNotServing
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := g.serveStep(m); err != nil {
			return err
		}
		if g.lastCmd == epStop {
			return nil
		}
	}
}

// serveStep waits for rank 0's command and carries it out.
func (g *epGroup) serveStep(m *Model) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.control(0); err != nil {
		return err
	}
	switch g.lastCmd {
	case epStop:
		return nil
	case epStep:
		start := g.clocks[m.rank]()
		if err := m.serve(); err != nil {
			g.tr.Abort(err)
			return err
		}
		g.smu.Lock()
		g.stats.Steps++
		g.stats.Seconds += g.clocks[m.rank]() - start
		g.smu.Unlock()
		return nil
	}
	return fmt.Errorf("expert parallelism over processes: rank 0 sent command %d", g.lastCmd)
}

// rankModel is m on another device: the same file, weights and tokenizer.
func (m *Model) rankModel(dev device.Device) *Model {
	r := &Model{opts: m.opts, file: m.file, arch: m.arch, tok: m.tok, dev: dev, info: m.info, nctx: m.nctx, kvF16: m.kvF16, ops: models.HostOps{K: dev}}
	r.charger, _ = dev.(device.Charger)
	r.labeler, _ = dev.(device.Labeler)
	r.place = residentPlacement{m: r}
	r.block = epBlock{r}
	return r
}

// hold allocates on rank r the experts its placements give it, in place of what it held.
func (g *epGroup) hold(r int) error {
	var b int64
	for j, p := range g.place[r] {
		b += int64(len(p.Local(r))) * g.expertBytes[j]
	}
	mem := g.ranks[r].dev.Memory()
	mem.Free(g.held[r])
	g.held[r] = 0
	if err := mem.Alloc(b, "its experts"); err != nil {
		return fmt.Errorf("expert parallelism, rank %d on %s: %.2f GiB of experts do not fit: %w", r, g.ranks[r].dev.Name(), float64(b)/(1<<30), err)
	}
	g.held[r] = b
	return nil
}

// step runs one forward pass on every rank at once: work[r] is rank r's, or nil for a rank
// with no tokens, which still serves its experts to the others.
func (g *epGroup) step(work []*epWork) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	N := len(g.ranks)
	var start float64
	for _, r := range g.local {
		start = max(start, g.clocks[r]())
	}
	if g.multi {
		if g.local[0] != 0 {
			return fmt.Errorf("rank %d of a group of processes serves its experts (ServeEP); the passes run on rank 0", g.local[0])
		}
		// The other processes wait in ServeEP for rank 0 to say that a pass begins.
		if err := g.control(epStep); err != nil {
			return err
		}
	}
	errs := make([]error, N)
	var wg sync.WaitGroup
	for _, r := range g.local {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := g.ranks[r]
			var err error
			if w := work[r]; w != nil && len(w.tokens) > 0 {
				w.logits, err = m.forward(w.kv, w.tokens, w.pos0, w.want, w.obs, nil)
			} else {
				err = m.serve()
			}
			if err != nil {
				errs[r] = err
				g.tr.Abort(err)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			// Every rank fails with the error of the one that aborted the group.
			if rerr := g.tr.Reset(); rerr != nil {
				return fmt.Errorf("%w; and the transport could not be made again: %v", err, rerr)
			}
			return err
		}
	}
	var end float64
	for _, r := range g.local {
		end = max(end, g.clocks[r]())
	}
	g.smu.Lock()
	g.stats.Steps++
	g.stats.Seconds += end - start
	g.smu.Unlock()
	return nil
}

// epWork is one rank's share of a step.
type epWork struct {
	kv     *models.KVCache
	tokens []int32
	pos0   int
	want   logitRows
	obs    RouteObserver
	logits []float32
}

// serve is a pass of a rank with no tokens: it takes part in every MoE layer's exchanges and
// computes the experts it is sent.
func (m *Model) serve() error {
	for i, l := range m.arch.Layers {
		if l.MoE != nil {
			if err := m.epMoE(i, l.MoE, nil, 0, nil, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// epBlock runs passes as rank 0's tokens in a step of every rank, and their MoE layers
// spread over the ranks (epMoE).
type epBlock struct{ m *Model }

func (e epBlock) pass(kv *models.KVCache, tokens []int32, pos0 int, want logitRows, obs RouteObserver, _ *commitState) ([]float32, error) {
	work := make([]*epWork, len(e.m.ep.ranks))
	work[0] = &epWork{kv: kv, tokens: tokens, pos0: pos0, want: want, obs: obs}
	if err := e.m.ep.step(work); err != nil {
		return nil, err
	}
	return work[0].logits, nil
}

func (e epBlock) moe(_ models.Backend, layer int, moe *models.MoE, x []float32, T, _ int, out []float32, ev *RouteEvent, _ *commitState) error {
	return e.m.epMoE(layer, moe, x, T, out, ev)
}

// f32bytes is v's memory as bytes, for the transport.
func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}

// epMoE is a MoE block under expert parallelism on this rank's T tokens (T may be 0). The
// steps are HarMoEny's and DeepSpeed's: route locally, exchange the routing (metadata) with
// every rank, plan the layer's schedule, dispatch the hidden states to the ranks computing
// their experts, compute, send the results back and combine them in each token's top-k order,
// exactly as the single-device block does.
func (m *Model) epMoE(layer int, moe *models.MoE, x []float32, T int, out []float32, ev *RouteEvent) error {
	g, r := m.ep, m.rank
	st := &epLayer{m: m, g: g, r: r, j: g.moeIdx[layer], layer: layer, moe: moe, x: x, T: T,
		N: len(g.ranks), E: moe.Experts, K: moe.Used, d: m.arch.Config.Embd, comm: g.comms[r], hb: m.hostBackend()}
	t0 := g.clocks[r]()
	// Timing-only runs do not take expert parallelism (checkTimingOnly): the routing is the
	// router's.
	logits, routes, err := m.routeTokens(st.hb, layer, moe, x, T, 0)
	if err != nil {
		return err
	}
	st.routes = routes
	ev.fill(moe, x[:T*st.d], logits, routes)
	if err := st.exchangeRouting(logits); err != nil {
		return err
	}
	if err := st.plan(); err != nil {
		return err
	}
	if err := st.dispatch(); err != nil {
		return err
	}
	tD := g.clocks[r]()
	results, err := st.compute()
	if err != nil {
		return err
	}
	tC := g.clocks[r]()
	if err := st.combine(results, out); err != nil {
		return err
	}
	m.sharedExpert(st.hb, layer, moe, x, T, out)
	g.record(st.j, r, tC-tD, g.clocks[r]()-t0, st.moved, st.s, st.b)
	return g.replace(r, st.j, moe)
}

// epLayer is one MoE layer's step of expert parallelism on rank r: what its stages (epMoE)
// hand each other.
type epLayer struct {
	m             *Model
	g             *epGroup
	r, j, layer   int // rank, MoE layer, block
	moe           *models.MoE
	x             []float32 // this rank's T tokens' inputs
	T, N, E, K, d int
	comm          multigpu.Comm
	hb            models.Backend
	routes        []routing
	width         int      // floats of a token's metadata row
	all           [][]byte // every rank's metadata
	base          []int    // rank q's tokens are the batch's base[q]..base[q+1]
	b             multigpu.Batch
	s             multigpu.Schedule
	sendIdx       [][]int // the assignments this rank sends to each rank, and receives
	recvIdx       [][]int
	send, recv    [][]byte
	rows          [][]float32 // the hidden states received from each rank
	moved         int64
}

// exchangeRouting is the metadata exchange: the host reads its tokens' routing and sends it
// (with what the policy weighs: the gating scores, the hidden state's entropy, the experts'
// affinities) to every rank.
func (st *epLayer) exchangeRouting(logits []float32) error {
	m, g, d, E, K := st.m, st.g, st.d, st.E, st.K
	m.dev.Sync(m.dev.Compute().Record())
	st.width = 2 * K
	if g.needProbs {
		st.width += E
	}
	if g.needEntropy {
		st.width++
	}
	if g.centroids != nil {
		st.width += E
	}
	meta := make([]float32, st.T*st.width)
	var scratch []float64 // for the entropies
	if g.needEntropy {
		scratch = make([]float64, d)
	}
	for t, rt := range st.routes {
		row := meta[t*st.width : (t+1)*st.width]
		for k, e := range rt.experts {
			row[k], row[K+k] = float32(e), rt.weights[k]
		}
		rest := row[2*K:]
		if g.needProbs {
			extraWeights(st.moe, logits[t*E:(t+1)*E], rt, rest[:E])
			rest = rest[E:]
		}
		if g.needEntropy {
			// MACS's information measure: the Shannon entropy of softmax(hidden state),
			// ln(d) less its KL divergence from uniform.
			rest[0] = float32(max(0, math.Log(float64(d))-klFromUniform(st.x[t*d:(t+1)*d], scratch)))
			rest = rest[1:]
		}
		if g.centroids != nil {
			multigpu.Affinities(st.x[t*d:(t+1)*d], g.centroids[st.j], g.centroidNorms[st.j], rest[:E])
		}
	}
	m.label("link", "metadata", st.layer, -1)
	counts, err := multigpu.AllGatherInt(st.comm, int64(st.T))
	if err != nil {
		return fmt.Errorf("layer %d: metadata exchange: %w", st.layer, err)
	}
	sizes := make([]int, st.N)
	st.base = make([]int, st.N+1)
	for i, n := range counts {
		if n < 0 || n > 1<<24 {
			return fmt.Errorf("layer %d: rank %d reports %d tokens", st.layer, i, n)
		}
		sizes[i] = int(n) * st.width * 4
		st.base[i+1] = st.base[i] + int(n)
	}
	if st.all, err = multigpu.AllGather(st.comm, f32bytes(meta), sizes); err != nil {
		return fmt.Errorf("layer %d: metadata exchange: %w", st.layer, err)
	}
	return nil
}

// plan is the layer's schedule, which every rank plans alike from the metadata it received.
func (st *epLayer) plan() error {
	m, g := st.m, st.g
	m.dev.Sync(m.dev.Compute().Record())
	st.b = g.batch(st.all, st.base, st.width, st.E, st.K, st.j)
	place := g.place[st.r][st.j]
	var err error
	if st.s, err = g.pols[st.r].Plan(st.b, place); err != nil {
		return fmt.Errorf("layer %d: %s: %w", st.layer, g.policy, err)
	}
	if err := st.s.Check(st.b, place); err != nil {
		return fmt.Errorf("layer %d: %s: %w", st.layer, g.policy, err)
	}
	return nil
}

// dispatch sends the hidden state of every assignment from this rank, in schedule order, so
// that every rank knows what it receives without being told.
func (st *epLayer) dispatch() error {
	N, r, d := st.N, st.r, st.d
	st.sendIdx, st.recvIdx = make([][]int, N), make([][]int, N)
	for i, a := range st.s.Assign {
		if a.From == r {
			st.sendIdx[a.To] = append(st.sendIdx[a.To], i)
		}
		if a.To == r {
			st.recvIdx[a.From] = append(st.recvIdx[a.From], i)
		}
	}
	st.send, st.recv = make([][]byte, N), make([][]byte, N)
	st.rows = make([][]float32, N)
	for q := range N {
		buf := make([]float32, len(st.sendIdx[q])*d)
		for k, i := range st.sendIdx[q] {
			t := st.s.Assign[i].Token - st.base[r]
			copy(buf[k*d:(k+1)*d], st.x[t*d:(t+1)*d])
		}
		st.send[q] = f32bytes(buf)
		st.rows[q] = make([]float32, len(st.recvIdx[q])*d)
		st.recv[q] = f32bytes(st.rows[q])
		if q != r {
			st.moved += int64(len(st.send[q]) + len(st.recv[q]))
		}
	}
	st.m.label("link", "dispatch", st.layer, -1)
	if err := st.comm.AllToAll(st.send, st.recv); err != nil {
		return fmt.Errorf("layer %d: dispatch: %w", st.layer, err)
	}
	return nil
}

// compute runs the experts assigned to this rank on the hidden states it received, and
// returns their outputs by sender. HarMoEny's fetches are asynchronous copies from the host
// into a slot, so the fetched experts compute last, once their copy has landed, while the
// others compute.
func (st *epLayer) compute() ([][]float32, error) {
	m, g, r, j, d, E := st.m, st.g, st.r, st.j, st.d, st.E
	fetched := map[int]*models.FFN{}
	var fetchEv device.Event
	for _, f := range st.s.Fetches {
		if f.To != r || fetched[f.Expert] != nil {
			continue
		}
		m.label("copy", "fetch", st.layer, f.Expert)
		ffn, err := g.fetchExpert(r, st.moe, f.Expert, len(fetched))
		if err != nil {
			return nil, fmt.Errorf("layer %d: fetching expert %d: %w", st.layer, f.Expert, err)
		}
		fetched[f.Expert] = ffn
		fetchEv = m.dev.Copy().Record()
	}
	if ev := g.pending[r][j]; ev != nil {
		m.dev.Compute().Wait(ev)
		g.pending[r][j] = nil
	}
	type slot struct{ src, k int }
	byExpert := make([][]slot, E)
	for q := range st.N {
		for k, i := range st.recvIdx[q] {
			e := st.s.Assign[i].Expert
			byExpert[e] = append(byExpert[e], slot{q, k})
		}
	}
	order := make([]int, 0, E)
	for e := range E {
		if len(byExpert[e]) > 0 && fetched[e] == nil {
			order = append(order, e)
		}
	}
	for e := range E {
		if len(byExpert[e]) > 0 && fetched[e] != nil {
			order = append(order, e)
		}
	}
	results := make([][]float32, st.N)
	for q := range st.N {
		results[q] = make([]float32, len(st.recvIdx[q])*d)
	}
	waited := false
	for _, e := range order {
		sl := byExpert[e]
		n := len(sl)
		xe, ye := make([]float32, n*d), make([]float32, n*d)
		for i, p := range sl {
			copy(xe[i*d:(i+1)*d], st.rows[p.src][p.k*d:(p.k+1)*d])
		}
		ffn := fetched[e]
		if ffn != nil && !waited {
			m.dev.Compute().Wait(fetchEv)
			waited = true
		}
		if ffn == nil {
			ffn = &models.FFN{Gate: st.moe.GateExps.Expert(e), Up: st.moe.UpExps.Expert(e), Down: st.moe.DownExps.Expert(e)}
		}
		m.label("expert", "", st.layer, e)
		m.swiglu(st.hb, m.dev.MatMulID, m.charger, ffn, xe, n, ye)
		for i, p := range sl {
			copy(results[p.src][p.k*d:(p.k+1)*d], ye[i*d:(i+1)*d])
		}
	}
	if len(fetched) > 0 {
		// A fetched expert visits for this pass; its slot is free again once the compute
		// stream is done with it.
		g.fetch[r].free = m.dev.Compute().Record()
	}
	return results, nil
}

// combine sends the results back to the ranks of their tokens, in the order they came, and
// sums each token's into out in its top-k order: its top-k, then the experts added beyond them
// in schedule order, as the single-device block lays them out. A dropped choice keeps a zero
// output and weighs nothing.
func (st *epLayer) combine(results [][]float32, out []float32) error {
	N, r, d, K, T := st.N, st.r, st.d, st.K, st.T
	back := make([][]float32, N)
	for q := range N {
		st.send[q] = f32bytes(results[q])
		back[q] = make([]float32, len(st.sendIdx[q])*d)
		st.recv[q] = f32bytes(back[q])
	}
	st.m.label("link", "combine", st.layer, -1)
	if err := st.comm.AllToAll(st.send, st.recv); err != nil {
		return fmt.Errorf("layer %d: combine: %w", st.layer, err)
	}
	routes := st.routes
	kept := make([][]bool, T)
	for t := range kept {
		kept[t] = make([]bool, K)
	}
	extra := map[int]int{} // assignment -> slot index within its token
	for i, a := range st.s.Assign {
		if a.From != r {
			continue
		}
		t := a.Token - st.base[r]
		if a.Choice >= 0 {
			kept[t][a.Choice] = true
			continue
		}
		rt := &routes[t]
		rt.experts = append(slices.Clip(rt.experts), a.Expert)
		rt.weights = append(slices.Clip(rt.weights), a.Score)
		extra[i] = len(rt.experts) - 1
	}
	off := make([]int, T+1)
	for t := range routes {
		for k := range K {
			if !kept[t][k] {
				routes[t].weights[k] = 0
			}
		}
		off[t+1] = off[t] + len(routes[t].experts)
	}
	ys := make([]float32, off[T]*d)
	for q := range N {
		for k, i := range st.sendIdx[q] {
			a := st.s.Assign[i]
			t := a.Token - st.base[r]
			sl := off[t] + a.Choice
			if a.Choice < 0 {
				sl = off[t] + extra[i]
			}
			copy(ys[sl*d:(sl+1)*d], back[q][k*d:(k+1)*d])
		}
	}
	st.m.combine(st.hb, st.layer, routes, ys, off, out)
	return nil
}

// batch is the layer's batch as every rank sees it after the metadata exchange: rank q's
// tokens are tokens base[q].. of it, living on rank q.
func (g *epGroup) batch(all [][]byte, base []int, width, E, K, layer int) multigpu.Batch {
	T := base[len(base)-1]
	b := multigpu.Batch{Routing: multigpu.Routing{Experts: E, K: K}, Layer: layer, Home: make([]int, T)}
	b.Choice, b.Score = make([]int, 0, T*K), make([]float32, 0, T*K)
	if g.needProbs {
		b.Probs = make([]float32, 0, T*E)
	}
	if g.needEntropy {
		b.Entropy = make([]float32, 0, T)
	}
	if g.centroids != nil {
		b.Affinity = make([]float32, 0, T*E)
	}
	for q, raw := range all {
		meta := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(raw))), len(raw)/4)
		for t := range base[q+1] - base[q] {
			row := meta[t*width : (t+1)*width]
			b.Home[base[q]+t] = q
			for k := range K {
				b.Choice = append(b.Choice, int(row[k]))
			}
			b.Score = append(b.Score, row[K:2*K]...)
			rest := row[2*K:]
			if g.needProbs {
				b.Probs = append(b.Probs, rest[:E]...)
				rest = rest[E:]
			}
			if g.needEntropy {
				b.Entropy = append(b.Entropy, rest[0])
				rest = rest[1:]
			}
			if g.centroids != nil {
				b.Affinity = append(b.Affinity, rest[:E]...)
			}
		}
	}
	return b
}

// copyExpert copies expert e's weights from the host to rank r: the traffic of a fetch or a
// move. A GPU uploads them, so that its kernels read them; other devices copy them into a
// spare slot on their copy stream, and compute from the same weights in host memory.
func (g *epGroup) copyExpert(r int, moe *models.MoE, e int) error {
	dev := g.ranks[r].dev
	if _, ok := dev.(device.Resident); ok {
		return g.uploadExpert(r, moe, e)
	}
	for _, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
		src := t.Expert(e).Data
		if cap(g.scratch[r]) < len(src) {
			g.scratch[r] = make([]byte, len(src))
		}
		dev.CopyIn(g.scratch[r][:len(src)], src)
	}
	return nil
}

// epFetch is a rank's slots for fetched experts on a device with memory of its own: each
// three device buffers (gate, up, down) as large as any layer's, charged to the budget when
// first needed and reused layer after layer, so that a fetch is an asynchronous copy on the
// copy stream and allocates nothing.
type epFetch struct {
	slots [][3][]byte
	size  [3]int // bytes of each slot's buffers
	// free is the compute stream done with the slots' last experts (nil: nothing to wait for).
	free device.Event
}

// fetchExpert copies expert e's weights from the host into rank r's fetch slot i, on the copy
// stream, and returns the expert as the rank computes it: from the slot on a device with
// memory of its own, from host memory on the others, where the copy is the traffic.
func (g *epGroup) fetchExpert(r int, moe *models.MoE, e, i int) (*models.FFN, error) {
	dev := g.ranks[r].dev
	ts := [3]*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps}
	res, ok := dev.(device.Resident)
	if !ok {
		if err := g.copyExpert(r, moe, e); err != nil {
			return nil, err
		}
		return &models.FFN{Gate: moe.GateExps.Expert(e), Up: moe.UpExps.Expert(e), Down: moe.DownExps.Expert(e)}, nil
	}
	f := &g.fetch[r]
	if f.size == [3]int{} {
		for _, l := range g.ranks[r].arch.Layers {
			if l.MoE != nil {
				for k, t := range [3]*models.Tensor{l.MoE.GateExps, l.MoE.UpExps, l.MoE.DownExps} {
					f.size[k] = max(f.size[k], len(t.Expert(0).Data))
				}
			}
		}
	}
	for len(f.slots) <= i {
		n := int64(f.size[0] + f.size[1] + f.size[2])
		if err := dev.Memory().Alloc(n, "a slot for fetched experts"); err != nil {
			return nil, fmt.Errorf("rank %d on %s: %w", r, dev.Name(), err)
		}
		var slot [3][]byte
		for k, t := range ts {
			b, err := res.Buffer(int64(f.size[k]), fmt.Sprintf("a slot for fetched %s experts", t.Name))
			if err != nil {
				for _, b := range slot[:k] {
					res.Release(b)
				}
				dev.Memory().Free(n)
				return nil, fmt.Errorf("rank %d: %w", r, err)
			}
			slot[k] = b
		}
		f.slots = append(f.slots, slot)
	}
	if f.free != nil {
		// The slots' last experts may still be computing.
		dev.Copy().Wait(f.free)
		f.free = nil
	}
	var ms [3]quant.Matrix
	for k, t := range ts {
		ms[k] = t.Expert(e)
		src := ms[k].Data
		dev.CopyIn(f.slots[i][k][:len(src)], src)
		ms[k].Data = f.slots[i][k][:len(src)]
	}
	return &models.FFN{Gate: ms[0], Up: ms[1], Down: ms[2]}, nil
}

// uploadExpert puts expert e's weights on rank r's device, if it has memory of its own.
func (g *epGroup) uploadExpert(r int, moe *models.MoE, e int) error {
	res, ok := g.ranks[r].dev.(device.Resident)
	if !ok {
		return nil
	}
	for _, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
		if err := res.Upload(t.Expert(e).Data, fmt.Sprintf("%s, expert %d", t.Name, e)); err != nil {
			return err
		}
	}
	return nil
}

// releaseExpert frees rank r's device copy of expert e, once its work is done.
func (g *epGroup) releaseExpert(r int, moe *models.MoE, e int) {
	if res, ok := g.ranks[r].dev.(device.Resident); ok {
		for _, t := range []*models.Tensor{moe.GateExps, moe.UpExps, moe.DownExps} {
			res.Release(t.Expert(e).Data)
		}
	}
}

// record adds rank r's figures of a pass of MoE layer j; the schedule's are counted once.
func (g *epGroup) record(j, r int, compute, total float64, moved int64, s multigpu.Schedule, b multigpu.Batch) {
	g.smu.Lock()
	defer g.smu.Unlock()
	L := &g.stats.Layers[j]
	// moved is what this rank sent and received in the dispatch: summed over the ranks that
	// counts every dispatched byte twice, once for the dispatch and once for the combine,
	// which moves the same rows back.
	L.Bytes += moved
	if r == g.local[0] {
		load := s.DeviceLoad()
		L.Tokens += int64(s.Tokens)
		L.Choices += int64(len(b.Choice))
		L.Dropped += int64(s.Dropped)
		L.Extra += int64(s.Rerouted)
		L.Fetches += int64(len(s.Fetches))
		L.MaxLoad += multigpu.Straggler(load)
		L.Balancedness += multigpu.Balancedness(load)
	}
	p := &g.pass[j]
	p.n++
	p.compute, p.total = max(p.compute, compute), max(p.total, total)
	if p.n == len(g.local) {
		L.Passes++
		L.Straggler += p.compute
		L.Time += p.total
		*p = epPass{}
	}
}

// replace lets an EPLB policy move experts after a pass: rank r allocates its new experts
// and copies those it did not hold; the layer's next experts wait for the copies.
func (g *epGroup) replace(r, j int, moe *models.MoE) error {
	rp, ok := g.pols[r].(multigpu.Replacer)
	if !ok {
		return nil
	}
	cur := g.place[r][j]
	np, changed := rp.Replace(j, cur)
	if !changed {
		return nil
	}
	if err := np.Check(len(cur.Holders)); err != nil {
		return fmt.Errorf("%s: new placement of MoE layer %d: %w", g.policy, j, err)
	}
	g.place[r][j] = np
	if err := g.hold(r); err != nil {
		g.place[r][j] = cur
		if err2 := g.hold(r); err2 != nil {
			return fmt.Errorf("%w; and the old placement no longer fits: %v", err, err2)
		}
		return err
	}
	dev := g.ranks[r].dev
	var moved int64
	for e := range np.Holders {
		switch {
		case np.Holds(r, e) && !cur.Holds(r, e):
			g.ranks[r].label("copy", "move", g.stats.Layers[j].Layer, e)
			if err := g.copyExpert(r, moe, e); err != nil {
				return fmt.Errorf("%s: moving expert %d of MoE layer %d to rank %d: %w", g.policy, e, j, r, err)
			}
			moved += g.expertBytes[j]
		case !np.Holds(r, e) && cur.Holds(r, e):
			g.releaseExpert(r, moe, e)
		}
	}
	if moved > 0 {
		g.pending[r][j] = dev.Copy().Record()
	}
	g.smu.Lock()
	g.stats.MovedBytes += moved
	if r == g.local[0] {
		g.stats.Replans++
	}
	g.smu.Unlock()
	return nil
}
