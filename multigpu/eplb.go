package multigpu

import (
	"fmt"
	"math"
	"slices"
)

// Balancedness is mean/max of per-device (or per-expert) load: 1 is perfectly balanced, and it
// falls towards 0 as one unit dominates (vLLM's metric, seeds/002). An idle set is balanced.
func Balancedness(load []float64) float64 {
	var sum, mx float64
	for _, v := range load {
		sum += v
		mx = max(mx, v)
	}
	if mx == 0 {
		return 1
	}
	return sum / float64(len(load)) / mx
}

// Straggler is the load of the busiest device: the layer ends when it does.
func Straggler(load []float64) float64 {
	var mx float64
	for _, v := range load {
		mx = max(mx, v)
	}
	return mx
}

// AllocateReplicas gives each expert one slot and every spare slot, one at a time, to the
// expert with the highest load per replica (EPLB's rule: replicate the current bottleneck;
// ties go to the lower expert).
func AllocateReplicas(load []float64, slots int) ([]int, error) {
	if err := checkLoads(load); err != nil {
		return nil, err
	}
	if slots < len(load) {
		return nil, fmt.Errorf("EPLB: %d slots for %d experts: want one per expert at least", slots, len(load))
	}
	rep := make([]int, len(load))
	for i := range rep {
		rep[i] = 1
	}
	for s := len(load); s < slots; s++ {
		best := 0
		for e := range load {
			if load[e]/float64(rep[e]) > load[best]/float64(rep[best]) {
				best = e
			}
		}
		rep[best]++
	}
	return rep, nil
}

// SplitReplicas spreads each expert's load evenly over its replicas and returns every slot's
// load and expert, experts in order.
func SplitReplicas(load []float64, replicas []int) (slotLoad []float64, slotExpert []int) {
	for e, r := range replicas {
		for range r {
			slotLoad = append(slotLoad, load[e]/float64(r))
			slotExpert = append(slotExpert, e)
		}
	}
	return slotLoad, slotExpert
}

// PackLPT assigns slots to devices longest-processing-time first: heaviest slot first, each to
// the least loaded device (lowest index on ties), within 4/3 of the optimal straggler. It
// returns each slot's device and each device's load.
func PackLPT(slotLoad []float64, devices int) (slotDevice []int, deviceLoad []float64, err error) {
	if devices < 1 {
		return nil, nil, fmt.Errorf("LPT: %d devices", devices)
	}
	if err := checkLoads(slotLoad); err != nil {
		return nil, nil, err
	}
	order := make([]int, len(slotLoad))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case slotLoad[a] > slotLoad[b]:
			return -1
		case slotLoad[a] < slotLoad[b]:
			return 1
		}
		return 0
	})
	slotDevice = make([]int, len(slotLoad))
	deviceLoad = make([]float64, devices)
	for _, s := range order {
		d := 0
		for i, l := range deviceLoad {
			if l < deviceLoad[d] {
				d = i
			}
		}
		slotDevice[s] = d
		deviceLoad[d] += slotLoad[s]
	}
	return slotDevice, deviceLoad, nil
}

// EPLBPlan is a placement of replicated experts on devices.
type EPLBPlan struct {
	Replicas   []int // per expert
	SlotExpert []int // per physical slot
	SlotDevice []int
	DeviceLoad []float64 // the load each device computes, an expert's split evenly over its replicas
}

// PlanEPLB replicates the experts of a measured load (tokens per expert, e.g. over a window of
// recent batches) into slots physical slots and packs them onto devices (seeds/002: DeepSeek's
// EPLB global policy, without node groups).
func PlanEPLB(load []float64, slots, devices int) (EPLBPlan, error) {
	rep, err := AllocateReplicas(load, slots)
	if err != nil {
		return EPLBPlan{}, err
	}
	if slots < devices {
		return EPLBPlan{}, fmt.Errorf("EPLB: %d slots for %d devices: every device needs a slot", slots, devices)
	}
	sl, se := SplitReplicas(load, rep)
	sd, dl, err := PackLPT(sl, devices)
	if err != nil {
		return EPLBPlan{}, err
	}
	return EPLBPlan{Replicas: rep, SlotExpert: se, SlotDevice: sd, DeviceLoad: dl}, nil
}

func checkLoads(load []float64) error {
	if len(load) == 0 {
		return fmt.Errorf("no loads")
	}
	for i, v := range load {
		if !(v >= 0) || math.IsInf(v, 0) {
			return fmt.Errorf("load %d is %v: want a finite load >= 0", i, v)
		}
	}
	return nil
}
