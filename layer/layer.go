// Package layer splits an iteration into logical layers (groups of
// consecutive operators) and estimates how long each op and group takes
// from the little a lightweight profile knows.
package layer

import (
	"github.com/chameleon-go/chameleon/trace"
)

// Group is a run of consecutive ops of one phase: ops First..Last inclusive
// (indices into Iteration.Ops).
type Group struct {
	Phase       trace.Phase
	First, Last int
}

// Len is the number of ops in the group.
func (g Group) Len() int { return g.Last - g.First + 1 }

// phaseRuns splits the ops into maximal runs of one phase.
func phaseRuns(ops []trace.Op) []Group {
	var runs []Group
	for i := range ops {
		if len(runs) > 0 && runs[len(runs)-1].Phase == ops[i].Phase {
			runs[len(runs)-1].Last = i
			continue
		}
		runs = append(runs, Group{Phase: ops[i].Phase, First: i, Last: i})
	}
	return runs
}

// Uniform is the paper's grouping: the forward and the backward are each cut
// into n groups of (nearly) equal op counts; other phases (the optimizer)
// stay one group each. n < 1 is taken as 1.
func Uniform(ops []trace.Op, n int) []Group {
	if n < 1 {
		n = 1
	}
	var out []Group
	for _, r := range phaseRuns(ops) {
		k := 1
		if r.Phase == trace.PhaseForward || r.Phase == trace.PhaseBackward {
			k = min(n, r.Len())
		}
		for j := range k {
			first := r.First + j*r.Len()/k
			last := r.First + (j+1)*r.Len()/k - 1
			out = append(out, Group{Phase: r.Phase, First: first, Last: last})
		}
	}
	return out
}

// Halved splits each forward and backward group of two ops or more into
// two of equal op counts (the first the smaller by one where odd), and
// keeps the others: as fine again as groups where a phase has the ops.
func Halved(groups []Group) []Group {
	out := make([]Group, 0, 2*len(groups))
	for _, g := range groups {
		if (g.Phase != trace.PhaseForward && g.Phase != trace.PhaseBackward) || g.Len() < 2 {
			out = append(out, g)
			continue
		}
		mid := g.First + g.Len()/2 - 1
		out = append(out, Group{Phase: g.Phase, First: g.First, Last: mid}, Group{Phase: g.Phase, First: mid + 1, Last: g.Last})
	}
	return out
}

// GroupOf returns, for every op, the index of its group.
func GroupOf(groups []Group, nops int) []int {
	idx := make([]int, nops)
	for g, gr := range groups {
		for i := gr.First; i <= gr.Last && i < nops; i++ {
			idx[i] = g
		}
	}
	return idx
}

// Estimator spreads an iteration's measured time over its ops. Estimate
// returns one duration per op, in microseconds, summing to the iteration's
// TimeMS (when known). It may use the ops' names, shapes and sizes and what
// it learned from other iterations, never the iteration's own per-op
// durations: the lightweight profile has none.
type Estimator interface {
	Estimate(it *trace.Iteration) []float64
}

// OpCount is the paper's estimator: T_op = T_iter / N_ops.
type OpCount struct{}

// Estimate implements Estimator.
func (OpCount) Estimate(it *trace.Iteration) []float64 {
	out := make([]float64, len(it.Ops))
	if len(out) == 0 {
		return out
	}
	per := it.TimeMS * 1000 / float64(len(out))
	for i := range out {
		out[i] = per
	}
	return out
}
