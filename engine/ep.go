package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
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
