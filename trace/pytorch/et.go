package pytorch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/chameleon-go/chameleon/trace/internal/jsonio"
)

// etNode is the part of one Execution Trace node the importer keeps.
type etNode struct {
	id        int64
	parent    int64 // ctrl_deps (schema 1.0.2+) or parent (1.0.1); == id for a root
	hasParent bool
	parentKey string // the field parent came from: "ctrl_deps" or "parent"
	name      string
	rf        int64 // rf_id: the record-function id Kineto calls "Record function id"
	hasRF     bool
	tid       int64
	seq       int64 // autograd sequence number, -1 when none
	fwTid     int64
	schema    string // op_schema
	in, out   []tensorRef
}

// tensorRef is one tensor argument: the storage it views and how much of it
// the view spans.
type tensorRef struct {
	storage  int64
	bytes    int64 // extent of the view in its storage, in bytes
	dtype    string
	shape    []int64
	device   string
	itemsize int64
}

// etDoc is a decoded Execution Trace.
type etDoc struct {
	schema string
	nodes  []*etNode // sorted by id
}

// rawNode covers both node layouts: attrs as a list of {name,type,value}
// with ctrl_deps and inputs/outputs objects (schema 1.0.2 and later), and
// the flat 1.0.1 layout (parent, rf_id, ... as node fields; inputs,
// input_shapes, input_types as parallel lists).
type rawNode struct {
	ID       *int64          `json:"id"`
	Name     *string         `json:"name"`
	CtrlDeps *int64          `json:"ctrl_deps"`
	Parent   *int64          `json:"parent"`
	Inputs   json.RawMessage `json:"inputs"`
	Outputs  json.RawMessage `json:"outputs"`
	InShapes json.RawMessage `json:"input_shapes"`
	InTypes  json.RawMessage `json:"input_types"`
	OutShape json.RawMessage `json:"output_shapes"`
	OutTypes json.RawMessage `json:"output_types"`
	Attrs    attrList        `json:"attrs"`
	RFID     json.RawMessage `json:"rf_id"`
	Tid      json.RawMessage `json:"tid"`
	SeqID    json.RawMessage `json:"seq_id"`
	FwTid    json.RawMessage `json:"fw_tid"`
	OpSchema json.RawMessage `json:"op_schema"`
}

type rawAttr struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value"`
}

type rawIO struct {
	Values  rawList `json:"values"`
	Shapes  rawList `json:"shapes"`
	Types   rawList `json:"types"`
	Strides rawList `json:"strides"`
}

// maxExtent bounds the size of one storage (1 PiB) so that garbage numbers
// cannot overflow the byte arithmetic.
const maxExtent = int64(1) << 50

