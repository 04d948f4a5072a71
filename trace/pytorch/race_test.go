//go:build race

package pytorch

// raceEnabled: under the race detector the tests that read a gigabyte skip.
const raceEnabled = true
