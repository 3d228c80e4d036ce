package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/device"
)

// The GPU's device.Grapher: a decode step captured once as a CUDA graph and replayed in one
// launch. Its inputs, the position and the token ids, live in pinned host memory of the step's
// own, which the graph's first node copies to the device: the position-dependent kernels
// (embedding, RoPE, the KV store, attention) read them there (opCall.pos), so that a replay at
// another position and with other tokens computes what an eager pass would, to the bit.

// stepCapture is a step being captured.
type stepCapture struct {
	pos0, ntok int
	in         *HostBuffer // the inputs: the position, then the token ids (int32s)
	dev        DevicePtr   // their device copy
	kernels    int64       // launches recorded
	err        error       // the first operation that could not be captured
}

// gpuStep is a captured decode step (device.Step).
type gpuStep struct {
	exec    *GraphExec
	ntok    int
	in      *HostBuffer
	dev     DevicePtr
	kernels int64
}

// errCapture reports an operation a captured step cannot hold.
func errCapture(what string) error {
	return fmt.Errorf("%s cannot be captured in a CUDA graph", what)
}

// failCompute records a failure of the compute stream's work: the sticky device error, or
// while a step is captured the capture's, which fails EndStep and leaves the device as it was.
// The caller holds g.mu.
func (g *GPU) failCompute(err error) {
	if st := g.step; st != nil {
		if st.err == nil {
			st.err = err
		}
		return
	}
	if g.err.Load() == nil {
		g.fail(err)
	}
}

// launched counts a kernel launch: recorded in the step being captured, or issued and run.
// The caller holds g.mu.
func (g *GPU) launched(mmq bool) {
	if st := g.step; st != nil {
		st.kernels++
		return
	}
	g.launches.Add(1)
	g.kernels.Add(1)
	if mmq {
		g.mmqLaunches.Add(1)
	}
}

// BeginStep implements device.Grapher.
func (g *GPU) BeginStep(tokens []int32, pos0 int) error {
	if !g.drv.Graphs() {
		return ErrNoGraphs
	}
	if len(tokens) == 0 || pos0 < 0 {
		return fmt.Errorf("a step of %d tokens at position %d", len(tokens), pos0)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.step != nil {
		return errors.New("cuda: a step is being captured already")
	}
	if err := g.Err(); err != nil {
		return err
	}
	n := 4 * (1 + len(tokens))
	in, err := g.ctx.HostAlloc(n)
	if err != nil {
		return err
	}
	dev, err := g.ctx.Alloc(int64(n))
	if err != nil {
		in.Free()
		return err
	}
	st := &stepCapture{pos0: pos0, ntok: len(tokens), in: in, dev: dev}
	writeStep(in, tokens, pos0)
	if err := g.compute.BeginCapture(); err != nil {
		in.Free()
		g.ctx.Free(dev)
		return err
	}
	g.step = st
	if err := g.compute.CopyHtoD(dev, in.Bytes); err != nil {
		st.err = err
	}
	return nil
}

// writeStep writes a step's inputs: the position, then the tokens.
func writeStep(in *HostBuffer, tokens []int32, pos0 int) {
	v := unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(in.Bytes))), len(in.Bytes)/4)
	v[0] = int32(pos0)
	copy(v[1:], tokens)
}

// EndStep implements device.Grapher.
func (g *GPU) EndStep() (device.Step, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.step
	if st == nil {
		return nil, errors.New("cuda: no step is being captured")
	}
	g.step = nil
	graph, err := g.compute.EndCapture()
	if err == nil && st.err != nil {
		err = st.err
	}
	var exec *GraphExec
	if err == nil {
		exec, err = graph.Instantiate()
	}
	if graph != nil {
		err = errors.Join(err, graph.Destroy())
	}
	if err != nil {
		if exec != nil {
			exec.Destroy()
		}
		st.in.Free()
		g.ctx.Free(st.dev)
		return nil, fmt.Errorf("capturing a decode step: %w", err)
	}
	return &gpuStep{exec: exec, ntok: st.ntok, in: st.in, dev: st.dev, kernels: st.kernels}, nil
}

// Replay implements device.Grapher: it writes the step's inputs and launches its graph. The
// host may write them again once the work enqueued so far is done (the engine reads the
// logits first).
func (g *GPU) Replay(s device.Step, tokens []int32, pos0 int) error {
	st, ok := s.(*gpuStep)
	if !ok || st.exec == nil {
		return fmt.Errorf("cuda: replay of %T, not a step of this device", s)
	}
	if len(tokens) != st.ntok || pos0 < 0 {
		return fmt.Errorf("cuda: a step of %d tokens replayed with %d at position %d", st.ntok, len(tokens), pos0)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.step != nil {
		return errors.New("cuda: a replay while a step is captured")
	}
	writeStep(st.in, tokens, pos0)
	if err := st.exec.Launch(g.compute); err != nil {
		g.fail(err)
		return err
	}
	g.launches.Add(1)
	g.graphLaunches.Add(1)
	g.kernels.Add(st.kernels)
	return nil
}

// ReleaseStep implements device.Grapher.
func (g *GPU) ReleaseStep(s device.Step) {
	st, ok := s.(*gpuStep)
	if !ok || st.exec == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// The step's inputs must outlive its launches.
	err := errors.Join(g.compute.Synchronize(), st.exec.Destroy(), st.in.Free(), g.ctx.Free(st.dev))
	st.exec = nil
	if err != nil {
		g.fail(err)
	}
}

var _ device.Grapher = (*GPU)(nil)