// readET decodes an Execution Trace one node at a time, within the
// limits of the package.
func readET(r io.Reader, name string) (*etDoc, error) {
	dec := newDecoder(r)
	if err := expectDelim(dec, '{', name, ""); err != nil {
		return nil, err
	}
	doc := &etDoc{}
	seen := make(map[int64]bool)
	sawNodes := false
	var strs interner
	args := 0 // tensor arguments kept, against MaxTensorArgs
	for dec.More() {
		key, err := objectKey(dec, name, "")
		if err != nil {
			return nil, err
		}
		switch key {
		case "schema":
			tok, err := dec.Token()
			if err != nil {
				return nil, readErr(name, "", wrapField("schema", err))
			}
			str, ok := tok.(string)
			if !ok {
				return nil, &ParseError{File: name, Field: "schema", Err: fmt.Errorf("want a string, got %v", tok)}
			}
			if doc.schema, err = strs.get(str); err != nil {
				return nil, &ParseError{File: name, Field: "schema", Err: err}
			}
		case "nodes":
			sawNodes = true
			if err := expectDelim(dec, '[', name, "nodes"); err != nil {
				return nil, err
			}
			for i := 0; dec.More(); i++ {
				if i >= MaxNodes {
					return nil, &ParseError{File: name, Where: fmt.Sprintf("nodes[%d]", i), Err: fmt.Errorf("more than %d nodes", MaxNodes)}
				}
				var rn rawNode
				if err := dec.Decode(&rn); err != nil {
					return nil, decodeErr(name, fmt.Sprintf("nodes[%d]", i), err)
				}
				n, err := convertNode(&rn, name, i, &strs)
				if err != nil {
					return nil, err
				}
				if seen[n.id] {
					return nil, &ParseError{File: name, Where: fmt.Sprintf("node %d", n.id), Field: "id", Err: errors.New("duplicate node id")}
				}
				if args += len(n.in) + len(n.out); args > MaxTensorArgs {
					return nil, &ParseError{File: name, Where: fmt.Sprintf("node %d", n.id), Err: fmt.Errorf("more than %d tensor arguments in the file", MaxTensorArgs)}
				}
				seen[n.id] = true
				doc.nodes = append(doc.nodes, n)
			}
			if err := expectDelim(dec, ']', name, "nodes"); err != nil {
				return nil, err
			}
		default:
			if err := skipValue(dec, name, key); err != nil {
				return nil, err
			}
		}
	}
	if err := expectDelim(dec, '}', name, ""); err != nil {
		return nil, err
	}
	if err := expectEnd(dec, name); err != nil {
		return nil, err
	}
	if !sawNodes {
		return nil, &ParseError{File: name, Field: "nodes", Err: errors.New("missing: not a PyTorch execution trace")}
	}
	if doc.schema != "" && !supportedSchema(doc.schema) {
		return nil, &ParseError{File: name, Field: "schema", Err: fmt.Errorf("unsupported execution trace schema %q (want 1.0.x or 1.1.x)", doc.schema)}
	}
	slices.SortFunc(doc.nodes, func(a, b *etNode) int { return cmpInt(a.id, b.id) })
	return doc, nil
}

