package engine

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/nccl"
	"github.com/commit-run/commit-run/sim"
)

// Opening a model spread over ranks: check the options, open each rank's device and copy of
// the non-expert weights, place its share of the experts, make the planners and connect the
// transport, in one process or one process per rank.

// openEP makes the ranks of Options.EP: rank 0 is m on its device, the others copies of m on
// devices of the same kind. Each allocates the non-expert weights and its experts. The steps:
// check the options, lay out the group (its MoE layers, MACS's centroids), open the ranks,
// connect each to the transport and place its weights, and make each rank's planner.
func (m *Model) openEP(path string) error {
	o := *m.opts.EP
	if err := m.checkEP(o); err != nil {
		return err
	}
	if err := m.checkHostOnly(); err != nil {
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
