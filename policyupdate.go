package chameleon

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Differential update: a cached policy planned under another limit, link
// or device is simulated on this Engine's link against its own profiled
// iteration (no new profile, no warm-up). The swaps that still hold are
// kept; when the policy overflows the new limit only the overflow is
// planned (swaps of tensors the policy does not move yet, over what its
// swaps leave); when the new limit is larger, the swaps its extra memory
// makes unneeded are let go. Only when no tier of the limit can be met that
// way is the profile planned again from scratch (a replan).

// updateStats says what an update did.
type updateStats struct {
	kept, added, dropped int
}

// update returns p planned for this Engine: updated (Stats.PolicyUpdates)
// or, failing that, planned again from its profile (Stats.Replans).
func (e *Engine) update(p *policy) (*policy, error) {
	pr := p.prof
	liveOut := make(map[trace.TensorID]bool, len(pr.liveOut))
	for _, id := range pr.liveOut {
		liveOut[id] = true
	}
	in := plan.Input{Iter: pr.iter, Limit: e.ctl.PlanLimit(), LiveOut: func(id trace.TensorID) bool { return liveOut[id] }}
	// The profile is another process's (a policy file, another rank): its
	// tensors are not this Engine's, so no layout is followed, and the
	// allocator places what it records (Allocator.Repeat) in the room
	// the tiers below the limit leave.
	opts := append(slices.Clone(e.cfg.planning), plan.WithoutLayout(), plan.WithTiers(unlaidTiers...))
	if slices.Contains(pr.recompute, true) {
		opts = append(opts, plan.WithRecompute(recomputable(pr.recompute)))
	}
	link := e.cfg.link()
	var st updateStats
	diff := plan.PlannerFunc(func(mi mre.Input, popts ...mre.Option) (*mre.Policy, error) {
		// Tier by tier, as a plan of the profile: the first the kept swaps
		// and the overflow meet wins.
		pol, s, err := differential(mi, p.swaps, p.recomputes, link, popts)
		st = s
		return pol, err
	})
	res, err := plan.Make(in, append(slices.Clone(opts), plan.WithPlanner(diff))...)
	replan := false
	if err != nil {
		e.cfg.logger.Debug("chameleon: no differential update, planning the profile again", "err", err)
		if res, err = plan.Make(in, opts...); err != nil {
			return nil, err
		}
		replan = true
	}
	np := e.bindPlan(p.key, pr, res)
	if replan {
		e.stats.Replans++
	} else {
		e.stats.PolicyUpdates++
	}
	e.cfg.logger.Info("chameleon: policy updated", "from_limit", p.env.Limit, "to_limit", e.cfg.limit, "from_device", p.env.Device,
		"to_device", e.dev.Name(), "replan", replan, "kept", st.kept, "added", st.added, "let_go", st.dropped, "swaps", len(np.swaps))
	return np, nil
}

// bindPlan makes the policy of a plan of a profile (not a live iteration:
// persistent tensors are bound by ID when the host has made them).
func (e *Engine) bindPlan(key policyKey, pr *profiled, res *plan.Result) *policy {
	it := pr.iter
	ord := ordinals(it, e.enc.Vocab)
	made := func(id trace.TensorID) plannedTensor {
		t := it.Tensors[id]
		if k := KindOfTensor(t); k.persistent() {
			return plannedTensor{Persistent: &persistRef{ID: id, Bytes: t.Bytes, DType: t.DType, Shape: t.Shape, Kind: k}}
		}
		pt := plannedTensor{Ptr: t.Ptr, Shape: t.Shape, Ord: ord[id]}
		if a := res.Model.Lifetime(id).Alloc; a >= 0 && a < len(it.Ops) {
			op := &it.Ops[a]
			pt.Name, pt.Overload, pt.Module = op.Name, op.Overload, op.Module
		}
		return pt
	}
	swaps := slices.Clone(res.Swaps())
	tensors := make([]plannedTensor, len(swaps))
	for i, s := range swaps {
		tensors[i] = made(s.Tensor)
	}
	rcs := slices.Clone(res.Recomputes())
	rtensors, mtensors := recomputeTensors(rcs, made)
	return e.newPolicy(policySpec{key: key, swaps: swaps, tensors: tensors, issue: res.Issue, recomputes: rcs,
		rtensors: rtensors, mtensors: mtensors, ordered: true, here: true, byID: true, env: e.env(), exec: res.Exec, prof: pr})
}

// errNoUpdate wraps mre.ErrInfeasible: the planning path then tries the
// next tier of the limit.
var errNoUpdate = fmt.Errorf("the cached policy cannot be updated to this limit: %w", mre.ErrInfeasible)

// differential is the Plan stage of an update at one tier of the limit
// (in.Limit): the old swaps and recomputes simulated on link, then the
// overflow planned or the swaps the room lets go dropped.
func differential(in mre.Input, old []simulate.Swap, rcs []simulate.Recompute, link simulate.Link, popts []mre.Option) (*mre.Policy, updateStats, error) {
	u := &updater{in: in, curve: in.ResolveCurve(), old: old, rcs: rcs, link: link}
	if err := u.check(); err != nil {
		return nil, u.st, err
	}
	sim, err := u.run(old)
	if err != nil {
		return nil, u.st, err
	}
	if sim.Peak <= in.Limit {
		return u.letGo(sim)
	}
	return u.overflow(sim, popts)
}

