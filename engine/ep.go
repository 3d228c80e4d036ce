package engine

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/eprun"
	"github.com/commit-run/commit-run/models"
)

// Expert parallelism is package eprun's: this file opens a model's group of ranks, runs its
// passes and MoE layers there (epBlock), and lends eprun each rank's model (epRank).

// EPOptions run the model with expert parallelism (Options.EP): Devices ranks, each a device
// of Options.Device's kind holding a copy of the non-expert weights and its share of the
// experts (eprun.Options).
type EPOptions = eprun.Options

// EPStats are an expert-parallel model's figures since it was opened (eprun.Stats).
type EPStats = eprun.Stats

// EPLayerStats are one MoE layer's figures summed over its passes (eprun.LayerStats).
type EPLayerStats = eprun.LayerStats

// EPPolicies lists the planners expert parallelism plans each MoE layer's batch with
// (EPOptions.Policy).
func EPPolicies() []string { return eprun.Policies() }

// EPStats reports expert parallelism's figures; ok is false when the model runs on one
// device.
func (m *Model) EPStats() (EPStats, bool) {
	if m.ep == nil {
		return EPStats{}, false
	}
	return m.ep.Stats(), true
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
	if g == nil || !g.Multi() || m.rank == 0 {
		return ErrNotServing
	}
	return g.Serve(ctx, m.rank)
}

// openEP makes the ranks of Options.EP: rank 0 is m on its device (or, in a group of
// processes, m is rank EPOptions.Rank), the others copies of m on devices of the same kind.
// The group holds the other ranks' devices and the transport from the start: closeEP
// releases them, if opening fails too.
func (m *Model) openEP(path string) error {
	o := *m.opts.EP
	if err := eprun.Check(o, m.arch.Config.Experts, m.epConflict()); err != nil {
		return err
	}
	if err := m.checkFeatures(); err != nil {
		return err
	}
	g, err := eprun.NewGroup(o, eprun.Model{Arch: m.arch, Name: m.info.Name, NonExpertBytes: m.info.NonExpertBytes,
		ExpertBytes: m.info.ExpertBytes, Calibrate: macsCalibration(path, m.opts)})
	if err != nil {
		return err
	}
	m.ep, m.rank = g, o.Rank
	return g.Open(epRank{m}, m.newEPRank)
}

// epConflict is what expert parallelism objects to among the other options, or nil.
func (m *Model) epConflict() error {
	switch {
	case m.opts.Offload != nil:
		return fmt.Errorf("expert parallelism spreads the experts over devices; it does not offload them to host memory too")
	case m.opts.Commit != nil:
		return fmt.Errorf("expert parallelism with the Commit Router is not supported")
	case m.opts.Drop != nil:
		return fmt.Errorf("expert parallelism plans token drop with its policy (token-drop, expanded-drop, ...); do not ask for single-device token drop too")
	}
	return nil
}

// newEPRank opens rank r of m's group: m on a device of the same kind, on CUDA the r-th GPU
// from m's, one GPU per rank.
func (m *Model) newEPRank(r int) (eprun.Rank, error) {
	opts := m.opts
	gpu, isGPU := m.dev.(*cuda.GPU)
	if isGPU {
		opts.Device = fmt.Sprintf("cuda:%d", gpu.Info().Ordinal+r)
	}
	dev, _, err := newDevice(opts)
	if err != nil {
		if isGPU {
			o := gpu.Info().Ordinal
			err = fmt.Errorf("one GPU per rank, cuda:%d to cuda:%d: %w", o, o+m.ep.Ranks()-1, err)
		}
		return nil, err
	}
	rm := &Model{opts: m.opts, file: m.file, arch: m.arch, tok: m.tok, dev: dev, info: m.info, nctx: m.nctx, kvF16: m.kvF16, ops: models.HostOps{K: dev}}
	rm.charger, _ = dev.(device.Charger)
	rm.labeler, _ = dev.(device.Labeler)
	rm.place = residentPlacement{m: rm}
	rm.block = epBlock{rm}
	rm.ep, rm.rank = m.ep, r
	return epRank{rm}, nil
}

// closeEP releases what the group holds beyond m's device: the transport and the other
// ranks' devices.
func (m *Model) closeEP() error {
	if m.ep == nil {
		return nil
	}
	return m.ep.Close(m.rank)
}

// epPerplexity is PerplexityWith under expert parallelism: the windows are spread over the
// ranks (eprun.Group.Perplexity), and the result is the single device's to the bit with a
// policy that drops nothing.
func (m *Model) epPerplexity(ctx context.Context, ids []int32, window, step int, res PerplexityResult) (PerplexityResult, error) {
	var wins [][]int32
	for start := 0; start+1 < len(ids); start += window {
		wins = append(wins, ids[start:min(start+window, len(ids))])
	}
	nll, n, err := m.ep.Perplexity(ctx, wins, step, m.epStep)
	if err != nil {
		return res, err
	}
	res.NLL, res.Tokens = nll, n
	res.Perplexity = math.Exp(res.NLL / float64(res.Tokens))
	res.BitsPerByte = res.NLL / math.Ln2 / float64(res.Bytes)
	return res, nil
}

// epStep runs a step holding the model open.
func (m *Model) epStep(work []func() error) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return m.ep.Step(work)
}
