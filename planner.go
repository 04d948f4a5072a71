package chameleon

import (
	"context"
	"slices"

	"github.com/samber/lo"
	"golang.org/x/sync/errgroup"

	"github.com/chameleon-go/chameleon/internal/controller"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

// planJob is a plan the controller asked for, made on the Engine's worker
// while iterations go on: the worker runs plan.Make on what the profiled
// iteration left (snapshot) and nothing else of the Engine; the policy is
// bound to the Engine's tensors when the job lands, at an iteration
// boundary, under the Engine's lock. A rank other than 0 whose plan the
// ranks exchange receives rank 0's policy instead (recv).
type planJob struct {
	req  controller.Request
	snap *planSnapshot
	recv bool
	done chan struct{}
	// Written by the worker before done closes.
	res     *plan.Result
	err     error
	payload []byte
}

// planSnapshot is what a plan is made from: the profiled iteration, what
// the host said of its ops, its tensors' ordinals, the tensors live at its
// end, the options of the moment, and the evictions it forced.
type planSnapshot struct {
	iter          *trace.Iteration
	hostRecompute []bool
	ord           map[trace.TensorID]uint32
	live          map[trace.TensorID]*Tensor
	opts          []plan.Option
	evictions     int64
}

// sendJob is rank 0's broadcast of a policy, on the worker.
type sendJob struct {
	shared bool // a policy (not a file of none)
	done   chan struct{}
	err    error
}

// snapshot takes what a plan needs from the iteration ending: the
// iteration gives up its profile, which the worker reads from now on.
func (e *Engine) snapshot(it *Iteration) *planSnapshot {
	live := lo.KeyBy(e.live, func(t *Tensor) trace.TensorID { return t.id })
	opts := append(append(append(deviceDefaults(e.dev), e.cfg.planning...), e.tm.planOptions()...),
		plan.WithLayout(e.alloc.PageSize(), e.cfg.limit))
	if slices.Contains(it.hostRecompute, true) {
		opts = append(opts, plan.WithRecompute(recomputable(it.hostRecompute)))
	}
	s := &planSnapshot{iter: it.detail, hostRecompute: it.hostRecompute, ord: it.ord, live: live, opts: opts, evictions: it.evictions}
	it.detail, it.hostRecompute, it.ord, it.keyCount = nil, nil, nil, nil
	return s
}

// startPlan runs req on the worker: rank 0's policy for a rank that takes
// it (recv), else a plan.
func (e *Engine) startPlan(ctx context.Context, req controller.Request, snap *planSnapshot, recv bool) {
	j := &planJob{req: req, snap: snap, recv: recv, done: make(chan struct{})}
	e.job = j
	timeout := e.rankTimeout()
	ch := e.cfg.ranks.ch
	opts := append(slices.Clip(snap.opts), plan.WithObserver(e.spans(ctx)), plan.WithCancel(e.work))
	in := plan.Input{Iter: snap.iter, Limit: req.Limit, Growing: req.Growing,
		LiveOut: func(id trace.TensorID) bool { return snap.live[id] != nil }}
	e.workers.Go(func() error {
		defer close(j.done)
		if recv {
			bctx, cancel := context.WithTimeout(e.work, timeout)
			j.payload, j.err = ch.Broadcast(bctx, nil)
			cancel()
			return nil
		}
		j.res, j.err = plan.Make(in, opts...)
		return nil
	})
}

// land takes the work the worker finished, at an iteration boundary (the
// end of an iteration): a plan that came back, rank 0's policy, a
// broadcast done. With WithSyncPlanning it waits for that work first.
func (e *Engine) land(ctx context.Context, r *Result) { e.landWith(ctx, r, e.cfg.syncPlanning) }

// landWith is land, waiting for the work under way when wait is set.
func (e *Engine) landWith(ctx context.Context, r *Result, wait bool) {
	for e.job != nil {
		j := e.job
		if !ready(j.done, wait) {
			break
		}
		e.job = nil
		if j.recv {
			e.landShared(ctx, j, r)
		} else {
			e.landPlan(ctx, j, r)
		}
	}
	e.sends = slices.DeleteFunc(e.sends, func(s *sendJob) bool {
		if !ready(s.done, wait) {
			return false
		}
		e.sent(s)
		return true
	})
}

// ready reports whether done is closed, waiting for it when wait is set.
func ready(done chan struct{}, wait bool) bool {
	if wait {
		<-done
		return true
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// landPlan binds a plan that came back and does what the controller says
// of it.
func (e *Engine) landPlan(ctx context.Context, j *planJob, r *Result) {
	var pol *policy
	if j.err == nil {
		pol = e.bind(j.snap, j.res, j.req.Key)
	}
	l := e.ctl.Landed(j.req, controller.Result{Err: j.err})
	if l.Retry != nil {
		e.startPlan(ctx, *l.Retry, j.snap, false)
		return
	}
	e.tm.planned(pol, j.res)
	r.Plan = j.res
	if l.Failed {
		r.PlanError = j.err
		e.stats.Infeasible++
		e.cfg.logger.Debug("chameleon: no policy", "iteration", r.Index, "err", j.err)
	} else {
		// Times measured while forced evictions shared the device with
		// the kernels: planned again once it runs without them.
		pol.disturbed = j.res.Measured && j.snap.evictions > 0
		for _, k := range l.Uncache {
			e.cache.drop(k)
		}
		e.cache.put(pol)
		r.Planned = true
		if l.Tightened {
			e.stats.Tightened++ // not a replan: the same sequence, placed
		} else {
			e.stats.Replans++
		}
		e.applyLanded(pol, l)
	}
	if j.req.Exchange {
		e.shareOutcome(pol, j.err)
	}
}

// applyLanded puts a policy that came back in force, when its sequence is
// still the one running.
func (e *Engine) applyLanded(p *policy, l controller.Landing) {
	if !l.Apply {
		return
	}
	e.setPolicy(p)
	if l.AdoptPlanned {
		e.det.Adopt()
	}
}

// setPolicy puts p in force (nil: none).
func (e *Engine) setPolicy(p *policy) {
	if p != nil && p.id == 0 {
		e.policies++
		p.id = e.policies
	}
	e.policy = p
}

// waitWork waits for the worker's jobs (Close).
func (e *Engine) waitWork() {
	e.stop()
	e.workers.Wait()
	e.job, e.sends = nil, nil
}

// planWorker runs the controller's plan requests and rank 0's broadcasts
// on goroutines of their own, canceled by Close.
type planWorker struct {
	// job is the plan in flight on the worker (nil: none), sends rank 0's
	// broadcasts in flight; work is canceled by Close (stop), workers
	// runs them.
	job     *planJob
	sends   []*sendJob
	work    context.Context
	stop    context.CancelFunc
	workers errgroup.Group
}
