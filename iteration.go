package chameleon

import (
	"context"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// Iteration is one pass of the host's loop through the Engine.
type Iteration struct {
	eng *Engine
	// err, when set, is why the iteration cannot run: every call returns it.
	err    error
	active bool // between Begin and End
	index  int
	op     int
	start  int64 // clock at Begin, ns
	detail *trace.Iteration
	span   oteltrace.Span
	ctx    context.Context
	// per-iteration execution counts
	swapsOut, swapsIn, onDemand int64
	bytesOut                    int64
	drops, recomputes           int64
	evictions, deferrals        int64
	evictedBytes                int64
	// hostRecompute marks, per profiled op, whether the host gave it a
	// Recompute.
	hostRecompute []bool
	// ord is, per tensor made in the profiled iteration, its ordinal among
	// the tensors of its call site and producer (match.NewOrdered), counted
	// in keyCount the way the matcher counts live ones.
	ord      map[trace.TensorID]uint32
	keyCount map[uint64]uint32
	// madeOp and madeN count the outputs the host made for op madeOp, by
	// rounded size: which of the layout's blocks each is (madeAt).
	madeOp int
	madeN  map[int64]int
	// carry is the copies back the policy of the iteration before left
	// due, by the op they start at (carriedIn).
	carry []carried
}

// carried is a copy back due at op of the iteration under way, left by
// the policy of the iteration before.
type carried struct {
	op int
	t  *Tensor
}

// carriedIn is what p, which ran the iteration before (of ran ops), left
// on the host with a copy back due that no one will issue, in the plan's
// issue order by the op each starts at (Stats.Carried): each swap across
// the step's end when next, the policy of this iteration, is another
// (nil: none), at the op p issues it at; and each swap of a parameter or
// optimizer state whose copy back was due at an op the iteration before
// did not reach, at the first op. Without them each comes back at its
// use, with the compute stream waiting for the whole copy.
func (p *policy) carriedIn(next *policy, ran int) []carried {
	var c []carried
	for _, i := range p.issue.InOrder {
		t := p.live[i]
		if t == nil || t.released || t.state != swapped {
			continue
		}
		switch {
		case p.swaps[i].Wraps():
			if next != p {
				c = append(c, carried{op: p.issue.InOp[i], t: t})
			}
		case t.kind != Activation && p.issue.InOp[i] >= ran:
			c = append(c, carried{op: 0, t: t})
		}
	}
	slices.SortStableFunc(c, func(a, b carried) int { return a.op - b.op })
	return c
}

// Begin starts an iteration. The returned Iteration is reused by the
// Engine: it is valid until End.
func (e *Engine) Begin() *Iteration { return e.BeginContext(context.Background()) }

// BeginContext is Begin under ctx: the iteration's span
// ("chameleon.execute") and those of the stages it runs, planning on the
// worker included, are children of ctx's span, so a service's trace shows
// the Engine's work under its own request or step.
func (e *Engine) BeginContext(ctx context.Context) *Iteration {
	if err := e.lock(); err != nil {
		return &Iteration{eng: e, err: err}
	}
	defer e.mu.Unlock()
	it := &e.it
	switch {
	case e.closed:
		return &Iteration{eng: e, err: ErrClosed}
	case it.active:
		// The iteration under way goes on untouched; this one runs nothing.
		return &Iteration{eng: e, err: ErrIterationUnderWay}
	}
	e.prefetches.endIteration() // the last iteration's planned copies back
	ranOps := it.op             // the ops the last iteration ran
	*it = Iteration{active: true, eng: e, index: e.stats.Iterations, start: e.cfg.clock().UnixNano(), hostRecompute: it.hostRecompute[:0], ord: it.ord, keyCount: it.keyCount, madeOp: -1, madeN: it.madeN}
	it.ctx, it.span = e.tracer.Start(ctx, "chameleon.execute")
	if p := e.restart; p != nil {
		// A restarted job: the policy of the sequence saved last runs from
		// the first iteration, dropped at its end if another sequence came.
		e.restart = nil
		e.setPolicy(p)
		e.ctl.Restarted(p.id)
	}
	e.tm.poll(false) // a drifted sample asks for a profile
	start := controller.Start{Policy: e.policy != nil, Next: e.det.Next(), Drifted: e.tm.takeDrift(), Cached: e.cached}
	if e.ctl.Drifting(start) {
		e.stats.DriftReplans++
		e.cfg.logger.Info("chameleon: layer times drifted from the plan: planning again", "threshold", e.cfg.timing.drift)
	}
	if e.ctl.Begin(start) {
		it.detail = &trace.Iteration{Index: it.index, Tensors: map[trace.TensorID]*trace.Tensor{}, MemExact: true}
		it.ord, it.keyCount = map[trace.TensorID]uint32{}, map[uint64]uint32{}
	}
	if e.ran != nil {
		it.carry = e.ran.carriedIn(e.policy, ranOps)
	}
	e.ran = e.policy
	if e.policy != nil {
		e.policy.reset()
		it.err = e.trimKept()
		e.reserveHost(e.policy)
	}
	if !e.cfg.noPlace {
		// A policy in STABLE repeats its requests; anything else may not.
		same := e.policy != nil && e.policy == e.placedFor && e.placedFor == e.placedBefore && e.det.Next() == seq.Stable
		if err := e.follow(e.policy); err != nil && it.err == nil {
			it.err = err
		}
		// A sequence whose placement was given up is never placed again
		// (giveUpPlacing): each step is a new one to the allocator.
		same = same && !e.unplaced[e.policy.key.Hash]
		gaveUp := e.alloc.Stats().GaveUp
		e.alloc.Repeat(same)
		if same && e.alloc.Stats().GaveUp > gaveUp {
			e.giveUpPlacing(e.policy)
		}
		e.placedBefore, e.placedFor = e.placedFor, e.policy
	}
	e.tm.begin(it.detail != nil)
	return it
}

// Before prepares op: its inputs are resident (any wait is queued on the
// compute stream, not on the host) and the swap-ins the policy issues at
// this op are started.
func (it *Iteration) Before(op *Op) error {
	e := it.eng
	if err := e.lock(); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := it.check(op); err != nil {
		return err
	}
	if e.inOp {
		return fmt.Errorf("%w: Before of op %d (%s)", ErrOpUnderWay, it.op, op.Name)
	}
	if err := it.checkFrozen(op); err != nil {
		return err
	}
	e.inOp = false
	e.serial++
	if !e.cfg.noPlace {
		e.alloc.Tick(it.op)
	}
	for _, t := range op.In {
		t.pin, t.listed = e.serial, e.serial
	}
	for _, t := range op.Out {
		t.pin, t.listed = e.serial, e.serial
	}
	if p := e.policy; p != nil {
		for _, k := range p.inAt[it.op] {
			if t := p.live[k]; t != nil {
				e.prefetches.add(t, k)
			}
		}
		if err := e.prefetches.retry(true, func(q prefetch) (bool, error) { return it.prefetch(p, q) }); err != nil {
			return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
		}
		for _, k := range p.recAt[it.op] {
			if x := p.rlive[k].x; x != nil && x.state == dropped && !x.released {
				if err := it.recompute(p, k); err != nil {
					return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
				}
			}
		}
	}
	for len(it.carry) > 0 && it.carry[0].op <= it.op {
		if t := it.carry[0].t; !t.released && t.state == swapped && !e.prefetches.waits(t) {
			e.prefetches.addCarried(t)
		}
		it.carry = it.carry[1:]
	}
	if err := e.retryPrefetches(); err != nil {
		return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
	}
	if err := it.resident(op, op.In); err != nil {
		return err
	}
	if err := it.resident(op, op.Out); err != nil {
		return err
	}
	// What the op writes no longer matches a host copy kept of it.
	for _, t := range op.Out {
		if t.kept {
			if err := e.unkeep(t); err != nil {
				return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
			}
		}
		if t.kind == Frozen {
			t.written = true
		}
	}
	e.inOp = true
	return nil
}

// prefetch starts the policy's copy back q, at its planned place, and
// counts it, or counts its deferral when no device memory is free yet.
func (it *Iteration) prefetch(p *policy, q prefetch) (bool, error) {
	t := q.t
	t.keepHost = p.keepIn[q.swap]
	var off int64 = -1
	if p.layout != nil {
		off = at(p.layout.in, int(q.swap))
	}
	ok, err := it.eng.swapIn(t, false, off)
	switch {
	case err != nil:
	case ok:
		it.swapsIn++
	default:
		it.deferrals++
	}
	return ok, err
}

// resident makes the tensors of op's list ts resident (resident1).
func (it *Iteration) resident(op *Op, ts []*Tensor) error {
	e := it.eng
	for _, t := range ts {
		if t.released {
			return fmt.Errorf("chameleon: op %d (%s) uses released tensor %d", it.op, op.Name, t.id)
		}
		if err := it.resident1(e.policy, t); err != nil {
			return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
		}
		t.lastUse = e.serial
	}
	return nil
}

// After records op and starts the swap-outs the policy schedules after it.
func (it *Iteration) After(op *Op) error {
	e := it.eng
	if err := e.lock(); err != nil {
		return err
	}
	defer e.mu.Unlock()
	if err := it.check(op); err != nil {
		return err
	}
	if !e.inOp {
		return fmt.Errorf("chameleon: After of op %d (%s) without its Before", it.op, op.Name)
	}
	e.inOp = false
	var fresh int64
	for _, t := range op.Out {
		if !t.produced {
			fresh += t.size
		}
	}
	tok := e.enc.Record(op.Name, op.Overload, fresh)
	p := e.policy
	if fresh > 0 {
		// Features are needed to match a policy's tensors, or to plan one
		// from this iteration's profile; otherwise hashing is wasted.
		need := p != nil || it.detail != nil
		var stack uint64
		if need {
			stack = match.Hash(op.Module)
		}
		for _, t := range op.Out {
			if t.produced {
				continue
			}
			t.produced = true
			if !need {
				continue
			}
			t.feat = features(uint64(t.ptr), stack, tok, t.shape)
			if it.detail != nil {
				k := match.Key(t.feat)
				it.ord[t.id] = it.keyCount[k]
				it.keyCount[k]++
			}
			if p != nil {
				if k, _ := p.matcher.Match(t.feat); k >= 0 {
					for _, sw := range p.matchSwap[k] {
						p.live[sw], t.plan = t, sw
						p.matched++
					}
					for _, rc := range p.matchRC[k] {
						p.rlive[rc].x, t.rc = t, rc
						p.matched++
					}
					if rm := p.matchRM[k]; rm >= 0 {
						p.rmlive[rm].x, t.rm = t, rm
					}
				}
			}
		}
	}
	if it.detail != nil {
		it.record(op)
	}
	if p != nil {
		p.capture(it.op, op)
		for _, k := range p.outAt[it.op] {
			t := p.live[k]
			if t == nil || t.released || t.state == swapped {
				continue
			}
			if p.swaps[k].Early {
				// A write-back: the tensor stays, read on, and leaves
				// at its Out (releaseAt) with nothing left to copy.
				ok, err := e.writeBack(t)
				if err != nil {
					return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
				}
				if ok {
					it.bytesOut += t.size
				}
				continue
			}
			if err := it.swapOut(t, p.reuseFrom(k)); err != nil {
				return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
			}
		}
		for _, k := range p.releaseAt[it.op] {
			if t := p.live[k]; t != nil && !t.released && t.state != swapped {
				if err := it.swapOut(t, p.reuseFrom(k)); err != nil {
					return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
				}
			}
		}
		if err := it.drop(p, it.op); err != nil {
			return fmt.Errorf("op %d (%s): %w", it.op, op.Name, err)
		}
	}
	e.tm.after(it.op)
	it.op++
	return nil
}

// swapOut is a planned swap-out of t, counted: a copy, or, where t's host
// copy is current (kept: a write-back, or unwritten since it came back),
// its device memory released with no bytes copied.
func (it *Iteration) swapOut(t *Tensor, from int) error {
	kept := t.kept
	if err := it.eng.swapOutFrom(t, from); err != nil {
		return err
	}
	it.swapsOut++
	if !kept {
		it.bytesOut += t.size
	}
	return nil
}

// record appends op to the detailed profile.
func (it *Iteration) record(op *Op) {
	e := it.eng
	ids := func(ts []*Tensor) []trace.TensorID {
		out := make([]trace.TensorID, len(ts))
		for i, t := range ts {
			out[i] = t.id
			if _, ok := it.detail.Tensors[t.id]; !ok {
				it.detail.Tensors[t.id] = &trace.Tensor{ID: t.id, Bytes: t.size, DType: t.dtype, Shape: t.shape, Kind: t.kind.traceKind(), Frozen: t.kind == Frozen, Ptr: t.feat.Ptr}
			}
		}
		return out
	}
	it.hostRecompute = append(it.hostRecompute, op.Recompute != nil)
	it.detail.Ops = append(it.detail.Ops, trace.Op{
		Seq: it.op, Name: op.Name, Overload: op.Overload, Phase: op.Phase, Module: op.Module,
		In: ids(op.In), Out: ids(op.Out), Mem: e.liveB, FLOPs: op.FLOPs, IOBytes: op.Bytes,
	})
}

// Result is what End reports about an iteration.
type Result struct {
	Index    int
	Ops      int
	Stage    seq.Stage // the stage this iteration ran in
	Detect   seq.Result
	Planned  bool  // a policy was planned from this iteration's profile
	CacheHit bool  // a cached policy was adopted for the next iterations
	Adopted  bool  // rank 0's policy was adopted instead of planning (WithRank)
	Matched  int   // planned tensors matched to live ones
	SwapsOut int64 // planned swap-outs this iteration (a copy, or a release of a current host copy)
	SwapsIn  int64
	OnDemand int64 // copies back issued at the use
	BytesOut int64 // bytes copied to the host by planned swap-outs and write-backs
	// Drops and Recomputes count the tensors dropped and made again.
	Drops, Recomputes int64
	// Evictions counts swap-outs forced by a failed allocation, Deferrals
	// the times a planned prefetch found no free block at its op and was
	// tried again later.
	Evictions, Deferrals int64
	// SimulatedMS is the step time the simulator predicts for the policy
	// this iteration ran (0 when none, or one loaded from a file).
	SimulatedMS float64
	// SettleError is why the end of the iteration could not make again a
	// tensor still dropped, if it could not.
	SettleError error
	// Err is why the iteration could not run at all: the Engine was closed,
	// Begin came again before End, or End without Begin. Nothing else in
	// the Result is set then.
	Err       error
	PlanError error // why planning found no policy, if it ran and failed
	// Plan is what the planning path made of this iteration's profile, when
	// it ran: the memory model, groups, op times, the policy and its
	// simulation as the executor issues it. Nil otherwise.
	Plan *plan.Result
}

// End closes the iteration: Detect, and when the stage says so, Group,
// Plan and Simulate the next policy (or adopt a cached one).
func (it *Iteration) End() Result {
	e := it.eng
	if err := e.lock(); err != nil {
		return Result{Index: it.index, Err: err}
	}
	defer e.mu.Unlock()
	if it.err != nil || !it.active || e.closed || (it == &e.it && e.inOp) {
		err := it.err
		switch {
		case e.closed:
			err = ErrClosed
		case err == nil && it.active:
			err = fmt.Errorf("%w: End before the After of op %d; the iteration ends, its profile dropped", ErrOpUnderWay, it.op)
		case err == nil:
			err = ErrNoIteration
		}
		if it == &e.it && it.active && !e.closed {
			// The iteration under way could not run (Begin failed): it
			// ends here, its profile dropped; the next Begin starts afresh.
			it.active, e.inOp = false, false
			e.enc.Finish()
			it.span.End()
			e.tm.end()
		}
		it.err = nil
		return Result{Index: it.index, Err: err}
	}
	e.inOp = false
	it.active = false
	var settleErr error
	if e.policy != nil {
		settleErr = it.settle(e.policy)
	}
	end := e.cfg.clock().UnixNano()
	ctx := it.ctx
	_, encSpan := e.tracer.Start(ctx, "chameleon.encode")
	prof := e.enc.Finish()
	encSpan.SetAttributes(attribute.Int("ops", prof.Len), attribute.Int64("bytes", prof.Bytes))
	encSpan.End()

	_, detSpan := e.tracer.Start(ctx, "chameleon.detect")
	res := e.det.Observe(prof)
	detSpan.SetAttributes(attribute.Bool("changed", res.Changed), attribute.String("stage", res.Stage.String()),
		attribute.Float64("similarity", res.Similarity))
	detSpan.End()

	r := Result{Index: it.index, Ops: prof.Len, Stage: res.Stage, Detect: res,
		SwapsOut: it.swapsOut, SwapsIn: it.swapsIn, OnDemand: it.onDemand, BytesOut: it.bytesOut,
		Drops: it.drops, Recomputes: it.recomputes, SettleError: settleErr, Evictions: it.evictions, Deferrals: it.deferrals}
	if p := e.policy; p != nil {
		r.SimulatedMS = p.simMS
	}
	key := policyKey{Hash: prof.Hash, Ops: prof.Len, Bytes: prof.Bytes}
	obs := controller.Observation{Key: key, Changed: res.Changed, Profiled: it.detail != nil,
		Cached: e.cached(key), Evictions: it.evictions, EvictedBytes: it.evictedBytes}
	obs.Shortfalls, obs.Fit = e.alloc.PageShortfalls()
	obs.BestFit = e.policy != nil && !e.cfg.noPlace && e.unplaced[e.policy.key.Hash]
	if p := e.policy; p != nil {
		obs.Policy = &controller.Policy{ID: p.id, Key: p.key, Here: p.here, Targets: p.targets(), Matched: p.matched, Disturbed: p.disturbed}
		if p.exec != nil {
			obs.Policy.Peak = p.exec.Peak
		}
		r.Matched = p.matched
	}
	ready := e.ctl.End(obs)
	e.carryOut(ready, key, &r)
	if ready.Plan != nil {
		it.detail.TimeMS = float64(end-it.start) / 1e6
		e.tm.measure(len(it.detail.Ops))
		e.startPlan(ctx, *ready.Plan, e.snapshot(it), e.receives(*ready.Plan))
	}
	e.land(ctx, &r)
	it.span.SetAttributes(attribute.Int("iteration", it.index), attribute.Int("ops", prof.Len),
		attribute.Int64("swaps_out", it.swapsOut), attribute.Int64("swaps_in", it.swapsIn),
		attribute.Int64("bytes_out", it.bytesOut), attribute.Int64("on_demand_in", it.onDemand),
		attribute.String("stage", res.Stage.String()))
	it.span.End()
	e.tm.end()
	e.stats.Iterations++
	return r
}

// carryOut does what the controller decided at the end of an iteration,
// before any plan it asked for.
func (e *Engine) carryOut(d controller.Ready, key policyKey, r *Result) {
	if d.Drop {
		e.setPolicy(nil)
	}
	for _, k := range d.Uncache {
		e.cache.drop(k)
	}
	if d.Stale {
		e.stats.StaleDrops++
	}
	if d.Outgrown {
		e.stats.Outgrown++
	}
	if d.Refine {
		e.stats.Refined++
	}
	if d.Adopt {
		e.setPolicy(e.cache.get(key))
		e.det.Adopt()
		r.CacheHit = true
		e.stats.CacheHits++
	}
	if d.Settle {
		e.det.Adopt()
		r.CacheHit = true
		e.stats.CacheHits++
	}
	if d.Expect != nil {
		if p := e.cache.get(*d.Expect); p != nil && p != e.policy {
			e.setPolicy(p)
			e.ctl.Expected(p.id)
			e.stats.Expected++
		}
	}
}

// check refuses an op the iteration cannot run: after Close, a second
// Begin, a nil op, a nil tensor, a tensor of another Engine.
func (it *Iteration) check(op *Op) error {
	switch {
	case it.eng.closed:
		return ErrClosed
	case it.err != nil:
		return it.err
	case !it.active:
		return fmt.Errorf("%w: op %d outside Begin and End", ErrNoIteration, it.op)
	case op == nil:
		return fmt.Errorf("chameleon: op %d is nil", it.op)
	}
	for _, ts := range [2][]*Tensor{op.In, op.Out} {
		for x, t := range ts {
			if t == nil {
				return fmt.Errorf("chameleon: op %d (%s): tensor %d of its list is nil", it.op, op.Name, x)
			}
			if t.eng != it.eng {
				return fmt.Errorf("chameleon: op %d (%s): tensor %d belongs to another Engine", it.op, op.Name, t.id)
			}
		}
	}
	return nil
}
