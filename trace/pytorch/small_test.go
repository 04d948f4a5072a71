package pytorch

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/trace"
)

// A hand-made step: fwd mm, in-place add_, sum, mul reusing the address of
// the freed mm output, a backward mul on the autograd thread, and an SGD
// step (foreach add_ over a list of tensors).

type tref struct {
	tid, sid, off, numel, item int64
	dtype                      string
	shape                      []int64
}

func (t tref) value() []any   { return []any{t.tid, t.sid, t.off, t.numel, t.item, "cuda:0"} }
func (t tref) typ() string    { return "Tensor(" + t.dtype + ")" }
func (t tref) strides() []any { return dense(t.shape) }

func dense(shape []int64) []any {
	st := make([]any, len(shape))
	s := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = s
		s *= shape[i]
	}
	return st
}

type snode struct {
	id, parent, rf, tid, seq int64
	name, schema             string
	in, out                  []any // tref, []tref, or a scalar
}

var (
	tx  = tref{100, 10, 0, 16, 4, "float", []int64{4, 4}}
	tw  = tref{101, 11, 0, 16, 4, "float", []int64{4, 4}}
	ty  = tref{102, 12, 0, 16, 4, "float", []int64{4, 4}}
	ts  = tref{103, 13, 0, 1, 4, "float", nil}
	ty2 = tref{104, 12, 0, 16, 4, "float", []int64{4, 4}} // address of y, reused
	tg  = tref{105, 14, 0, 16, 4, "float", []int64{4, 4}}
)

var smallNodes = []snode{
	{id: 1, parent: 1, name: "[pytorch|profiler|execution_trace|process]"},
	{id: 2, parent: 1, name: "[pytorch|profiler|execution_trace|thread]", tid: 1},
	{id: 3, parent: 2, rf: 1, tid: 1, seq: 7, name: "aten::mm", schema: "aten::mm(Tensor self, Tensor mat2) -> Tensor", in: []any{tx, tw}, out: []any{ty}},
	{id: 4, parent: 2, rf: 2, tid: 1, seq: 8, name: "aten::add_", schema: "aten::add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)", in: []any{ty, tx, 1}, out: []any{ty}},
	{id: 5, parent: 2, rf: 3, tid: 1, seq: 9, name: "aten::sum", schema: "aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor", in: []any{ty}, out: []any{ts}},
	{id: 6, parent: 2, rf: 4, tid: 1, seq: 10, name: "aten::mul", schema: "aten::mul.Scalar(Tensor self, Scalar other) -> Tensor", in: []any{tx, 2.0}, out: []any{ty2}},
	{id: 7, parent: 2, rf: 5, tid: 1, seq: -1, name: "aten::ones_like", schema: "aten::ones_like(Tensor self) -> Tensor", in: []any{ts}, out: []any{tref{106, 15, 0, 1, 4, "float", nil}}},
	{id: 8, parent: 1, name: "[pytorch|profiler|execution_trace|thread]", tid: 2},
	{id: 9, parent: 8, rf: 6, tid: 2, name: "autograd::engine::evaluate_function: MulBackward0"},
	{id: 10, parent: 9, rf: 7, tid: 2, seq: 10, name: "MulBackward0"},
	{id: 11, parent: 10, rf: 8, tid: 2, name: "aten::mul", schema: "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor", in: []any{ty2, tw}, out: []any{tg}},
	{id: 12, parent: 2, rf: 9, tid: 1, name: "Optimizer.step#SGD.step"},
	{id: 13, parent: 12, rf: 10, tid: 1, name: "aten::_foreach_add_", schema: "aten::_foreach_add_.List(Tensor(a!)[] self, Tensor[] other, *, Scalar alpha=1) -> ()", in: []any{[]tref{tw}, []tref{tg}, -0.1}},
}

