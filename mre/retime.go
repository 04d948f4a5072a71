package mre

import "slices"

// retimeRounds bounds the passes of retime.
const retimeRounds = 32

// retime moves the copies of a policy's swaps that made compute wait,
// where the simulated memory has room, and keeps each pass that simulates
// faster:
//   - a swap whose memory an op waited to count free (its copy out was
//     queued behind others) frees it later, at the first op that starts
//     after the copy ends;
//   - a swap whose use waited for its copy back has it issued earlier, by
//     the wait;
//   - a swap that wraps the iteration whose copy out ran past its end,
//     making the next one's first op wait, is freed in the next iteration
//     instead, at the first op that starts once the copy is done;
//   - where freeing later does not fit, copies back that hold memory there
//     and would still end well before their use are issued later, when
//     that makes the room.
//
// The selection times each copy on the stall-free timeline and, for the
// swaps that wrap the iteration, without the others that share the
// engine, so where copies crowd (the optimizer state a hoisted step writes
// in the backward, the weights it wrote that leave in the forward) ops
// wait that memory would let run. A move holds the swap's bytes over the
// ops it spans: it is taken only while the memory after each of them, with
// every move taken before it, stays within the limit, and a swap keeps
// freeing over at least one op. It is a pure function of the policy.
func (p *planner) retime(in Input, pol *Policy) *Policy {
	if pol == nil || pol.Sim == nil || len(pol.Swaps) == 0 || len(pol.Sim.Ops) != len(pol.Curve) {
		return pol
	}
	n := len(pol.Curve)
	for range retimeRounds {
		sim := pol.Sim
		mem := make([]int64, n)
		for t := range n {
			mem[t] = sim.Ops[t].Mem
		}
		fits := func(lo, hi int, b int64) bool {
			for t := lo; t < hi; t++ {
				if mem[t]+b > in.Limit {
					return false
				}
			}
			return true
		}
		take := func(lo, hi int, b int64) {
			for t := lo; t < hi; t++ {
				mem[t] += b
			}
		}
		swaps := slices.Clone(pol.Swaps)
		moved := false
		// room issues later the copies back that hold memory over [f, k)
		// and would still end well before their use (twice their copy
		// time), until b bytes more fit there; s is the swap that needs
		// the room. It reports whether they fit, and undoes its moves
		// when they do not.
		room := func(s, f, k int, b int64) bool {
			type undo struct{ x, in int }
			var done []undo
			for x := range swaps {
				if fits(f, k, b) {
					return true
				}
				v := &swaps[x]
				if x == s || v.In > f || v.Use < k || sim.Ops[v.Use].Stall > 0 {
					continue
				}
				if v.Wraps() && v.In == 0 && v.Free >= n {
					continue
				}
				if d := sim.In[x].End - sim.In[x].Start; sim.Ops[v.Use].Start-sim.Ops[k].Start < 2*d {
					continue
				}
				done = append(done, undo{x, v.In})
				take(v.In, k, -v.Bytes)
				v.In = k
			}
			if fits(f, k, b) {
				return true
			}
			for _, u := range slices.Backward(done) {
				take(u.in, k, swaps[u.x].Bytes)
				swaps[u.x].In = u.in
			}
			return false
		}
		for s := range swaps {
			w := &swaps[s]
			inside := w.Out < w.Use
			// The copy out: the op at Free waited for it.
			if f := sim.Freed[s]; f >= 0 && f < n && w.Free >= 0 && !w.NoCopyOut && !w.Early && sim.Ops[f].Stall > 0 && sim.Out[s].End >= sim.Ops[f].Start-1e-6 {
				end := n // a wrap frees over [Free, n) and [0, In)
				if inside {
					end = w.In - 1
				} else if w.In == 0 {
					end = n - 1
				}
				target := sim.Out[s].End + sim.Ops[f].Stall
				k := f
				for k < end && sim.Ops[k].Start < target {
					k++
				}
				if k > f && (fits(f, k, w.Bytes) || room(s, f, k, w.Bytes)) {
					take(f, k, w.Bytes)
					w.Free, moved = k, true
				}
			}
			// The copy out ran past the iteration's end and the next
			// one's first op waited for it: free it in the next
			// iteration, at the first op that starts once it is done
			// (before its copy back), where the memory of the ops
			// before has room.
			if w.Wraps() && !w.NoCopyOut && !w.Early && w.Free == n && w.In > 1 && sim.WaitStartUS > 0 && sim.Out[s].End > sim.IterationUS {
				late, wait := sim.Out[s].End-sim.IterationUS, sim.Ops[0].Stall
				k := 0
				for k < w.In-1 && sim.Ops[k].Start-wait < late {
					k++
				}
				if k > 0 && (fits(0, k, w.Bytes) || room(s, 0, k, w.Bytes)) {
					take(0, k, w.Bytes)
					w.Free, moved = n+k, true
				}
			}
			// The copy back: its use waited for it.
			if u := sim.Ops[w.Use]; u.Stall > 0 && sim.In[s].End >= u.Start-1e-6 && w.In > 0 {
				lo := 0
				if inside {
					lo = max(w.Out, w.Free, sim.Freed[s]) + 1
				} else if w.Free >= n {
					lo = max(1, w.Free-n+1) // freed in the next iteration: after that
				}
				target := sim.Ops[w.In].Start - u.Stall
				k := w.In
				for k > lo && sim.Ops[k-1].Start >= target && mem[k-1]+w.Bytes <= in.Limit {
					k--
				}
				if k < w.In {
					take(k, w.In, w.Bytes)
					w.In, moved = k, true
				}
			}
		}
		if !moved {
			return pol
		}
		r, err := p.simulateRound(in, swaps)
		if err != nil || r.IterationUS >= pol.Sim.IterationUS || r.Peak > max(in.Limit, pol.Sim.Peak) {
			return pol
		}
		next := *pol
		next.Swaps, next.Sim = swaps, r
		pol = &next
	}
	return pol
}

// Retime is Plan's last steps on its own, for a caller that plans
// WithoutRetime and checks what the moves cost it elsewhere (blocks that
// must still fit in pages): it moves the copies of pol that made compute
// wait where the memory of in's curve (in.ResolveCurve) under in.Limit has
// room, issues copies out as write-backs where that is faster, and
// returns the moved policy with pol's Curve, or pol itself when nothing
// moved or nothing ran faster. in is the input pol was planned
// from, its curve raised where the caller held memory back; pol is not
// changed. WithoutRetime among opts returns pol.
func Retime(in Input, pol *Policy, opts ...Option) *Policy {
	cfg := newConfig(opts)
	if cfg.validate() != nil || cfg.noRetime || pol == nil || pol.Sim == nil || in.Model == nil {
		return pol
	}
	curve := in.ResolveCurve()
	if len(curve) != len(pol.Curve) || len(in.OpTimes) != len(curve) {
		return pol
	}
	p := &planner{cfg: cfg, simCurve: curve, recomputes: pol.Recomputes}
	start := *pol
	start.Curve = curve
	sim, err := p.simulateRound(in, slices.Clone(pol.Swaps))
	if err != nil {
		return pol
	}
	start.Sim = sim
	out := p.writeBack(in, p.retime(in, &start))
	if out == &start {
		return pol
	}
	out.Curve = pol.Curve
	return out
}
