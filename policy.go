package chameleon

import (
	"context"
	"math"
	"slices"
	"sort"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// policy is a plan in force: its schedule (what to swap and recompute,
// when, and where the layout puts each block), what the current iteration
// bound to it (the live tensors it matched), and what the Engine learns of
// it as it runs.
type policy struct {
	schedule
	binding
	// disturbed: planned on times measured in an iteration that forced
	// evictions (the controller's refine).
	disturbed bool
	// eng binds a loaded policy's persistent tensors, by ID, when the
	// restarted job has made them (bindPersistent); binds counts the tries.
	eng *Engine
	// timing is its layers and their times, for a policy planned here.
	timing *policyTiming
	// hostReserved: the host pool was sized for the policy (reserveHost).
	hostReserved bool
	// id is its number once put in force (Engine.setPolicy), 0 before.
	id uint64
}

// schedule is what a plan says, made once by newPolicy from a policySpec
// and never changed after (simulated sets its simulation, once).
type schedule struct {
	key policyKey
	// here: planned (or updated) by this Engine, from its own profile; one
	// from a policy file or another rank is run as it came.
	here  bool
	swaps []simulate.Swap
	// tensors describes, per swap, the planned activation (zero for a
	// persistent tensor): what matching and the policy file need.
	tensors []plannedTensor
	outAt   map[int][]int32
	inAt    map[int][]int32
	// releaseAt: per op, the write-backs (simulate.Swap.Early) whose
	// tensors leave after it; their copies are issued at outAt.
	releaseAt map[int][]int32
	// Per matcher index, the swaps and recomputes of that tensor (over
	// different gaps).
	matchSwap, matchRC [][]int32
	// recomputes are the tensors dropped and made again, rtensors what
	// matches them; filed by producer, drop and use, with this iteration's
	// state in rlive.
	recomputes            []simulate.Recompute
	rtensors              []plannedTensor
	prodAt, dropAt, recAt map[int][]int32
	// remade are the inputs recomputes make again, one slot per tensor:
	// what matches them, their producer, how many recomputes use each, and
	// per recompute its slots.
	remade   []simulate.Remade
	mtensors []plannedTensor
	rmProdAt map[int][]int32
	rmUsers  []int
	rcRemade [][]int32
	matchRM  []int32          // per matcher index, its remade slot, -1
	simMS    float64          // the simulated step of the plan, as the executor issues it
	exec     *simulate.Result // the simulation of the plan (nil: unknown)
	reuse    []int            // per swap, reuseFrom (nil: unknown)
	// issue is when, and in which order, the copies are issued; env what
	// the plan assumed (zero: unknown, a policy of a version 1 file); prof
	// the profiled iteration it was planned from (nil: unknown), which a
	// differential update plans from again.
	issue *simulate.IssuePlan
	env   policyEnv
	prof  *profiled
	// keepIn says, per swap, that the tensor's host copy is kept when it
	// comes back: a later swap of it copies nothing out (NoCopyOut), as
	// the plan counted (an activation swapped twice, unwritten between).
	keepIn []bool
	// layout is where the plan put its blocks (nil: none that fits, or a
	// policy from a file or another rank).
	layout *policyLayout
}

// binding is what the iterations bound to a schedule: the tensors matched
// to its swaps, recomputes and remade inputs (reset at each Begin, but for
// the persistent tensors bound by handle), and the matcher's state.
type binding struct {
	// fixed holds, per swap, the persistent tensor it moves (parameters,
	// optimizer state keep their handle across iterations, so they need no
	// matching), nil for a swap of an activation, found by matching.
	fixed   []*Tensor
	matcher *match.Matcher
	live    []*Tensor
	matched int
	rlive   []rcLive
	rmlive  []rmLive
	binds   int
}

// plannedTensor is what a policy knows of a planned activation: its device
// address when profiled and the op and call site that produced it, with
// its shape. For a swap of a persistent tensor, Persistent says which one.
type plannedTensor struct {
	Ptr      uint64
	Name     string
	Overload string
	Module   string
	Shape    []int64
	// Ord is the tensor's ordinal among those its call site and producer
	// made in the profiled iteration (match.NewOrdered).
	Ord uint32
	// Persistent, set for a swap of a parameter or optimizer state, is the
	// tensor as a restarted job knows it (persistRef).
	Persistent *persistRef
}

// features is the tensor's match key in the vocabulary of this process.
func (t *plannedTensor) features(v *seq.Vocab) match.Features {
	return features(t.Ptr, match.Hash(t.Module), v.Token(t.Name, t.Overload), t.Shape)
}

// features is the one place match keys are made, for planned tensors and
// for live ones (stack is match.Hash of the call site).
func features(ptr, stack uint64, producer seq.Token, shape []int64) match.Features {
	return match.Features{Ptr: ptr, Stack: stack, Producer: uint32(producer), Shape: match.ShapeHash(shape)}
}

// newPolicy indexes a plan's swaps by the op their copies are issued at,
// and its recomputes by their ops. ordered says the planned tensors carry
// their ordinals (Ord); a policy file without them takes ranks among the
// planned tensors. fixed may be nil (no persistent tensor
// among the swaps), and so may ip (issue each copy at the plan's Out and
// In) and rcs.
// policySpec is everything a policy is made of (newPolicy): the plan's
// swaps and recomputes with what matches their tensors, and where it came
// from.
type policySpec struct {
	key   policyKey
	swaps []simulate.Swap
	// tensors, per swap, what matches its activation (zero for a
	// persistent tensor); fixed, per swap, the persistent tensor it moves,
	// bound by handle (nil: none yet, bound by ID as the host makes them).
	tensors []plannedTensor
	fixed   []*Tensor
	issue   *simulate.IssuePlan // nil: issued in the swaps' order
	// recomputes and what matches their tensors (rtensors) and the inputs
	// they make again (mtensors).
	recomputes         []simulate.Recompute
	rtensors, mtensors []plannedTensor
	ordered            bool // the tensors carry their ordinals (match.NewOrdered)
	// byID: its persistent tensors are bound by ID as the host makes them
	// (bindPersistent: a policy of a file, or of another profile).
	byID   bool
	here   bool // planned here, from this Engine's profile
	layout *policyLayout
	env    policyEnv
	prof   *profiled
	exec   *simulate.Result // the plan's simulation, when known
	simMS  float64          // its step, when exec is not known (a policy file's)
}

// newPolicy makes the policy of s for this Engine: its schedule indexed by
// op, its tensors' matcher, an empty binding.
func (e *Engine) newPolicy(s policySpec) *policy {
	swaps, ip, rcs, fixed := s.swaps, s.issue, s.recomputes, s.fixed
	if fixed == nil {
		fixed = make([]*Tensor, len(swaps))
	}
	if ip == nil {
		ip = simulate.Issue(swaps, nil)
	}
	p := &policy{}
	if s.byID {
		p.eng = e
	}
	p.schedule = schedule{key: s.key, here: s.here, swaps: swaps, tensors: s.tensors, issue: ip, layout: s.layout, env: s.env, prof: s.prof,
		simMS: s.simMS, outAt: map[int][]int32{}, inAt: map[int][]int32{}, releaseAt: map[int][]int32{}, rtensors: s.rtensors, mtensors: s.mtensors}
	p.binding = binding{fixed: fixed, live: make([]*Tensor, len(swaps))}
	tensors, rtensors, mtensors, v := s.tensors, s.rtensors, s.mtensors, e.enc.Vocab
	// Copy streams run copies in issue order: the plan's issue order (when,
	// and in which order, its simulation started them) makes the streams
	// run the planned schedule.
	for _, i := range ip.OutOrder {
		p.outAt[ip.OutOp[i]] = append(p.outAt[ip.OutOp[i]], int32(i))
		if swaps[i].Early {
			p.releaseAt[swaps[i].Out] = append(p.releaseAt[swaps[i].Out], int32(i))
		}
	}
	for _, i := range ip.InOrder {
		p.inAt[ip.InOp[i]] = append(p.inAt[ip.InOp[i]], int32(i))
	}
	p.indexRecomputes(rcs)
	// One matcher entry per planned activation, whether it is swapped,
	// recomputed or both (over different gaps).
	var mf []match.Features
	var ords []uint32
	entry := map[trace.TensorID]int{}
	add := func(id trace.TensorID, t *plannedTensor) int {
		if x, ok := entry[id]; ok {
			return x
		}
		entry[id] = len(mf)
		mf = append(mf, t.features(v))
		ords = append(ords, t.Ord)
		p.matchSwap, p.matchRC, p.matchRM = append(p.matchSwap, nil), append(p.matchRC, nil), append(p.matchRM, -1)
		return len(mf) - 1
	}
	for i := range swaps {
		if fixed[i] == nil && tensors[i].Persistent == nil {
			x := add(swaps[i].Tensor, &tensors[i])
			p.matchSwap[x] = append(p.matchSwap[x], int32(i))
		}
	}
	for k := range rcs {
		x := add(rcs[k].Tensor, &rtensors[k])
		p.matchRC[x] = append(p.matchRC[x], int32(k))
	}
	for m := range p.remade {
		p.matchRM[add(p.remade[m].Tensor, &mtensors[m])] = int32(m)
	}
	if !s.ordered {
		ords = nil
	}
	p.matcher = match.NewOrdered(e.cfg.match, mf, ords)
	p.keepIn = make([]bool, len(swaps))
	for _, ks := range p.matchSwap {
		for _, i := range ks {
			for _, j := range ks {
				if swaps[j].NoCopyOut && swaps[j].Out > swaps[i].Out {
					p.keepIn[i] = true
				}
			}
		}
	}
	if s.exec != nil {
		p.simulated(s.exec)
	}
	return p
}

// targets is the number of planned tensors the policy needs matched.
func (p *policy) targets() int { return len(p.swaps) + len(p.recomputes) }

// reset starts an iteration: activations are matched afresh, persistent
// tensors are known.
func (p *policy) reset() {
	p.matcher.Reset()
	clear(p.live)
	for k := range p.rlive {
		p.rlive[k] = rcLive{in: p.rlive[k].in[:0]}
	}
	for m := range p.rmlive {
		p.rmlive[m] = rmLive{in: p.rmlive[m].in[:0]}
	}
	p.matched = 0
	p.bindPersistent()
	for i, t := range p.fixed {
		if t != nil && !t.released {
			p.live[i], t.plan = t, int32(i)
			p.matched++
		}
	}
}

// cached reports whether the cache holds a policy for k.
func (e *Engine) cached(k policyKey) bool {
	return e.cache.get(k) != nil
}

// simulated records the plan's simulation as the executor issues it, its
// step, and when each swap's memory may be reused (reuseFrom).
func (p *policy) simulated(ex *simulate.Result) {
	p.simMS, p.exec = ex.IterationUS/1000, ex
	p.reuse = nil
	if len(ex.Out) != len(p.swaps) {
		return
	}
	p.reuse = make([]int, len(p.swaps))
	for k, s := range p.swaps {
		p.reuse[k] = s.Free
		c := ex.Out[k]
		if s.Free < 0 || s.Wraps() || math.IsNaN(c.End) {
			continue
		}
		// The first op that starts once the copy is done, with a margin
		// for a link a little slower than the model's.
		done := c.End + copySlack*(c.End-c.Start)
		t := sort.Search(len(ex.Ops), func(i int) bool { return ex.Ops[i].Start >= done })
		p.reuse[k] = min(s.Free, max(t, s.Out+1))
	}
}

// copySlack is the share of a copy's simulated time added to its end
// before its memory is handed to others by placement (policy.reuseFrom).
const copySlack = 0.25

// reuseFrom is the op from which the allocator's placement may hand the
// memory of swap k's tensor to others: the op that starts once the
// simulated copy out is done, never later than the plan's Free (its
// simulation counts the memory taken until Free; placement, which packs
// blocks by when their memory is really done with, gets the room between).
func (p *policy) reuseFrom(k int32) int {
	if int(k) < len(p.reuse) {
		return p.reuse[k]
	}
	return p.swaps[k].Free
}

// bind makes the policy of a plan that came back from the worker: its
// swaps and recomputes bound to this Engine's tensors, persistent ones by
// handle (those live when the profile ended), activations by their match
// features.
func (e *Engine) bind(snap *planSnapshot, res *plan.Result, key policyKey) *policy {
	it, live, ord := snap.iter, snap.live, snap.ord
	swaps := slices.Clone(res.Swaps())
	tensors := make([]plannedTensor, len(swaps))
	fixed := make([]*Tensor, len(swaps))
	made := func(id trace.TensorID) plannedTensor {
		t := it.Tensors[id]
		op := &it.Ops[res.Model.Lifetime(id).Alloc]
		return plannedTensor{Ptr: t.Ptr, Name: op.Name, Overload: op.Overload, Module: op.Module, Shape: t.Shape, Ord: ord[id]}
	}
	for i, s := range swaps {
		if t := live[s.Tensor]; t != nil && t.kind.persistent() {
			fixed[i] = t
			tensors[i].Persistent = &persistRef{ID: t.id, Bytes: t.size, DType: t.dtype, Shape: t.shape, Kind: t.kind}
			continue
		}
		tensors[i] = made(s.Tensor)
	}
	rcs := slices.Clone(res.Recomputes())
	rtensors, mtensors := recomputeTensors(rcs, made)
	return e.newPolicy(policySpec{key: key, swaps: swaps, tensors: tensors, fixed: fixed, issue: res.Issue,
		recomputes: rcs, rtensors: rtensors, mtensors: mtensors, ordered: true, here: true,
		layout: newPolicyLayout(res.Layout, len(swaps), len(rcs)), env: e.env(), exec: res.Exec,
		prof: newProfiled(it, snap.hostRecompute, func(id trace.TensorID) bool { return live[id] != nil })})
}

// spans makes an OpenTelemetry span of each planning stage, under ctx.
// The stages of each of the two plans Make makes side by side carry the
// count of logical layers that plan counted its prefetches over
// (plan_groups); the choose span says which was kept.
func (e *Engine) spans(ctx context.Context) plan.Observer {
	return func(s plan.Stage) func(*plan.Result, error) {
		_, span := e.tracer.Start(ctx, "chameleon."+string(s))
		return func(r *plan.Result, err error) {
			if s != plan.StageGroup && r != nil && len(r.PlanGroups) > 0 {
				span.SetAttributes(attribute.Int("plan_groups", len(r.PlanGroups)))
			}
			switch s {
			case plan.StageGroup:
				span.SetAttributes(attribute.Int("groups", len(r.Groups)))
				if r.Model != nil {
					span.SetAttributes(attribute.Int("ops", len(r.Model.Curve)), attribute.Int64("peak_bytes", r.Model.Peak))
				}
			case plan.StagePlan:
				var bytes int64
				for _, sw := range r.Swaps() {
					bytes += sw.Bytes
				}
				span.SetAttributes(attribute.Int("swaps", len(r.Swaps())), attribute.Int64("bytes", bytes),
					attribute.Int64("limit", r.Limit), attribute.Int64("planned_limit", r.Planned))
			case plan.StageSimulate, plan.StageChoose:
				if r.Exec != nil {
					span.SetAttributes(attribute.Float64("iteration_us", r.Exec.IterationUS), attribute.Float64("stall_us", r.Exec.StallUS),
						attribute.Float64("overhead_pct", r.Exec.OverheadPct()))
				}
			}
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, err.Error())
			}
			span.End()
		}
	}
}

