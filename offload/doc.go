// Package offload is expert offloading (DESIGN.md §2 and §4 in the shared notes): the
// Offloader, which serves a model's routed experts from device slots or host memory under one
// of the policies, and the parts it is made of, which know no device and no forward pass. The
// engine's MoE block asks it where each expert computes (engine/placement.go).
//
//   - Offloader (offloader.go): sizes the slots from the budget, copies the experts that miss
//     on the device's copy stream, predicts the next layer's with a heuristic when no Commit
//     Router does, and counts what it did (Stats).
//   - The policies, one small type each (policy_*.go), answering the offloader's questions
//     (strategy.go): which experts the host computes, what loads ahead, what fills the slots
//     at open; and how a prompt's misses are weighed between host and copy (prefill.go).
//   - Store: every routed expert in one contiguous host region each, so that one copy loads an
//     expert into a slot and the whole store can be pinned at once; or views of the model
//     file's memory map (ZeroCopy), or address space that nothing backs (Reserved, for
//     timing-only runs).
//   - Cache: which device slot each expert occupies and which resident expert gives its slot
//     up (LRU or LFU, deterministic, pinned experts exempt), as pure bookkeeping: it moves no
//     bytes.
//   - Policy: the names of the policies (ondemand, prefetch, commit, cpu-miss, static,
//     static-cache, hot, auto).
//   - Modelled predictors standing in for the Commit Router in timing-only runs (Oracle,
//     Accuracy), and MostUsed, the ranking of the frequency heuristic.
//   - Shape and FileShape: the cost of one decode token of a model file by parts (a public
//     shape's is its synth file's), which the expert-parallel benchmark's cost model prices
//     (timing-only runs of one device go through the engine itself).
package offload
