//go:build race

package replay_test

// raceEnabled: under the race detector the public-trace replays keep the
// bundled trace only; they are single-goroutine loops ten times slower there.
const raceEnabled = true
