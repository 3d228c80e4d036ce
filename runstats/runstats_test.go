package runstats

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/offload"
)

// A run's row: the mean and percentiles of its steps' latencies, the hit rate over the
// experts needed, and no accuracy without predictions, which JSON writes as null.
func TestSummarise(t *testing.T) {
	st := []offload.TokenStats{
		{Latency: 0.3, Limit: 0.1, Hits: 3, Misses: 1},
		{Latency: 0.1, Limit: 0.1, Hits: 4},
		{Latency: 0.2, Limit: 0.1, Hits: 1, Misses: 3},
	}
	r := Summarise("ondemand", 64, st)
	if math.Abs(r.Mean-0.2) > 1e-12 || r.P50 != 0.2 || r.P90 != 0.3 || r.HitRate != 8.0/12 || r.Slots != 64 {
		t.Errorf("row %+v", r)
	}
	if math.Abs(r.OverLimit-2) > 1e-12 || !math.IsNaN(r.Accuracy) {
		t.Errorf("over the limit %v, accuracy %v", r.OverLimit, r.Accuracy)
	}
	b, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(b), `"Accuracy":null`) {
		t.Errorf("JSON %s, %v", b, err)
	}
}

// A step's limit is the largest of its compute, its bytes over the link and the host's reads
// over host memory.
func TestStep(t *testing.T) {
	a := Snapshot{T: 1}
	b := Snapshot{T: 1.5, Off: offload.Stats{NeededBytes: 100, HostBytes: 40}}
	b.Dev.ComputeBusy = 0.2
	if got := Step(a, b, 400, 0).Limit; got != 0.25 {
		t.Errorf("link-bound limit %v, want 0.25", got)
	}
	if got := Step(a, b, 400, 100).Limit; got != 0.4 {
		t.Errorf("host-bound limit %v, want 0.4", got)
	}
	if got := Step(a, b, 0, 0); got.Limit != 0.2 || got.Latency != 0.5 {
		t.Errorf("compute-bound step %+v", got)
	}
}
