package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/trace"
)

// topSwapCount is how many swaps the text and the JSON list by size.
const topSwapCount = 10

// largeSwap is one of the largest swaps of a plan, named after the op
// that makes the tensor (none for a tensor live at entry: a parameter,
// optimizer state, an input).
type largeSwap struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Kind   string         `json:"kind"`
	// ProducerOp is the producing op's seq number, -1 for a tensor live
	// at entry (a parameter, optimizer state, an input), and FirstUseOp
	// the first op that uses it; OpName and OpModule name the producer,
	// or the first use where there is none ("" when unknown).
	ProducerOp int    `json:"producer_op"`
	FirstUseOp int    `json:"first_use_op"`
	OpName     string `json:"op_name"`
	OpModule   string `json:"op_module"`
	Out        int    `json:"out_after_op"`
	Use        int    `json:"in_before_op"`
}

// peakBreakdown is the device memory at a peak split by tensor kind.
type peakBreakdown struct {
	Op    int   `json:"op"` // the op's seq number
	Bytes int64 `json:"bytes"`
	// KindBytes are the bytes of the storages of each kind live at the op
	// (less, after the plan, those swapped out or dropped for a
	// recompute); Other is what the curve holds beyond them (allocator
	// rounding, storages no op of the iteration references).
	KindBytes
	Other int64 `json:"other"`
}

// byKind is a quantity split by tensor kind. Gradients are the
// activations an optimizer step reads as such (trace.Gradients); a trace
// does not mark them.
type byKind[T int64 | float64] struct {
	Params      T `json:"params"`
	OptState    T `json:"optimizer_state"`
	Activations T `json:"activations"`
	Gradients   T `json:"gradients"`
	Inputs      T `json:"inputs"`
}

// KindBytes is bytes split by tensor kind.
type KindBytes = byKind[int64]

// kindMS is milliseconds split by tensor kind.
type kindMS = byKind[float64]

// add counts n of a storage of kind (grad: an activation an optimizer
// step reads as a gradient).
func (k *byKind[T]) add(kind trace.Kind, grad bool, n T) {
	switch {
	case kind == trace.KindParam:
		k.Params += n
	case kind == trace.KindOptState:
		k.OptState += n
	case kind == trace.KindInput:
		k.Inputs += n
	case kind == trace.KindActivation && grad:
		k.Gradients += n
	default:
		k.Activations += n
	}
}

// sum is the total over the kinds.
func (k byKind[T]) sum() T { return k.Params + k.OptState + k.Activations + k.Gradients + k.Inputs }

// bytesString writes bytes by kind for the text output.
func bytesString(k KindBytes) string {
	return fmt.Sprintf("params %s, optimizer state %s, activations %s, gradients %s, inputs %s",
		fmtBytes(k.Params), fmtBytes(k.OptState), fmtBytes(k.Activations), fmtBytes(k.Gradients), fmtBytes(k.Inputs))
}

// msString writes milliseconds by kind for the text output.
func msString(k kindMS) string {
	return fmt.Sprintf("params %.2f ms, optimizer state %.2f ms, activations %.2f ms, gradients %.2f ms, inputs %.2f ms",
		k.Params, k.OptState, k.Activations, k.Gradients, k.Inputs)
}

// trafficByKind is what a plan's swaps copy over the link in one step, by
// the kind of the tensor: In to the device (every swap), Out to the host
// (every swap but those whose host copy is current, which leave with no
// copy: bytes_released).
type trafficByKind struct {
	In  KindBytes `json:"h2d"`
	Out KindBytes `json:"d2h"`
}

// trafficOf splits pol's copies by kind.
func trafficOf(m *memory.Model, pol *mre.Policy) trafficByKind {
	var r trafficByKind
	grads := trace.Gradients(m.Iter)
	for _, s := range pol.Swaps {
		kind := kindOf(m.Iter, s.Tensor)
		r.In.add(kind, grads[s.Tensor], s.Bytes)
		if !s.NoCopyOut {
			r.Out.add(kind, grads[s.Tensor], s.Bytes)
		}
	}
	return r
}

