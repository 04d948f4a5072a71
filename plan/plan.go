// Package plan is the one planning path: it joins Group, Plan and Simulate
// into a pure function from a profiled iteration, what lives across its
// boundary and a memory limit to a checked policy. The Engine plans with it
// when an iteration has been profiled, the command line plans recorded
// traces with it, and the examples report its simulation: all three get
// the same swaps for the same iteration and settings.
//
// Each stage is an interface with the default implementation, set through
// options: the grouping (layer.Uniform, 32 groups per phase),
// the op time estimator (layer.Default, the H200 cost model), the planner
// (mre.Plan) and the simulator (simulate.Run).
package plan

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Grouper splits an iteration's ops into the logical layers the planner
// counts prefetch distances in.
type Grouper interface {
	Group(ops []trace.Op) []layer.Group
}

// GrouperFunc adapts a function to Grouper.
type GrouperFunc func(ops []trace.Op) []layer.Group

// Group implements Grouper.
func (f GrouperFunc) Group(ops []trace.Op) []layer.Group { return f(ops) }

// Discovered groups ops into the model's repeating blocks, merged to at
// most n per forward and backward (layer.Layers): the model's own layers.
func Discovered(n int) Grouper {
	return GrouperFunc(func(ops []trace.Op) []layer.Group { return layer.Layers(ops, n) })
}

// Uniform cuts the forward and the backward into n groups of equal op
// counts each (layer.Uniform, the paper's grouping): the default, with n
// 32. The planner counts its prefetch distance in these groups, and finer
// groups hold less memory for a prefetch: on the public traces Uniform(32)
// plans are as fast as those over the discovered layers, or faster where
// the model has few layers (llama7b-8l at 60% of its peak: 105% overhead
// against 125% over its 8 discovered layers; docs/plan.md).
func Uniform(n int) Grouper {
	return GrouperFunc(func(ops []trace.Op) []layer.Group { return layer.Uniform(ops, n) })
}

// Planner selects the swaps that keep an iteration under a limit. It gets
// the planner settings in force (WithPlanOptions, then the link) and is
// called once per limit tier (WithTiers), from the lowest, until it
// returns a policy or an error that does not wrap mre.ErrInfeasible.
type Planner interface {
	Plan(in mre.Input, opts ...mre.Option) (*mre.Policy, error)
}

// PlannerFunc adapts a function to Planner; mre.Plan is one.
type PlannerFunc func(in mre.Input, opts ...mre.Option) (*mre.Policy, error)

// Plan implements Planner.
func (f PlannerFunc) Plan(in mre.Input, opts ...mre.Option) (*mre.Policy, error) {
	return f(in, opts...)
}

// Simulator runs swaps on a virtual timeline. The default planner checks
// each of its rounds on it, and the policy is run on it once more as the
// executor issues it.
type Simulator interface {
	Simulate(in simulate.Input) (*simulate.Result, error)
}

// SimulatorFunc adapts a function to Simulator; simulate.Run is one.
type SimulatorFunc func(in simulate.Input) (*simulate.Result, error)

// Simulate implements Simulator.
func (f SimulatorFunc) Simulate(in simulate.Input) (*simulate.Result, error) { return f(in) }

// Input is what Make plans.
type Input struct {
	// Iter is the profiled iteration: its ops in order, their tensors and
	// its measured time (TimeMS; when 0, the sum of the ops' DurUS).
	Iter *trace.Iteration
	// LiveOut reports the tensors still held after the iteration's last op
	// (nil: none besides parameters and optimizer state).
	LiveOut memory.LiveOutFunc
	// Limit is the device bytes the iteration must fit in.
	Limit int64
	// Growing says the iteration's bytes are growing from one to the next
	// (a decode loop's cache): the tiers below the limit are planned for
	// even when the curve is under it, so that the policy holds as the
	// bytes grow instead of being outgrown at once.
	Growing bool
}

