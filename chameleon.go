// Package chameleon lets a training or inference process hosted in Go fit in
// less accelerator memory: it swaps idle tensors to pinned host memory and
// brings them back in time, and keeps doing so when the operator sequence
// changes from one iteration to the next (skipped mixed-precision steps,
// dropped layers, MoE routing, varying sequence lengths).
//
// The work is a pipeline of stages, each its own package:
//
//	Encode, Detect (seq) -> Group (layer, memory) -> Plan (mre) -> Simulate (simulate) -> Execute (device)
//
// Every stage before Execute is a pure function of its inputs, so a plan can
// be made, tested and inspected from a recorded trace (package trace, and
// the chameleon command) as well as live. Package plan joins Group, Plan and
// Simulate into the one planning path: the Engine plans a profiled
// iteration with plan.Make, and so does the chameleon command.
//
// Start with a device (device/host.New for the pure-Go backend, device/cuda
// or device/ascend for an accelerator), then New; ExampleNew shows a loop.
package chameleon
