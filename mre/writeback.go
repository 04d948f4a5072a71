package mre

import (
	"slices"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/simulate"
)

// WriteBackAt is the op after which swap x of swaps may copy its tensor
// out as a write-back (simulate.Swap.Early): the last op before its Out
// that writes the tensor, when the tensor stays on the device from there
// through Out. That is an op of the iteration, or, for a tensor that lives
// across the iteration's end and is not written before Out in it, the
// previous iteration's last write (an op after the swap's Use). It reports
// false where the swap copies nothing out, the tensor is frozen, Out
// itself writes it (nothing to gain), or another swap or a recompute of
// the tensor has it off the device in between.
func WriteBackAt(m *memory.Model, swaps []simulate.Swap, rcs []simulate.Recompute, x int) (int, bool) {
	s := &swaps[x]
	it := m.Iter
	lt := m.Lifetime(s.Tensor)
	if s.NoCopyOut || lt == nil || lt.Tensor.Frozen || len(lt.Uses) == 0 || Writes(it, s.Out, s.Tensor) {
		return 0, false
	}
	n := len(it.Ops)
	// off reports whether the tensor is off the device at op t: strictly
	// inside another swap's gap or a recompute's.
	var others []*simulate.Swap // the tensor's other swaps, found once
	for y := range swaps {
		if y != x && swaps[y].Tensor == s.Tensor {
			others = append(others, &swaps[y])
		}
	}
	off := func(t int) bool {
		for _, v := range others {
			if v.Wraps() && (t < v.In || t > v.Out) || !v.Wraps() && t > v.Out && t < v.In {
				return true
			}
		}
		for _, rc := range rcs {
			if rc.Tensor == s.Tensor && t > rc.Drop && t < rc.Before {
				return true
			}
		}
		return false
	}
	// resident reports that no op of [lo, hi) has the tensor off.
	resident := func(lo, hi int) bool {
		for t := lo; t < hi; t++ {
			if off(t) {
				return false
			}
		}
		return true
	}
	// The uses before Out, latest first.
	k, _ := slices.BinarySearch(lt.Uses, int32(s.Out))
	for i := k - 1; i >= 0; i-- {
		u := int(lt.Uses[i])
		if !resident(u+1, s.Out) {
			return 0, false
		}
		if Writes(it, u, s.Tensor) {
			if s.Wraps() && u < s.Use {
				return 0, false // before the tensor came back
			}
			return u, true
		}
	}
	if s.Wraps() || !lt.LiveIn || !lt.LiveOut || !resident(0, s.Out) {
		return 0, false
	}
	// Not written in the iteration before Out: the last write of the
	// previous one, after this swap's use.
	for i := len(lt.Uses) - 1; i >= 0; i-- {
		u := int(lt.Uses[i])
		if u <= s.Out || u < s.Use || !resident(u+1, n) {
			return 0, false
		}
		if Writes(it, u, s.Tensor) {
			return u, true
		}
	}
	return 0, false
}

// writeBack copies out, as write-backs, the tensors of pol's swaps at
// their last writes before they leave (WriteBackAt), where that simulates
// faster: the copy runs while the tensor is still read, and at Out its
// memory is released with nothing left to copy. A step whose optimizer
// writes each weight in the backward then copies the weights out there,
// not in the next forward, where the activations it makes crowd the link
// out and the weights' memory could only count free once their copies
// ended. It tries four sets, each with its copies then moved where memory
// has room (retime): every swap that can, those whose release waited for
// their copy out, those written in the previous iteration, those written
// in this one; it keeps the fastest, pol where none is faster.
func (p *planner) writeBack(in Input, pol *Policy) *Policy {
	if p.cfg.noWriteBack || pol == nil || pol.Sim == nil || len(pol.Swaps) == 0 {
		return pol
	}
	type cand struct{ x, at int }
	var cs []cand
	for x := range pol.Swaps {
		if at, ok := WriteBackAt(in.Model, pol.Swaps, pol.Recomputes, x); ok {
			cs = append(cs, cand{x, at})
		}
	}
	sim, n := pol.Sim, len(pol.Curve)
	best := pol
	for _, pick := range []func(c cand) bool{
		func(cand) bool { return true },
		func(c cand) bool {
			f := sim.Freed[c.x]
			return f >= 0 && f < n && sim.Ops[f].Stall > 0
		},
		func(c cand) bool { return c.at > pol.Swaps[c.x].Out },
		func(c cand) bool { return c.at < pol.Swaps[c.x].Out },
	} {
		swaps := slices.Clone(pol.Swaps)
		moved := false
		for _, c := range cs {
			if pick(c) {
				// Released at Out, its memory free from the next op,
				// which waits for the copy if it is still running (the
				// executor makes compute wait for it there).
				w := &swaps[c.x]
				w.Early, w.CopyAfter, w.Free, moved = true, c.at, w.Out+1, true
			}
		}
		if !moved {
			continue
		}
		r, err := p.simulateRound(in, swaps)
		if err != nil {
			continue
		}
		next := *pol
		next.Swaps, next.Sim = swaps, r
		cur := p.retime(in, &next)
		if cur.Sim.IterationUS < best.Sim.IterationUS && cur.Sim.Peak <= max(in.Limit, pol.Sim.Peak) {
			best = cur
		}
	}
	return best
}
