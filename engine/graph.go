package engine

import (
	"errors"
	"fmt"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// Decode steps as CUDA graphs. On a device that captures them (device.Grapher), a session's
// first decoded token is enqueued as usual but captured instead of run; every later token
// replays the capture in one launch with its own token and position, which the step's
// kernels read from device memory, and the host reads back only the logits. A step writes its
// session's KV cache where it lies and the pass's activations in the model's reserve (passes in
// device memory take turns, passMu), so there is one step per KV cache, released with it.
// What the host must see or decide during a pass (a layer routed on the host, an offloader's
// copies, an observer, the Commit Router) keeps passes eager; an offloader whose every layer's
// experts keep their slots for good (llama.cpp's split with no host layer, which auto chooses
// for a model that fits) decides nothing during a decode step, and its steps replay too.

// stepGraphs are a model's captured decode steps.
type stepGraphs struct {
	g      device.Grapher
	used   int        // the experts a step computes: every MoE layer's top-k
	mu     sync.Mutex // steps: sessions close on their own goroutines
	steps  map[*models.KVCache]*stepGraph
	failed error // why a capture failed: passes run eagerly from then on
}

// stepGraph is one KV cache's captured decode step.
type stepGraph struct {
	step   device.Step
	logits []float32 // where the step writes the logits (device memory)
	// host is where a replay reads the logits back to: its session's (Model.logitsHost).
	host []float32
}

// setupGraphs turns on captured decode steps where every pass of one token can be captured:
// on a device that captures them, with the model in its memory, every MoE layer routed on
// the device, and nothing that makes the host take part in a pass.
func (m *Model) setupGraphs() {
	g, ok := m.dev.(device.Grapher)
	if !ok || m.opts.NoGraphs || m.opts.ProfileKernels || m.fused == nil || m.ep != nil || m.commit != nil || m.commitDev != nil || m.replay != nil {
		return
	}
	used := 0
	for i, l := range m.arch.Layers {
		if l.MoE != nil && (m.moeDev == nil || m.moeDev[i] == nil) {
			return
		}
		if l.MoE != nil {
			used += l.MoE.Used
		}
	}
	m.graphs = &stepGraphs{g: g, used: used, steps: map[*models.KVCache]*stepGraph{}}
}

// takes says whether a pass is a decode step that replays a graph: one token of one sequence,
// its logits wanted, and nobody watching its routing.
func (gs *stepGraphs) takes(seqs []seqRows, tokens []int32, want logitRows, obs RouteObserver, cs *commitState) bool {
	return gs != nil && len(seqs) == 1 && len(tokens) == 1 && want != noLogits && obs == nil && cs == nil
}

// replayStep runs a decode step of s's token by replaying its KV cache's step, captured now
// if it was not yet. ok is false where the step cannot be captured: the caller runs the pass
// eagerly (and every later one: GraphNote says why).
func (m *Model) replayStep(s seqRows, tokens []int32) (logits []float32, ok bool, err error) {
	if s.pos0 == 0 && s.kv.Recurrent() {
		// A pass at position 0 starts the recurrent states afresh: a step captured there
		// would clear them at every replay.
		return nil, false, nil
	}
	gs := m.graphs
	gs.mu.Lock()
	sg, failed := gs.steps[s.kv], gs.failed
	gs.mu.Unlock()
	captured := sg == nil // the capture's enqueue counted the step's experts
	if sg == nil {
		if failed != nil {
			return nil, false, nil
		}
		if sg, err = m.captureStep(s, tokens); err != nil {
			gs.mu.Lock()
			gs.failed = err
			gs.mu.Unlock()
			return nil, false, nil
		}
		gs.mu.Lock()
		gs.steps[s.kv] = sg
		gs.mu.Unlock()
	}
	if err := gs.g.Replay(sg.step, tokens, s.pos0); err != nil {
		return nil, true, err
	}
	s.kv.Replayed(s.pos0 + 1)
	if !captured {
		m.place.deviceRouted(gs.used)
	}
	if !m.resident {
		return sg.logits, true, m.deviceErr()
	}
	m.ops.Read(sg.host, sg.logits)
	return sg.host, true, m.deviceErr()
}

// captureStep captures a decode step of s's token: the pass enqueued as forward would, its
// logits left in device memory.
func (m *Model) captureStep(s seqRows, tokens []int32) (*stepGraph, error) {
	g := m.graphs.g
	if err := g.BeginStep(tokens, s.pos0); err != nil {
		return nil, err
	}
	logits, err := m.enqueue([]seqRows{s}, tokens, lastLogits, nil, nil, true)
	step, serr := g.EndStep()
	if err = errors.Join(err, serr); err != nil {
		if step != nil {
			g.ReleaseStep(step)
		}
		return nil, err
	}
	sg := &stepGraph{step: step, logits: logits}
	if m.resident {
		sg.host = m.logitsHost.get(s.kv, len(logits))
	}
	return sg, nil
}

// drop releases kv's step, if it has one.
func (gs *stepGraphs) drop(kv *models.KVCache) {
	if gs == nil {
		return
	}
	gs.mu.Lock()
	sg := gs.steps[kv]
	delete(gs.steps, kv)
	gs.mu.Unlock()
	if sg != nil {
		gs.g.ReleaseStep(sg.step)
	}
}

// close releases every step.
func (gs *stepGraphs) close() {
	if gs == nil {
		return
	}
	gs.mu.Lock()
	steps := gs.steps
	gs.steps = map[*models.KVCache]*stepGraph{}
	gs.mu.Unlock()
	for _, sg := range steps {
		gs.g.ReleaseStep(sg.step)
	}
}

// GraphNote says how decode steps run on the device: "" where they replay captured CUDA
// graphs or the device has none, else why each token's kernels are launched one by one.
func (m *Model) GraphNote() string {
	gs := m.graphs
	if gs == nil {
		if _, ok := m.dev.(device.Grapher); ok && m.resident {
			return "decode steps launch their kernels eagerly: " + m.eagerReason()
		}
		return ""
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.failed != nil {
		return fmt.Sprintf("decode steps launch their kernels eagerly: capturing one failed: %v", gs.failed)
	}
	return ""
}

// eagerReason says why setupGraphs left decode steps eager.
func (m *Model) eagerReason() string {
	switch {
	case m.opts.NoGraphs:
		return "CUDA graphs are off"
	case m.opts.ProfileKernels:
		return "kernels are profiled one by one"
	case m.off != nil:
		return "the offloader copies experts during a token"
	case m.ep != nil:
		return "expert parallelism exchanges tokens between ranks"
	case m.commit != nil || m.commitDev != nil:
		return "the Commit Router predicts on the host during a token"
	case m.fused == nil:
		return "the device has no fused kernels"
	}
	return m.moeDevErr.Error()
}
