package autoplace

import (
	"errors"
	"testing"

	"github.com/commit-run/commit-run/offload"
)

// A real card finds the profile of its kind by the name the driver gives it.
func TestProfileOfKind(t *testing.T) {
	for _, c := range []struct{ driver, want string }{
		{"NVIDIA GeForce RTX 4090", "rtx4090"},
		{"NVIDIA GeForce RTX 2080 Ti", "rtx2080ti"},
		{"NVIDIA GeForce RTX 2080", "rtx2080"},
		{"NVIDIA H100 PCIe", "h100-pcie"},
		{"NVIDIA H200", "h200"},
		{"Tesla T4", ""},
		{"NVIDIA GeForce RTX 2080 SUPER", ""},
	} {
		p := profileOfKind(c.driver)
		got := ""
		if p != nil {
			got = p.Name
		}
		if got != c.want {
			t.Errorf("%q: profile %q, want %q", c.driver, got, c.want)
		}
	}
}

// TestAutoChoose: the fastest candidate, or within tie of it the quickest to the first
// token; resident whenever every expert fits; never one that failed.
func TestAutoChoose(t *testing.T) {
	cand := func(p offload.Policy, n int, rate, ttft float64) Candidate {
		return Candidate{Offload: offload.Options{Policy: p, HostLayers: n}, TokensPerSecond: rate, TTFT: ttft}
	}
	failed := cand(offload.CPUMiss, 0, 0, 0)
	failed.Err = errors.New("too small")
	for _, c := range []struct {
		name  string
		cands []Candidate
		want  int // index into cands, -1: an error
	}{
		{"fastest", []Candidate{cand(offload.OnDemand, 0, 10, 0.1), cand(offload.Hot, 0, 20, 0.3)}, 1},
		{"close and quicker to the first token", []Candidate{cand(offload.StaticCache, 14, 59.6, 0.40), cand(offload.Hot, 0, 58.3, 0.15)}, 1},
		{"quicker but too slow", []Candidate{cand(offload.StaticCache, 14, 59.6, 0.40), cand(offload.Hot, 0, 57.0, 0.15)}, 0},
		{"resident wins", []Candidate{cand(offload.Hot, 0, 90, 0.1), cand(offload.Static, 0, 80, 0.2)}, 1},
		{"a failed one is never chosen", []Candidate{failed, cand(offload.OnDemand, 0, 10, 0.5)}, 1},
		{"none ran", []Candidate{failed}, -1},
	} {
		p := &Plan{Candidates: c.cands}
		err := p.choose()
		if c.want < 0 {
			if err == nil {
				t.Errorf("%s: chose %v, want an error", c.name, p.Chosen)
			}
			continue
		}
		if err != nil || p.Chosen.Offload != c.cands[c.want].Offload {
			t.Errorf("%s: chose %v (%v), want %v", c.name, p.Chosen, err, c.cands[c.want])
		}
	}
}
