package policyfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"

	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/trace"
)

// fieldError is a field of the policy file that cannot be used.
type fieldError struct {
	path string // e.g. policies[2].swaps[5].bytes
	msg  string
}

func (e *fieldError) Error() string { return e.path + ": " + e.msg }

func bad(path, format string, args ...any) error {
	return &fieldError{path: path, msg: fmt.Sprintf(format, args...)}
}

// Config is what the decoder checks sizes against.
type Config struct {
	// MaxTensor is the largest tensor the device can hold: a tensor or a
	// swap or recompute of more bytes is refused. 0, or more than
	// MaxTensorBytes: MaxTensorBytes.
	MaxTensor int64
}

// Decode reads a policy file (version 2, or version 1 converted) and
// checks every field. The error names the field, with its entry indices
// (policies[0].swaps[17].bytes), or the line of the JSON that is wrong: the
// caller adds the file's name. On error the File is the zero File.
//
// A file of version 1 comes back as its policies alone (no Format,
// Version or Last), converted to version 2: its swaps of activations,
// issued at their own ops, with nothing it did not record (no
// assumptions, no profile) and no ordinals (Policy.Ordered is false).
func Decode(data []byte, dc Config) (File, error) {
	var none File
	if len(data) > MaxFileBytes {
		return none, fmt.Errorf("%d bytes: larger than the %d bytes a policy file may have", len(data), MaxFileBytes)
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
	case *probe.Format == FormatV1:
		var v1 FileV1
		if err := strictDecode(data, &v1); err != nil {
			return none, err
		}
		ps, err := convertV1(v1, dc)
		return File{Policies: ps}, err
	case *probe.Format != FormatName:
		return none, bad("format", "%q: not a policy file (want %q)", *probe.Format, FormatName)
	case probe.Version == nil:
		return none, bad("version", "missing")
	case *probe.Version != Version:
		return none, bad("version", "%d: this build reads versions 1 and %d", *probe.Version, Version)
	}
	var c File
	if err := strictDecode(data, &c); err != nil {
		return none, err
	}
	if len(c.Policies) > MaxPolicies {
		return none, bad("policies", "%d policies: at most %d", len(c.Policies), MaxPolicies)
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
		if !slices.ContainsFunc(c.Policies, func(p Policy) bool { return p.Key == *c.Last }) {
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
		return fmt.Errorf("line %d: field %s: %s, want %s", lineOf(data, te.Offset), field, te.Value, jsonKind(te.Type))
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("truncated: %w", err)
	}
	if what != "" {
		return fmt.Errorf("%s: %w", what, err)
	}
	return err
}

// jsonKind says what JSON value a field of Go type t takes, as the file's
// format names it (docs/policy.md), not as Go names the type.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return "a value"
}

// lineOf is the line of data that byte offset off is on, from 1.
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
	if len(shape) > MaxDims {
		return bad(path, "%d dimensions: at most %d", len(shape), MaxDims)
	}
	for d, x := range shape {
		if x < 0 || x > MaxDim {
			return bad(fmt.Sprintf("%s[%d]", path, d), "%d: want 0 to %d", x, int64(MaxDim))
		}
	}
	return nil
}

func checkName(path, s string) error {
	if len(s) > MaxNameLen {
		return bad(path, "%d bytes: at most %d", len(s), MaxNameLen)
	}
	return nil
}

func checkFloat(path string, x, hi float64) error {
	if math.IsNaN(x) || x < 0 || x > hi {
		return bad(path, "%g: want 0 to %g", x, hi)
	}
	return nil
}

func (dc Config) tensorMax() (int64, string) {
	if dc.MaxTensor > 0 && dc.MaxTensor < MaxTensorBytes {
		return dc.MaxTensor, "the device"
	}
	return MaxTensorBytes, "4 TiB"
}

func validateKey(k controller.Key, path string) error {
	if k.Ops < 1 || k.Ops > MaxOps {
		return bad(path+".ops", "%d: want 1 to %d", k.Ops, MaxOps)
	}
	if k.Bytes < 0 || k.Bytes > MaxKeyBytes {
		return bad(path+".bytes", "%d: want 0 to %d", k.Bytes, int64(MaxKeyBytes))
	}
	return nil
}

