//go:build !race

package chameleon_test

const policyRace = false
