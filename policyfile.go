package chameleon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// The policy file, version 2 (docs/policy.md describes every field, its
// unit and range). It is the file's own set of types, so that the
// simulator's and the planner's may change without changing the format.
// Every field is checked on load (decodePolicies): a damaged or foreign
// file adds no policy and says which field of which entry is wrong.

const (
	policyFormatName = "chameleon-policies"
	policyVersion    = 2
	policyFormatV1   = "chameleon-policies/v1"
)

// Ranges the decoder accepts.
const (
	maxPolicyFileBytes = 512 << 20 // a file larger than this is refused unread
	maxTensorBytes     = 4 << 40   // 4 TiB: no tensor of any device is larger
	maxKeyBytes        = 1 << 60   // the bytes an iteration's ops allocate
	maxPolicies        = 4096
	maxOps             = 1 << 22 // ops of one iteration
	maxEntries         = 1 << 22 // swaps, recomputes, tensors of one policy
	maxDims            = 16
	maxDim             = 1 << 48
	maxNameLen         = 4096
	maxLinkRate        = 1e13 // bytes per second: 10 TB/s
)

type fileCache struct {
	Format   string       `json:"format"`
	Version  int          `json:"version"`
	Policies []filePolicy `json:"policies"`
	// Last is the sequence of the saver's latest iteration, when the file
	// holds its policy: a job restarted from the file applies that policy
	// from its first iteration.
	Last *policyKey `json:"last,omitempty"`
}

type filePolicy struct {
	Key         policyKey       `json:"key"`
	Assumed     *fileAssumed    `json:"assumed"`
	SimulatedMS float64         `json:"simulated_ms"`
	Tensors     []fileTensor    `json:"tensors"`
	Swaps       []fileSwap      `json:"swaps"`
	OutOrder    []int           `json:"out_order"`
	InOrder     []int           `json:"in_order"`
	Recomputes  []fileRecompute `json:"recomputes"`
	Profile     *fileProfile    `json:"profile"`
	// ordered: the tensors carry their ordinals (version 2; a converted
	// version 1 file does not).
	ordered bool
}

type fileAssumed struct {
	LimitBytes int64    `json:"limit_bytes"`
	Link       fileLink `json:"link"`
	Device     string   `json:"device"`
}

type fileLink struct {
	D2H       float64 `json:"d2h_bytes_per_s"`
	H2D       float64 `json:"h2d_bytes_per_s"`
	D2HShared float64 `json:"d2h_shared_bytes_per_s"`
	H2DShared float64 `json:"h2d_shared_bytes_per_s"`
}

// Tensor kinds in the file.
const (
	fileActivation = "activation"
	fileParam      = "parameter"
	fileOptState   = "optimizer_state"
	// fileFrozen is a parameter no op writes (Frozen).
	fileFrozen = "frozen_parameter"
)

type fileTensor struct {
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

type fileSwap struct {
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
}

type fileRecompute struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Op     int            `json:"op"`
	Drop   int            `json:"dropped_after_op"`
	Before int            `json:"before_op"`
	Kept   []fileKept     `json:"kept_inputs"`
	Remade []fileRemade   `json:"remade_inputs"`
}

type fileKept struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	From   int            `json:"from_op"`
}

type fileRemade struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Op     int            `json:"op"`
}

// fileProfile is the profiled iteration, compact: names are indices into
// Strings.
type fileProfile struct {
	TimeMS  float64          `json:"time_ms"`
	Strings []string         `json:"strings"`
	Tensors []fileProfTensor `json:"tensors"`
	Ops     []fileProfOp     `json:"ops"`
	LiveOut []trace.TensorID `json:"live_out"`
}

