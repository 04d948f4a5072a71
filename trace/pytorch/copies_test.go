package pytorch

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/trace"
)

// producesNew reports whether op returns a tensor it was not handed.
func producesNew(op *trace.Op) bool {
	return slices.ContainsFunc(op.Out, func(id trace.TensorID) bool { return !slices.Contains(op.In, id) })
}

// In the bundled step, op 404 (node 1913) is an aten::reshape of a
// transposed gradient: the strides allow no view, so it cloned into a new
// storage (ET storage 1130, tensor 302) and the next reshape (405) and t
// (406) view that copy. The copy is a producer of a new tensor named after
// the clone that allocated it; the views around it stay views of their
// input's tensor.
func TestRealReshapeThatCopies(t *testing.T) {
	res := loadReal(t)
	it := res.Trace.Iterations[0]

	cp := &it.Ops[404]
	assert.Equal(t, int64(1913), res.Ops[404].NodeID)
	assert.Equal(t, "aten::reshape", res.Ops[404].ETName)
	assert.Equal(t, "aten::clone", cp.Name, "a reshape that copied is named after the clone inside it")
	assert.Equal(t, "default", cp.Overload)
	require.Len(t, cp.In, 1)
	require.Len(t, cp.Out, 1)
	out := cp.Out[0]
	assert.NotEqual(t, cp.In[0], out, "a new storage is a new tensor")
	assert.Equal(t, trace.TensorID(302), out)
	assert.Equal(t, trace.KindActivation, it.Tensors[out].Kind)
	assert.NotEqual(t, layer.KindView, layer.Classify(it, cp), "a copy writes its output")
	assert.Equal(t, 1, res.Ops[404].Kernels, "the copy launched a kernel")

	tr := &it.Ops[403] // the transpose the copy reads
	assert.Equal(t, "aten::transpose", tr.Name)
	assert.Equal(t, tr.In, tr.Out, "a view is its input's tensor")
	assert.Equal(t, cp.In, tr.Out)
	for _, k := range []int{405, 406} { // reshape and t of the copy: views
		v := &it.Ops[k]
		assert.Equal(t, res.Ops[k].ETName, v.Name)
		assert.Equal(t, layer.KindView, layer.Classify(it, v), "op %d", k)
		assert.Equal(t, []trace.TensorID{out}, v.In, "op %d", k)
		assert.Equal(t, []trace.TensorID{out}, v.Out, "op %d: a view keeps its input's tensor", k)
	}
	assert.Equal(t, "aten::reshape", it.Ops[405].Name)
	assert.Equal(t, "aten::t", it.Ops[406].Name)

	// Over the step: every op the data model reads as a view returns only
	// tensors it was handed; the renamed ops are exactly the reshapes that
	// copied (one per q, k and v gradient of each of the 4 layers).
	renamed, views := 0, 0
	for k := range it.Ops {
		op := &it.Ops[k]
		if layer.Classify(it, op) == layer.KindView {
			views++
			assert.False(t, producesNew(op), "op %d (%s) is a view that produces a new tensor", k, op.Name)
		}
		if op.Name != res.Ops[k].ETName {
			renamed++
			assert.Equal(t, "aten::reshape", res.Ops[k].ETName, "op %d", k)
			assert.Equal(t, "aten::clone", op.Name, "op %d", k)
			assert.True(t, producesNew(op), "op %d", k)
		}
	}
	assert.Equal(t, 12, renamed)
	assert.Greater(t, views, 200, "the views stay views")
}

// copyNodes: a reshape that views (same storage), a transpose, a reshape
// that copies through clone (empty_like, copy_) and _unsafe_view, and a
// reshape that copied with no descendants recorded.
func copyNodes() []snode {
	x := tref{100, 10, 0, 16, 4, "float", []int64{4, 4}}
	xv := tref{101, 10, 0, 16, 4, "float", []int64{16}}
	xt := tref{102, 10, 0, 16, 4, "float", []int64{4, 4}}
	c := tref{103, 11, 0, 16, 4, "float", []int64{4, 4}}
	cv := tref{104, 11, 0, 16, 4, "float", []int64{16}}
	d := tref{105, 12, 0, 16, 4, "float", []int64{16}}
	const rs = "aten::reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)"
	return []snode{
		{id: 1, parent: 1, name: "[pytorch|profiler|execution_trace|process]"},
		{id: 2, parent: 1, name: "[pytorch|profiler|execution_trace|thread]", tid: 1},
		{id: 3, parent: 2, rf: 1, tid: 1, name: "aten::reshape", schema: rs, in: []any{x}, out: []any{xv}},
		{id: 4, parent: 3, rf: 2, tid: 1, name: "aten::view", schema: "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)", in: []any{x}, out: []any{xv}},
		{id: 5, parent: 2, rf: 3, tid: 1, name: "aten::transpose", schema: "aten::transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)", in: []any{x, 0, 1}, out: []any{xt}},
		{id: 6, parent: 2, rf: 4, tid: 1, name: "aten::reshape", schema: rs, in: []any{xt}, out: []any{cv}},
		{id: 7, parent: 6, rf: 5, tid: 1, name: "aten::clone", schema: "aten::clone(Tensor self, *, MemoryFormat? memory_format=None) -> Tensor", in: []any{xt}, out: []any{c}},
		{id: 8, parent: 7, rf: 6, tid: 1, name: "aten::empty_like", schema: "aten::empty_like(Tensor self) -> Tensor", in: []any{xt}, out: []any{c}},
		{id: 9, parent: 7, rf: 7, tid: 1, name: "aten::copy_", schema: "aten::copy_(Tensor(a!) self, Tensor src, bool non_blocking=False) -> Tensor(a!)", in: []any{c, xt}, out: []any{c}},
		{id: 10, parent: 6, rf: 8, tid: 1, name: "aten::_unsafe_view", schema: "aten::_unsafe_view(Tensor self, SymInt[] size) -> Tensor", in: []any{c}, out: []any{cv}},
		{id: 11, parent: 2, rf: 9, tid: 1, name: "aten::reshape", schema: rs, in: []any{xt}, out: []any{d}},
		{id: 12, parent: 2, rf: 10, tid: 1, name: "aten::sum", schema: "aten::sum(Tensor self, *, ScalarType? dtype=None) -> Tensor", in: []any{cv, d}, out: []any{tref{106, 13, 0, 1, 4, "float", nil}}},
	}
}

