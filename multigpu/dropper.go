package multigpu

import (
	"fmt"
	"sync"
)

// DropOptions are capacity-aware token drop on one device (seeds/000): in a pass of T >= 2
// tokens, an expert chosen by more than floor(Gamma * T * k / experts) of them computes only
// that many, chosen by Metric, and the others' choice of it contributes nothing (a token that
// loses every choice passes through the residual). Single-token passes never drop: their
// capacity would be under one token.
//
// With Devices > 1 the batch is planned as expert parallelism over that many devices with the
// experts placed round-robin: each device's contiguous share of the batch is capped on its
// own, as the paper's devices do before the all-to-all.
type DropOptions struct {
	Gamma  float64
	Metric DropMetric
	Seed   uint64 // for ByRandom
	// Expand is expanded drop: each token is also offered to the experts of its own device,
	// weighted by its gating score on the scale of its top-k weights, and may compute more
	// than k experts.
	Expand bool
	// DeviceLevel caps each device's experts together (n_l x the capacity) instead of each.
	DeviceLevel bool
	// Devices is the expert-parallel degree the plan assumes (0 or 1: one device).
	Devices int
}

// DropStats are capacity-aware token drop's counts since the model was opened.
type DropStats struct {
	// Choices are the top-k expert choices of the batched passes; Dropped those not
	// computed; Added the experts expanded drop computed beyond the top-k.
	Choices, Dropped, Added int64
}

// Dropper plans capacity-aware token drop (CapacityDrop) for the batches of a model on one
// device, over the round-robin placement of the devices its options assume, and counts what
// it dropped and added. It is safe for concurrent use.
type Dropper struct {
	policy CapacityDrop
	place  Placement
	mu     sync.Mutex
	stats  DropStats
}

// NewDropper checks o for a model of experts routed experts per MoE layer.
func NewDropper(o DropOptions, experts int) (*Dropper, error) {
	if !(o.Gamma >= 0) || o.Gamma > 1e6 {
		return nil, fmt.Errorf("capacity factor %v: want 0 or more", o.Gamma)
	}
	if !o.Metric.Valid() {
		return nil, fmt.Errorf("token drop: unknown metric %v", o.Metric)
	}
	if o.Devices < 0 || (experts > 0 && o.Devices > experts) {
		return nil, fmt.Errorf("token drop over %d devices: want 1 to the model's %d experts", o.Devices, experts)
	}
	d := &Dropper{policy: CapacityDrop{Gamma: o.Gamma, Metric: o.Metric, Seed: o.Seed, Expand: o.Expand, DeviceLevel: o.DeviceLevel}}
	if experts > 0 {
		var err error
		if d.place, err = RoundRobin(experts, max(o.Devices, 1)); err != nil {
			return nil, fmt.Errorf("token drop: %w", err)
		}
	}
	return d, nil
}

// Plan plans the drop of batch b (with Expand, b needs the gating scores Probs) and counts its
// choices, those it dropped and the experts it added.
func (d *Dropper) Plan(b Batch) (Schedule, error) {
	s, err := d.policy.Plan(b, d.place)
	if err != nil {
		return Schedule{}, err
	}
	d.mu.Lock()
	d.stats.Choices += int64(len(b.Choice))
	d.stats.Dropped += int64(s.Dropped)
	d.stats.Added += int64(s.Rerouted)
	d.mu.Unlock()
	return s, nil
}

// Stats are the counts so far.
func (d *Dropper) Stats() DropStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats
}