type fileProfTensor struct {
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

type fileProfOp struct {
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

// Version 1: swaps of activations with, in parallel, what matches them.
type fileCacheV1 struct {
	Format   string         `json:"format"`
	Policies []filePolicyV1 `json:"policies"`
}

type filePolicyV1 struct {
	Key     policyKey      `json:"key"`
	Swaps   []fileSwapV1   `json:"swaps"`
	Tensors []fileTensorV1 `json:"tensors"`
}

type fileSwapV1 struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Out    int            `json:"out_after_op"`
	Free   int            `json:"freed_at_op"`
	In     int            `json:"in_issue_op"`
	Use    int            `json:"in_before_op"`
}

type fileTensorV1 struct {
	Ptr      uint64  `json:"ptr"`
	Producer string  `json:"producer"`
	Overload string  `json:"overload"`
	Module   string  `json:"module"`
	Shape    []int64 `json:"shape"`
}

// persistRef is a persistent tensor as a restarted job knows it: by its ID
// (the order the host made its tensors in: parameters and optimizer state
// made at start get the same IDs in every run), checked by size, dtype and
// shape before a policy moves it.
type persistRef struct {
	ID    trace.TensorID
	Bytes int64
	DType string
	Shape []int64
	Kind  Kind
}

// policyEnv is what a plan assumed besides its sequence: the memory limit,
// the host link and the device.
type policyEnv struct {
	Limit  int64
	Link   simulate.Link
	Device string
}

func (v policyEnv) known() bool { return v.Limit > 0 }

// profiled is the iteration a policy was planned from, with the tensors
// live after it and the ops the host could run again: what plan.Make
// needs to plan it again without profiling.
type profiled struct {
	iter      *trace.Iteration
	liveOut   []trace.TensorID
	recompute []bool
}

func newProfiled(it *trace.Iteration, host []bool, live func(trace.TensorID) bool) *profiled {
	p := &profiled{iter: it, recompute: slices.Clone(host)}
	for id := range it.Tensors {
		if live(id) {
			p.liveOut = append(p.liveOut, id)
		}
	}
	slices.Sort(p.liveOut)
	return p
}

// fieldError is a field of the policy file that cannot be used.
type fieldError struct {
	path string // e.g. policies[2].swaps[5].bytes
	msg  string
}

func (e *fieldError) Error() string { return e.path + ": " + e.msg }

func bad(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

// decodeConfig is what the decoder checks sizes against.
type decodeConfig struct {
	maxTensor int64 // the largest tensor the device can hold
}

// decodePolicies reads a policy file (version 2, or version 1 converted)
// and checks every field. The error names the field: the caller adds the
// file's name.
func decodePolicies(data []byte, dc decodeConfig) (fileCache, error) {
	var none fileCache
	if len(data) > maxPolicyFileBytes {
		return none, fmt.Errorf("%d bytes: larger than the %d bytes a policy file may have", len(data), maxPolicyFileBytes)
	}
	var probe struct {
		Format  *string `json:"format"`
		Version *int    `json:"version"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&probe); err != nil {
		return none, jsonError(data, err, "not a policy file")
	}
	switch {
	case probe.Format == nil:
		return none, bad("format", "missing: not a policy file")
	case *probe.Format == policyFormatV1:
		var v1 fileCacheV1
		if err := strictDecode(data, &v1); err != nil {
			return none, err
		}
		ps, err := convertV1(v1, dc)
		return fileCache{Policies: ps}, err
	case *probe.Format != policyFormatName:
		return none, bad("format", "%q: not a policy file (want %q)", *probe.Format, policyFormatName)
	case probe.Version == nil:
		return none, bad("version", "missing")
	case *probe.Version != policyVersion:
		return none, bad("version", "%d: this build reads versions 1 and %d", *probe.Version, policyVersion)
	}
	var c fileCache
	if err := strictDecode(data, &c); err != nil {
		return none, err
	}
	if len(c.Policies) > maxPolicies {
		return none, bad("policies", "%d policies: at most %d", len(c.Policies), maxPolicies)
	}
	for i := range c.Policies {
		if err := c.Policies[i].validate(fmt.Sprintf("policies[%d]", i), dc); err != nil {
			return none, err
		}
		c.Policies[i].ordered = true
	}
	if c.Last != nil {
		if err := validateKey(*c.Last, "last"); err != nil {
			return none, err
		}
		if !slices.ContainsFunc(c.Policies, func(p filePolicy) bool { return p.Key == *c.Last }) {
			return none, bad("last", "no policy of the file has this key")
		}
	}
	return c, nil
}

// strictDecode decodes one JSON value into v: unknown fields and anything
// after the value are refused.
func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(data, err, "")
	}
	if _, err := dec.Token(); err != io.EOF {
		off := dec.InputOffset()
		return fmt.Errorf("line %d: trailing data after the policy file's object", lineOf(data, off))
	}
	return nil
}

// jsonError says where in data a decoding error is, and which field.
func jsonError(data []byte, err error, what string) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("line %d: %w", lineOf(data, se.Offset), err)
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "(top level)"
		}
		return fmt.Errorf("line %d: field %s: %s in a field of type %s", lineOf(data, te.Offset), field, te.Value, te.Type)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("truncated: %w", err)
	}
	if what != "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	return err
}

func lineOf(data []byte, off int64) int {
	off = min(max(off, 0), int64(len(data)))
	return bytes.Count(data[:off], []byte("\n")) + 1
}

func checkBytes(path string, b, hi int64, what string) error {
	if b < 0 {
		return bad(path, "%d: negative", b)
	}
	if b > hi {
		return bad(path, "%d bytes: larger than %s (%d bytes)", b, what, hi)
	}
	return nil
}

func checkCount(path string, n, hi int) error {
	if n > hi {
		return bad(path, "%d entries: at most %d", n, hi)
	}
	return nil
}

func checkShape(path string, shape []int64) error {
	if len(shape) > maxDims {
		return bad(path, "%d dimensions: at most %d", len(shape), maxDims)
	}
	for d, x := range shape {
		if x < 0 || x > maxDim {
			return bad(fmt.Sprintf("%s[%d]", path, d), "%d: want 0 to %d", x, int64(maxDim))
		}
	}
	return nil
}

func checkName(path, s string) error {
	if len(s) > maxNameLen {
		return bad(path, "%d bytes: at most %d", len(s), maxNameLen)
	}
	return nil
}

func checkFloat(path string, x, hi float64) error {
	if math.IsNaN(x) || x < 0 || x > hi {
		return bad(path, "%g: want 0 to %g", x, hi)
	}
	return nil
}

func (dc decodeConfig) tensorMax() (int64, string) {
	if dc.maxTensor > 0 && dc.maxTensor < maxTensorBytes {
		return dc.maxTensor, "the device"
	}
	return maxTensorBytes, "4 TiB"
}

func validateKey(k policyKey, path string) error {
	if k.Ops < 1 || k.Ops > maxOps {
		return bad(path+".ops", "%d: want 1 to %d", k.Ops, maxOps)
	}
	if k.Bytes < 0 || k.Bytes > maxKeyBytes {
		return bad(path+".bytes", "%d: want 0 to %d", k.Bytes, int64(maxKeyBytes))
	}
	return nil
}

// validate checks every field of a policy against the others and the
// ranges of docs/policy.md.
func (p *filePolicy) validate(path string, dc decodeConfig) error {
	if err := validateKey(p.Key, path+".key"); err != nil {
		return err
	}
	nops := p.Key.Ops
	tmax, twhat := dc.tensorMax()
	if a := p.Assumed; a != nil {
		ap := path + ".assumed"
		if a.LimitBytes < 1 || a.LimitBytes > maxTensorBytes*64 {
			return bad(ap+".limit_bytes", "%d: want 1 to %d", a.LimitBytes, int64(maxTensorBytes*64))
		}
		for _, r := range []struct {
			name string
			v    float64
		}{{"d2h_bytes_per_s", a.Link.D2H}, {"h2d_bytes_per_s", a.Link.H2D}, {"d2h_shared_bytes_per_s", a.Link.D2HShared}, {"h2d_shared_bytes_per_s", a.Link.H2DShared}} {
			if !(r.v > 0) || r.v > maxLinkRate {
				return bad(ap+".link."+r.name, "%g: want a rate above 0 and at most %g", r.v, maxLinkRate)
			}
		}
		if err := checkName(ap+".device", a.Device); err != nil {
			return err
		}
	}
	if err := checkFloat(path+".simulated_ms", p.SimulatedMS, 1e9); err != nil {
		return err
	}
	for _, c := range []struct {
		name string
		n    int
	}{{"tensors", len(p.Tensors)}, {"swaps", len(p.Swaps)}, {"recomputes", len(p.Recomputes)}} {
		if err := checkCount(path+"."+c.name, c.n, maxEntries); err != nil {
			return err
		}
	}
	known := make(map[trace.TensorID]*fileTensor, len(p.Tensors))
	for i := range p.Tensors {
		t := &p.Tensors[i]
		tp := fmt.Sprintf("%s.tensors[%d]", path, i)
		if t.ID < 0 {
			return bad(tp+".id", "%d: negative", t.ID)
		}
		if known[t.ID] != nil {
			return bad(tp+".id", "%d: listed twice", t.ID)
		}
		known[t.ID] = t
		switch t.Kind {
		case fileActivation, fileParam, fileOptState, fileFrozen:
		default:
			return bad(tp+".kind", "%q: want %q, %q, %q or %q", t.Kind, fileActivation, fileParam, fileOptState, fileFrozen)
		}
		if err := checkBytes(tp+".bytes", t.Bytes, tmax, twhat); err != nil {
			return err
		}
		if t.Bytes == 0 {
			return bad(tp+".bytes", "0: want at least 1")
		}
		if err := checkShape(tp+".shape", t.Shape); err != nil {
			return err
		}
		for _, f := range []struct{ name, v string }{{"dtype", t.DType}, {"producer", t.Producer}, {"overload", t.Overload}, {"module", t.Module}} {
			if err := checkName(tp+"."+f.name, f.v); err != nil {
				return err
			}
		}
	}
	tensor := func(fp string, id trace.TensorID, b int64, activation bool) error {
		t := known[id]
		if t == nil {
			return bad(fp+".tensor", "%d: not among the policy's tensors", id)
		}
		if activation && t.Kind != fileActivation {
			return bad(fp+".tensor", "%d: a %s where an activation is needed", id, t.Kind)
		}
		if err := checkBytes(fp+".bytes", b, tmax, twhat); err != nil {
			return err
		}
		if b > memory.RoundBytes(t.Bytes) {
			return bad(fp+".bytes", "%d: more than its tensor's %d bytes, rounded up to %d", b, t.Bytes, memory.RoundBytes(t.Bytes))
		}
		return nil
	}
	for i, s := range p.Swaps {
		sp := fmt.Sprintf("%s.swaps[%d]", path, i)
		if err := tensor(sp, s.Tensor, s.Bytes, false); err != nil {
			return err
		}
		sw := simulate.Swap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use}
		if err := sw.Validate(nops); err != nil {
			return bad(sp, "%v", err)
		}
		if sw.Wraps() {
			if s.IssueOut != s.Out || s.IssueIn != s.In {
				return bad(sp+".issue_out_after_op", "%d, issue_in_at_op %d: a swap over the iteration's end is issued at its out_after_op %d and in_issue_op %d",
					s.IssueOut, s.IssueIn, s.Out, s.In)
			}
			continue
		}
		if s.IssueOut < s.Out || s.IssueOut >= s.Use {
			return bad(sp+".issue_out_after_op", "%d: want %d to %d", s.IssueOut, s.Out, s.Use-1)
		}
		if s.IssueIn < s.In || s.IssueIn > s.Use {
			return bad(sp+".issue_in_at_op", "%d: want %d to %d", s.IssueIn, s.In, s.Use)
		}
	}
	for _, o := range []struct {
		name  string
		order []int
	}{{"out_order", p.OutOrder}, {"in_order", p.InOrder}} {
		if err := checkOrder(path+"."+o.name, o.order, len(p.Swaps)); err != nil {
			return err
		}
	}
	var prof map[trace.TensorID]bool
	if p.Profile != nil {
		var err error
		if prof, err = p.Profile.validate(path+".profile", nops, tmax, twhat); err != nil {
			return err
		}
		for i := range p.Tensors {
			if !prof[p.Tensors[i].ID] {
				return bad(fmt.Sprintf("%s.tensors[%d].id", path, i), "%d: not a tensor of the profile", p.Tensors[i].ID)
			}
		}
	}
	for i, r := range p.Recomputes {
		rp := fmt.Sprintf("%s.recomputes[%d]", path, i)
		if err := tensor(rp, r.Tensor, r.Bytes, true); err != nil {
			return err
		}
		if err := checkCount(rp+".kept_inputs", len(r.Kept), maxEntries); err != nil {
			return err
		}
		if err := checkCount(rp+".remade_inputs", len(r.Remade), maxEntries); err != nil {
			return err
		}
		rc := r.recompute()
		if err := rc.Validate(nops); err != nil {
			return bad(rp, "%v", err)
		}
		for j, m := range r.Remade {
			if err := tensor(fmt.Sprintf("%s.remade_inputs[%d]", rp, j), m.Tensor, m.Bytes, true); err != nil {
				return err
			}
		}
		for j, k := range r.Kept {
			kp := fmt.Sprintf("%s.kept_inputs[%d]", rp, j)
			if k.Tensor < 0 || (prof != nil && !prof[k.Tensor]) {
				return bad(kp+".tensor", "%d: not a tensor of the profile", k.Tensor)
			}
			if err := checkBytes(kp+".bytes", k.Bytes, tmax, twhat); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOrder checks that order is a permutation of 0..n-1.
func checkOrder(path string, order []int, n int) error {
	if len(order) != n {
		return bad(path, "%d entries for %d swaps", len(order), n)
	}
	seen := make([]bool, n)
	for i, x := range order {
		if x < 0 || x >= n || seen[x] {
			return bad(fmt.Sprintf("%s[%d]", path, i), "%d: want each swap index 0 to %d once", x, n-1)
		}
		seen[x] = true
	}
	return nil
}

func (r fileRecompute) recompute() simulate.Recompute {
	rc := simulate.Recompute{Tensor: r.Tensor, Bytes: r.Bytes, Op: r.Op, Drop: r.Drop, Before: r.Before}
	for _, k := range r.Kept {
		rc.Kept = append(rc.Kept, simulate.Kept{Tensor: k.Tensor, Bytes: k.Bytes, From: k.From})
	}
	for _, m := range r.Remade {
		rc.Remade = append(rc.Remade, simulate.Remade{Tensor: m.Tensor, Bytes: m.Bytes, Op: m.Op})
	}
	return rc
}

// validate checks the profile and returns its tensors' IDs.
func (f *fileProfile) validate(path string, nops int, tmax int64, twhat string) (map[trace.TensorID]bool, error) {
	if len(f.Ops) != nops {
		return nil, bad(path+".ops", "%d ops: the key says %d", len(f.Ops), nops)
	}
	if err := checkFloat(path+".time_ms", f.TimeMS, 1e9); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		name string
		n    int
	}{{"strings", len(f.Strings)}, {"tensors", len(f.Tensors)}, {"live_out", len(f.LiveOut)}} {
		if err := checkCount(path+"."+c.name, c.n, maxEntries); err != nil {
			return nil, err
		}
	}
	for i, s := range f.Strings {
		if err := checkName(fmt.Sprintf("%s.strings[%d]", path, i), s); err != nil {
			return nil, err
		}
	}
	str := func(p string, x int) error {
		if x < 0 || x >= len(f.Strings) {
			return bad(p, "%d: want a string index 0 to %d", x, len(f.Strings)-1)
		}
		return nil
	}
	ids := make(map[trace.TensorID]bool, len(f.Tensors))
	for i, t := range f.Tensors {
		tp := fmt.Sprintf("%s.tensors[%d]", path, i)
		if t.ID < 0 {
			return nil, bad(tp+".id", "%d: negative", t.ID)
		}
		if ids[t.ID] {
			return nil, bad(tp+".id", "%d: listed twice", t.ID)
		}
		ids[t.ID] = true
		if err := checkBytes(tp+".bytes", t.Bytes, tmax, twhat); err != nil {
			return nil, err
		}
		if t.Kind < int(trace.KindActivation) || t.Kind > int(trace.KindInput) {
			return nil, bad(tp+".kind", "%d: want 0 to %d", t.Kind, int(trace.KindInput))
		}
		if t.Frozen && t.Kind != int(trace.KindParam) {
			return nil, bad(tp+".frozen", "true on a tensor of kind %d: only a parameter (%d) is frozen", t.Kind, int(trace.KindParam))
		}
		if err := str(tp+".dtype", t.DType); err != nil {
			return nil, err
		}
		if err := checkShape(tp+".shape", t.Shape); err != nil {
			return nil, err
		}
	}
	for i, op := range f.Ops {
		op := op
		opp := fmt.Sprintf("%s.ops[%d]", path, i)
		for _, s := range []struct {
			name string
			x    int
		}{{"n", op.Name}, {"o", op.Overload}, {"m", op.Module}} {
			if err := str(opp+"."+s.name, s.x); err != nil {
				return nil, err
			}
		}
		if op.Phase < int(trace.PhaseUnknown) || op.Phase > int(trace.PhaseOptimizer) {
			return nil, bad(opp+".p", "%d: want 0 to %d", op.Phase, int(trace.PhaseOptimizer))
		}
		for _, l := range []struct {
			name string
			ids  []trace.TensorID
		}{{"in", op.In}, {"out", op.Out}} {
			if err := checkCount(opp+"."+l.name, len(l.ids), maxEntries); err != nil {
				return nil, err
			}
			for j, id := range l.ids {
				if !ids[id] {
					return nil, bad(fmt.Sprintf("%s.%s[%d]", opp, l.name, j), "%d: not among the profile's tensors", id)
				}
			}
		}
		if op.Mem < -1 || op.Mem > maxKeyBytes {
			return nil, bad(opp+".mem", "%d: want -1 (none) to %d", op.Mem, int64(maxKeyBytes))
		}
		if err := checkFloat(opp+".flops", op.FLOPs, 1e30); err != nil {
			return nil, err
		}
		if err := checkFloat(opp+".io_bytes", op.IOBytes, 1e30); err != nil {
			return nil, err
		}
	}
	for i, id := range f.LiveOut {
		if !ids[id] {
			return nil, bad(fmt.Sprintf("%s.live_out[%d]", path, i), "%d: not among the profile's tensors", id)
		}
	}
	return ids, nil
}

// convertV1 turns a version 1 file into version 2 policies: its swaps of
// activations, with what matches them, and nothing it did not record (no
// assumptions, so no update; no profile).
func convertV1(v1 fileCacheV1, dc decodeConfig) ([]filePolicy, error) {
	if len(v1.Policies) > maxPolicies {
		return nil, bad("policies", "%d policies: at most %d", len(v1.Policies), maxPolicies)
	}
	out := make([]filePolicy, 0, len(v1.Policies))
	for i, sp := range v1.Policies {
		path := fmt.Sprintf("policies[%d]", i)
		if len(sp.Tensors) != len(sp.Swaps) {
			return nil, bad(path+".tensors", "%d entries for %d swaps", len(sp.Tensors), len(sp.Swaps))
		}
		if err := checkCount(path+".swaps", len(sp.Swaps), maxEntries); err != nil {
			return nil, err
		}
		fp := filePolicy{Key: sp.Key}
		seen := map[trace.TensorID]bool{}
		for j, s := range sp.Swaps {
			t := sp.Tensors[j]
			if !seen[s.Tensor] && s.Tensor >= 0 {
				seen[s.Tensor] = true
				fp.Tensors = append(fp.Tensors, fileTensor{ID: s.Tensor, Kind: fileActivation, Bytes: max(s.Bytes, 1), Shape: t.Shape,
					Ptr: t.Ptr, Producer: t.Producer, Overload: t.Overload, Module: t.Module})
			}
			fp.Swaps = append(fp.Swaps, fileSwap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use,
				IssueOut: s.Out, IssueIn: s.In})
			fp.OutOrder, fp.InOrder = append(fp.OutOrder, j), append(fp.InOrder, j)
		}
		if err := fp.validate(path, dc); err != nil {
			return nil, err
		}
		out = append(out, fp)
	}
	return out, nil
}

// kindName is a Kind in the file.
func kindName(k Kind) string {
	switch k {
	case Persistent:
		return fileParam
	case OptimizerState:
		return fileOptState
	case Frozen:
		return fileFrozen
	}
	return fileActivation
}

func kindOfName(s string) Kind {
	switch s {
	case fileParam:
		return Persistent
	case fileOptState:
		return OptimizerState
	case fileFrozen:
		return Frozen
	}
	return Activation
}

// encodePolicy is the file form of p.
func encodePolicy(p *policy) filePolicy {
	fp := filePolicy{Key: p.key, SimulatedMS: p.simMS, Swaps: make([]fileSwap, 0, len(p.swaps)), Tensors: []fileTensor{},
		Recomputes: []fileRecompute{}}
	if p.env.known() {
		l := p.env.Link
		fp.Assumed = &fileAssumed{LimitBytes: p.env.Limit, Device: p.env.Device,
			Link: fileLink{D2H: l.D2H, H2D: l.H2D, D2HShared: l.D2HShared, H2DShared: l.H2DShared}}
	}
	seen := map[trace.TensorID]bool{}
	addT := func(id trace.TensorID, b int64, t *plannedTensor) {
		if seen[id] {
			return
		}
		seen[id] = true
		ft := fileTensor{ID: id, Kind: fileActivation, Bytes: max(b, 1), Shape: t.Shape, Ptr: t.Ptr, Producer: t.Name, Overload: t.Overload, Module: t.Module, Ord: t.Ord}
		if r := t.Persistent; r != nil {
			ft = fileTensor{ID: id, Kind: kindName(r.Kind), Bytes: r.Bytes, DType: r.DType, Shape: r.Shape}
		}
		if p.prof != nil {
			if tt := p.prof.iter.Tensors[id]; tt != nil {
				ft.Bytes = max(tt.Bytes, 1)
				if ft.DType == "" {
					ft.DType = tt.DType
				}
			}
		}
		fp.Tensors = append(fp.Tensors, ft)
	}
	ip := p.issue
	if ip == nil {
		ip = simulate.Issue(p.swaps, nil)
	}
	for i, s := range p.swaps {
		addT(s.Tensor, s.Bytes, &p.tensors[i])
		fs := fileSwap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use,
			IssueOut: ip.OutOp[i], IssueIn: ip.InOp[i]}
		if s.NoCopyOut {
			fs.D2H = new(bool)
		}
		fp.Swaps = append(fp.Swaps, fs)
	}
	fp.OutOrder, fp.InOrder = slices.Clone(ip.OutOrder), slices.Clone(ip.InOrder)
	if fp.OutOrder == nil {
		fp.OutOrder, fp.InOrder = []int{}, []int{}
	}
	for k, r := range p.recomputes {
		addT(r.Tensor, r.Bytes, &p.rtensors[k])
		fr := fileRecompute{Tensor: r.Tensor, Bytes: r.Bytes, Op: r.Op, Drop: r.Drop, Before: r.Before}
		for _, x := range r.Kept {
			fr.Kept = append(fr.Kept, fileKept{Tensor: x.Tensor, Bytes: x.Bytes, From: x.From})
		}
		for _, m := range r.Remade {
			fr.Remade = append(fr.Remade, fileRemade{Tensor: m.Tensor, Bytes: m.Bytes, Op: m.Op})
		}
		fp.Recomputes = append(fp.Recomputes, fr)
	}
	for m, x := range p.remade {
		addT(x.Tensor, x.Bytes, &p.mtensors[m])
	}
	if p.prof != nil {
		fp.Profile = encodeProfile(p.prof)
	}
	return fp
}

func encodeProfile(pr *profiled) *fileProfile {
	it := pr.iter
	f := &fileProfile{TimeMS: it.TimeMS, LiveOut: slices.Clone(pr.liveOut), Strings: []string{}}
	if f.LiveOut == nil {
		f.LiveOut = []trace.TensorID{}
	}
	index := map[string]int{}
	str := func(s string) int {
		if x, ok := index[s]; ok {
			return x
		}
		index[s] = len(f.Strings)
		f.Strings = append(f.Strings, s)
		return len(f.Strings) - 1
	}
	ids := make([]trace.TensorID, 0, len(it.Tensors))
	for id := range it.Tensors {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		t := it.Tensors[id]
		f.Tensors = append(f.Tensors, fileProfTensor{ID: id, Bytes: t.Bytes, Kind: int(t.Kind), DType: str(t.DType), Shape: t.Shape, Ptr: t.Ptr, Frozen: t.Frozen})
	}
	for i := range it.Ops {
		op := &it.Ops[i]
		f.Ops = append(f.Ops, fileProfOp{Name: str(op.Name), Overload: str(op.Overload), Module: str(op.Module), Phase: int(op.Phase),
			In: op.In, Out: op.Out, Mem: op.Mem, FLOPs: op.FLOPs, IOBytes: op.IOBytes, Recompute: i < len(pr.recompute) && pr.recompute[i]})
	}
	return f
}

// profiled is the profile as the planning path reads it.
func (f *fileProfile) profiled() *profiled {
	it := &trace.Iteration{TimeMS: f.TimeMS, MemExact: true, Tensors: make(map[trace.TensorID]*trace.Tensor, len(f.Tensors)), Ops: make([]trace.Op, len(f.Ops))}
	for _, t := range f.Tensors {
		it.Tensors[t.ID] = &trace.Tensor{ID: t.ID, Bytes: t.Bytes, DType: f.Strings[t.DType], Shape: t.Shape, Kind: trace.Kind(t.Kind), Ptr: t.Ptr, Frozen: t.Frozen}
	}
	pr := &profiled{iter: it, liveOut: f.LiveOut, recompute: make([]bool, len(f.Ops))}
	for i, op := range f.Ops {
		it.Ops[i] = trace.Op{Seq: i, Name: f.Strings[op.Name], Overload: f.Strings[op.Overload], Module: f.Strings[op.Module],
			Phase: trace.Phase(op.Phase), In: op.In, Out: op.Out, Mem: op.Mem, FLOPs: op.FLOPs, IOBytes: op.IOBytes}
		pr.recompute[i] = op.Recompute
	}
	return pr
}

// decodePolicy makes the policy of a checked file entry, in this
// process's vocabulary.
func (e *Engine) decodePolicy(fp *filePolicy) *policy {
	byID := make(map[trace.TensorID]*fileTensor, len(fp.Tensors))
	for i := range fp.Tensors {
		byID[fp.Tensors[i].ID] = &fp.Tensors[i]
	}
	planned := func(id trace.TensorID) plannedTensor {
		t := byID[id]
		if t.Kind != fileActivation {
			return plannedTensor{Persistent: &persistRef{ID: id, Bytes: t.Bytes, DType: t.DType, Shape: t.Shape, Kind: kindOfName(t.Kind)}}
		}
		return plannedTensor{Ptr: t.Ptr, Name: t.Producer, Overload: t.Overload, Module: t.Module, Shape: t.Shape, Ord: t.Ord}
	}
	swaps := make([]simulate.Swap, len(fp.Swaps))
	tensors := make([]plannedTensor, len(fp.Swaps))
	ip := &simulate.IssuePlan{OutOp: make([]int, len(fp.Swaps)), InOp: make([]int, len(fp.Swaps)),
		OutOrder: slices.Clone(fp.OutOrder), InOrder: slices.Clone(fp.InOrder)}
	for i, s := range fp.Swaps {
		swaps[i] = simulate.Swap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use,
			NoCopyOut: s.D2H != nil && !*s.D2H}
		tensors[i] = planned(s.Tensor)
		ip.OutOp[i], ip.InOp[i] = s.IssueOut, s.IssueIn
	}
	rcs := make([]simulate.Recompute, len(fp.Recomputes))
	for k, r := range fp.Recomputes {
		rcs[k] = r.recompute()
	}
	rtensors, mtensors := recomputeTensors(rcs, planned)
	p := newPolicy(fp.Key, e.cfg.match, e.enc.Vocab, swaps, tensors, nil, ip, rcs, rtensors, mtensors, fp.ordered)
	p.simMS, p.eng = fp.SimulatedMS, e
	if a := fp.Assumed; a != nil {
		p.env = policyEnv{Limit: a.LimitBytes, Device: a.Device,
			Link: simulate.Link{D2H: a.Link.D2H, H2D: a.Link.H2D, D2HShared: a.Link.D2HShared, H2DShared: a.Link.H2DShared}}
	}
	if fp.Profile != nil {
		p.prof = fp.Profile.profiled()
	}
	return p
}

// bindPersistent binds a loaded policy's swaps of persistent tensors to
// the handles of this job: same ID, size, dtype and shape. It tries at the
// first iterations the policy is in force, while some are unbound (the
// host may make its parameters late).
func (p *policy) bindPersistent() {
	if p.eng == nil || p.binds >= 3 {
		return
	}
	unbound := 0
	for i := range p.swaps {
		if p.fixed[i] == nil && p.tensors[i].Persistent != nil {
			unbound++
		}
	}
	if unbound == 0 {
		p.binds = 3
		return
	}
	p.binds++
	byID := map[trace.TensorID]*Tensor{}
	for _, t := range p.eng.live {
		if t.kind.persistent() {
			byID[t.id] = t
		}
	}
	for i := range p.swaps {
		r := p.tensors[i].Persistent
		if p.fixed[i] != nil || r == nil {
			continue
		}
		if t := byID[r.ID]; t != nil && t.size == r.Bytes && t.kind == r.Kind && t.dtype == r.DType && slices.Equal(t.shape, r.Shape) {
			p.fixed[i] = t
		}
	}
}