// validate checks every field of a policy against the others and the
// ranges of docs/policy.md.
func (p *Policy) validate(path string, dc Config) error {
	if err := validateKey(p.Key, path+".key"); err != nil {
		return err
	}
	nops := p.Key.Ops
	tmax, twhat := dc.tensorMax()
	if a := p.Assumed; a != nil {
		ap := path + ".assumed"
		if a.LimitBytes < 1 || a.LimitBytes > MaxTensorBytes*64 {
			return bad(ap+".limit_bytes", "%d: want 1 to %d", a.LimitBytes, int64(MaxTensorBytes*64))
		}
		for _, r := range []struct {
			name string
			v    float64
		}{{"d2h_bytes_per_s", a.Link.D2H}, {"h2d_bytes_per_s", a.Link.H2D}, {"d2h_shared_bytes_per_s", a.Link.D2HShared}, {"h2d_shared_bytes_per_s", a.Link.H2DShared}} {
			if !(r.v > 0) || r.v > MaxLinkRate {
				return bad(ap+".link."+r.name, "%g: want a rate above 0 and at most %g", r.v, MaxLinkRate)
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
		if err := checkCount(path+"."+c.name, c.n, MaxEntries); err != nil {
			return err
		}
	}
	known := make(map[trace.TensorID]*Tensor, len(p.Tensors))
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
		case KindActivation, KindParam, KindOptState, KindFrozen:
		default:
			return bad(tp+".kind", "%q: want %q, %q, %q or %q", t.Kind, KindActivation, KindParam, KindOptState, KindFrozen)
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
		if activation && t.Kind != KindActivation {
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
		sw := s.Sim()
		if err := sw.Validate(nops); err != nil {
			return bad(sp, "%v", err)
		}
		// Where the copy out may be issued (simulate.Issue): after Out
		// and before the op that waits for it; a write-back's from its
		// write on, by Out at the latest (within the iteration: it is
		// released at Out), or to the iteration's end (the previous
		// iteration's write: for the next one's release).
		lo, hi := s.Out, s.Use-1
		switch {
		case sw.EarlyWraps():
			lo, hi = sw.CopyAfter, nops-1
		case sw.Early:
			lo, hi = sw.CopyAfter, s.Out
		case sw.Wraps():
			hi = nops - 1
		}
		if s.IssueOut < lo || s.IssueOut > hi {
			return bad(sp+".issue_out_after_op", "%d: want %d to %d", s.IssueOut, lo, hi)
		}
		if sw.Wraps() {
			if s.IssueIn < s.In || s.IssueIn > s.Use {
				return bad(sp+".issue_in_at_op", "%d: want %d to %d", s.IssueIn, s.In, s.Use)
			}
			continue
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
		if err := checkCount(rp+".kept_inputs", len(r.Kept), MaxEntries); err != nil {
			return err
		}
		if err := checkCount(rp+".remade_inputs", len(r.Remade), MaxEntries); err != nil {
			return err
		}
		rc := r.Sim()
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

// validate checks the profile and returns its tensors' IDs.
func (f *Profile) validate(path string, nops int, tmax int64, twhat string) (map[trace.TensorID]bool, error) {
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
		if err := checkCount(path+"."+c.name, c.n, MaxEntries); err != nil {
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
			if err := checkCount(opp+"."+l.name, len(l.ids), MaxEntries); err != nil {
				return nil, err
			}
			for j, id := range l.ids {
				if !ids[id] {
					return nil, bad(fmt.Sprintf("%s.%s[%d]", opp, l.name, j), "%d: not among the profile's tensors", id)
				}
			}
		}
		if op.Mem < -1 || op.Mem > MaxKeyBytes {
			return nil, bad(opp+".mem", "%d: want -1 (none) to %d", op.Mem, int64(MaxKeyBytes))
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
func convertV1(v1 FileV1, dc Config) ([]Policy, error) {
	if len(v1.Policies) > MaxPolicies {
		return nil, bad("policies", "%d policies: at most %d", len(v1.Policies), MaxPolicies)
	}
	out := make([]Policy, 0, len(v1.Policies))
	for i, sp := range v1.Policies {
		path := fmt.Sprintf("policies[%d]", i)
		if len(sp.Tensors) != len(sp.Swaps) {
			return nil, bad(path+".tensors", "%d entries for %d swaps", len(sp.Tensors), len(sp.Swaps))
		}
		if err := checkCount(path+".swaps", len(sp.Swaps), MaxEntries); err != nil {
			return nil, err
		}
		fp := Policy{Key: sp.Key}
		seen := map[trace.TensorID]bool{}
		for j, s := range sp.Swaps {
			t := sp.Tensors[j]
			if !seen[s.Tensor] && s.Tensor >= 0 {
				seen[s.Tensor] = true
				fp.Tensors = append(fp.Tensors, Tensor{ID: s.Tensor, Kind: KindActivation, Bytes: max(s.Bytes, 1), Shape: t.Shape,
					Ptr: t.Ptr, Producer: t.Producer, Overload: t.Overload, Module: t.Module})
			}
			fp.Swaps = append(fp.Swaps, Swap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use,
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