// ordinals counts, for the tensors an iteration's ops make (each at its
// first appearance as an output, persistent ones aside, as After counts live
// ones), their ordinal among those of their call site and producer: what a
// plan of a stored profile binds its tensors with (match.NewOrdered).
func ordinals(it *trace.Iteration, v *seq.Vocab) map[trace.TensorID]uint32 {
	ord := make(map[trace.TensorID]uint32, len(it.Tensors))
	seen := make(map[trace.TensorID]bool, len(it.Tensors))
	count := map[uint64]uint32{}
	for i := range it.Ops {
		op := &it.Ops[i]
		stack, tok := match.Hash(op.Module), v.Token(op.Name, op.Overload)
		for _, id := range op.Out {
			t := it.Tensors[id]
			if seen[id] || t == nil || KindOf(t.Kind).persistent() {
				continue
			}
			seen[id] = true
			k := match.Key(features(t.Ptr, stack, tok, t.Shape))
			ord[id] = count[k]
			count[k]++
		}
	}
	return ord
}

// recomputeTensors describes, by made, what a policy's recomputes match:
// each recomputed tensor, and each input they make again, once.
func recomputeTensors(rcs []simulate.Recompute, made func(trace.TensorID) plannedTensor) (rtensors, mtensors []plannedTensor) {
	rtensors = make([]plannedTensor, len(rcs))
	seen := map[trace.TensorID]bool{}
	for k, r := range rcs {
		rtensors[k] = made(r.Tensor)
		for _, m := range r.Remade {
			if !seen[m.Tensor] {
				seen[m.Tensor] = true
				mtensors = append(mtensors, made(m.Tensor))
			}
		}
	}
	return rtensors, mtensors
}

// inForce is which policy the Engine runs, the cache it comes from, and
// the controller that decides.
type inForce struct {
	policy *policy
	cache  *policyCache
	// ctl decides which policy is in force, when to profile and plan
	// (internal/controller); no other code writes its state.
	ctl *controller.Controller
	// restart is the policy of the sequence a policy file saved last,
	// applied from the first iteration (nil: none).
	restart *policy
	// policies numbers the policies put in force (policy.id).
	policies uint64
}
