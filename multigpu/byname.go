package multigpu

import (
	"fmt"
	"strings"
)

// PolicyNames lists the planners NewPolicy makes, by the names --ep-policy takes.
func PolicyNames() []string {
	return []string{"round-robin", "token-drop", "token-drop/device", "expanded-drop", "expanded-drop/device", "harmoeny", "eplb", "macs", "macs-expanded"}
}

// PolicyEnv is what a planner is made for: a layer's experts over the devices, the machine,
// and the options of the capacity-aware planners.
type PolicyEnv struct {
	Experts, Devices int
	// Gamma, Metric and Seed are the capacity factor, drop metric and random drop's seed of
	// the capacity-aware planners.
	Gamma  float64
	Metric DropMetric
	Seed   uint64
	// Cluster and Cost are the machine and an expert's cost that HarMoEny weighs.
	Cluster Cluster
	Cost    ExpertCost
	// HarMoEnyQ is HarMoEny's token threshold q (0: eq. 4 from Cluster and Cost).
	HarMoEnyQ int
	// Eta weighs semantic affinity in MACS's rerouting; the batches carry the affinities.
	Eta float64
	// Calibrate draws a batch of a layer that is not measured, for MACS's expert classes;
	// nil: no calibration (every expert shared).
	Calibrate func(layer int) (Batch, error)
}

// NewPolicy makes a planner by name (PolicyNames).
func NewPolicy(name string, env PolicyEnv) (Policy, error) {
	switch name {
	case "round-robin":
		return Static{}, nil
	case "token-drop", "token-drop/device", "expanded-drop", "expanded-drop/device":
		return CapacityDrop{Gamma: env.Gamma, Metric: env.Metric, Seed: env.Seed,
			Expand: strings.HasPrefix(name, "expanded"), DeviceLevel: strings.HasSuffix(name, "/device")}, nil
	case "harmoeny":
		return HarMoEny{Threshold: env.HarMoEnyQ, Cluster: env.Cluster, Cost: env.Cost}, nil
	case "macs", "macs-expanded":
		base := DefaultMACS(env.Gamma)
		base.Expand = name == "macs-expanded"
		base.Eta = env.Eta
		return &macsLayers{name: name, base: base, calibrate: env.Calibrate, classes: map[int][]ExpertClass{}}, nil
	case "eplb":
		// Spare slots for a quarter of the experts (at least one per device), re-planned
		// every 4 batches from the last 4.
		return NewEPLB(env.Experts+max(env.Devices, env.Experts/4), 4, 4)
	}
	return nil, fmt.Errorf("expert-parallel policy %q: want one of %s", name, strings.Join(PolicyNames(), ", "))
}

// macsLayers is MACS with each layer's experts classed visual, text or shared from a
// calibration batch of that layer, made the first time the layer is planned.
type macsLayers struct {
	name      string
	base      MACS
	calibrate func(layer int) (Batch, error)
	classes   map[int][]ExpertClass
}

func (x *macsLayers) Name() string { return x.name }

func (x *macsLayers) Plan(b Batch, p Placement) (Schedule, error) {
	cls, ok := x.classes[b.Layer]
	if !ok && x.calibrate != nil {
		cb, err := x.calibrate(b.Layer)
		if err != nil {
			return Schedule{}, err
		}
		counts, tokens, err := ActivationCounts(cb)
		if err != nil {
			return Schedule{}, err
		}
		// The paper's margin of 0.1 is on frequencies that average k/experts per token; we
		// scale it to half that mean, so that a 3:1 preference of one modality shows.
		if cls, err = ClassifyExperts(counts, tokens, 0.5*float64(b.K)/float64(b.Experts)); err != nil {
			return Schedule{}, err
		}
	}
	x.classes[b.Layer] = cls
	m := x.base
	m.Classes = cls
	return m.Plan(b, p)
}