func supportedSchema(s string) bool {
	return strings.HasPrefix(s, "1.0.") || strings.HasPrefix(s, "1.1.") || s == "1.0" || s == "1.1"
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func convertNode(rn *rawNode, file string, idx int, strs *interner) (*etNode, error) {
	where := fmt.Sprintf("nodes[%d]", idx)
	if rn.ID == nil {
		return nil, &ParseError{File: file, Where: where, Field: "id", Err: errors.New("missing")}
	}
	n := &etNode{id: *rn.ID, seq: -1}
	where = fmt.Sprintf("node %d", n.id)
	bad := func(field string, err error) error {
		return &ParseError{File: file, Where: where, Field: field, Err: err}
	}
	if rn.Name == nil {
		return nil, bad("name", errors.New("missing"))
	}
	var err error
	if n.name, err = strs.get(*rn.Name); err != nil {
		return nil, bad("name", err)
	}
	switch {
	case rn.CtrlDeps != nil:
		n.parent, n.hasParent, n.parentKey = *rn.CtrlDeps, true, "ctrl_deps"
	case rn.Parent != nil:
		n.parent, n.hasParent, n.parentKey = *rn.Parent, true, "parent"
	}
	// Attributes: named list first, flat node fields (schema 1.0.1) else.
	set := func(field string, raw json.RawMessage) error {
		if len(raw) == 0 || string(raw) == "null" {
			return nil
		}
		switch field {
		case "rf_id", "tid", "seq_id", "fw_tid":
			v, err := parseInt(raw)
			if err != nil {
				return bad(field, err)
			}
			switch field {
			case "rf_id":
				n.rf, n.hasRF = v, true
			case "tid":
				n.tid = v
			case "seq_id":
				n.seq = v
			case "fw_tid":
				n.fwTid = v
			}
		case "op_schema":
			var schema string
			if err := json.Unmarshal(raw, &schema); err != nil {
				return bad(field, errors.New("want a string"))
			}
			var err error
			if n.schema, err = strs.get(schema); err != nil {
				return bad(field, err)
			}
		}
		return nil
	}
	for _, f := range []struct {
		k string
		v json.RawMessage
	}{{"rf_id", rn.RFID}, {"tid", rn.Tid}, {"seq_id", rn.SeqID}, {"fw_tid", rn.FwTid}, {"op_schema", rn.OpSchema}} {
		if err := set(f.k, f.v); err != nil {
			return nil, err
		}
	}
	for _, a := range rn.Attrs {
		if err := set(a.Name, a.Value); err != nil {
			return nil, err
		}
	}
	if n.in, err = parseIO(rn.Inputs, rn.InShapes, rn.InTypes, "inputs", bad, strs); err != nil {
		return nil, err
	}
	if n.out, err = parseIO(rn.Outputs, rn.OutShape, rn.OutTypes, "outputs", bad, strs); err != nil {
		return nil, err
	}
	return n, nil
}

// parseInt reads a JSON integer (or an integer written as a string).
func parseInt(raw json.RawMessage) (int64, error) {
	s := string(bytes.TrimSpace(raw))
	if len(s) >= 2 && s[0] == '"' {
		s = s[1 : len(s)-1]
	}
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return int64(u), nil // uint64 ids above 2^63 wrap; they only need to be unique
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<62 {
		return 0, fmt.Errorf("want an integer, got %.40s", s)
	}
	return int64(f), nil
}

// parseIO reads the tensor arguments of inputs or outputs. Only values whose
// type names a tensor (Tensor(...), or a GenericList of them) are read.
func parseIO(raw, shapes, types json.RawMessage, field string, bad func(string, error) error, strs *interner) ([]tensorRef, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var rio rawIO
	switch bytes.TrimSpace(raw)[0] {
	case '{':
		if err := json.Unmarshal(raw, &rio); err != nil {
			var le *listError
			if errors.As(err, &le) {
				return nil, bad(field, err)
			}
			return nil, bad(field, fmt.Errorf("want {values, shapes, types}: %v", err))
		}
	case '[': // schema 1.0.1: parallel lists
		if err := json.Unmarshal(raw, &rio.Values); err != nil {
			return nil, bad(field, err)
		}
		if len(shapes) > 0 && string(shapes) != "null" {
			if err := json.Unmarshal(shapes, &rio.Shapes); err != nil {
				return nil, bad(field[:len(field)-1]+"_shapes", err)
			}
		}
		if len(types) > 0 && string(types) != "null" {
			if err := json.Unmarshal(types, &rio.Types); err != nil {
				return nil, bad(field[:len(field)-1]+"_types", err)
			}
		}
	default:
		return nil, bad(field, errors.New("want an object or a list"))
	}
	var refs []tensorRef
	for i, v := range rio.Values {
		if i >= len(rio.Types) {
			break // no type: cannot tell a tensor from a list of ints
		}
		var typ string
		if err := json.Unmarshal(rio.Types[i], &typ); err != nil {
			return nil, bad(fmt.Sprintf("%s.types[%d]", field, i), errors.New("want a string"))
		}
		if !strings.Contains(typ, "Tensor") {
			continue
		}
		sh, st := at(rio.Shapes, i), at(rio.Strides, i)
		f := fmt.Sprintf("%s.values[%d]", field, i)
		if strings.HasPrefix(typ, "Tensor") {
			t, ok, err := parseTensor(v, sh, st, tensorDType(typ))
			if err == nil && ok {
				err = t.intern(strs)
			}
			if err != nil {
				return nil, bad(f, err)
			}
			if ok {
				refs = append(refs, t)
			}
			continue
		}
		// A list of tensors: GenericList[Tensor(float),Tensor(float),...].
		var elems, shs, sts rawList
		if err := json.Unmarshal(v, &elems); err != nil {
			var le *listError
			if errors.As(err, &le) {
				return nil, bad(f, err)
			}
			continue // "<None>" or a scalar in an optional list
		}
		_ = json.Unmarshal(sh, &shs)
		_ = json.Unmarshal(st, &sts)
		dts := listDTypes(typ)
		for j, e := range elems {
			dt := ""
			if j < len(dts) {
				dt = dts[j]
			}
			t, ok, err := parseTensor(e, at(shs, j), at(sts, j), dt)
			if err == nil && ok {
				err = t.intern(strs)
			}
			if err != nil {
				return nil, bad(fmt.Sprintf("%s[%d]", f, j), err)
			}
			if ok {
				refs = append(refs, t)
			}
		}
	}
	return refs, nil
}

// intern makes the dtype and device shared copies.
func (t *tensorRef) intern(strs *interner) (err error) {
	if t.dtype, err = strs.get(t.dtype); err != nil {
		return err
	}
	t.device, err = strs.get(t.device)
	return err
}

func at(l []json.RawMessage, i int) json.RawMessage {
	if i < len(l) {
		return l[i]
	}
	return nil
}

// parseTensor reads [tensor_id, storage_id, offset, numel, itemsize, device].
// ok is false for values that name no device storage: undefined tensors
// (storage 0 or no device), CPU and meta tensors, and empty views.
func parseTensor(v, shape, strides json.RawMessage, dtype string) (tensorRef, bool, error) {
	var parts rawList
	if err := json.Unmarshal(v, &parts); err != nil {
		if len(v) > 0 && (v[0] == '"' || string(v) == "null") {
			return tensorRef{}, false, nil // "<None>": an absent optional tensor
		}
		var le *listError
		if errors.As(err, &le) {
			return tensorRef{}, false, fmt.Errorf("want 6 elements [tensor_id, storage_id, offset, numel, itemsize, device], got %d", le.n)
		}
		return tensorRef{}, false, errors.New("want [tensor_id, storage_id, offset, numel, itemsize, device]")
	}
	if len(parts) != 6 {
		return tensorRef{}, false, fmt.Errorf("want 6 elements [tensor_id, storage_id, offset, numel, itemsize, device], got %d", len(parts))
	}
	var num [5]int64
	for k := range 5 {
		x, err := parseInt(parts[k])
		if err != nil {
			return tensorRef{}, false, fmt.Errorf("element %d: %v", k, err)
		}
		num[k] = x
	}
	var dev string
	if err := json.Unmarshal(parts[5], &dev); err != nil {
		return tensorRef{}, false, errors.New("element 5 (device): want a string")
	}
	sid, off, numel, item := num[1], num[2], num[3], num[4]
	if off < 0 || numel < 0 || item < 0 || off > maxExtent || numel > maxExtent || item > 64 {
		return tensorRef{}, false, fmt.Errorf("implausible offset %d, numel %d or itemsize %d", off, numel, item)
	}
	if sid == 0 || dev == "" || dev == "cpu" || strings.HasPrefix(dev, "meta") || numel == 0 || item == 0 {
		return tensorRef{}, false, nil
	}
	t := tensorRef{storage: sid, dtype: dtype, device: dev, itemsize: item}
	sh, st := dims(shape), dims(strides)
	t.shape = sh
	// The view spans offset + 1 + sum((size-1)*stride) elements; a broadcast
	// (stride 0) view spans far fewer than numel. Without strides assume a
	// dense view.
	ext := off + numel
	if len(st) == len(sh) && len(sh) > 0 {
		span, ok := int64(1), true
		for k, s := range sh {
			if s <= 0 || st[k] < 0 || s > maxExtent || st[k] > maxExtent {
				ok = false
				break
			}
			span += (s - 1) * st[k]
			if span > maxExtent {
				ok = false
				break
			}
		}
		if ok {
			ext = off + span
		}
	}
	if ext > maxExtent || ext*item > trace.MaxBytes {
		return tensorRef{}, false, fmt.Errorf("implausible extent %d elements of %d bytes", ext, item)
	}
	t.bytes = ext * item
	return t, true, nil
}

// dims reads a shape or strides list; nil when it is not a list of
// integers or has more than trace.MaxShapeDims of them.
func dims(raw json.RawMessage) []int64 {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' || raw[len(raw)-1] != ']' || jsonio.CountElements(raw) > trace.MaxShapeDims {
		return nil
	}
	var d []int64
	_ = json.Unmarshal(raw, &d) // what it could read, as before the cap
	return d
}

