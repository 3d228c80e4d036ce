package engine

import (
	"math"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/offload"
)

// OffloadOptions turn on expert offloading (offload.Options): the routed experts live in a
// host store and are copied into a fixed set of device slots as the policy decides.
type OffloadOptions = offload.Options

// OffloadStats count what the offloader did since the model was opened (offload.Stats).
type OffloadStats = offload.Stats

// A placement is where the experts a MoE layer computes live, and when their weights move:
// the step "place" of the MoE block (moe.go: route, select, place, compute, combine). The
// model's own weights (residentPlacement) are one answer; the offloader (offload.Offloader),
// serving experts from device slots or the host under one of the offload policies, is the
// other. Its methods are called in a pass's order, layer by layer.
type placement interface {
	// BeginPass starts a forward pass; decodeBatch says that its rows are the next tokens of
	// several sequences (continuous batching), not a prompt's.
	BeginPass(decodeBatch bool)
	// Predicted returns the experts predicted for layer's pass (learnt: the Commit Router's,
	// or nil), and those a single-token pass computes with instead of the router's choice
	// (commit; nil: the router's). T is the pass's tokens, used the layer's top-k.
	Predicted(layer int, learnt []int, T, used int) (pred, commit []int)
	// routed tells the router's choice for the pass's tokens and the prediction made for it;
	// unless the pass committed, the host then knows which experts to move.
	routed(layer int, routes []routing, pred []int, committed bool)
	// OnHost says which of a layer's experts the host computes, tokens[i] rows for
	// experts[i] (nil: none).
	OnHost(layer int, experts, tokens []int) []bool
	// Weights returns expert e of layer's weights where it computes (on the host, or on the
	// device) and done, to call once its kernels are enqueued.
	Weights(layer, e int, host bool) (w offload.ExpertWeights, done func() error, err error)
	// Pinnable is how many experts' weights the device can hold at once between Weights and
	// done, besides those Kept: as many as a launch of several experts may need.
	Pinnable() int
	// Kept says whether expert e of layer stays on the device for good, so that holding it
	// takes nothing from Pinnable.
	Kept(layer, e int) bool
	// Holds says whether the device holds expert e of layer now, so that Weights serves it
	// without a copy or an eviction.
	Holds(layer, e int) bool
	// keptWeights returns expert e of layer's weights where they stay on the device for as
	// long as the model is open (false where they may move), for a device that routes the
	// layer itself (setupFused).
	keptWeights(layer, e int) (offload.ExpertWeights, bool, error)
	// deviceRouted tells that the device routed a pass's tokens of a layer and computed their
	// n experts from keptWeights', none of which the host saw.
	deviceRouted(n int)
	// hostsLayer says whether OnHost may put any of layer's experts on the host.
	hostsLayer(layer int) bool
	// Heuristic says whether Ahead predicts from the routing the host has read (prev-token,
	// frequency), so that a committed pass must read it first.
	Heuristic() bool
	// Ahead runs once layer's experts are enqueued: it moves what the next MoE layer,
	// nextLayer, is predicted to need, used experts per token: learnt, the Commit Router's
	// prediction, readable once ready, or else a heuristic's.
	Ahead(layer, used, nextLayer int, learnt []int, ready device.Event) error
}

// residentPlacement is every expert in the model's own weights, on the device it runs on:
// nothing moves. With the Commit Router and no offloading, commit still computes with the
// predicted experts, which is how its quality is measured.
type residentPlacement struct {
	m       *Model
	commits bool
}

func (residentPlacement) BeginPass(bool) {}

func (p residentPlacement) Predicted(layer int, learnt []int, T, used int) (pred, commit []int) {
	if p.commits {
		return learnt, learnt
	}
	return learnt, nil
}

func (residentPlacement) routed(int, []routing, []int, bool) {}
func (residentPlacement) OnHost(int, []int, []int) []bool    { return nil }
func (residentPlacement) Heuristic() bool                    { return false }
func (residentPlacement) Pinnable() int                      { return math.MaxInt }
func (residentPlacement) Kept(int, int) bool                 { return true }
func (residentPlacement) Holds(int, int) bool                { return true }
func (residentPlacement) deviceRouted(int)                   {}
func (residentPlacement) hostsLayer(int) bool                { return false }

func (p residentPlacement) keptWeights(layer, e int) (offload.ExpertWeights, bool, error) {
	moe := p.m.arch.Layers[layer].MoE
	return offload.ExpertWeights{Gate: moe.GateExps.Expert(e), Up: moe.UpExps.Expert(e), Down: moe.DownExps.Expert(e)}, true, nil
}

func (residentPlacement) Ahead(int, int, int, []int, device.Event) error { return nil }

func (p residentPlacement) Weights(layer, e int, _ bool) (offload.ExpertWeights, func() error, error) {
	w, _, _ := p.keptWeights(layer, e)
	return w, noDone, nil
}

func noDone() error { return nil }

var (
	_ placement = residentPlacement{}
	_ placement = offloaderPlacement{}
)

// offloaderPlacement is the offloader as the MoE block's placement: it takes the routing as the
// experts each token chose.
type offloaderPlacement struct{ *offload.Offloader }

func (f offloaderPlacement) routed(layer int, routes []routing, pred []int, committed bool) {
	chosen := make([][]int, len(routes))
	for t, r := range routes {
		chosen[t] = r.experts
	}
	f.Routed(layer, chosen, pred, committed)
}

func (f offloaderPlacement) keptWeights(layer, e int) (offload.ExpertWeights, bool, error) {
	return f.KeptWeights(layer, e)
}

func (f offloaderPlacement) deviceRouted(n int)        { f.DeviceRouted(n) }
func (f offloaderPlacement) hostsLayer(layer int) bool { return f.HostsLayer(layer) }
