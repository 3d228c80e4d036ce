package multigpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// Cluster is the modelled hardware of expert parallelism: Devices identical devices, each
// with its compute rate and memory bandwidth, a link to every other device for the
// all-to-all, and a link to the host that holds every expert's weights.
type Cluster struct {
	Devices int
	FLOPS   float64 // per device, FLOP/s
	MemBW   float64 // device memory, bytes/s
	// LinkBW is what one device sends (and, at once, receives) to the others in an
	// all-to-all, bytes/s; LinkLatency the fixed cost of one all-to-all.
	LinkBW      float64
	LinkLatency float64
	// HostBW is the host-to-device rate of a fetch from host memory (PCIe), bytes/s.
	HostBW float64
	// Launch is the fixed cost of one expert's kernels.
	Launch float64
}

// ExpertCost is the size of one expert of a layer: the bytes of its weights as stored (what a
// computation reads and a fetch copies), the FLOPs of one token through it, and the bytes of
// one token's hidden state (what the all-to-all moves each way).
type ExpertCost struct {
	WeightBytes   float64
	FLOPsPerToken float64
	TokenBytes    float64
	// ElementBytes is the bytes of one weight element as stored (HarMoEny's d_type; 4.5/8
	// for Q4_K).
	ElementBytes float64
}

// LayerTime is the modelled time of one MoE layer under a schedule, in seconds.
type LayerTime struct {
	// Dispatch and Combine are the two all-to-alls; each ends when its busiest device's
	// link does.
	Dispatch, Combine float64
	// Compute is each device's expert work after the dispatch, waits for fetched experts
	// included; Straggler the longest.
	Compute   []float64
	Straggler float64
	// Total is the layer: dispatch, the straggler, combine.
	Total float64
}

// Check validates a cluster and an expert's cost.
func (c Cluster) Check(x ExpertCost) error {
	for _, v := range []struct {
		name string
		v    float64
		pos  bool
	}{
		{"FLOPS", c.FLOPS, true}, {"memory bandwidth", c.MemBW, true}, {"link bandwidth", c.LinkBW, true},
		{"host bandwidth", c.HostBW, true}, {"link latency", c.LinkLatency, false}, {"launch", c.Launch, false},
		{"expert bytes", x.WeightBytes, false}, {"FLOPs per token", x.FLOPsPerToken, false}, {"token bytes", x.TokenBytes, false},
	} {
		if math.IsNaN(v.v) || math.IsInf(v.v, 0) || v.v < 0 || (v.pos && v.v == 0) {
			return fmt.Errorf("cluster: %s %v", v.name, v.v)
		}
	}
	if c.Devices < 1 {
		return fmt.Errorf("cluster: %d devices", c.Devices)
	}
	return nil
}

// Time models one MoE layer under s: each device receives its tokens, then computes each
// expert it was given (a roofline of reading the expert's weights against its tokens' FLOPs,
// plus a launch), experts it holds first and fetched ones after, each fetched one no sooner
// than its copy (issued at the layer's start, one at a time per device) has landed; then the
// results go back. The all-to-alls synchronise every device, so the layer ends with the
// straggler.
func (c Cluster) Time(s Schedule, x ExpertCost) (LayerTime, error) {
	if err := c.Check(x); err != nil {
		return LayerTime{}, err
	}
	if s.Devices != c.Devices {
		return LayerTime{}, fmt.Errorf("cluster of %d devices for a schedule on %d", c.Devices, s.Devices)
	}
	D := c.Devices
	send, recv := make([]float64, D), make([]float64, D)
	tokens := make([]map[int]int, D) // per device, tokens per expert
	for d := range tokens {
		tokens[d] = map[int]int{}
	}
	for _, a := range s.Assign {
		if a.From != a.To {
			send[a.From]++
			recv[a.To]++
		}
		tokens[a.To][a.Expert]++
	}
	a2a := func() float64 {
		var t float64
		for d := range D {
			t = max(t, max(send[d], recv[d])*x.TokenBytes/c.LinkBW)
		}
		if t > 0 {
			t += c.LinkLatency
		}
		return t
	}
	lt := LayerTime{Dispatch: a2a(), Compute: make([]float64, D)}
	lt.Combine = lt.Dispatch // the results retrace the tokens' way back
	fetchDone := make([]map[int]float64, D)
	for d := range fetchDone {
		fetchDone[d] = map[int]float64{}
	}
	linkFree := make([]float64, D)
	for _, f := range s.Fetches {
		bw := c.LinkBW
		if f.From == Host {
			bw = c.HostBW
		}
		linkFree[f.To] += x.WeightBytes / bw
		fetchDone[f.To][f.Expert] = linkFree[f.To]
	}
	for d := range D {
		experts := make([]int, 0, len(tokens[d]))
		for e := range tokens[d] {
			experts = append(experts, e)
		}
		// Held experts first, then fetched ones in the order their copies land.
		slices.SortFunc(experts, func(a, b int) int {
			fa, oka := fetchDone[d][a]
			fb, okb := fetchDone[d][b]
			switch {
			case oka != okb:
				if oka {
					return 1
				}
				return -1
			case oka:
				return cmp.Compare(fa, fb)
			}
			return cmp.Compare(a, b)
		})
		t := lt.Dispatch
		for _, e := range experts {
			if f, ok := fetchDone[d][e]; ok {
				t = max(t, f)
			}
			n := float64(tokens[d][e])
			t += c.Launch + max(x.WeightBytes/c.MemBW, n*x.FLOPsPerToken/c.FLOPS)
		}
		lt.Compute[d] = t - lt.Dispatch
		lt.Straggler = max(lt.Straggler, lt.Compute[d])
	}
	lt.Total = lt.Dispatch + lt.Straggler + lt.Combine
	return lt, nil
}