func ioJSON(vals []any) map[string]any {
	io := map[string]any{"values": []any{}, "shapes": []any{}, "types": []any{}, "strides": []any{}}
	for _, v := range vals {
		var val, sh, ty, st any
		switch x := v.(type) {
		case tref:
			val, sh, ty, st = x.value(), x.shape, x.typ(), x.strides()
			if x.shape == nil {
				sh, st = []any{}, []any{}
			}
		case []tref:
			var vs, shs, sts []any
			var tys []string
			for _, t := range x {
				vs, shs, sts = append(vs, t.value()), append(shs, t.shape), append(sts, t.strides())
				tys = append(tys, t.typ())
			}
			val, sh, st, ty = vs, shs, sts, "GenericList["+strings.Join(tys, ",")+"]"
		case int:
			val, sh, ty, st = x, []any{}, "Int", []any{}
		default:
			val, sh, ty, st = x, []any{}, "Double", []any{}
		}
		io["values"] = append(io["values"].([]any), val)
		io["shapes"] = append(io["shapes"].([]any), sh)
		io["types"] = append(io["types"].([]any), ty)
		io["strides"] = append(io["strides"].([]any), st)
	}
	return io
}

// smallET renders the nodes in the attrs layout (schema 1.1.1) or, with
// flat, in the 1.0.1 layout; nodes come in post-order like the real writer.
func smallET(nodes []snode, flat bool) []byte {
	order := []int{2, 3, 4, 5, 6, 1, 10, 9, 8, 7, 12, 11, 0}
	var out []any
	for _, i := range order {
		if i >= len(nodes) {
			continue
		}
		n := nodes[i]
		if flat {
			in, o := ioJSON(n.in), ioJSON(n.out)
			out = append(out, map[string]any{
				"id": n.id, "name": n.name, "parent": n.parent, "rf_id": n.rf, "tid": n.tid, "seq_id": n.seq,
				"fw_tid": 0, "op_schema": n.schema, "inputs": in["values"], "input_shapes": in["shapes"],
				"input_types": in["types"], "outputs": o["values"], "output_shapes": o["shapes"], "output_types": o["types"],
			})
			continue
		}
		out = append(out, map[string]any{
			"id": n.id, "name": n.name, "ctrl_deps": n.parent, "inputs": ioJSON(n.in), "outputs": ioJSON(n.out),
			"attrs": []any{
				map[string]any{"name": "op_schema", "type": "string", "value": n.schema},
				map[string]any{"name": "tid", "type": "uint64", "value": n.tid},
				map[string]any{"name": "seq_id", "type": "int64", "value": n.seq},
				map[string]any{"name": "rf_id", "type": "uint64", "value": n.rf},
			},
		})
	}
	schema := "1.1.1-chakra.0.0.4"
	if flat {
		schema = "1.0.1"
	}
	b, _ := json.Marshal(map[string]any{"schema": schema, "pid": 7, "nodes": out, "finish_ts": 9})
	return b
}

