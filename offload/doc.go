// Package offload holds the parts of expert offloading that know no device and no forward
// pass (DESIGN.md §2 and §4 in the shared notes); the engine's offloader and its policies
// (engine/placement.go, engine/policy_*.go) put them to work.
//
//   - Store: every routed expert in one contiguous host region each, so that one copy loads an
//     expert into a slot and the whole store can be pinned at once; or views of the model
//     file's memory map (ZeroCopy), or address space that nothing backs (Reserved, for
//     timing-only runs).
//   - Cache: which device slot each expert occupies and which resident expert gives its slot
//     up (LRU or LFU, deterministic, pinned experts exempt), as pure bookkeeping: it moves no
//     bytes.
//   - Policy: the names of the four expert policies (ondemand, prefetch, commit, cpu-miss).
//   - Modelled predictors standing in for the Commit Router in timing-only runs (Oracle,
//     Accuracy), and MostUsed, the ranking of the frequency heuristic.
//   - Shape and PublicShape: the cost of one decode token of a model by parts, which the
//     expert-parallel benchmark's cost model prices (timing-only runs of one device go
//     through the engine itself).
package offload
