//go:build race

package nccl

// The race detector makes sync.Pool drop items at random, and purego pools its call
// frames: allocation counts mean nothing then.
func init() { raceEnabled = true }
