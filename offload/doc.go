// Package offload will hold the host expert store (pinned host RAM), the device expert-slot
// cache with its replacement policies, and the copy scheduling that streams experts over PCIe.
// It is empty until the offloading engine lands (see DESIGN.md §2 and §4 in the shared notes).
package offload
