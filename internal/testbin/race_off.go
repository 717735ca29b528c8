//go:build !race

package testbin

// RaceEnabled: this binary runs under the race detector.
const RaceEnabled = false
