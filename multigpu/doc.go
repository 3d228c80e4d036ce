// Package multigpu will hold expert parallelism across GPUs: capacity planning and token
// drop, MACS, HarMoEny rebalancing and EPLB replica placement. Nothing lives here yet.
package multigpu
