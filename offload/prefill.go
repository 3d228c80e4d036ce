package offload

// The prompt's pipeline. A prompt's pass routes many tokens per layer, so that most of a
// layer's experts are needed, each for several tokens, and no single-token prediction helps.
//   - On a device that can weigh the host against a copy (device.Planner), every policy but
//     ondemand (the baseline) weighs each of a layer's misses: the host computes its tokens,
//     or it is copied and the device computes them, whichever finishes first behind the work
//     already planned (cpu-miss's weighing), so that the link and the host work side by side
//     with the device's resident experts. llama.cpp weighs a large batch's host experts the
//     same way: it copies their weights to the GPU when the batch is large enough.
//   - The pass goes through every layer once, so the experts it has used are the ones it no
//     longer needs: the offloader demotes them (Cache.Demote) and a copy evicts them
//     first, not the later layers' experts, which LRU would take and the pass is about to use.
//     On sim:rtx4090 this took cpu-miss's TTFT for a 128-token prompt of Qwen3-30B-A3B from 203
//     to 133 ms, and hot's of Mixtral-8x7B with the card's whole memory from 422 to 177 ms.
//
// It does not copy the next layer's likely experts while a layer computes. That was tried
// (prefillAhead in commit dd33a69: the experts at least half of such passes would need,
// judged by how often the layer chose each, weighed the same way) and cost TTFT on every
// shape measured (128-token prompts, bench --shape, default routing):
//   - dd33a69 against its parent's weighing alone, before the demotion: prefetch on
//     Qwen3-30B-A3B (sim:rtx4090, 12 GiB) 240 against 205 ms, on DeepSeek-V2-Lite
//     (sim:rtx2080ti, 5.5 GiB) 341 against 286 ms;
//   - its prefillAhead called from every policy's prompt pass on top of the demotion (not
//     committed): hot 149 against 133 ms and 204 against 179 ms.
// The link is the bottleneck of these passes, so a copy sent ahead moves no more bytes per
// second; it only decides with a guess of the tokens what the next layer's weighing decides
// with their routing, and takes from the host experts it would have served sooner. A variant
// limited to the link's idle time (not committed; it asked the simulated device when its
// kernels end, which a real card does not say) gained at most 1.5% on Qwen3's 512- and
// 2048-token prompts.

// weighedMisses is prefetch's and commit's host share: where prediction serves worst, in a
// prompt's pass and in each token's first MoE layer (predicted across tokens, issue 5: 0.44
// to 0.47 of its experts right, against 0.8 and more for the later layers), each miss is
// weighed as cpu-miss weighs it instead of stalling on its copy. Elsewhere, and on a device
// that cannot weigh, they copy every miss (nil). f's lock is held.
func weighedMisses(f *Offloader, layer int, experts, tokens []int) []bool {
	if f.planner == nil || !batched(tokens) && f.moeIdx[layer] != 0 {
		return nil
	}
	return cpuMiss{}.onHost(f, layer, experts, tokens)
}
