//go:build race

package main

// raceEnabled: under the race detector the public-trace tests keep one
// trace beside the bundled one; the planning they repeat is single-threaded
// and costs ten times its normal time there.
const raceEnabled = true
