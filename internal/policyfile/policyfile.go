// Package policyfile is the policy file's format: the values a file holds,
// how they are encoded, how a file is read and checked, and how one is
// saved without ever leaving a partial file.
//
// A policy file is one JSON object (File) followed by a newline: the
// format's name (FormatName) and version (Version), the policies of the
// sequences an Engine has seen (Policy: its sequence key, what it assumed,
// its swaps, their issue order, its recomputes and the profiled iteration
// it was planned from) and, optionally, the sequence of the saver's latest
// iteration (Last). docs/policy.md describes every field, its unit and its
// range. The types are the file's own, so that the simulator's and the
// planner's may change without changing the format.
//
// Decode reads a file of version 2, or of version 1 (FormatV1: swaps of
// activations with what matches them) converted to version 2, and checks
// every field against the others and the ranges of docs/policy.md (the
// Max constants): a damaged or foreign file is refused whole, and the
// error names the field and its entry, e.g. policies[2].swaps[5].bytes.
// Encode writes a file; WriteAtomic replaces a file on disk with the
// bytes of a new one, or leaves it as it was.
//
// The package knows nothing of the Engine: package chameleon converts its
// in-memory policies to and from these values.
package policyfile

import (
	"encoding/json"

	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// The format: its name and version, and the name of version 1 (which
// carried its version in its name).
const (
	FormatName = "chameleon-policies"
	Version    = 2
	FormatV1   = "chameleon-policies/v1"
)

// Ranges the decoder accepts.
const (
	MaxFileBytes   = 512 << 20 // a file larger than this is refused unread
	MaxTensorBytes = 4 << 40   // 4 TiB: no tensor of any device is larger
	MaxKeyBytes    = 1 << 60   // the bytes an iteration's ops allocate
	MaxPolicies    = 4096
	MaxOps         = 1 << 22 // ops of one iteration
	MaxEntries     = 1 << 22 // swaps, recomputes, tensors of one policy
	MaxDims        = 16
	MaxDim         = 1 << 48
	MaxNameLen     = 4096
	MaxLinkRate    = 1e13 // bytes per second: 10 TB/s
)

// File is a policy file (version 2).
type File struct {
	Format   string   `json:"format"`
	Version  int      `json:"version"`
	Policies []Policy `json:"policies"`
	// Last is the sequence of the saver's latest iteration, when the file
	// holds its policy: a job restarted from the file applies that policy
	// from its first iteration.
	Last *controller.Key `json:"last,omitempty"`
}

// Policy is the policy of one sequence.
type Policy struct {
	Key         controller.Key `json:"key"`
	Assumed     *Assumed       `json:"assumed"`
	SimulatedMS float64        `json:"simulated_ms"`
	Tensors     []Tensor       `json:"tensors"`
	Swaps       []Swap         `json:"swaps"`
	OutOrder    []int          `json:"out_order"`
	InOrder     []int          `json:"in_order"`
	Recomputes  []Recompute    `json:"recomputes"`
	Profile     *Profile       `json:"profile"`
	// ordered: the tensors carry their ordinals (version 2; a converted
	// version 1 file does not). Decode sets it; it is not in the file.
	ordered bool
}

// Ordered says whether p's tensors carry their ordinals (Tensor.Ord): true
// for a policy Decode read from a version 2 file, false for one converted
// from version 1 and for one not decoded.
func (p *Policy) Ordered() bool { return p.ordered }

// Assumed is what a policy was planned under: the memory limit, the host
// link and the device.
type Assumed struct {
	LimitBytes int64  `json:"limit_bytes"`
	Link       Link   `json:"link"`
	Device     string `json:"device"`
}

// Link is the host link's bandwidths, in bytes per second, alone and
// shared by the two directions.
type Link struct {
	D2H       float64 `json:"d2h_bytes_per_s"`
	H2D       float64 `json:"h2d_bytes_per_s"`
	D2HShared float64 `json:"d2h_shared_bytes_per_s"`
	H2DShared float64 `json:"h2d_shared_bytes_per_s"`
}

// Tensor kinds in the file (Tensor.Kind).
const (
	KindActivation = "activation"
	KindParam      = "parameter"
	KindOptState   = "optimizer_state"
	// KindFrozen is a parameter no op writes (chameleon.Frozen).
	KindFrozen = "frozen_parameter"
)

// Tensor is a tensor a policy swaps or recomputes, as a job finds it
// again: an activation by its call site and shape, a persistent tensor by
// its ID, size, dtype and shape.
type Tensor struct {
	ID       trace.TensorID `json:"id"`
	Kind     string         `json:"kind"`
	Bytes    int64          `json:"bytes"`
	DType    string         `json:"dtype"`
	Shape    []int64        `json:"shape"`
	Ptr      uint64         `json:"ptr"`
	Producer string         `json:"producer"`
	Overload string         `json:"overload"`
	Module   string         `json:"module"`
	// Ord is an activation's ordinal among the tensors of its call site and
	// producer in the profiled iteration.
	Ord uint32 `json:"ord"`
}

// Swap is a swap of a tensor out to the host and back (simulate.Swap),
// with the ops its copies are issued at.
type Swap struct {
	Tensor   trace.TensorID `json:"tensor"`
	Bytes    int64          `json:"bytes"`
	Out      int            `json:"out_after_op"`
	Free     int            `json:"freed_at_op"`
	In       int            `json:"in_issue_op"`
	Use      int            `json:"in_before_op"`
	IssueOut int            `json:"issue_out_after_op"`
	IssueIn  int            `json:"issue_in_at_op"`
	// D2H false: the swap copies nothing out (simulate.Swap.NoCopyOut);
	// absent, a copy out, as in files written before the field.
	D2H *bool `json:"d2h,omitempty"`
	// CopyAfter, when present, makes the copy out a write-back issued
	// after that op (simulate.Swap.Early, CopyAfter); IssueOut is then
	// from it to Out (the last op, for a write-back of the previous
	// iteration's last write).
	CopyAfter *int `json:"copy_out_after_op,omitempty"`
}

// Sim is the swap as the simulator takes it.
func (s Swap) Sim() simulate.Swap {
	sw := simulate.Swap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use,
		NoCopyOut: s.D2H != nil && !*s.D2H}
	if s.CopyAfter != nil {
		sw.Early, sw.CopyAfter = true, *s.CopyAfter
	}
	return sw
}