// updater is a differential update under way: the profile's input and
// curve, the cached policy's swaps and recomputes, the link, and what it
// kept, added and let go.
type updater struct {
	in    mre.Input
	curve []int64
	old   []simulate.Swap
	rcs   []simulate.Recompute
	link  simulate.Link
	st    updateStats
}

// check refuses a policy whose swaps and recomputes are not the profile's.
func (u *updater) check() error {
	n := len(u.curve)
	for _, s := range u.old {
		if _, ok := u.in.Model.Index[s.Tensor]; !ok {
			return fmt.Errorf("swap of tensor %d: not a tensor of the profile", s.Tensor)
		}
		if err := s.Validate(n); err != nil {
			return err
		}
	}
	for _, r := range u.rcs {
		if err := r.Validate(n); err != nil {
			return err
		}
	}
	return nil
}

// run simulates swaps sw with the policy's recomputes.
func (u *updater) run(sw []simulate.Swap) (*simulate.Result, error) {
	return simulate.Run(simulate.Input{OpTimes: u.in.OpTimes, Curve: u.curve, Swaps: sw, Recomputes: u.rcs, Link: u.link})
}

// done is the updated policy of swaps sw and their simulation.
func (u *updater) done(sw []simulate.Swap, sim *simulate.Result) (*mre.Policy, updateStats, error) {
	return &mre.Policy{Limit: u.in.Limit, MRL: mre.MRL(u.curve, u.in.Limit), Swaps: sw, Recomputes: u.rcs, Sim: sim, Curve: u.curve, Rounds: 1}, u.st, nil
}

// letGo is the update of a policy that holds under the limit (sim): it
// lets go of what the room allows, largest first, each swap's bytes coming
// back over the ops where they counted as free if the curve stays under
// the limit there.
func (u *updater) letGo(sim *simulate.Result) (*mre.Policy, updateStats, error) {
	old, n, limit := u.old, len(u.curve), u.in.Limit
	mem := make([]int64, n)
	for t := range sim.Ops {
		mem[t] = sim.Ops[t].Mem
	}
	order := make([]int, len(old))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(old[b].Bytes, old[a].Bytes) })
	kept := make([]simulate.Swap, 0, len(old))
	drop := make([]bool, len(old))
	for _, i := range order {
		s := old[i]
		free := s.Free
		if i < len(sim.Freed) && sim.Freed[i] >= 0 {
			free = sim.Freed[i]
		}
		spans := s.FreeSpans(free, n)
		fits := true
		for _, sp := range spans {
			for t := sp[0]; t < sp[1] && fits; t++ {
				fits = mem[t]+s.Bytes <= limit
			}
		}
		if !fits {
			continue
		}
		for _, sp := range spans {
			for t := sp[0]; t < sp[1]; t++ {
				mem[t] += s.Bytes
			}
		}
		drop[i] = true
	}
	for i, s := range old {
		if !drop[i] {
			kept = append(kept, s)
		}
	}
	if len(kept) < len(old) {
		if ks, err := u.run(kept); err == nil && ks.Peak <= limit {
			u.st.kept, u.st.dropped = len(kept), len(old)-len(kept)
			return u.done(kept, ks)
		}
	}
	u.st.kept = len(old)
	return u.done(slices.Clone(old), sim)
}

// overflow is the update of a policy that overflows the limit (sim): it
// plans the overflow over what its swaps leave, with tensors it does not
// move yet, a few rounds.
func (u *updater) overflow(sim *simulate.Result, popts []mre.Option) (*mre.Policy, updateStats, error) {
	in, n := u.in, len(u.curve)
	moved := map[trace.TensorID]bool{}
	for _, s := range u.old {
		moved[s.Tensor] = true
	}
	for _, r := range u.rcs {
		moved[r.Tensor] = true
	}
	// Tensors the policy moves are no candidates: their bytes are already
	// off the curve over their gaps.
	model := *in.Model
	model.Lifetimes = slices.Clone(in.Model.Lifetimes)
	hide := func() {
		for k := range model.Lifetimes {
			if moved[model.Lifetimes[k].Tensor.ID] {
				model.Lifetimes[k].Bytes = 0
			}
		}
	}
	all := slices.Clone(u.old)
	for range 3 {
		hide()
		rest := make([]int64, n)
		for t := range sim.Ops {
			rest[t] = sim.Ops[t].Mem
		}
		extra, err := mre.Plan(mre.Input{Model: &model, Curve: rest, OpTimes: in.OpTimes, Groups: in.Groups, Limit: in.Limit}, popts...)
		if err != nil {
			if errors.Is(err, mre.ErrInfeasible) {
				return nil, u.st, errNoUpdate
			}
			return nil, u.st, err
		}
		added := 0
		for _, s := range extra.Swaps {
			if !moved[s.Tensor] {
				moved[s.Tensor] = true
				all = append(all, s)
				added++
			}
		}
		if added == 0 {
			break
		}
		u.st.added += added
		slices.SortStableFunc(all, func(a, b simulate.Swap) int {
			return cmp.Or(cmp.Compare(a.Out, b.Out), cmp.Compare(a.Tensor, b.Tensor))
		})
		if sim, err = u.run(all); err != nil {
			return nil, u.st, err
		}
		if sim.Peak <= in.Limit {
			u.st.kept = len(u.old)
			return u.done(all, sim)
		}
	}
	return nil, u.st, errNoUpdate
}