// Result is a checked policy and what it was planned from.
type Result struct {
	// Model is the iteration's memory model; Curve the allocated bytes
	// after each op that the plan keeps under the limit.
	Model *memory.Model
	Curve []int64
	// Groups are the logical layers; OpTimes each op's estimated time (µs).
	// Measured says the groups' times are measured ones (WithMeasured),
	// which the estimate only split among each group's ops.
	Groups   []layer.Group
	OpTimes  []float64
	Measured bool
	// PlanGroups are the logical layers the planner counted its prefetch
	// distances in: Groups, or Groups each halved (layer.Halved) where
	// that plan was kept (Make plans with both, WithOneGrouping aside).
	PlanGroups []layer.Group
	// Limit is the limit asked for; Planned the tier the policy meets.
	Limit, Planned int64
	// Policy holds the swaps and the planner's simulation of them; nil when
	// no tier could be met (Make then returns the error too).
	Policy *mre.Policy
	// Issue is when, and in which order, the executor issues each copy to
	// its in-order stream (simulate.Issue), and Exec the policy simulated
	// that way: the timeline the executor is expected to run.
	Issue *simulate.IssuePlan
	Exec  *simulate.Result
	// Layout is where the plan's blocks go in device memory (nil with
	// WithoutLayout), and Tries how often Make planned again, lower, for a
	// layout that fits; Layout.Fits says whether one did.
	Layout *Layout
	Tries  int
	// Held is, per op, the bytes Make kept free below Planned there for
	// the layout (nil: none): the policy meets Planned less Held[t] at
	// each op t.
	Held []int64
}

// Recomputes is the policy's recomputes (none when it is nil).
func (r *Result) Recomputes() []simulate.Recompute {
	if r == nil || r.Policy == nil {
		return nil
	}
	return r.Policy.Recomputes
}

// Swaps is the policy's swaps (none when it is nil).
func (r *Result) Swaps() []simulate.Swap {
	if r == nil || r.Policy == nil {
		return nil
	}
	return r.Policy.Swaps
}

// Make plans in.Iter under in.Limit: the memory model, the logical layers,
// the op time estimates, then the plan at each limit tier until one is met,
// then the simulation of the policy as the executor issues it. With the
// package's own planner and simulator it plans twice, side by side: with
// its prefetch distances counted over the logical layers and over each of
// them halved, and keeps the better plan (Result.PlanGroups; the Observer
// sees the stages of both, then StageChoose with the plan kept). The
// planner is sensitive to where layers begin: on llama7b-8l-bf16 with its
// optimizer step in the backward at a quarter of its peak (kernel times),
// the halved layers plan 288.01 ms against 299.61 ms; on llama16-bf16 so
// cut the layers as given plan faster (144.48 ms), and are kept.
// WithOneGrouping plans once. It is pure:
// no clock, no I/O, no global state; the same input and options give the
// same policy.
//
// When no tier can be met, Make returns the result so far (Policy nil) with
// the planner's error at the full limit, which wraps mre.ErrInfeasible when
// swapping cannot meet it (an *mre.InfeasibleError says where).
func Make(in Input, opts ...Option) (*Result, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if in.Limit <= 0 {
		return nil, fmt.Errorf("plan: limit %d bytes: want a positive limit", in.Limit)
	}
	r, err := prepare(cfg, in)
	if err != nil {
		return nil, err
	}
	// The ops that may run again, asked of the host once for both plans.
	flags := sync.OnceValues(func() ([]bool, error) {
		if cfg.recompute == nil {
			return nil, nil
		}
		ok := cfg.recompute(in.Iter)
		if len(ok) != len(in.Iter.Ops) {
			return nil, fmt.Errorf("plan: recomputable flags for %d ops, want %d", len(ok), len(in.Iter.Ops))
		}
		return ok, nil
	})
	finer := layer.Halved(r.Groups)
	if !cfg.ownStages || cfg.oneGrouping || len(finer) == len(r.Groups) {
		return r, r.planWith(cfg, in, r.Groups, flags)
	}
	// The plan over the logical layers and the plan over each of them
	// halved, side by side; the better is kept.
	a, b := *r, *r
	var errA, errB error
	var g sync.WaitGroup
	g.Go(func() { errB = b.planWith(cfg, in, finer, flags) })
	errA = a.planWith(cfg, in, r.Groups, flags)
	g.Wait()
	done := cfg.observe(StageChoose)
	*r, err = a, errA
	if errB == nil && (errA != nil || better(&b, &a)) {
		*r, err = b, nil
	}
	done(r, err)
	return r, err
}

