package predictor

import (
	"math"
	"testing"
)

// The counter adds each committed token to its MoE layer, and Stats is a copy the counter
// does not change afterwards.
func TestCommitCounter(t *testing.T) {
	c := NewCommitCounter([]int{1, 3})
	c.Add(0, 2, true)
	c.Add(0, 0, false)
	c.Add(1, 1, false)
	c.FirstByRouter()
	st := c.Stats()
	want := []CommitLayerStats{{Layer: 1, Tokens: 2, Correct: 2, AllWrong: 1, OWA: 1}, {Layer: 3, Tokens: 1, Correct: 1}}
	if len(st.Layers) != 2 || st.Layers[0] != want[0] || st.Layers[1] != want[1] || st.FirstByRouter != 1 {
		t.Fatalf("stats %+v, want layers %+v and one first layer by the router", st, want)
	}
	c.Add(1, 2, true)
	if st.Layers[1] != want[1] {
		t.Errorf("a later count changed an earlier copy: %+v", st.Layers[1])
	}
	if a := st.Layers[0].Accuracy(2); a != 0.5 {
		t.Errorf("accuracy %v, want 0.5", a)
	}
	if a := (CommitLayerStats{}).Accuracy(2); !math.IsNaN(a) {
		t.Errorf("accuracy of no tokens %v, want NaN", a)
	}
}