// tensorDType maps "Tensor(c10::BFloat16)" to "bfloat16".
func tensorDType(typ string) string {
	i, j := strings.IndexByte(typ, '('), strings.LastIndexByte(typ, ')')
	if i < 0 || j <= i {
		return ""
	}
	return cppDType(typ[i+1 : j])
}

func listDTypes(typ string) []string {
	var out []string
	for _, part := range strings.Split(typ, "Tensor(")[1:] {
		if k := strings.IndexByte(part, ')'); k >= 0 {
			out = append(out, cppDType(part[:k]))
		}
	}
	return out
}

func cppDType(s string) string {
	switch s {
	case "float":
		return "float32"
	case "double":
		return "float64"
	case "c10::Half":
		return "float16"
	case "c10::BFloat16":
		return "bfloat16"
	case "long int", "long", "int64_t":
		return "int64"
	case "int":
		return "int32"
	case "short int", "short":
		return "int16"
	case "signed char":
		return "int8"
	case "unsigned char":
		return "uint8"
	case "bool":
		return "bool"
	case "c10::complex<float>":
		return "complex64"
	case "c10::complex<double>":
		return "complex128"
	case "c10::Float8_e4m3fn":
		return "float8_e4m3fn"
	case "c10::Float8_e5m2":
		return "float8_e5m2"
	}
	return s
}

