//go:build race

package chameleon_test

// policyRace: under the race detector the policy-file tests keep the
// bundled trace only, and the fault tests a few faults; the public-trace
// replays are ten times slower there.
const policyRace = true
