package memory

import (
	"slices"

	"github.com/chameleon-go/chameleon/trace"
)

// HoistTrace is trace.HoistTrace with the recorded memory of each hoisted
// iteration made what its host holds (Reordered of the split iteration's
// model), so that the model of a hoisted iteration reads the same releases
// off it as the split one's, with its gradients released in the backward.
func HoistTrace(split *trace.Trace, origins [][]trace.Origin) (*trace.Trace, [][]trace.Origin) {
	h, horigins := trace.HoistTrace(split, origins)
	for k, it := range h.Iterations {
		s := split.Iterations[k]
		if slices.ContainsFunc(s.Ops, func(op trace.Op) bool { return op.Mem < 0 }) {
			continue // some op has no record to re-time
		}
		at := make(map[[2]int]int, len(origins[k]))
		for i, o := range origins[k] {
			at[[2]int{o.Op, o.Piece}] = i
		}
		from := make([]int, len(horigins[k]))
		moved := false
		for i, o := range horigins[k] {
			from[i] = at[[2]int{o.Op, o.Piece}]
			moved = moved || from[i] != i
		}
		if !moved {
			continue // the recorded memory is the host's as it is
		}
		Build(s, LiveOutFromTrace(split, k)).Reordered(it, from)
	}
	return h, horigins
}

// Reordered sets the recorded memory (op.Mem) of it, the ops of m's
// iteration in another order (op i of it is op from[i] of m's), to what a
// host running them in that order holds after each: every storage from the
// op that makes it to its release, both where the ops went. A storage
// released after its last use is released after its last use in the new
// order; one the host held past its last use (Model.Free later than the op
// after it) is released after the op it was released after, or after its
// last use where that now comes later. A storage whose last use is an op
// run ahead of ops it followed (a piece of an optimizer step moved into the
// backward, trace.Hoist) and that no later iteration reads (a gradient) is
// released right after it: the host that steps a parameter from a hook
// after its gradient is final frees the gradient there too. What no op
// references (Base) stays as it was at the first op.
//
// The curve it sets is one Build reads the same releases off: the model
// of it is m's, re-timed.
func (m *Model) Reordered(it *trace.Iteration, from []int) {
	n := len(from)
	if n == 0 || n != len(m.Iter.Ops) || n != len(it.Ops) {
		return
	}
	pos := make([]int, n)
	for i, j := range from {
		pos[j] = i
	}
	// ahead[i]: op i of it runs before an op it followed in m's order.
	ahead := make([]bool, n)
	low := n
	for i := n - 1; i >= 0; i-- {
		ahead[i] = from[i] > low
		low = min(low, from[i])
	}
	size := func(lt *Lifetime) int64 { return lt.Bytes }
	if m.Iter.MemExact {
		size = func(lt *Lifetime) int64 { return lt.Tensor.Bytes }
	}
	delta := make([]int64, n+1)
	var entry, first int64
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		b := size(lt)
		if lt.Alloc <= 0 {
			first += b // what op 0 of m's iteration holds after it
		}
		if lt.Free <= 0 {
			first -= b
		}
		alloc := 0
		if lt.Alloc < 0 {
			entry += b
		} else {
			alloc = pos[lt.Alloc]
			delta[alloc] += b
		}
		free := n
		if u := lt.LastUse(); lt.Free < n && u >= 0 {
			last := pos[u]
			switch {
			case lt.Free <= u: // released inside its last op
				free = last
			case lt.Free == u+1 || ahead[last]:
				free = last + 1
			default:
				free = max(last, pos[lt.Free-1]) + 1
			}
		}
		free = max(free, alloc)
		delta[free] -= b
	}
	base := m.Iter.Ops[0].Mem - first
	cur := entry
	for i := range it.Ops {
		cur += delta[i]
		it.Ops[i].Mem = base + cur
	}
}