// planWith plans r (prepared) with the planner's triggers counted in groups
// (Result.PlanGroups): the tiers, the simulation, the layout and the
// moves, with the ops flags says may run again. It sets r's policy, or
// clears it and returns the error.
func (r *Result) planWith(cfg config, in Input, groups []layer.Group, flags func() ([]bool, error)) error {
	r.PlanGroups = groups
	done := cfg.observe(StagePlan)
	popts := append(append([]mre.Option{mre.WithSimulator(cfg.sim.Simulate)}, cfg.planOpts...), mre.WithLink(cfg.link))
	// The package's planner moves the copies that still wait (mre.Retime)
	// once the layout is known, not in every plan it makes: moved, the
	// blocks live longer and may fit pages worse. The plans the layout
	// makes are judged moved (fit's rt), and the plan kept is moved once
	// more at the end.
	retimeLater := cfg.ownStages && !cfg.noLayout
	retimeOpts := popts
	if retimeLater {
		popts = append(slices.Clone(popts), mre.WithoutRetime())
	}
	recomputable, err := flags()
	if err != nil {
		done(r, err)
		return err
	}
	tiers := cfg.tiers
	if slices.Max(r.Curve) <= in.Limit && !in.Growing {
		// Nothing to move: headroom below the limit would only cost swaps.
		tiers = []int{100}
	}
	// planAt plans for limit less held[t] bytes at each op t (held nil:
	// the limit alone), as the planner's curve raised by held.
	planAt := func(limit int64, held []int64) (*mre.Policy, error) {
		if err := cfg.canceled(); err != nil {
			return nil, fmt.Errorf("plan: limit %d bytes: %w", limit, err)
		}
		pol, err := cfg.planner.Plan(mre.Input{Model: r.Model, Curve: raised(r.Curve, held), OpTimes: r.OpTimes, Groups: r.PlanGroups, Limit: limit,
			Recomputable: recomputable}, popts...)
		if err == nil && pol != nil && held != nil {
			pol.Curve = r.Curve // the curve the plan keeps, not the one raised by held
		}
		if err == nil && pol != nil {
			err = checkHost(in.Iter, pol.Swaps, cfg.hostLimit)
		}
		if err == nil && (pol == nil || pol.Sim == nil) {
			err = errors.New("plan: the planner returned no simulated policy")
		}
		if err != nil {
			return nil, fmt.Errorf("plan: limit %d bytes: %w", limit, err)
		}
		return pol, nil
	}
	for _, pct := range tiers {
		limit := in.Limit/100*int64(pct) + in.Limit%100*int64(pct)/100 // in.Limit*pct/100 without overflow
		r.Policy, err = planAt(limit, nil)
		if err == nil {
			r.Planned = limit
			break
		}
		if !errors.Is(err, mre.ErrInfeasible) {
			break
		}
	}
	if err != nil {
		r.Policy, r.Planned = nil, 0
	}
	done(r, err)
	if err == nil {
		err = r.simulate(cfg, true)
	}
	if err == nil && !cfg.noLayout {
		var rt func(*Result) error
		if retimeLater {
			rt = func(x *Result) error { return x.retime(cfg, in.Limit, recomputable, retimeOpts) }
		}
		err = r.fit(cfg, in.Limit, planAt, rt)
	}
	if err == nil && retimeLater {
		err = r.retime(cfg, in.Limit, recomputable, retimeOpts)
	}
	if err != nil {
		r.Policy, r.Planned, r.Issue, r.Exec = nil, 0, nil, nil
	}
	return err
}

