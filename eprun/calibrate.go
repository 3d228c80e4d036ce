package eprun

import "fmt"

// defaultCalibrationTokens is how much of a MACS calibration text NewGroup runs when
// Options.MACSCalibrationTokens is 0: enough that each expert of a 64-expert top-8 layer
// averages 500 tokens for its centroid.
const defaultCalibrationTokens = 4096

// Routed is one MoE layer's routing of a batch of calibration tokens, as the model reports it
// to Model.Calibrate's caller. Its slices are valid during the call only.
type Routed struct {
	Layer   int // block index
	Tokens  int
	Experts int // routed experts of the layer
	Used    int // experts chosen per token (top-k)
	// Input is the router's input, Tokens rows of the embedding width; Selected the chosen
	// experts, Tokens rows of Used.
	Input    []float32
	Selected []int
}

// Centroids runs the first maxTokens tokens of text through model m (m.Calibrate) and returns
// every MoE layer's expert centroids (multigpu.ExpertCentroids' layout: experts rows of the
// embedding width) by MoE layer (moeIdx maps a layer to its MoE layer, -1 for a dense one),
// and the tokens it ran. A centroid is the mean router input of the tokens that chose the
// expert (seeds/001 appendix A.3); an expert no token chose keeps the zero vector, which
// rerouting scores as dissimilar to everything.
func Centroids(m Model, text string, maxTokens int, moeIdx []int) ([][]float32, int, error) {
	c := m.Arch.Config
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
	ran, err := m.Calibrate(text, maxTokens, func(ev Routed) {
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
