package mre

import (
	"slices"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// SwapAll is the PyTorch save_on_cpu policy: every activation produced in
// the forward and used again in the backward goes out after its last
// forward use, is freed as soon as that copy is done, and is brought back
// only when its first backward use asks for it (issued at that op, which
// waits: no prefetch).
func SwapAll(m *memory.Model) []simulate.Swap {
	ops := m.Iter.Ops
	var out []simulate.Swap
	for k := range m.Lifetimes {
		lt := &m.Lifetimes[k]
		if !lt.ProducedHere() || lt.Tensor.Kind != trace.KindActivation || ops[lt.Alloc].Phase != trace.PhaseForward {
			continue
		}
		i, j := -1, -1
		for _, u := range lt.Uses {
			switch ops[u].Phase {
			case trace.PhaseForward:
				if j < 0 {
					i = int(u)
				}
			case trace.PhaseBackward:
				if j < 0 {
					j = int(u)
				}
			}
		}
		if i < 0 || j < 0 || j-i < 2 || lt.Bytes == 0 {
			continue
		}
		out = append(out, simulate.Swap{Tensor: lt.Tensor.ID, Bytes: lt.Bytes, Out: i, Free: -1, In: j, Use: j})
	}
	slices.SortFunc(out, func(a, b simulate.Swap) int {
		if a.Out != b.Out {
			return a.Out - b.Out
		}
		return int(a.Tensor - b.Tensor)
	})
	// Counted as the planner counts: a swap whose host copy is current
	// copies nothing out (MarkReadOnly). Each activation swaps once here,
	// so the rule marks none unless its tensor is frozen.
	MarkReadOnly(m, out)
	return out
}
