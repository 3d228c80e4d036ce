package engine

import (
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/device"
)

// checkFeatures refuses a model that needs what only some devices compute
// (models.Model.Features: gpt-oss's sliding window, sinks, biased router and experts and its
// activation; Qwen3.5's DeltaNet layers, gated attention output and sigmoid shared gate) where
// the passes would not compute it: on a device with kernels of its own that does not say it
// computes them (device.Featured; the CUDA GPU computes them all), which would leave them out
// and run another model. The CPU and the simulated GPU (whose numbers are the CPU's) run
// every model, and so do expert parallelism's ranks, whose experts are the engine's
// (expertFFN) on each rank's device.
func (m *Model) checkFeatures() error {
	needs := m.arch.Features()
	if len(needs) == 0 {
		return nil
	}
	_, ops := m.dev.(device.Ops)
	_, routed := m.dev.(device.RoutedMoE)
	_, fused := m.dev.(device.Fused)
	if !ops && !routed && !fused {
		return nil
	}
	fd, _ := m.dev.(device.Featured)
	var missing []device.Feature
	for _, f := range needs {
		if fd == nil || !fd.Computes(f) {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s has no kernels for %s's %s: run it on the CPU", m.dev.Name(), m.arch.Config.Arch, joinFeatures(missing))
	}
	return nil
}

func joinFeatures(fs []device.Feature) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = string(f)
	}
	return strings.Join(s, ", ")
}
