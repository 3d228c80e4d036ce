// Package owa will hold Output Weight Adjustment: pure functions that repair the mixing
// weights when committed expert predictions miss, plus per-model α1/α2 settings. Nothing lives
// here yet.
package owa