// simulate runs r's policy as the executor issues it (r.Issue, r.Exec);
// observed, as StageSimulate.
func (r *Result) simulate(cfg config, observed bool) error {
	done := func(*Result, error) {}
	if observed {
		done = cfg.observe(StageSimulate)
	}
	r.Issue = simulate.Issue(r.Policy.Swaps, r.Policy.Sim)
	var err error
	r.Exec, err = cfg.sim.Simulate(simulate.Input{OpTimes: r.OpTimes, Curve: r.Curve, Swaps: r.Policy.Swaps,
		Recomputes: r.Policy.Recomputes, Link: cfg.link, Issue: r.Issue})
	if err != nil {
		err = fmt.Errorf("plan: simulate the executor's order: %w", err)
	}
	done(r, err)
	return err
}

// fit lays r's plan out (Layout) and, while its blocks need more memory
// than the budget, plans again until they fit, two ways: for less where
// they do not fit (fitOps) and for less everywhere (fitLower). It keeps
// the plan that fits and runs fastest (the first only when faster by more
// than a heldEdge-th) or, when none fits, the one that needs the least
// over the budget, which the executor still runs, with what does not fit
// served by its allocator's best fit.
//
// rt (nil: none) moves a plan's copies where memory has room and lays it
// out again, keeping the move where that is faster and fits (Result.retime).
// Each plan the two ways make is judged moved: a plan whose blocks do not
// fit as planned may fit once moved, and moved ones are what the two ways
// compare. On llama7b-8l-bf16 at a quarter of its peak with the optimizer
// step in the backward (kernel times), the plan at 85% of the limit needs
// 1,711 pages of 4 MiB as planned, 1,563 moved, of the limit's 1,608; the
// plan kept simulates 299.61 ms against 306.59 ms when only the plan kept
// was moved.
func (r *Result) fit(cfg config, limit int64, planAt func(int64, []int64) (*mre.Policy, error), rt func(*Result) error) error {
	page, budget := cfg.pages(limit)
	done := cfg.observe(StageLayout)
	r.Layout = LayOut(r, page, budget)
	if r.Layout.Fits() {
		done(r, nil)
		return nil
	}
	// The two ways from the same first plan, each on a copy of it: at
	// once when the planner and the simulator are the package's own
	// (safe to run side by side), else one after the other.
	var best, lower Result
	var errOps, errLower error
	a, b := *r, *r
	ops := func() { best, errOps = a.fitOps(cfg, page, budget, planAt, rt) }
	low := func() { lower, errLower = b.fitLower(cfg, page, budget, planAt, rt) }
	if cfg.ownStages {
		var g sync.WaitGroup
		g.Go(ops)
		low()
		g.Wait()
	} else {
		ops()
		low()
	}
	if err := cmp.Or(errOps, errLower); err != nil {
		done(r, err)
		return err
	}
	tries := best.Tries + lower.Tries
	if better(&lower, &best) || lower.Layout.Fits() && best.Layout.Fits() &&
		lower.Exec.IterationUS <= best.Exec.IterationUS*(1+1.0/heldEdge) {
		best = lower
	}
	*r = best
	r.Tries = tries
	done(r, nil)
	return nil
}

// raised is curve raised by held at each op (held nil: curve itself).
func raised(curve, held []int64) []int64 {
	if held == nil {
		return curve
	}
	out := slices.Clone(curve)
	for t := range out {
		out[t] += held[t]
	}
	return out
}