// waitsOf splits the time pol's simulated step waited for copies by the
// kind of the tensor copied (simulate.Result.SwapWaitUS), in
// milliseconds: where the step waits, optimizer state or activations.
func waitsOf(m *memory.Model, pol *mre.Policy) kindMS {
	var r kindMS
	grads := trace.Gradients(m.Iter)
	for x, s := range pol.Swaps {
		if x >= len(pol.Sim.SwapWaitUS) {
			break
		}
		r.add(kindOf(m.Iter, s.Tensor), grads[s.Tensor], pol.Sim.SwapWaitUS[x]/1000)
	}
	return r
}

// kindOf is the kind of tensor id of it, an activation where it does not
// know the tensor.
func kindOf(it *trace.Iteration, id trace.TensorID) trace.Kind {
	if t := it.Tensor(id); t != nil {
		return t.Kind
	}
	return trace.KindActivation
}

// peakBreakdowns is the breakdown at the peak before and after the plan.
type peakBreakdowns struct {
	Before peakBreakdown `json:"before"`
	After  peakBreakdown `json:"after"`
}

// largestSwaps lists the topSwapCount largest of pol's swaps, largest
// first (ties by tensor), ops as the trace's seq numbers (seqOf).
func largestSwaps(m *memory.Model, pol *mre.Policy, seqOf func(int) int) []largeSwap {
	it := m.Iter
	out := make([]largeSwap, 0, len(pol.Swaps))
	for _, s := range pol.Swaps {
		ls := largeSwap{Tensor: s.Tensor, Bytes: s.Bytes, ProducerOp: -1, FirstUseOp: -1, Out: seqOf(s.Out), Use: seqOf(s.Use)}
		if t := it.Tensor(s.Tensor); t != nil {
			ls.Kind = t.Kind.String()
		}
		if l := m.Lifetime(s.Tensor); l != nil {
			named := -1
			if len(l.Uses) > 0 {
				named = int(l.Uses[0])
				ls.FirstUseOp = it.Ops[named].Seq
			}
			if l.Alloc >= 0 && l.Alloc < len(it.Ops) {
				named = l.Alloc
				ls.ProducerOp = it.Ops[named].Seq
			}
			if named >= 0 {
				ls.OpName, ls.OpModule = it.Ops[named].Name, it.Ops[named].Module
			}
		}
		out = append(out, ls)
	}
	slices.SortStableFunc(out, func(a, b largeSwap) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.Tensor, b.Tensor))
	})
	return out[:min(len(out), topSwapCount)]
}

// breakdownAt splits mem, the bytes at op t, by the kinds of the storages
// of m live at t that gone does not hold off the device.
func breakdownAt(m *memory.Model, grads map[trace.TensorID]bool, t int, mem int64, gone func(trace.TensorID) bool) peakBreakdown {
	b := peakBreakdown{Op: m.Iter.Ops[t].Seq, Bytes: mem}
	var sum int64
	for i := range m.Lifetimes {
		l := &m.Lifetimes[i]
		live := (l.LiveIn || (l.Alloc >= 0 && l.Alloc <= t)) && t < l.Free
		if !live || l.Tensor == nil || (gone != nil && gone(l.Tensor.ID)) {
			continue
		}
		b.add(l.Tensor.Kind, grads[l.Tensor.ID], l.Bytes)
		sum += l.Bytes
	}
	b.Other = mem - sum
	return b
}

