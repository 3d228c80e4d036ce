package engine

import (
	"context"

	"github.com/commit-run/commit-run/eprun"
)

// macsCalibration is MACS's calibration run for the model at path (eprun.Model.Calibrate,
// whose centroids eprun.Centroids averages): the first maxTokens tokens of text through the
// model on the CPU, from an empty cache every window of up to 512 tokens, each MoE layer's
// routing shown to see.
//
// The CPU, whatever the ranks run on, because every rank of a group of processes computes the
// centroids itself and the same code on the same weights gives them the same numbers; a rank
// uses them only for its own tokens' affinities, which it sends, so even a difference would
// not make the ranks' plans disagree.
func macsCalibration(path string, opts Options) func(string, int, func(eprun.Routed)) (int, error) {
	return func(text string, maxTokens int, see func(eprun.Routed)) (int, error) {
		cm, err := Open(path, Options{Device: "cpu", Threads: opts.Threads, ContextLength: 512, KVType: opts.KVType})
		if err != nil {
			return 0, err
		}
		defer cm.Close()
		ids, window, err := cm.windowed(text, 0)
		if err != nil {
			return 0, err
		}
		s, err := cm.NewSession()
		if err != nil {
			return 0, err
		}
		defer s.Close()
		s.ObserveRouting(func(ev *RouteEvent) {
			see(eprun.Routed{Layer: ev.Layer, Tokens: ev.Tokens, Experts: ev.Experts, Used: ev.Used, Input: ev.Input, Selected: ev.Selected})
		})
		return s.observe(context.Background(), ids[:min(len(ids), maxTokens)], window)
	}
}
