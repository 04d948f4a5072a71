// Package chameleon lets a training or inference process hosted in Go fit in
// less accelerator memory: it swaps idle tensors to pinned host memory and
// brings them back in time, and keeps doing so when the operator sequence
// changes from one iteration to the next (skipped mixed-precision steps,
// dropped layers, MoE routing, varying sequence lengths).
//
// # Where to start
//
// Open a device, then an Engine over it, then run each step as an
// iteration of ops:
//
//	dev, err := host.New(1 << 30) // device/host: pure Go; device/cuda, device/ascend: accelerators
//	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(256<<20))
//	defer eng.Close()
//	it := eng.Begin()
//	out, err := eng.NewTensor(size, chameleon.Activation, "float32", shape)
//	op := chameleon.Op{Name: "aten::mm", In: ins, Out: []*chameleon.Tensor{out}}
//	it.Before(&op) // inputs resident; kernels read t.Ptr() on eng.ComputeStream()
//	it.After(&op)
//	eng.Release(dead)
//	res := it.End()
//
// host.New (package device/host) makes the pure-Go device, [New] the
// Engine over a device; [Open] is the same with the device an option
// ([WithDevice]), and without it opens the first accelerator whose runtime
// loads (CUDA, then Ascend). [Engine.BeginContext] parents the Engine's
// spans under the host's own (a service's request, a trainer's step), and
// [WithLogger] takes what CHAMELEON_DEBUG prints. ExampleNew
// (go doc -all, or pkg.go.dev) is a whole loop that swaps, and
// examples/embed in the repository is one that builds and runs as a
// program.
//
// # Concurrency
//
// An Engine may be shared by goroutines: NewTensor, Release, Stats, Stage,
// Close, Begin and the Iteration's Before, After and End lock the Engine and
// run one at a time. The ops of an iteration are one sequence: issue Begin,
// each op's Before and After, and End from one goroutine (or in an order
// the goroutines agree on). Other goroutines may allocate and release
// tensors meanwhile, a data loader's inputs say; a tensor allocated while
// an op runs (between its Before and After) never moves that op's tensors.
// SavePolicies, LoadPolicies and their file forms must not overlap other
// calls. A Tensor's Ptr is read without the lock: call it inside the op
// that lists the tensor, as its documentation says. Handles are never
// reused: releasing a tensor twice does nothing, and an op that lists a
// released tensor is an error, however many tensors were made since.
//
// # Planning off the step
//
// Which policy is in force, and when to profile and plan, is decided by a
// pure state machine (internal/controller) from what each iteration showed.
// A plan it asks for runs on the Engine's worker while iterations go on:
// End never waits for it (nor for a rank's policy broadcast), and the
// policy is taken at the end of the first iteration after it is ready,
// applied from the next when its sequence is still the one running (it
// enters the cache either way). Close cancels planning between the plans
// it tries and waits for the worker. [WithSyncPlanning] makes End wait, so
// that each policy applies from the iteration right after its profile
// whatever the machine's speed, as a replay needs.
//
// # Stages
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
package chameleon
