//go:build race

package main

// raceEnabled: the test binary runs under -race, so the sidecar binary the
// end-to-end tests run is race-built too.
const raceEnabled = true