// smallKineto: cpu_ops at 100 µs steps, kernels for mm (rf 1), sum (rf 3)
// and the backward mul (rf 8), memory events.
func smallKineto(rfShift int64) []byte {
	var ev []any
	cpu := func(rf int64, name string, ts, dur float64) {
		ev = append(ev, map[string]any{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
			"args": map[string]any{"External id": rf + 1000, "Record function id": rf + rfShift}})
	}
	for _, n := range smallNodes {
		if n.rf > 0 {
			cat := "cpu_op"
			if strings.HasPrefix(n.name, "Optimizer.") {
				cat = "user_annotation"
			}
			ev = append(ev, map[string]any{"ph": "X", "cat": cat, "name": n.name, "pid": 1, "tid": n.tid, "ts": float64(n.rf * 100), "dur": 50.0,
				"args": map[string]any{"External id": n.rf + 1000, "Record function id": n.rf + rfShift}})
		}
	}
	_ = cpu
	kern := func(ext int64, ts, dur float64) {
		ev = append(ev, map[string]any{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
			"args": map[string]any{"External id": ext, "correlation": ext + 5000}})
	}
	kern(1001, 120, 30)
	kern(1001, 150, 5)
	kern(1003, 320, 2)
	// The backward mul's kernel names its launch by correlation only.
	ev = append(ev, map[string]any{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": 810.0, "dur": 3.0,
		"args": map[string]any{"External id": 1008, "correlation": 9008}})
	ev = append(ev, map[string]any{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 820.0, "dur": 7.0,
		"args": map[string]any{"correlation": 9008}})
	mem := func(ts float64, total, bytes int64, dev int) {
		ev = append(ev, map[string]any{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "s": "t",
			"args": map[string]any{"Total Allocated": total, "Bytes": bytes, "Addr": 1 << 40, "Device Type": dev, "Device Id": 0}})
	}
	mem(110, 1064, 64, 1)  // mm allocates y
	mem(115, 9999, 64, 0)  // a CPU allocation: ignored
	mem(310, 1576, 512, 1) // sum
	mem(330, 1512, -64, 1) // y freed
	mem(410, 1576, 64, 1)  // mul
	mem(810, 2000, 424, 1) // backward mul (peak)
	mem(820, 1700, -300, 1)
	b, _ := json.Marshal(map[string]any{"schemaVersion": 1, "deviceProperties": []any{map[string]any{"id": 0, "name": "Test GPU"}},
		"traceEvents": ev, "traceName": "x"})
	return b
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func loadSmall(t *testing.T, et, k []byte) *Result {
	t.Helper()
	res, err := Load(bytes.NewReader(et), "small.et.json", bytes.NewReader(k), "small.kineto.json")
	require.NoError(t, err)
	return res
}

func TestSmall(t *testing.T) {
	for _, flat := range []bool{false, true} {
		t.Run(fmt.Sprintf("flat=%v", flat), func(t *testing.T) {
			res := loadSmall(t, smallET(smallNodes, flat), gz(smallKineto(0)))
			it := res.Trace.Iterations[0]
			var names []string
			var phases []trace.Phase
			for _, op := range it.Ops {
				names = append(names, op.Name)
				phases = append(phases, op.Phase)
			}
			assert.Equal(t, []string{"aten::mm", "aten::add_", "aten::sum", "aten::mul", "aten::ones_like", "aten::mul", "aten::_foreach_add_"}, names)
			F, B, O := trace.PhaseForward, trace.PhaseBackward, trace.PhaseOptimizer
			assert.Equal(t, []trace.Phase{F, F, F, F, B, B, O}, phases)
			assert.Equal(t, 7, res.MatchedOps)
			assert.Equal(t, "Test GPU", res.Trace.Header.Device)

			mm, add, sum, mul, _, bmul, step := it.Ops[0], it.Ops[1], it.Ops[2], it.Ops[3], it.Ops[4], it.Ops[5], it.Ops[6]
			assert.Equal(t, "default", mm.Overload)
			assert.Equal(t, "Tensor", add.Overload)
			assert.Equal(t, "List", step.Overload)
			assert.Equal(t, "#MulBackward0", bmul.Module)
			assert.Empty(t, mm.Module)

			// Kernel time where kernels ran (two kernels for mm, one found by
			// correlation for the backward mul), host time elsewhere.
			assert.InDelta(t, 35, mm.DurUS, 1e-9)
			assert.InDelta(t, 2, sum.DurUS, 1e-9)
			assert.InDelta(t, 7, bmul.DurUS, 1e-9)
			assert.InDelta(t, 50, add.DurUS, 1e-9)
			assert.Equal(t, 2, res.Ops[0].Kernels)
			assert.InDelta(t, 50, res.Ops[0].CPUDurUS, 1e-9)
			assert.InDelta(t, 44, res.KernelUS, 1e-9)
			assert.Zero(t, res.UnattributedKernelUS)

			// Mem: last device event at or before the op's host end (rf*100+50);
			// before the first event, its total less its own bytes.
			var mems []int64
			for _, op := range it.Ops {
				mems = append(mems, op.Mem)
			}
			assert.Equal(t, []int64{1064, 1064, 1512, 1576, 1576, 1700, 1700}, mems)
			assert.Equal(t, int64(2000), it.PeakBytes)
			// Span: host start of mm (100) to host end of the step's add_
			// (1050), for 44 us of kernels: host-bound, so the iteration is
			// timed by its kernels and warned about.
			assert.InDelta(t, 0.95, it.WallMS, 1e-9)
			assert.InDelta(t, 0.044, it.TimeMS, 1e-9)

			// Storage identity.
			x, w, y := mm.In[0], mm.In[1], mm.Out[0]
			assert.Equal(t, []trace.TensorID{y, x}, add.In)
			assert.Equal(t, []trace.TensorID{y}, add.Out, "in-place keeps the id")
			y2 := mul.Out[0]
			assert.NotEqual(t, y, y2, "a reallocated address is a new tensor")
			assert.Equal(t, []trace.TensorID{y2, w}, bmul.In)
			g := bmul.Out[0]
			assert.Equal(t, []trace.TensorID{w, g}, step.In)
			assert.Empty(t, step.Out)
			assert.Equal(t, trace.KindInput, it.Tensors[x].Kind)
			assert.Equal(t, trace.KindParam, it.Tensors[w].Kind, "read by the optimizer")
			assert.Equal(t, trace.KindActivation, it.Tensors[y].Kind)
			assert.Equal(t, trace.KindActivation, it.Tensors[g].Kind)
			assert.Equal(t, int64(64), it.Tensors[y].Bytes)
			assert.Equal(t, "float32", it.Tensors[y].DType)
			assert.Equal(t, []int64{4, 4}, it.Tensors[y].Shape)
			assert.True(t, it.HasMem())
		})
	}
}

func TestSmallParamThreshold(t *testing.T) {
	res, err := Load(bytes.NewReader(smallET(smallNodes, false)), "e", bytes.NewReader(smallKineto(0)), "k", WithParamMinBytes(16))
	require.NoError(t, err)
	it := res.Trace.Iterations[0]
	assert.Equal(t, trace.KindParam, it.Tensors[it.Ops[0].In[0]].Kind, "64 bytes >= 16: a big pre-existing tensor is a param")
}

func TestBroadcastExtent(t *testing.T) {
	// [1024] expanded to [1024, 1024] with stride 0: numel is a million,
	// the storage 1024 elements.
	v := json.RawMessage(`[21, 7, 0, 1048576, 8, "cuda:0"]`)
	r, ok, err := parseTensor(v, json.RawMessage(`[1024, 1024]`), json.RawMessage(`[1, 0]`), "int64")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(1024*8), r.bytes)
	r, ok, err = parseTensor(json.RawMessage(`[21, 7, 10, 6, 2, "cuda:0"]`), nil, nil, "")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, int64(32), r.bytes, "(offset+numel)*itemsize without strides")
	_, ok, err = parseTensor(json.RawMessage(`[291, 0, 0, 0, 0, ""]`), nil, nil, "")
	require.NoError(t, err)
	assert.False(t, ok, "undefined tensor")
	_, ok, err = parseTensor(json.RawMessage(`[1, 5, 0, 4, 4, "cpu"]`), nil, nil, "")
	require.NoError(t, err)
	assert.False(t, ok, "CPU tensor")
}

