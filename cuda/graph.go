package cuda

import (
	"errors"
	"unsafe"
)

// captureModeRelaxed is CU_STREAM_CAPTURE_MODE_RELAXED: other goroutines of the process may
// allocate and free device memory while a stream captures (the copy stream's slots, another
// model), which the stricter modes would turn into a failed capture.
const captureModeRelaxed = 2

type graphSyms struct {
	beginCapture, endCapture, graphInstantiate, graphLaunch, graphExecDestroy, graphDestroy uintptr
}

// The graph calls are optional: a driver without them runs every launch eagerly
// (Driver.Graphs says which).
func (s *graphSyms) table() []symbol {
	return []symbol{
		// CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
		{Name: "cuStreamBeginCapture_v2", Addr: &s.beginCapture, Optional: true},
		// CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
		{Name: "cuStreamEndCapture", Addr: &s.endCapture, Optional: true},
		// CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags);
		{Name: "cuGraphInstantiateWithFlags", Addr: &s.graphInstantiate, Optional: true},
		// CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
		{Name: "cuGraphLaunch", Addr: &s.graphLaunch, Optional: true},
		// CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
		{Name: "cuGraphExecDestroy", Addr: &s.graphExecDestroy, Optional: true},
		// CUresult cuGraphDestroy(CUgraph hGraph);
		{Name: "cuGraphDestroy", Addr: &s.graphDestroy, Optional: true},
	}
}

// ErrNoGraphs reports that the driver lacks the graph calls (CUDA 11.4 and newer have them).
var ErrNoGraphs = errors.New("cuda: the driver has no CUDA graphs (cuStreamBeginCapture_v2, cuGraphInstantiateWithFlags)")

// Graphs says whether the driver has the calls of stream capture and graphs.
func (d *Driver) Graphs() bool {
	s := &d.graphSyms
	return s.beginCapture != 0 && s.endCapture != 0 && s.graphInstantiate != 0 && s.graphLaunch != 0 &&
		s.graphExecDestroy != 0 && s.graphDestroy != 0
}

// Graph is the work a stream captured, a CUgraph; instantiate it to launch it.
type Graph struct {
	c *Context
	h uintptr
}

// GraphExec is an instantiated graph, a CUgraphExec: one launch runs all of its work.
type GraphExec struct {
	c *Context
	h uintptr
}

// BeginCapture makes the stream record the work enqueued on it, until EndCapture, instead of
// running it. While it captures, the stream cannot be synchronised or wait for events
// recorded outside the capture, and copies must use pinned host memory: the driver refuses
// them, and EndCapture then fails.
func (s *Stream) BeginCapture() error {
	if !s.c.d.Graphs() {
		return ErrNoGraphs
	}
	return s.c.do("cuStreamBeginCapture_v2", s.c.d.beginCapture, s.h, captureModeRelaxed)
}

// EndCapture ends the stream's capture and returns the graph of what it recorded.
func (s *Stream) EndCapture() (*Graph, error) {
	var h uintptr
	if err := s.c.do("cuStreamEndCapture", s.c.d.endCapture, s.h, uintptr(unsafe.Pointer(&h))); err != nil {
		return nil, err
	}
	return &Graph{c: s.c, h: h}, nil
}

// Instantiate makes the graph launchable. The graph may be destroyed after.
func (g *Graph) Instantiate() (*GraphExec, error) {
	var h uintptr
	if err := g.c.do("cuGraphInstantiateWithFlags", g.c.d.graphInstantiate, uintptr(unsafe.Pointer(&h)), g.h, 0); err != nil {
		return nil, err
	}
	return &GraphExec{c: g.c, h: h}, nil
}

// Destroy frees the graph.
func (g *Graph) Destroy() error {
	if g == nil || g.h == 0 {
		return nil
	}
	err := g.c.do("cuGraphDestroy", g.c.d.graphDestroy, g.h)
	g.h = 0
	return err
}

// Launch enqueues the whole graph on the stream.
func (e *GraphExec) Launch(s *Stream) error {
	return e.c.do2("cuGraphLaunch", e.c.d.graphLaunch, e.h, s.h)
}

// Destroy frees the instantiated graph once its launches are done.
func (e *GraphExec) Destroy() error {
	if e == nil || e.h == 0 {
		return nil
	}
	err := e.c.do("cuGraphExecDestroy", e.c.d.graphExecDestroy, e.h)
	e.h = 0
	return err
}