// pages is the page and the budget the layout of a plan under limit
// counts in: cfg's, else CUDA's granule to its largest page for the
// budget (device/cuda) and the limit.
func (cfg config) pages(limit int64) (page, budget int64) {
	budget = cmp.Or(cfg.budget, limit)
	page = cfg.page
	if page < 0 {
		page = device.PageFor(budget, 2<<20, 16<<20)
	}
	return page, budget
}

// retime moves the copies of r's plan that still make compute wait where
// the memory under the limit r was planned for, less what it held back,
// has room (mre.Retime), and keeps the moved plan if its blocks fit as
// well as r's do (fit, or no more over the budget) and the executor's
// order runs it faster.
func (r *Result) retime(cfg config, limit int64, recomputable []bool, popts []mre.Option) error {
	if r.Policy == nil || r.Layout == nil {
		return nil
	}
	pol := mre.Retime(mre.Input{Model: r.Model, Curve: raised(r.Curve, r.Held), OpTimes: r.OpTimes, Groups: r.PlanGroups, Limit: r.Planned,
		Recomputable: recomputable}, r.Policy, popts...)
	if pol == r.Policy {
		return nil
	}
	next := *r
	next.Policy = pol
	if err := next.simulate(cfg, false); err != nil {
		return err
	}
	page, budget := cfg.pages(limit)
	next.Layout = LayOut(&next, page, budget)
	fits := next.Layout.Fits() || !r.Layout.Fits() && next.Layout.Over() <= r.Layout.Over()
	if fits && next.Exec.IterationUS < r.Exec.IterationUS {
		*r = next
	}
	return nil
}

// heldEdge: where both plans fit, the plan made for less where the blocks
// did not fit (fitOps) must simulate faster than the plan made lower
// everywhere (fitLower) by more than a heldEdge-th to be kept. Its blocks
// fill the limit where the other leaves room at every op, and room is what
// absorbs a copy finishing later than simulated: on the H200 (0db9749),
// llama16-bf16 at 45% with recompute ran 150.0 ms under the held plan,
// simulated 135.5 ms, and 139.2 ms under the lower one, simulated 135.7 ms.
const heldEdge = 16

// fitOps plans again for less where the layout needs more than the budget:
// at each op, the bytes of the blocks then in use that lie above the
// budget, at most what the layout needs over it, are held back from the
// limit there (Result.Held), added to what earlier tries held, for up to
// 2*layoutTries plans. What a fragmented layout needs beyond the budget
// differs from op to op: on llama16-bf16 at a quarter of its peak, a plan
// whose layout fits this way simulates 216.5 ms against 383.7 ms for the
// limit lowered at every op (kernel times). Where a try holds back more
// than the planner can meet, it holds back nothing more over the ops
// around the op the planner names, four times as many ops each time. It
// returns the fastest plan that fits, else the one the least over, each
// judged moved by rt where the moved one fits (movedIfFits; the tries go
// on from the plans as made).
func (r *Result) fitOps(cfg config, page, budget int64, planAt func(int64, []int64) (*mre.Policy, error), rt func(*Result) error) (Result, error) {
	n := len(r.Curve)
	best := *r
	if n == 0 {
		return best, nil
	}
	held := make([]int64, n)
	prev := int64(-1)
	for try := 1; try < 2*layoutTries && !r.Layout.Fits(); try++ {
		over, top := r.Layout.Over(), r.Layout.Top()
		// A try that left the layout as far over as the one before held
		// back too little to change the plan (a few bytes above the
		// budget where a whole page is over): hold back a page more
		// where blocks lie above, at each such try.
		stuck := prev >= 0 && over >= prev
		prev = over
		// The bytes above the budget's whole pages in use at each op:
		// added where a block's life begins, taken where it ends, summed
		// over the ops.
		above := make([]int64, n+1)
		for _, b := range r.Layout.Blocks {
			if b.Off < 0 || b.Off+b.Size <= top {
				continue
			}
			hi := b.Off + b.Size - max(b.Off, top)
			for _, v := range b.Life.IV[:b.Life.N] {
				if from, to := min(int(v.From), n), min(int(v.To), n); from < to {
					above[from] += hi
					above[to] -= hi
				}
			}
		}
		for t := 1; t < n; t++ {
			above[t] += above[t-1]
		}
		above = above[:n]
		if slices.Max(above) == 0 {
			break // blocks with no place at all (Unplaced): nothing to hold back where
		}
		var pol *mre.Policy
		var err error
		next := slices.Clone(held)
		for t, a := range above {
			if stuck && a > 0 {
				a = max(a, max(page, 1))
			}
			next[t] += min(a, over)
		}
		for w := 16; ; w *= 4 {
			pol, err = planAt(r.Planned, next)
			var ie *mre.InfeasibleError
			if !errors.As(err, &ie) || ie.Op < 0 || ie.Op >= n || next[ie.Op] == held[ie.Op] || w > 4*n {
				break
			}
			// Where the planner cannot hold that much back (the step's
			// end, where parameters, gradients and state all live), hold
			// back nothing more over the ops around it, more of them each
			// time.
			lo, hi := max(ie.Op-w, 0), min(ie.Op+w+1, n)
			copy(next[lo:hi], held[lo:hi])
		}
		if errors.Is(err, mre.ErrInfeasible) {
			break
		}
		if err != nil {
			return best, err
		}
		held = next
		r.Policy, r.Held, r.Tries = pol, held, try
		if err := r.simulate(cfg, false); err != nil {
			return best, err
		}
		r.Layout = LayOut(r, page, budget)
		cand := *r
		if err := movedIfFits(&cand, rt); err != nil {
			return best, err
		}
		if better(&cand, &best) {
			best = cand
		}
	}
	best.Tries = r.Tries
	return best, nil
}

