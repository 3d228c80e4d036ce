package engine

import (
	"context"
	"fmt"
)

// defaultMACSCalibrationTokens is how much of a MACS calibration text Open runs when
// EPOptions.MACSCalibrationTokens is 0: enough that each expert of a 64-expert top-8 layer
// averages 500 tokens for its centroid.
const defaultMACSCalibrationTokens = 4096

// macsCentroids runs the first maxTokens tokens of text through the model at path on the CPU,
// from an empty cache every window of up to 512 tokens, and returns every MoE layer's expert
// centroids (multigpu.ExpertCentroids' layout: experts rows of the embedding width) by MoE
// layer index, and the tokens it ran. An expert no token chose keeps the zero vector, which
// rerouting scores as dissimilar to everything.
//
// The CPU, whatever the ranks run on, because every rank of a group of processes computes the
// centroids itself and the same code on the same weights gives them the same numbers; a rank
// uses them only for its own tokens' affinities, which it sends, so even a difference would
// not make the ranks' plans disagree.
func macsCentroids(path string, opts Options, text string, maxTokens int, moeIdx []int) ([][]float32, int, error) {
	cm, err := Open(path, Options{Device: "cpu", Threads: opts.Threads, ContextLength: 512, KVType: opts.KVType})
	if err != nil {
		return nil, 0, fmt.Errorf("MACS calibration: %w", err)
	}
	defer cm.Close()
	ids, window, err := cm.windowed(text, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("MACS calibration: %w", err)
	}
	ids = ids[:min(len(ids), maxTokens)]
	c := cm.arch.Config
	E, D := c.Experts, c.Embd
	var layers int
	for _, j := range moeIdx {
		layers = max(layers, j+1)
	}
	sum := make([][]float64, layers)
	n := make([][]int, layers)
	for j := range sum {
		sum[j], n[j] = make([]float64, E*D), make([]int, E)
	}
	s, err := cm.NewSession()
	if err != nil {
		return nil, 0, fmt.Errorf("MACS calibration: %w", err)
	}
	defer s.Close()
	s.ObserveRouting(func(ev *RouteEvent) {
		j := moeIdx[ev.Layer]
		if j < 0 || ev.Experts != E || len(ev.Input) != ev.Tokens*D {
			return
		}
		for t := range ev.Tokens {
			z := ev.Input[t*D : (t+1)*D]
			for _, e := range ev.Selected[t*ev.Used : (t+1)*ev.Used] {
				row := sum[j][e*D : (e+1)*D]
				for i, v := range z {
					row[i] += float64(v)
				}
				n[j][e]++
			}
		}
	})
	ran, err := s.observe(context.Background(), ids, window)
	if err != nil {
		return nil, 0, fmt.Errorf("MACS calibration: %w", err)
	}
	mu := make([][]float32, layers)
	for j := range mu {
		mu[j] = make([]float32, E*D)
		for i, v := range sum[j] {
			if k := n[j][i/D]; k > 0 {
				mu[j][i] = float32(v / float64(k))
			}
		}
	}
	return mu, ran, nil
}