// Recompute is a tensor dropped and made again before its use
// (simulate.Recompute).
type Recompute struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Op     int            `json:"op"`
	Drop   int            `json:"dropped_after_op"`
	Before int            `json:"before_op"`
	Kept   []Kept         `json:"kept_inputs"`
	Remade []Remade       `json:"remade_inputs"`
}

// Kept is an input of a recompute kept on the device (simulate.Kept).
type Kept struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	From   int            `json:"from_op"`
}

// Remade is an input of a recompute made again too (simulate.Remade).
type Remade struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Op     int            `json:"op"`
}

// Sim is r in the simulator's terms.
func (r Recompute) Sim() simulate.Recompute {
	rc := simulate.Recompute{Tensor: r.Tensor, Bytes: r.Bytes, Op: r.Op, Drop: r.Drop, Before: r.Before}
	for _, k := range r.Kept {
		rc.Kept = append(rc.Kept, simulate.Kept{Tensor: k.Tensor, Bytes: k.Bytes, From: k.From})
	}
	for _, m := range r.Remade {
		rc.Remade = append(rc.Remade, simulate.Remade{Tensor: m.Tensor, Bytes: m.Bytes, Op: m.Op})
	}
	return rc
}

// Profile is the profiled iteration, compact: names are indices into
// Strings.
type Profile struct {
	TimeMS  float64          `json:"time_ms"`
	Strings []string         `json:"strings"`
	Tensors []ProfTensor     `json:"tensors"`
	Ops     []ProfOp         `json:"ops"`
	LiveOut []trace.TensorID `json:"live_out"`
}

// ProfTensor is a tensor of the profiled iteration (trace.Tensor); Kind is
// a trace.Kind, DType an index into Profile.Strings.
type ProfTensor struct {
	ID    trace.TensorID `json:"id"`
	Bytes int64          `json:"bytes"`
	Kind  int            `json:"kind"`
	DType int            `json:"dtype"`
	Shape []int64        `json:"shape"`
	Ptr   uint64         `json:"ptr"`
	// Frozen marks a parameter no op writes (trace.Tensor.Frozen); left out
	// when false.
	Frozen bool `json:"frozen,omitempty"`
}

// ProfOp is an op of the profiled iteration (trace.Op): Name, Overload
// and Module are indices into Profile.Strings, Phase a trace.Phase;
// Recompute says the host could run it again.
type ProfOp struct {
	Name      int              `json:"n"`
	Overload  int              `json:"o"`
	Module    int              `json:"m"`
	Phase     int              `json:"p"`
	In        []trace.TensorID `json:"in"`
	Out       []trace.TensorID `json:"out"`
	Mem       int64            `json:"mem"`
	FLOPs     float64          `json:"flops"`
	IOBytes   float64          `json:"io_bytes"`
	Recompute bool             `json:"rc"`
}

// FileV1 is a file of version 1: swaps of activations with, in parallel,
// what matches them. Decode converts it to version 2.
type FileV1 struct {
	Format   string     `json:"format"`
	Policies []PolicyV1 `json:"policies"`
}

// PolicyV1 is a policy of version 1: Tensors[i] is the tensor of Swaps[i].
type PolicyV1 struct {
	Key     controller.Key `json:"key"`
	Swaps   []SwapV1       `json:"swaps"`
	Tensors []TensorV1     `json:"tensors"`
}

// SwapV1 is a swap of version 1.
type SwapV1 struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Out    int            `json:"out_after_op"`
	Free   int            `json:"freed_at_op"`
	In     int            `json:"in_issue_op"`
	Use    int            `json:"in_before_op"`
}

// TensorV1 is what matches the activation of a swap of version 1.
type TensorV1 struct {
	Ptr      uint64  `json:"ptr"`
	Producer string  `json:"producer"`
	Overload string  `json:"overload"`
	Module   string  `json:"module"`
	Shape    []int64 `json:"shape"`
}

// Encode is f as a file of this version: Format and Version are set to
// FormatName and Version, nil Policies are written as none ([]), and the
// JSON object is followed by a newline.
func Encode(f File) ([]byte, error) {
	f.Format, f.Version = FormatName, Version
	if f.Policies == nil {
		f.Policies = []Policy{}
	}
	data, err := json.Marshal(f)
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
