//go:build race

package cpu

// raceEnabled: the race detector allocates on its own account.
const raceEnabled = true
