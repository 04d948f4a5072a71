//go:build !longreplay

package main

// checkPlanDoc: docs/plan.md is checked against the head's plans in the
// long step only (long_test.go), which has the time for the laid-out plans.
const checkPlanDoc = false
