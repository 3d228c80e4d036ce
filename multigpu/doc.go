// Package multigpu is expert parallelism across devices: how one MoE layer's batch of tokens is
// spread over the devices that hold its experts, and the policies that fight the straggler (the
// most loaded device sets the layer's latency). It plans; it moves nothing and knows nothing
// of devices: capacity-aware token drop (seeds/000), EPLB replica placement (seeds/002), and,
// to come, expanded drop, device-level capacity, MACS and HarMoEny rebalancing.
package multigpu
