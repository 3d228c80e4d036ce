//go:build !linux

package models

// mapNoReserve: other systems do not count untouched anonymous memory.
const mapNoReserve = 0
