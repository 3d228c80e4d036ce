//go:build !linux

package engine

// mapNoReserve: other systems do not count untouched anonymous memory.
const mapNoReserve = 0
