package chameleon

import (
	"slices"

	"github.com/chameleon-go/chameleon/internal/policyfile"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// The policy file's format (its types, decoding, checks and atomic save)
// is package internal/policyfile's; docs/policy.md describes it. Here is
// the conversion between a policy in memory and a policy of the file:
// encodePolicy writes one, (*Engine).decodePolicy reads a checked one in
// this process's vocabulary, and bindPersistent binds its persistent
// tensors to this job's.

// persistRef is a persistent tensor as a restarted job knows it: by its ID
// (the order the host made its tensors in: parameters and optimizer state
// made at start get the same IDs in every run), checked by size, dtype and
// shape before a policy moves it.
type persistRef struct {
	ID    trace.TensorID
	Bytes int64
	DType string
	Shape []int64
	Kind  Kind
}

// policyEnv is what a plan assumed besides its sequence: the memory limit,
// the host link and the device.
type policyEnv struct {
	Limit  int64
	Link   simulate.Link
	Device string
}

func (v policyEnv) known() bool { return v.Limit > 0 }

// profiled is the iteration a policy was planned from, with the tensors
// live after it and the ops the host could run again: what plan.Make
// needs to plan it again without profiling.
type profiled struct {
	iter      *trace.Iteration
	liveOut   []trace.TensorID
	recompute []bool
}

func newProfiled(it *trace.Iteration, host []bool, live func(trace.TensorID) bool) *profiled {
	p := &profiled{iter: it, recompute: slices.Clone(host)}
	for id := range it.Tensors {
		if live(id) {
			p.liveOut = append(p.liveOut, id)
		}
	}
	slices.Sort(p.liveOut)
	return p
}

// kindName is a Kind in the file.
func kindName(k Kind) string {
	switch k {
	case Persistent:
		return policyfile.KindParam
	case OptimizerState:
		return policyfile.KindOptState
	case Frozen:
		return policyfile.KindFrozen
	}
	return policyfile.KindActivation
}

func kindOfName(s string) Kind {
	switch s {
	case policyfile.KindParam:
		return Persistent
	case policyfile.KindOptState:
		return OptimizerState
	case policyfile.KindFrozen:
		return Frozen
	}
	return Activation
}

// encodePolicy is the file form of p.
func encodePolicy(p *policy) policyfile.Policy {
	fp := policyfile.Policy{Key: p.key, SimulatedMS: p.simMS, Swaps: make([]policyfile.Swap, 0, len(p.swaps)), Tensors: []policyfile.Tensor{},
		Recomputes: []policyfile.Recompute{}}
	if p.env.known() {
		l := p.env.Link
		fp.Assumed = &policyfile.Assumed{LimitBytes: p.env.Limit, Device: p.env.Device,
			Link: policyfile.Link{D2H: l.D2H, H2D: l.H2D, D2HShared: l.D2HShared, H2DShared: l.H2DShared}}
	}
	seen := map[trace.TensorID]bool{}
	addT := func(id trace.TensorID, b int64, t *plannedTensor) {
		if seen[id] {
			return
		}
		seen[id] = true
		ft := policyfile.Tensor{ID: id, Kind: policyfile.KindActivation, Bytes: max(b, 1), Shape: t.Shape, Ptr: t.Ptr, Producer: t.Name, Overload: t.Overload, Module: t.Module, Ord: t.Ord}
		if r := t.Persistent; r != nil {
			ft = policyfile.Tensor{ID: id, Kind: kindName(r.Kind), Bytes: r.Bytes, DType: r.DType, Shape: r.Shape}
		}
		if p.prof != nil {
			if tt := p.prof.iter.Tensors[id]; tt != nil {
				ft.Bytes = max(tt.Bytes, 1)
				if ft.DType == "" {
					ft.DType = tt.DType
				}
			}
		}
		fp.Tensors = append(fp.Tensors, ft)
	}
	ip := p.issue
	if ip == nil {
		ip = simulate.Issue(p.swaps, nil)
	}
	for i, s := range p.swaps {
		addT(s.Tensor, s.Bytes, &p.tensors[i])
		fs := policyfile.Swap{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use,
			IssueOut: ip.OutOp[i], IssueIn: ip.InOp[i]}
		if s.NoCopyOut {
			fs.D2H = new(bool)
		}
		if s.Early {
			fs.CopyAfter = &s.CopyAfter
		}
		fp.Swaps = append(fp.Swaps, fs)
	}
	fp.OutOrder, fp.InOrder = slices.Clone(ip.OutOrder), slices.Clone(ip.InOrder)
	if fp.OutOrder == nil {
		fp.OutOrder, fp.InOrder = []int{}, []int{}
	}
	for k, r := range p.recomputes {
		addT(r.Tensor, r.Bytes, &p.rtensors[k])
		fr := policyfile.Recompute{Tensor: r.Tensor, Bytes: r.Bytes, Op: r.Op, Drop: r.Drop, Before: r.Before}
		for _, x := range r.Kept {
			fr.Kept = append(fr.Kept, policyfile.Kept{Tensor: x.Tensor, Bytes: x.Bytes, From: x.From})
		}
		for _, m := range r.Remade {
			fr.Remade = append(fr.Remade, policyfile.Remade{Tensor: m.Tensor, Bytes: m.Bytes, Op: m.Op})
		}
		fp.Recomputes = append(fp.Recomputes, fr)
	}
	for m, x := range p.remade {
		addT(x.Tensor, x.Bytes, &p.mtensors[m])
	}
	if p.prof != nil {
		fp.Profile = encodeProfile(p.prof)
	}
	return fp
}

func encodeProfile(pr *profiled) *policyfile.Profile {
	it := pr.iter
	f := &policyfile.Profile{TimeMS: it.TimeMS, LiveOut: slices.Clone(pr.liveOut), Strings: []string{}}
	if f.LiveOut == nil {
		f.LiveOut = []trace.TensorID{}
	}
	index := map[string]int{}
	str := func(s string) int {
		if x, ok := index[s]; ok {
			return x
		}
		index[s] = len(f.Strings)
		f.Strings = append(f.Strings, s)
		return len(f.Strings) - 1
	}
	ids := make([]trace.TensorID, 0, len(it.Tensors))
	for id := range it.Tensors {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		t := it.Tensors[id]
		f.Tensors = append(f.Tensors, policyfile.ProfTensor{ID: id, Bytes: t.Bytes, Kind: int(t.Kind), DType: str(t.DType), Shape: t.Shape, Ptr: t.Ptr, Frozen: t.Frozen})
	}
	for i := range it.Ops {
		op := &it.Ops[i]
		f.Ops = append(f.Ops, policyfile.ProfOp{Name: str(op.Name), Overload: str(op.Overload), Module: str(op.Module), Phase: int(op.Phase),
			In: op.In, Out: op.Out, Mem: op.Mem, FLOPs: op.FLOPs, IOBytes: op.IOBytes, Recompute: i < len(pr.recompute) && pr.recompute[i]})
	}
	return f
}

// profiledOf is the file's profile f as the planning path reads it.
func profiledOf(f *policyfile.Profile) *profiled {
	it := &trace.Iteration{TimeMS: f.TimeMS, MemExact: true, Tensors: make(map[trace.TensorID]*trace.Tensor, len(f.Tensors)), Ops: make([]trace.Op, len(f.Ops))}
	for _, t := range f.Tensors {
		it.Tensors[t.ID] = &trace.Tensor{ID: t.ID, Bytes: t.Bytes, DType: f.Strings[t.DType], Shape: t.Shape, Kind: trace.Kind(t.Kind), Ptr: t.Ptr, Frozen: t.Frozen}
	}
	pr := &profiled{iter: it, liveOut: f.LiveOut, recompute: make([]bool, len(f.Ops))}
	for i, op := range f.Ops {
		it.Ops[i] = trace.Op{Seq: i, Name: f.Strings[op.Name], Overload: f.Strings[op.Overload], Module: f.Strings[op.Module],
			Phase: trace.Phase(op.Phase), In: op.In, Out: op.Out, Mem: op.Mem, FLOPs: op.FLOPs, IOBytes: op.IOBytes}
		pr.recompute[i] = op.Recompute
	}
	return pr
}

// decodePolicy makes the policy of a checked file entry, in this
// process's vocabulary.
func (e *Engine) decodePolicy(fp *policyfile.Policy) *policy {
	byID := make(map[trace.TensorID]*policyfile.Tensor, len(fp.Tensors))
	for i := range fp.Tensors {
		byID[fp.Tensors[i].ID] = &fp.Tensors[i]
	}
	planned := func(id trace.TensorID) plannedTensor {
		t := byID[id]
		if t.Kind != policyfile.KindActivation {
			return plannedTensor{Persistent: &persistRef{ID: id, Bytes: t.Bytes, DType: t.DType, Shape: t.Shape, Kind: kindOfName(t.Kind)}}
		}
		return plannedTensor{Ptr: t.Ptr, Name: t.Producer, Overload: t.Overload, Module: t.Module, Shape: t.Shape, Ord: t.Ord}
	}
	swaps := make([]simulate.Swap, len(fp.Swaps))
	tensors := make([]plannedTensor, len(fp.Swaps))
	ip := &simulate.IssuePlan{OutOp: make([]int, len(fp.Swaps)), InOp: make([]int, len(fp.Swaps)),
		OutOrder: slices.Clone(fp.OutOrder), InOrder: slices.Clone(fp.InOrder)}
	for i, s := range fp.Swaps {
		swaps[i] = s.Sim()
		tensors[i] = planned(s.Tensor)
		ip.OutOp[i], ip.InOp[i] = s.IssueOut, s.IssueIn
	}
	rcs := make([]simulate.Recompute, len(fp.Recomputes))
	for k, r := range fp.Recomputes {
		rcs[k] = r.Sim()
	}
	rtensors, mtensors := recomputeTensors(rcs, planned)
	spec := policySpec{key: fp.Key, swaps: swaps, tensors: tensors, issue: ip, recomputes: rcs, rtensors: rtensors, mtensors: mtensors,
		ordered: fp.Ordered(), byID: true, simMS: fp.SimulatedMS}
	if a := fp.Assumed; a != nil {
		spec.env = policyEnv{Limit: a.LimitBytes, Device: a.Device,
			Link: simulate.Link{D2H: a.Link.D2H, H2D: a.Link.H2D, D2HShared: a.Link.D2HShared, H2DShared: a.Link.H2DShared}}
	}
	if fp.Profile != nil {
		spec.prof = profiledOf(fp.Profile)
	}
	return e.newPolicy(spec)
}

// bindPersistent binds a loaded policy's swaps of persistent tensors to
// the handles of this job: same ID, size, dtype and shape. It tries at the
// first iterations the policy is in force, while some are unbound (the
// host may make its parameters late).
func (p *policy) bindPersistent() {
	if p.eng == nil || p.binds >= 3 {
		return
	}
	unbound := 0
	for i := range p.swaps {
		if p.fixed[i] == nil && p.tensors[i].Persistent != nil {
			unbound++
		}
	}
	if unbound == 0 {
		p.binds = 3
		return
	}
	p.binds++
	byID := map[trace.TensorID]*Tensor{}
	for _, t := range p.eng.live {
		if t.kind.persistent() {
			byID[t.id] = t
		}
	}
	for i := range p.swaps {
		r := p.tensors[i].Persistent
		if p.fixed[i] != nil || r == nil {
			continue
		}
		if t := byID[r.ID]; t != nil && t.size == r.Bytes && t.kind == r.Kind && t.dtype == r.DType && slices.Equal(t.shape, r.Shape) {
			p.fixed[i] = t
		}
	}
}
