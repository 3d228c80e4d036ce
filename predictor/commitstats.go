package predictor

import (
	"math"
	"slices"
	"sync"
)

// CommitStats count what committed routing did with a Router's predictions since the model
// was opened (the engine's Model.CommitStats).
type CommitStats struct {
	// Layers[j] counts MoE layer j's committed tokens: Tokens routed with a prediction,
	// Correct predicted experts the router also chose (of Tokens*k), AllWrong tokens where
	// none was, OWA tokens whose weights OWA adjusted.
	Layers []CommitLayerStats
	// FirstByRouter counts first MoE layers routed by the router because no prediction was
	// pending (the first decoded token of a sequence).
	FirstByRouter int64
}

// CommitLayerStats are one MoE layer's commit counts.
type CommitLayerStats struct {
	Layer                          int // block index
	Tokens, Correct, AllWrong, OWA int64
}

// Accuracy is the mean share of predicted experts the router also chose.
func (s CommitLayerStats) Accuracy(k int) float64 {
	if s.Tokens == 0 {
		return math.NaN()
	}
	return float64(s.Correct) / float64(s.Tokens*int64(k))
}

// CommitCounter adds up CommitStats as committed routing runs; it is safe for concurrent use.
type CommitCounter struct {
	mu sync.Mutex
	s  CommitStats
}

// NewCommitCounter counts for the MoE layers moeLayers (block indices, in order).
func NewCommitCounter(moeLayers []int) *CommitCounter {
	c := &CommitCounter{s: CommitStats{Layers: make([]CommitLayerStats, len(moeLayers))}}
	for j, l := range moeLayers {
		c.s.Layers[j].Layer = l
	}
	return c
}

// FirstByRouter counts a first MoE layer the router routed because no prediction was pending.
func (c *CommitCounter) FirstByRouter() {
	c.mu.Lock()
	c.s.FirstByRouter++
	c.mu.Unlock()
}

// Add counts a committed token of MoE layer j: correct of the experts it committed to are
// ones the router also chose, and adjusted says whether OWA adjusted their weights.
func (c *CommitCounter) Add(j, correct int, adjusted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := &c.s.Layers[j]
	st.Tokens++
	st.Correct += int64(correct)
	if correct == 0 {
		st.AllWrong++
	}
	if adjusted {
		st.OWA++
	}
}

// Stats are the counts so far.
func (c *CommitCounter) Stats() CommitStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s
	s.Layers = slices.Clone(s.Layers)
	return s
}
