// Package eprun runs a model spread over ranks by expert parallelism: the group of ranks and
// its transport, each MoE layer's steps (route locally, exchange the routing, plan with a
// multigpu planner, dispatch, compute, combine), MACS's expert centroids averaged over the
// routing of a calibration text (Centroids), the experts a plan fetches or moves, and
// perplexity with its windows spread over the ranks. The engine opens a group for a model
// with Options.EP and drives it through Rank, which its rank models implement, and runs the
// calibration text through Model.Calibrate.
package eprun

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
)

// Group is the ranks of an expert-parallel model and what they share. Each rank plans with
// its own policy and placement, as separate processes would: they agree because every rank
// plans the same batches in the same order.
type Group struct {
	opts   Options
	model  Model
	arch   *models.Model
	policy string
	// ranks are every rank's model, by rank; in a group of processes only this process's
	// rank (local) is here, the others are nil.
	ranks  []Rank
	local  []int
	multi  bool
	tr     transport
	how    string // what the transport is, for Stats
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
	fetch   []fetchSlots

	mu      sync.Mutex // one step at a time
	lastCmd int64      // rank 0's last command to a group of processes (under mu)

	smu   sync.Mutex
	pass  []layerPass
	stats Stats
}

// transport is a group's transport: its ranks' ends, and the way a failing rank releases
// the others and the group is readied again.
type transport interface {
	Comm(r int) multigpu.Comm
	Abort(err error)
	Reset() error
	Close() error
}

// localTransport is the in-process group as a transport.
type localTransport struct{ *multigpu.LocalGroup }

func (l localTransport) Reset() error { l.LocalGroup.Reset(); return nil }
func (l localTransport) Close() error { return nil }

// layerPass gathers one MoE layer pass's figures from every rank.
type layerPass struct {
	n              int
	compute, total float64
}

// Stats reports the group's figures since it was opened.
func (g *Group) Stats() Stats {
	g.smu.Lock()
	defer g.smu.Unlock()
	st := g.stats
	st.Layers = slices.Clone(st.Layers)
	return st
}

// Ranks is the number of ranks.
func (g *Group) Ranks() int { return len(g.ranks) }

// Multi says whether the ranks are processes of their own, of which this one runs a single
// rank.
func (g *Group) Multi() bool { return g.multi }

// Close releases what the group holds beyond the device of rank, this process's first local
// rank: the transport and the other ranks' devices. Called by another rank it does nothing.
func (g *Group) Close(rank int) error {
	if len(g.local) == 0 || rank != g.local[0] {
		return nil
	}
	var errs []error
	if g.multi && g.tr != nil && rank == 0 {
		// Release the other processes from Serve; a group that failed has released them.
		errs = append(errs, g.control(cmdStop))
	}
	if g.tr != nil {
		errs = append(errs, g.tr.Close())
		g.tr = nil
	}
	for _, r := range g.local {
		if r != rank {
			errs = append(errs, g.ranks[r].Close())
		}
	}
	g.local = []int{rank}
	return errors.Join(errs...)
}

// The commands rank 0 of a group of processes sends the others before each pass.
const (
	cmdStop = iota
	cmdStep
)

// control sends rank 0's command to every process of the group (the others send nothing of
// use) and returns it.
func (g *Group) control(cmd int64) error {
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

// Serve runs rank r, this process's rank of a group of processes, above 0: it takes part in
// every pass rank 0 runs, computing the experts it holds for the tokens it is sent, and
// returns nil when rank 0 closes its model. ctx is looked at between passes only: a pass
// under way waits for the others. An error of any rank ends the group.
func (g *Group) Serve(ctx context.Context, r int) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := g.serveStep(r); err != nil {
			return err
		}
		if g.lastCmd == cmdStop {
			return nil
		}
	}
}

// serveStep waits for rank 0's command and carries it out.
func (g *Group) serveStep(r int) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.control(0); err != nil {
		return err
	}
	switch g.lastCmd {
	case cmdStop:
		return nil
	case cmdStep:
		start := g.clocks[r]()
		if err := g.serve(r); err != nil {
			g.tr.Abort(err)
			return err
		}
		g.smu.Lock()
		g.stats.Steps++
		g.stats.Seconds += g.clocks[r]() - start
		g.smu.Unlock()
		return nil
	}
	return fmt.Errorf("expert parallelism over processes: rank 0 sent command %d", g.lastCmd)
}

// Step runs one forward pass on every rank at once: work[r] runs rank r's tokens, or is nil
// for a rank with no tokens, which still serves its experts to the others.
func (g *Group) Step(work []func() error) error {
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
		// The other processes wait in Serve for rank 0 to say that a pass begins.
		if err := g.control(cmdStep); err != nil {
			return err
		}
	}
	errs := make([]error, N)
	var wg sync.WaitGroup
	for _, r := range g.local {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if w := work[r]; w != nil {
				err = w()
			} else {
				err = g.serve(r)
			}
			if err != nil {
				errs[r] = err
				g.tr.Abort(err)
			}
		}()
	}
	wg.Wait()
	return g.endStep(start, errs)
}

// endStep readies the group again after a step that failed, and returns the error every rank
// failed with; or counts the step that did not.
func (g *Group) endStep(start float64, errs []error) error {
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

// serve is a pass of rank r with no tokens: it takes part in every MoE layer's exchanges and
// computes the experts it is sent.
func (g *Group) serve(r int) error {
	for i, l := range g.arch.Layers {
		if l.MoE != nil {
			if err := g.MoE(r, i, l.MoE, nil, 0, nil, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// hold allocates on rank r the experts its placements give it, in place of what it held.
func (g *Group) hold(r int) error {
	var b int64
	for j, p := range g.place[r] {
		b += int64(len(p.Local(r))) * g.expertBytes[j]
	}
	dev := g.ranks[r].Device()
	mem := dev.Memory()
	mem.Free(g.held[r])
	g.held[r] = 0
	if err := mem.Alloc(b, "its experts"); err != nil {
		return fmt.Errorf("expert parallelism, rank %d on %s: %.2f GiB of experts do not fit: %w", r, dev.Name(), float64(b)/(1<<30), err)
	}
	g.held[r] = b
	return nil
}

// f32bytes is v's memory as bytes, for the transport.
func f32bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v))
}
