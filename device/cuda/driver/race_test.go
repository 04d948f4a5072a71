//go:build race

package driver_test

// raceEnabled: sync.Pool drops items at random under the race detector, so
// allocation counts do not hold there.
const raceEnabled = true