// copyDocs renders nodes as an Execution Trace (attrs layout, post-order)
// and a Kineto profile with one cpu_op per rf_id.
func copyDocs(t *testing.T, nodes []snode) (et, kineto []byte) {
	t.Helper()
	var out, ev []any
	for i := len(nodes) - 1; i >= 0; i-- {
		n := nodes[i]
		out = append(out, map[string]any{
			"id": n.id, "name": n.name, "ctrl_deps": n.parent, "inputs": ioJSON(n.in), "outputs": ioJSON(n.out),
			"attrs": []any{
				map[string]any{"name": "op_schema", "type": "string", "value": n.schema},
				map[string]any{"name": "tid", "type": "uint64", "value": n.tid},
				map[string]any{"name": "seq_id", "type": "int64", "value": -1},
				map[string]any{"name": "rf_id", "type": "uint64", "value": n.rf},
			},
		})
		if n.rf > 0 {
			ev = append(ev, map[string]any{"ph": "X", "cat": "cpu_op", "name": n.name, "pid": 1, "tid": 1, "ts": float64(n.rf * 100), "dur": 50.0,
				"args": map[string]any{"External id": n.rf + 1000, "Record function id": n.rf}})
		}
	}
	et, err := json.Marshal(map[string]any{"schema": "1.1.1-chakra.0.0.4", "nodes": out})
	require.NoError(t, err)
	kineto, err = json.Marshal(map[string]any{"traceEvents": ev})
	require.NoError(t, err)
	return et, kineto
}

func TestViewsThatCopy(t *testing.T) {
	et, k := copyDocs(t, copyNodes())
	res, err := Load(bytes.NewReader(et), "copy.et.json", bytes.NewReader(k), "copy.kineto.json")
	require.NoError(t, err)
	it := res.Trace.Iterations[0]
	require.Len(t, it.Ops, 5)
	view, tr, cp, bare, sum := &it.Ops[0], &it.Ops[1], &it.Ops[2], &it.Ops[3], &it.Ops[4]
	x := view.In[0]

	assert.Equal(t, "aten::reshape", view.Name, "a reshape that shares its input's storage stays a view")
	assert.Equal(t, []trace.TensorID{x}, view.Out)
	assert.Equal(t, "aten::transpose", tr.Name)
	assert.Equal(t, []trace.TensorID{x}, tr.Out)

	assert.Equal(t, "aten::clone", cp.Name, "named after the outermost allocating node, not its empty_like")
	assert.Equal(t, "default", cp.Overload)
	assert.Equal(t, "aten::reshape", res.Ops[2].ETName)
	assert.Equal(t, []trace.TensorID{x}, cp.In)
	require.Len(t, cp.Out, 1)
	assert.NotEqual(t, x, cp.Out[0])

	assert.Equal(t, "aten::clone", bare.Name, "a copy without recorded descendants")
	assert.Equal(t, "default", bare.Overload)
	require.Len(t, bare.Out, 1)
	assert.NotContains(t, []trace.TensorID{x, cp.Out[0]}, bare.Out[0])

	assert.Equal(t, []trace.TensorID{cp.Out[0], bare.Out[0]}, sum.In)
	for k := range it.Ops {
		op := &it.Ops[k]
		if layer.Classify(it, op) == layer.KindView {
			assert.False(t, producesNew(op), "op %d (%s)", k, op.Name)
		} else {
			assert.Contains(t, []int{2, 3, 4}, k, "op %d (%s) is not a view", k, op.Name)
		}
	}
}
