// Package offload will hold the host expert store (pinned host RAM), the device expert-slot
// cache with its replacement policies, and the copy scheduling that streams experts over PCIe
// (see DESIGN.md §2 and §4 in the shared notes).
//
// What exists so far: Store, every routed expert in one contiguous host region each (one copy
// loads an expert into a slot; the whole store can be pinned at once), and the slot cache as
// pure bookkeeping: Cache decides which device slot
// each expert occupies and which resident expert gives its slot up (LRU or LFU, deterministic,
// pinned experts exempt); it moves no bytes and knows no device.
package offload
