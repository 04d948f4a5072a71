// Package trace holds the data model every chameleon stage shares (operators,
// tensors, iterations) and the readers for recorded traces.
//
// The model is deliberately plain: slices of values in execution order, tensor
// ids that name storages, and optional measurements (durations, the recorded
// allocated-bytes curve) that are zero or flagged absent when the source did
// not record them. Stages derive whatever indices they need from it.
//
// The readers (ReadFile and Reader for optrace/v1, ReadKernels for
// optrace-kernels/v1) bound what a file may cost, so that a damaged or
// hostile file, a small gzip that inflates to gigabytes, is refused with a
// ParseError naming the file, the line and the field once a limit is read,
// and never costs more than a small multiple of what it legitimately holds.
// Per line: MaxLineBytes (16 MiB), MaxShapeDims (64), MaxOpTensors
// (1,048,576 in each of in and out), MaxBytes (4 TiB). Per file:
// MaxFileBytes (1 GiB decompressed), MaxFileTensors (524,288 storages),
// MaxFileDims (2,097,152 shape dims), MaxFileOps (1,048,576),
// MaxFileRefs (4,194,304 tensor references), MaxFileIterations (65,536),
// MaxFileStrings (65,536 distinct strings) of MaxFileStringBytes (8 MiB).
// A kernels file: MaxKernelsBytes (8 MiB decompressed), MaxKernelOps
// (262,144). Each limit is 20 times or more what the largest recorded
// trace reaches; see the constants. Package pytorch bounds its imports
// likewise.
//
// Values that parse but make nonsense are refused the same way: iteration
// indices that are negative, repeat or go back, and a time or a declared
// cost that is negative or over its cap: MaxIterMS (a day) for an
// iteration's times, MaxOpUS (an hour) for an op's, MaxOpFLOPs (1e21) and
// MaxOpIOBytes (1e18) for an op's declared FLOPs and bytes.
package trace

import (
	"fmt"
)

// TensorID names one storage (one device allocation). Views and in-place
// results keep the id of the storage they alias; a fresh allocation gets a
// fresh id even when its address was used before.
type TensorID int64

// Phase is the part of a training step an operator belongs to.
type Phase uint8

// Phases of an iteration.
const (
	PhaseUnknown Phase = iota
	PhaseForward
	PhaseBackward
	PhaseOptimizer
)

var phaseNames = [...]string{"unknown", "fwd", "bwd", "opt"}

// String returns the trace spelling of the phase ("fwd", "bwd", "opt").
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", p)
}

// ParsePhase maps a trace spelling to a Phase.
func ParsePhase(s string) (Phase, bool) {
	switch s {
	case "fwd":
		return PhaseForward, true
	case "bwd":
		return PhaseBackward, true
	case "opt":
		return PhaseOptimizer, true
	}
	return PhaseUnknown, false
}

// Kind says what a storage holds, which decides whether it lives across
// iterations.
type Kind uint8

// Tensor kinds.
const (
	KindActivation Kind = iota // produced by an operator of the iteration
	KindParam                  // a model parameter: lives across iterations
	KindOptState               // optimizer state: lives across iterations
	KindInput                  // an input batch or constant handed in by the host
)

var kindNames = [...]string{"act", "param", "opt", "input"}

// String returns the trace spelling of the kind.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// ParseKind maps a trace spelling to a Kind.
func ParseKind(s string) (Kind, bool) {
	for i, n := range kindNames {
		if n == s {
			return Kind(i), true
		}
	}
	return 0, false
}

// Persistent reports whether tensors of this kind outlive one iteration
// regardless of their uses.
func (k Kind) Persistent() bool { return k == KindParam || k == KindOptState }

// Tensor is one storage.
type Tensor struct {
	ID    TensorID
	Bytes int64   // storage size in bytes
	DType string  // e.g. "bfloat16"
	Shape []int64 // of the first tensor seen on the storage
	Kind  Kind
	Ptr   uint64 // device address when recorded, else 0
	// Frozen marks a parameter no op writes during the run (no gradient, no
	// optimizer update: LoRA base weights, every weight at inference): a
	// host copy of it never goes stale, so moving it off the device copies
	// nothing out.
	Frozen bool
	// Line is the line of the trace file that declared the storage (from
	// 1), 0 when it was not read from a line-oriented file: errors about
	// the tensor in later stages point back at it.
	Line int
}

// Op is one operator call.
type Op struct {
	Seq      int    // index inside the iteration, from 0
	Name     string // e.g. "aten::mm"
	Overload string // e.g. "default"
	Phase    Phase
	// Module is the call-stack identity of the op: the nn.Module path that
	// ran it, in backward "path#AutogradNode". Empty when unknown.
	Module string
	In     []TensorID
	Out    []TensorID
	// DurUS is the measured duration in microseconds, 0 when unknown.
	DurUS float64
	// Mem is the recorded allocated bytes after the op, -1 when unknown.
	Mem int64
	// FLOPs and IOBytes are costs a host may declare for its own operators;
	// 0 when unknown. Time estimation uses them when the op name is not one
	// it has a model for.
	FLOPs   float64
	IOBytes float64
	// Line is the line of the trace file the op was read from (from 1), 0
	// when it was not read from a line-oriented file.
	Line int
}

// Iteration is one training step: its operators in execution order and what
// was measured about it.
type Iteration struct {
	Index int
	Ops   []Op
	// Tensors holds every storage an op of this iteration reads or writes.
	// The pointers are shared with other iterations of the same trace.
	Tensors map[TensorID]*Tensor
	SeqLen  int
	// PeakBytes is the allocator's peak during the iteration (including
	// transient workspaces inside ops), 0 when unknown.
	PeakBytes int64
	// TimeMS is the iteration time measured without instrumentation: the
	// real step time. WallMS is the instrumented time. 0 when unknown.
	TimeMS float64
	WallMS float64
	// MemExact says each op's Mem is exactly the bytes of the storages
	// live after it, with no allocator rounding or bookkeeping (an Engine
	// records its own profile so): the memory model then places releases
	// with no slack.
	MemExact bool
}

// HasMem reports whether the iteration carries a recorded memory curve.
func (it *Iteration) HasMem() bool {
	return len(it.Ops) > 0 && it.Ops[0].Mem >= 0
}

// Tensor returns the storage with the given id, or nil.
func (it *Iteration) Tensor(id TensorID) *Tensor { return it.Tensors[id] }

// Header describes the recording.
type Header struct {
	Format string
	Model  string
	Batch  int
	Seq    int
	AMP    string
	Ckpt   bool
	Device string
	Torch  string
	Params int64
	// Config is the model configuration as recorded (JSON object), nil when
	// absent.
	Config []byte
}

// Trace is a whole recorded trace in memory.
type Trace struct {
	Name       string // file name it was read from
	Header     Header
	Iterations []*Iteration
}
