package pytorch

import (
	"slices"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/trace"
)

// copyName is the name of a view-named op that copied when the Execution
// Trace holds no descendant that allocated its result: reshape, flatten and
// contiguous copy through clone.
const copyName = "aten::clone"

// copies renames the top-level ops that the data model would take for views
// by their name (layer.Classify: reshape, view, transpose, ...) but that
// wrote a new storage.
//
// Whether an op aliased its input or copied is in the Execution Trace's
// storage ids, not in its name: aten::reshape (and view_as) returns a view
// when the strides allow one and otherwise a contiguous copy (clone, then
// _unsafe_view of the clone). storages makes a tensor that
// shares its input's storage the input's trace.TensorID, so a view's outputs
// are among its inputs; an output that is not is a storage the op allocated
// and wrote. The data model's consumers (the replay's byte check, mre's
// Writes, the cost model) read an op named as a view as writing nothing,
// so such an op is named after the Execution Trace node inside it that
// allocated the new storage: the outermost aten descendant that returns one
// of the op's new storages without taking it as an input and is not itself
// named as a view (aten::clone under a copying reshape, not the
// aten::empty_like under the clone), with that node's overload; copyName
// when the trace holds no such descendant. Ops that share their input's
// storage keep their name and stay views. OpInfo.ETName keeps the name the
// Execution Trace gave.
func (b *builder) copies(it *trace.Iteration) {
	nodes := b.doc.nodes
	var renamed map[int]int // node index of a top-level op -> its position k
	for k, i := range b.tops {
		op := &it.Ops[k]
		if layer.Classify(it, op) != layer.KindView {
			continue
		}
		if !slices.ContainsFunc(op.Out, func(id trace.TensorID) bool { return !slices.Contains(op.In, id) }) {
			continue
		}
		if renamed == nil {
			renamed = make(map[int]int)
		}
		renamed[i] = k
		op.Name, op.Overload = copyName, "default"
	}
	if renamed == nil {
		return
	}
	done := make(map[int]bool, len(renamed))
	for j, d := range nodes { // by id: an ancestor before its descendants
		t := b.info[j].top
		k, ok := renamed[t]
		if !ok || t == j || done[t] || !isAten(d.name) {
			continue
		}
		if layer.Classify(it, &trace.Op{Name: d.name}) == layer.KindView {
			continue // empty_like, empty: allocations named as views
		}
		top := nodes[t]
		fresh := newStorages(top)
		if slices.ContainsFunc(newStorages(d), func(s int64) bool { return len(fresh) == 0 || slices.Contains(fresh, s) }) {
			it.Ops[k].Name, it.Ops[k].Overload = d.name, overload(d.name, d.schema)
			done[t] = true
		}
	}
}

// newStorages lists the storages among n's outputs that are not among its
// inputs.
func newStorages(n *etNode) []int64 {
	var s []int64
	for _, r := range n.out {
		if !slices.ContainsFunc(n.in, func(x tensorRef) bool { return x.storage == r.storage }) && !slices.Contains(s, r.storage) {
			s = append(s, r.storage)
		}
	}
	return s
}