// movedIfFits makes r the plan rt moves it to where that plan's blocks fit
// (rt keeps a move only where it runs faster); otherwise r stays as
// planned, so that where no plan fits the tries compare by what they need
// as planned (rt nil: no move).
func movedIfFits(r *Result, rt func(*Result) error) error {
	if rt == nil {
		return nil
	}
	c := *r
	if err := rt(&c); err != nil {
		return err
	}
	if c.Layout.Fits() {
		*r = c
	}
	return nil
}

// better reports whether x is a better plan than y: it fits where y does
// not, runs faster where both fit (or where either is not laid out),
// needs less over the budget where neither does.
func better(x, y *Result) bool {
	if x.Layout == nil || y.Layout == nil {
		return x.Exec.IterationUS < y.Exec.IterationUS
	}
	switch xf, yf := x.Layout.Fits(), y.Layout.Fits(); {
	case xf != yf:
		return xf
	case xf:
		return x.Exec.IterationUS < y.Exec.IterationUS
	default:
		return x.Layout.Over() < y.Layout.Over()
	}
}

// fitLower plans again for a lower limit at every op: first lower by what
// the blocks need over the budget (at least a two-hundredth of it), then,
// once one limit fits and a higher one does not, halfway between them,
// until they are a two-hundredth of the budget apart or layoutTries plans
// have been made. A limit the planner cannot meet counts as one that does
// not fit from below. Each plan is moved by rt first where the moved one
// fits (movedIfFits). It returns the fastest plan that fits (moved, a
// lower limit can run faster than a higher one) or, when none does, the
// one that needs the least over the budget.
func (r *Result) fitLower(cfg config, page, budget int64, planAt func(int64, []int64) (*mre.Policy, error), rt func(*Result) error) (Result, error) {
	best := *r
	step := budget / 200
	hi, lo, floor := r.Planned, int64(-1), budget/4 // hi does not fit, lo does, floor cannot be met
	for try := 1; try < layoutTries && (!best.Layout.Fits() || lo >= 0 && hi-lo > step); try++ {
		next := hi - max(r.Layout.Over(), step)
		if lo >= 0 {
			next = lo + (hi-lo)/2
		}
		if next <= floor {
			next = floor + (hi-floor)/2
		}
		if hi-next < step/2 {
			break
		}
		pol, err := planAt(next, nil)
		if errors.Is(err, mre.ErrInfeasible) {
			floor = next
			continue
		}
		if err != nil {
			return best, err
		}
		r.Policy, r.Planned, r.Tries = pol, next, try
		if err := r.simulate(cfg, false); err != nil {
			return best, err
		}
		r.Layout = LayOut(r, page, budget)
		if err := movedIfFits(r, rt); err != nil {
			return best, err
		}
		switch {
		case r.Layout.Fits():
			lo = next
			if !best.Layout.Fits() || r.Exec.IterationUS < best.Exec.IterationUS {
				best = *r
			}
		case best.Layout.Fits():
			hi = next
		default:
			hi = next
			if r.Layout.Over() < best.Layout.Over() {
				best = *r
			}
		}
	}
	best.Tries = r.Tries
	return best, nil
}

