//go:build race

package plan_test

// raceEnabled: under the race detector the plans of the large public
// traces are left out (ten times slower there, the same code as without
// it); the bundled trace's plans keep Make's two plans side by side, its
// one concurrent part, under the detector.
const raceEnabled = true
