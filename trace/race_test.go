//go:build race

package trace_test

// raceEnabled: under the race detector the tests that read a gigabyte skip.
const raceEnabled = true
