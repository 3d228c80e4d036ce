package engine

import (
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/device"
)

// checkHostOnly refuses a model that needs what only the host's operations compute
// (models.Model.HostOnly: gpt-oss's sliding window, sinks, biased router and experts and its
// activation) where the passes would not compute on the host: on a device with kernels of
// its own (a GPU), which would leave them out and run another model, and under expert
// parallelism, whose ranks compute the experts their own way. The CPU and the simulated GPU
// (whose numbers are the CPU's) run it.
func (m *Model) checkHostOnly() error {
	missing := m.arch.HostOnly()
	if len(missing) == 0 {
		return nil
	}
	what := strings.Join(missing, ", ")
	if m.opts.EP != nil {
		return fmt.Errorf("expert parallelism does not compute %s's %s yet: run it on one device", m.arch.Config.Arch, what)
	}
	_, ops := m.dev.(device.Ops)
	_, routed := m.dev.(device.RoutedMoE)
	_, fused := m.dev.(device.Fused)
	if ops || routed || fused {
		return fmt.Errorf("%s has no kernels for %s's %s: run it on the CPU", m.dev.Name(), m.arch.Config.Arch, what)
	}
	return nil
}