// overload extracts the overload name from op_schema:
// "aten::empty.memory_format(SymInt[] size, ...)" -> "memory_format",
// "aten::view(Tensor(a) self, ...)" -> "default"; "" when unknown.
func overload(name, schema string) string {
	i := strings.IndexByte(schema, '(')
	if i < 0 || !strings.HasPrefix(schema[:i], name) {
		return ""
	}
	rest := schema[len(name):i]
	if rest == "" {
		return "default"
	}
	if rest[0] == '.' && len(rest) > 1 {
		return rest[1:]
	}
	return ""
}

// JSON streaming helpers shared by both decoders.

func expectDelim(dec *decoder, d json.Delim, name, field string) error {
	tok, err := dec.Token()
	if err != nil {
		return readErr(name, "", wrapField(field, err))
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		return &ParseError{File: name, Field: field, Err: fmt.Errorf("want %q, got %v", string(d), tok)}
	}
	return nil
}

func wrapField(field string, err error) error {
	if field == "" {
		return err
	}
	return fmt.Errorf("in %q: %w", field, err)
}

func objectKey(dec *decoder, name, where string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", readErr(name, where, err)
	}
	key, ok := tok.(string)
	if !ok {
		return "", &ParseError{File: name, Where: where, Err: fmt.Errorf("want an object key, got %v", tok)}
	}
	return key, nil
}

// skipValue reads past one value, at most MaxValueBytes of it, without
// decoding it: the decoder's scan is tens of times faster than a token at
// a time.
func skipValue(dec *decoder, name, field string) error {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return readErr(name, "", wrapField(clip(field), err))
	}
	return nil
}

// expectEnd checks that only white space follows the document, reading the
// stream to its end so that a gzip stream verifies its length and checksum.
func expectEnd(dec *decoder, name string) error {
	rest := dec.rest()
	buf := make([]byte, 4<<10) // usually a newline is left, if anything
	for {
		n, err := rest.Read(buf)
		if len(bytes.TrimSpace(buf[:n])) > 0 {
			return &ParseError{File: name, Err: errors.New("data after the end of the JSON document")}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return readErr(name, "", err)
		}
	}
}

// decodeErr turns a Decode error into a ParseError naming the field.
func decodeErr(name, where string, err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &ParseError{File: name, Where: where, Field: te.Field, Err: fmt.Errorf("want %s, got JSON %s", te.Type, te.Value)}
	}
	var le *listError
	if errors.As(err, &le) {
		return &ParseError{File: name, Where: where, Field: "attrs", Err: err} // the one list a node decodes whole
	}
	return readErr(name, where, err)
}
