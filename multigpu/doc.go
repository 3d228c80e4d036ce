// Package multigpu is expert parallelism across devices: how one MoE layer's batch of tokens is
// spread over the devices that hold its experts, and the policies that fight the straggler (the
// most loaded device sets the layer's latency). A Policy turns a Batch and a Placement into a
// Schedule (which device computes which token's expert, which experts are fetched, what is
// dropped): round-robin placement (Static), capacity-aware token drop, expanded drop and
// device-level capacity (seeds/000), MACS (seeds/001), EPLB replicas (seeds/002) and HarMoEny
// rebalancing (seeds/004). It plans and models time (Cluster, Simulate), and its transports
// (Comm) move the tokens between the ranks of an executed run: in-process (LocalGroup), on a
// modelled link (Modelled), or between CUDA GPUs with NCCL (NCCLGroup). A Dropper plans token
// drop for the batched passes of a model on one device (DropOptions), counting what it dropped.
package multigpu