func TestOverload(t *testing.T) {
	assert.Equal(t, "memory_format", overload("aten::empty", "aten::empty.memory_format(SymInt[] size) -> Tensor"))
	assert.Equal(t, "default", overload("aten::view", "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)"))
	assert.Equal(t, "", overload("aten::view", ""))
	assert.Equal(t, "", overload("aten::view", "aten::viewx(Tensor self)"))
}

func TestSmallErrors(t *testing.T) {
	et, k := smallET(smallNodes, false), smallKineto(0)
	load := func(et, k []byte) error {
		_, err := Load(bytes.NewReader(et), "s.et.json", bytes.NewReader(k), "s.kineto.json")
		return err
	}
	// Kineto of another run: record-function ids name nothing here.
	err := load(et, smallKineto(500))
	require.ErrorIs(t, err, ErrMismatched)
	assert.Contains(t, err.Error(), "s.kineto.json")
	// Same ids, other operators.
	err = load(et, smallKineto(1))
	require.ErrorIs(t, err, ErrMismatched)
	assert.Contains(t, err.Error(), "Record function id")

	cases := []struct {
		name, et, k, want string
	}{
		{"not json", "garbage", string(k), "s.et.json"},
		{"no nodes", `{"schema": "1.1.1"}`, string(k), `"nodes"`},
		{"schema", `{"schema": "2.0.0", "nodes": []}`, string(k), `"schema"`},
		{"node without id", `{"nodes": [{"name": "aten::mm"}]}`, string(k), `nodes[0]: field "id"`},
		{"bad rf_id", `{"nodes": [{"id": 4, "name": "aten::mm", "attrs": [{"name": "rf_id", "value": "x"}]}]}`, string(k), `node 4: field "rf_id"`},
		{"bad tensor", `{"nodes": [{"id": 4, "name": "aten::mm", "inputs": {"values": [[1, 2, 3]], "types": ["Tensor(float)"]}}]}`, string(k), `node 4: field "inputs.values[0]"`},
		{"tensor above the size cap", `{"nodes": [{"id": 4, "name": "aten::mm", "inputs": {"values": [[1, 2, 0, 1125899906842624, 8, "cuda:0"]], "types": ["Tensor(double)"]}}]}`, string(k), `node 4: field "inputs.values[0]": implausible extent`},
		{"duplicate id", `{"nodes": [{"id": 4, "name": "a"}, {"id": 4, "name": "b"}]}`, string(k), "duplicate"},
		{"cycle", `{"nodes": [{"id": 4, "name": "aten::a", "ctrl_deps": 5}, {"id": 5, "name": "aten::b", "ctrl_deps": 4}]}`, string(k), "cycle"},
		{"no aten ops", `{"nodes": [{"id": 1, "name": "x"}]}`, string(k), "no aten operators"},
		{"trailing data", string(et) + "}", string(k), "after the end"},
		{"truncated", string(et[:len(et)/2]), string(k), "truncated"},
		{"kineto not json", string(et), "[1,2]", "s.kineto.json"},
		{"kineto no events", string(et), `{"schemaVersion": 1}`, `"traceEvents"`},
		{"kineto bad ts", string(et), `{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "soon", "dur": 1}]}`, `traceEvents[0]: field "ts"`},
		{"kineto bad memory", string(et), `{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Total Allocated": -5}}]}`, `field "args.Total Allocated"`},
		{"kineto memory above the cap", string(et), `{"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Total Allocated": 1000000000000000000}}]}`, `field "args.Total Allocated": 1000000000000000000 outside`},
		{"kineto bad dur", string(et), `{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": -1}]}`, `traceEvents[0]: field "dur"`},
		{"kineto without rf ids", string(et), `{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1}]}`, "record-function id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := load([]byte(c.et), []byte(c.k))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestTruncatedGzip(t *testing.T) {
	et, k := gz(smallET(smallNodes, false)), gz(smallKineto(0))
	for _, cut := range []int{len(et) - 4, len(et) - 9, len(et) / 2, 11} {
		_, err := Load(bytes.NewReader(et[:cut]), "s.et.json.gz", bytes.NewReader(k), "s.kineto.json.gz")
		require.Error(t, err, "cut at %d of %d", cut, len(et))
		assert.Contains(t, err.Error(), "s.et.json.gz")
	}
	_, err := Load(bytes.NewReader(et), "s.et.json.gz", bytes.NewReader(k[:len(k)-3]), "s.kineto.json.gz")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "s.kineto.json.gz")
	_, err = Load(bytes.NewReader(et), "s.et.json.gz", bytes.NewReader(k), "s.kineto.json.gz")
	require.NoError(t, err)
}