// Stage names a step of Make for an Observer.
type Stage string

// The stages Make runs, in order.
const (
	// StageGroup builds the memory model, the logical layers and the op
	// time estimates.
	StageGroup Stage = "group"
	// StagePlan selects the swaps, tier by tier.
	StagePlan Stage = "plan"
	// StageSimulate runs the policy as the executor issues it.
	StageSimulate Stage = "simulate"
	// StageLayout lays the plan's blocks out in device memory, and plans
	// again for less while they do not fit.
	StageLayout Stage = "layout"
	// StageChoose keeps the better of the two plans Make makes side by
	// side (Result.PlanGroups says which); it follows the other stages of
	// both, and is not run when Make plans once.
	StageChoose Stage = "choose"
)

// Observer is told when each stage of Make starts; the function it returns
// is called when the stage ends, with the result so far and the stage's
// error. The Engine makes its OpenTelemetry spans from it. It must not
// change the result. Where Make plans twice, the stages from StagePlan to
// StageLayout run for both plans at once, each told with its own result
// (Result.PlanGroups), so an Observer may be called from two goroutines.
type Observer func(s Stage) (end func(r *Result, err error))

// Prepare runs the Group stage alone: the memory model, the curve, the
// logical layers and the op time estimates that Make plans from (in.Limit
// is not used). The profile command reports them.
func Prepare(in Input, opts ...Option) (*Result, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return prepare(cfg, in)
}

func prepare(cfg config, in Input) (*Result, error) {
	it := in.Iter
	if it == nil || len(it.Ops) == 0 {
		return nil, errors.New("plan: an iteration with no ops")
	}
	r := &Result{Limit: in.Limit}
	done := cfg.observe(StageGroup)
	r.Model = memory.Build(it, in.LiveOut)
	r.Curve = r.Model.Curve
	if cfg.recorded && it.HasMem() {
		r.Curve = mre.Input{Model: r.Model}.ResolveCurve()
	}
	r.Groups = cfg.grouper.Group(it.Ops)
	r.OpTimes = cfg.estimator.Estimate(timed(it))
	var err error
	if len(r.OpTimes) != len(it.Ops) {
		err = fmt.Errorf("plan: the estimator gave %d op times for %d ops", len(r.OpTimes), len(it.Ops))
	} else if cfg.measured != nil {
		r.OpTimes, err = splitMeasured(r.OpTimes, cfg.measured, r.Groups)
		r.Measured = err == nil
	}
	done(r, err)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// timed returns it, or a shallow copy whose TimeMS is the sum of its ops'
// instrumented durations when it has no measured time of its own.
func timed(it *trace.Iteration) *trace.Iteration {
	if it.TimeMS > 0 {
		return it
	}
	var sum float64
	for i := range it.Ops {
		sum += it.Ops[i].DurUS
	}
	c := *it
	c.TimeMS = sum / 1000
	return &c
}
