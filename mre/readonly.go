package mre

import (
	"slices"
	"strings"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Writes reports whether op t of it may write storage id: id is among the
// op's outputs and the op is not a view (a view's output is its input's
// storage, unchanged), or the op writes in place (a name ending in "_",
// an "out" overload) and lists id at all: an in-place op may list what it
// writes among its inputs alone (aten::_fused_adamw_ updates every
// parameter it reads and returns nothing), so every tensor it names counts
// as written.
func Writes(it *trace.Iteration, t int, id trace.TensorID) bool {
	op := &it.Ops[t]
	if InPlace(op) {
		return slices.Contains(op.Out, id) || slices.Contains(op.In, id)
	}
	if !slices.Contains(op.Out, id) {
		return false
	}
	return layer.Classify(it, op) != layer.KindView
}

// InPlace reports whether op writes in place (a name ending in "_", an
// "out" overload): it may write any tensor it lists (Writes).
func InPlace(op *trace.Op) bool {
	name := op.Name
	if _, n, ok := strings.Cut(name, "::"); ok {
		name = n
	}
	return strings.HasSuffix(name, "_") || op.Overload == "out" || strings.HasPrefix(op.Overload, "out_")
}

// MarkReadOnly sets NoCopyOut on every swap whose tensor's host copy is
// current when it leaves, and clears it on the others:
//   - a frozen parameter (trace.Tensor.Frozen): always;
//   - any other tensor when an earlier swap of the same tensor brought it
//     back (its copy back ends before that swap's Use) and no op writes it
//     from that Use through this swap's Out. Within the iteration, the
//     earlier swap is the one whose Use comes last at or before this Out;
//     a swap that wraps the iteration brings the tensor back at the start
//     (its copy out was the previous step's), so it is the earlier swap of
//     the tensor's first gap, and of its own copy out when it is the only
//     swap of the tensor that came back.
//
// Such swaps release their device memory at the end of Out and copy only
// back. swaps is changed in place.
func MarkReadOnly(m *memory.Model, swaps []simulate.Swap) {
	it := m.Iter
	byTensor := make(map[trace.TensorID][]int)
	for x := range swaps {
		byTensor[swaps[x].Tensor] = append(byTensor[swaps[x].Tensor], x)
	}
	for id, xs := range byTensor {
		t := it.Tensors[id]
		if t != nil && t.Frozen {
			for _, x := range xs {
				swaps[x].NoCopyOut, swaps[x].Early = true, false
			}
			continue
		}
		for _, x := range xs {
			s := &swaps[x]
			s.NoCopyOut = false
			// The latest copy back before s leaves.
			back := -1
			for _, y := range xs {
				p := &swaps[y]
				if y == x && !p.Wraps() {
					continue
				}
				if p.Use <= s.Out && (back < 0 || p.Use > swaps[back].Use) {
					back = y
				}
			}
			if back < 0 {
				continue
			}
			written := false
			for op := swaps[back].Use; op <= s.Out && !written; op++ {
				written = Writes(it, op, id)
			}
			s.NoCopyOut = !written
			if s.NoCopyOut {
				s.Early = false
			}
		}
	}
}

// frozenIdle is, per op, the bytes of frozen parameters on the device that
// the op does not use: what may leave there with no copy out.
func frozenIdle(m *memory.Model) []int64 {
	n := len(m.Iter.Ops)
	idle := make([]int64, n)
	var all int64
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if !lt.Tensor.Frozen {
			continue
		}
		all += lt.Bytes
		for _, u := range lt.Uses {
			idle[u] -= lt.Bytes
		}
	}
	for t := range idle {
		idle[t] += all
	}
	return idle
}

// forwardOnly reports an iteration with no backward or optimizer step:
// every op is a forward op (inference, a decode step).
func forwardOnly(it *trace.Iteration) bool {
	if it == nil || len(it.Ops) == 0 {
		return false
	}
	for t := range it.Ops {
		if it.Ops[t].Phase != trace.PhaseForward {
			return false
		}
	}
	return true
}