// peakBreakdownsOf is the breakdown at the peak of curve (before the plan)
// and at the simulated peak of pol (after it).
func peakBreakdownsOf(m *memory.Model, curve []int64, pol *mre.Policy) peakBreakdowns {
	var r peakBreakdowns
	if len(curve) == 0 || len(curve) != len(m.Iter.Ops) {
		return r
	}
	pb := 0
	for t, v := range curve {
		if v > curve[pb] {
			pb = t
		}
	}
	grads := trace.Gradients(m.Iter)
	r.Before = breakdownAt(m, grads, pb, curve[pb], nil)
	sim := pol.Sim
	pa := sim.PeakOp
	if pa < 0 || pa >= len(sim.Ops) || pa >= len(m.Iter.Ops) {
		return r
	}
	// Off the device at op t: a swap where its memory counts free
	// (simulate.Swap.FreeSpans), a recompute from after its drop to
	// before the op that needs it.
	gone := map[trace.TensorID]bool{}
	for x, s := range pol.Swaps {
		free := s.Free
		if x < len(sim.Freed) {
			free = sim.Freed[x]
		}
		for _, sp := range s.FreeSpans(free, len(sim.Ops)) {
			if sp[0] <= pa && pa < sp[1] {
				gone[s.Tensor] = true
			}
		}
	}
	for _, rc := range pol.Recomputes {
		if rc.Drop+1 <= pa && pa < rc.Before {
			gone[rc.Tensor] = true
		}
	}
	r.After = breakdownAt(m, grads, pa, sim.Ops[pa].Mem, func(id trace.TensorID) bool { return gone[id] })
	return r
}

func (b peakBreakdown) String() string {
	parts := []string{}
	for _, p := range []struct {
		name string
		n    int64
	}{{"params", b.Params}, {"optimizer state", b.OptState}, {"activations", b.Activations}, {"gradients", b.Gradients}, {"inputs", b.Inputs}, {"other", b.Other}} {
		parts = append(parts, fmt.Sprintf("%s %s", p.name, fmtBytes(p.n)))
	}
	return fmt.Sprintf("%s at op %d: %s", fmtBytes(b.Bytes), b.Op, strings.Join(parts, ", "))
}

// printSwapsAndBreakdown writes the peak's breakdown before and after the
// plan and the largest swaps.
func printSwapsAndBreakdown(w io.Writer, r *planReport) {
	if r.PeakBreakdown != nil {
		fmt.Fprintf(w, "peak before: %s\n", r.PeakBreakdown.Before)
		fmt.Fprintf(w, "peak after:  %s\n", r.PeakBreakdown.After)
	}
	if r.Traffic != nil {
		fmt.Fprintf(w, "copied in a step, by kind:  %s\n", bytesString(r.Traffic.In))
		fmt.Fprintf(w, "copied out a step, by kind: %s\n", bytesString(r.Traffic.Out))
	}
	if r.WaitsByKind != nil {
		fmt.Fprintf(w, "waits for copies, by kind: %s\n", msString(*r.WaitsByKind))
	}
	if len(r.LargestSwaps) == 0 {
		return
	}
	fmt.Fprintf(w, "largest swaps (%d of %d, by bytes):\n", len(r.LargestSwaps), len(r.Swaps))
	fmt.Fprintf(w, "  %8s %10s %-6s %-30s %-32s %9s %9s\n", "tensor", "bytes", "kind", "made by op (or first used by*)", "module", "out after", "in before")
	for _, s := range r.LargestSwaps {
		prod := "-"
		if s.ProducerOp >= 0 {
			prod = fmt.Sprintf("%d %s", s.ProducerOp, s.OpName)
		} else if s.FirstUseOp >= 0 {
			prod = fmt.Sprintf("*%d %s", s.FirstUseOp, s.OpName)
		}
		mod := cmp.Or(s.OpModule, "-")
		fmt.Fprintf(w, "  %8d %10s %-6s %-30s %-32s %9d %9d\n", s.Tensor, fmtMiB(s.Bytes), s.Kind, clipText(prod, 30), clipText(mod, 32), s.Out, s.Use)
	}
}

func fmtMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// clipText shortens s to n runes, marking the cut with "…" at its start
// (a module path's tail says the most).
func clipText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return "…" + string(r[len(r)-n+1:])
}
