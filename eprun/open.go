package eprun

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/nccl"
	"github.com/commit-run/commit-run/sim"
)

// Opening a model spread over ranks: lay out the group, open each rank's device and copy of
// the non-expert weights, connect the transport, place each rank's share of the experts and
// make the planners, in one process or one process per rank.

// NewGroup lays out the group of ranks of o (checked by Check) for model m: its MoE layers and
// their experts' bytes, the experts' first placement (round-robin), and MACS's centroids
// (Centroids, over m.Calibrate) where eta asks for them. It holds nothing yet: Open opens the ranks.
func NewGroup(o Options, m Model) (*Group, error) {
	if o.Gamma == 0 {
		o.Gamma = 1.5
	}
	policy := strings.TrimSpace(o.Policy)
	if policy == "" {
		policy = "round-robin"
	}
	c := m.Arch.Config
	g := &Group{opts: o, model: m, arch: m.Arch, policy: policy, moeIdx: make([]int, c.Layers)}
	for i, l := range m.Arch.Layers {
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
		mu, ran, err := Centroids(m, o.MACSCalibration, cmp.Or(o.MACSCalibrationTokens, defaultCalibrationTokens), g.moeIdx)
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

// Open makes the ranks: self is the caller's rank on its device (rank 0, or Options.Rank of a
// group of processes), and newRank(r) opens a copy of the model as rank r on another device of
// the same kind. Each rank allocates the non-expert weights and its experts, and uploads them,
// but self, which uploads with the model. From here on the group owns the other ranks' devices
// and the transport: Close(self's rank) releases them, whether Open failed or not.
func (g *Group) Open(self Rank, newRank func(r int) (Rank, error)) error {
	o := g.opts
	N := o.Devices
	g.ranks = make([]Rank, N)
	if o.Rendezvous != "" {
		if err := g.openProcess(self); err != nil {
			return err
		}
	} else if err := g.openLocal(self, newRank); err != nil {
		return err
	}
	env := multigpu.PolicyEnv{Experts: g.arch.Config.Experts, Devices: N, Gamma: o.Gamma, Metric: o.Metric, Seed: o.Seed, HarMoEnyQ: o.HarMoEnyThreshold, Eta: o.MACSEta}
	g.comms, g.clocks = make([]multigpu.Comm, N), make([]func() float64, N)
	g.place, g.pending, g.scratch = make([][]multigpu.Placement, N), make([][]device.Event, N), make([][]byte, N)
	g.fetch = make([]fetchSlots, N)
	g.held = make([]int64, N)
	wall := time.Now()
	for _, r := range g.local {
		if err := g.connect(r, wall, &env); err != nil {
			return err
		}
		if err := g.placeWeights(r); err != nil {
			return err
		}
	}
	return g.makePlanners(env)
}

// connect gives local rank r its end of the transport and its clock: on a device that models
// its link (a simulated GPU), a modelled end and the device's time, and on rank 0 the
// cluster the cost-model planners weigh (env.Cluster).
func (g *Group) connect(r int, wall time.Time, env *multigpu.PolicyEnv) error {
	dev := g.ranks[r].Device()
	comm := g.tr.Comm(r)
	clock := func() float64 { return time.Since(wall).Seconds() }
	if lk, ok := dev.(device.Linker); ok {
		link := multigpu.Link{Bandwidth: g.opts.LinkBandwidth, Latency: g.opts.LinkLatency}
		if sd, ok := dev.(*sim.Device); ok {
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
			return fmt.Errorf("expert parallelism on %s: %w", dev.Name(), err)
		}
		clock = lk.Ready
	}
	g.comms[r], g.clocks[r] = comm, clock
	return nil
}

// placeWeights gives local rank r its first placement of every MoE layer's experts, and
// allocates (and, beside the first local rank, which uploads with the model, uploads) the
// non-expert weights and its experts.
func (g *Group) placeWeights(r int) error {
	rk := g.ranks[r]
	dev := rk.Device()
	layers := len(g.expertBytes)
	place := make([]multigpu.Placement, layers)
	for j := range place {
		place[j] = g.start
	}
	g.place[r] = place
	g.pending[r] = make([]device.Event, layers)
	if err := dev.Memory().Alloc(g.model.NonExpertBytes, "the non-expert weights"); err != nil {
		return fmt.Errorf("expert parallelism, rank %d on %s: %.2f GiB of non-expert weights do not fit: %w", r, dev.Name(), float64(g.model.NonExpertBytes)/(1<<30), err)
	}
	if err := g.hold(r); err != nil {
		return err
	}
	if r != g.local[0] {
		// The first local rank uploads its weights with the model's own (engine.Open).
		if err := rk.Upload(); err != nil {
			return fmt.Errorf("expert parallelism, rank %d: %w", r, err)
		}
	}
	return nil
}

// UploadExperts puts the experts rank r holds on its device, if it has memory of its own: the
// rank's Upload, after the non-expert weights.
func (g *Group) UploadExperts(r int) error {
	for i, l := range g.arch.Layers {
		if j := g.moeIdx[i]; j >= 0 {
			for _, e := range g.place[r][j].Local(r) {
				if err := g.uploadExpert(r, l.MoE, e); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// makePlanners makes every rank's planner of the group's policy, HarMoEny's cost model from
// the first MoE layer's experts, and the group's statistics.
func (g *Group) makePlanners(env multigpu.PolicyEnv) error {
	policy := g.policy
	if policy == "harmoeny" && env.HarMoEnyQ == 0 && env.Cluster.Devices == 0 {
		env.HarMoEnyQ = defaultHarMoEnyQ
	}
	if env.Cluster.Devices > 0 {
		env.Cost = g.expertCost()
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
	g.pass = make([]layerPass, layers)
	g.stats = Stats{Policy: policy, Devices: len(g.ranks), Transport: g.how, Layers: make([]LayerStats, layers), CalibrationTokens: g.calibrated}
	for i, j := range g.moeIdx {
		if j >= 0 {
			g.stats.Layers[j].Layer = i
		}
	}
	return nil
}

// expertCost is an expert's cost for HarMoEny's eq. 4, which needs the bytes of one weight
// element: the first MoE layer's.
func (g *Group) expertCost() multigpu.ExpertCost {
	var firstMoE *models.MoE
	for _, l := range g.arch.Layers {
		if l.MoE != nil {
			firstMoE = l.MoE
			break
		}
	}
	params := 3 * float64(firstMoE.GateExps.Expert(0).Rows) * float64(firstMoE.GateExps.Expert(0).Cols)
	return multigpu.ExpertCost{WeightBytes: float64(g.expertBytes[0]), FLOPsPerToken: 2 * params,
		TokenBytes: 4 * float64(g.arch.Config.Embd), ElementBytes: float64(g.expertBytes[0]) / params}
}

// openLocal makes every rank in this process: rank 0 is self, the others newRank's.
func (g *Group) openLocal(self Rank, newRank func(r int) (Rank, error)) error {
	N := g.opts.Devices
	g.ranks[0] = self
	g.local = []int{0}
	for r := 1; r < N; r++ {
		rk, err := newRank(r)
		if err != nil {
			return fmt.Errorf("expert parallelism over %d devices, rank %d: %w", N, r, err)
		}
		g.ranks[r] = rk
		g.local = append(g.local, r)
	}
	tr, how, err := newTransport(g.opts, g.ranks)
	if err != nil {
		return fmt.Errorf("expert parallelism over %d devices: %w", N, err)
	}
	g.tr, g.how = tr, how
	return nil
}

// openProcess makes this process's rank of a group of processes: self on its GPU, with NCCL
// communicators made from the id the rendezvous hands out.
func (g *Group) openProcess(self Rank) error {
	o := g.opts
	N, r := o.Devices, o.Rank
	gpu, ok := self.Device().(*cuda.GPU)
	if !ok {
		return fmt.Errorf("expert parallelism over processes runs on CUDA GPUs, with NCCL; %s is not one", self.Device().Name())
	}
	if t := strings.TrimSpace(o.Transport); t != "" && t != "auto" && t != "nccl" {
		return fmt.Errorf("expert parallelism over processes: transport %q: the processes exchange tokens with NCCL", o.Transport)
	}
	g.multi = true
	g.ranks[r] = self
	g.local = []int{r}
	lib, err := nccl.Load(o.NCCLLibrary)
	if err != nil {
		return fmt.Errorf("expert parallelism over processes: %w", err)
	}
	// Processes that disagree on what they run would exchange garbage: the rendezvous
	// refuses them.
	m := g.model
	fp := fmt.Sprintf("%s %d bytes, %d experts, planner %s, capacity %g, metric %v, seed %d, q %d, eta %g",
		m.Name, m.NonExpertBytes+m.ExpertBytes, g.arch.Config.Experts, g.policy, o.Gamma, o.Metric, o.Seed, o.HarMoEnyThreshold, o.MACSEta)
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

// newTransport makes what moves the tokens between the ranks, and says what it is.
func newTransport(o Options, ranks []Rank) (transport, string, error) {
	var gpus []*cuda.GPU
	for _, rk := range ranks {
		if g, ok := rk.Device().(*cuda.GPU); ok {
			gpus = append(gpus, g)
		}
	}
	local := func() (transport, error) {
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
			return nil, "", fmt.Errorf("the nccl transport moves tokens between CUDA GPUs; the ranks are on %s", ranks[0].Device().Name())
		}
		return newNCCL(o.NCCLLibrary, gpus)
	default:
		return nil, "", fmt.Errorf("transport %q: want nccl, local or auto", o.Transport)
	}
}

// newNCCL loads NCCL and makes a group of the GPUs.
func newNCCL(lib string, gpus []*cuda.GPU) (transport, string, error) {
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
