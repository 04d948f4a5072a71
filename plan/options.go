package plan

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Option configures Make; nil options are ignored.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// DefaultGroups is the most logical layers per forward and backward the
// default grouping makes.
const DefaultGroups = 32

// DefaultTiers are the shares of the limit, in percent, planned for in
// turn: the limit alone. The room a plan leaves its allocator comes from
// its layout (WithLayout), which measures it, not from a fixed share.
var DefaultTiers = []int{100}

// layoutTries bounds how often Make plans again, lower, for a layout that
// needs more memory than the limit.
const layoutTries = 6

type config struct {
	grouper   Grouper
	estimator layer.Estimator
	planner   Planner
	sim       Simulator
	link      simulate.Link
	planOpts  []mre.Option
	tiers     []int
	recorded  bool
	observer  Observer
	recompute func(it *trace.Iteration) []bool
	hostLimit int64 // WithHostLimit; 0: none
	// ownStages: the planner and the simulator are the package's own
	// (no WithPlanner, no WithSimulator), which may run side by side.
	ownStages bool
	// WithLayout: the page memory is mapped in (0: one range; -1: the
	// CUDA page for the budget, device.PageFor) and the bytes the layout
	// must fit (0: the limit); noLayout turns it off.
	page, budget int64
	noLayout     bool
	// oneGrouping: plan over the grouper's logical layers alone
	// (WithOneGrouping), not also over each of them halved.
	oneGrouping bool
	measured    []float64 // per op, µs (WithMeasured)
	// cancel, when set, stops planning between plans (WithCancel).
	cancel context.Context
}

// canceled is why planning stops early: the context of WithCancel is done.
func (c config) canceled() error {
	if c.cancel == nil {
		return nil
	}
	return context.Cause(c.cancel)
}

func (c config) observe(s Stage) func(*Result, error) {
	if c.observer == nil {
		return func(*Result, error) {}
	}
	return c.observer(s)
}

func newConfig(opts []Option) (config, error) {
	c := config{
		grouper:   Uniform(DefaultGroups),
		estimator: layer.Default(),
		planner:   PlannerFunc(mre.Plan),
		sim:       SimulatorFunc(simulate.Run),
		link:      simulate.H200(),
		tiers:     DefaultTiers,
		page:      -1,
		ownStages: true,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c, c.validate()
}

func (c config) validate() error {
	if err := mre.Validate(slices.Concat(c.planOpts, []mre.Option{mre.WithLink(c.link)})...); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	if c.hostLimit < 0 {
		return fmt.Errorf("plan: host limit %d bytes: negative", c.hostLimit)
	}
	if c.page < -1 || (c.page > 0 && c.page&(c.page-1) != 0) || c.budget < 0 {
		return fmt.Errorf("plan: layout in pages of %d bytes, budget %d: want a power of two (0: no pages) and a budget of 0 or more", c.page, c.budget)
	}
	if len(c.tiers) == 0 {
		return errors.New("plan: no limit tiers")
	}
	for i, t := range c.tiers {
		if t < 1 || t > 100 || (i > 0 && t <= c.tiers[i-1]) {
			return fmt.Errorf("plan: limit tiers %v: want increasing percentages in [1, 100]", c.tiers)
		}
	}
	return nil
}

// Validate reports the first of opts that Make would refuse, so a caller
// (the Engine's New) can refuse bad settings before it has anything to plan.
func Validate(opts ...Option) error {
	_, err := newConfig(opts)
	return err
}

// WithGrouper sets the logical-layer grouping (default Uniform(32), see
// Uniform).
func WithGrouper(g Grouper) Option {
	return optionFunc(func(c *config) {
		if g != nil {
			c.grouper = g
		}
	})
}

// WithEstimator sets the op time estimator (default layer.Default, the
// H200 cost model scaled to the iteration's time).
func WithEstimator(e layer.Estimator) Option {
	return optionFunc(func(c *config) {
		if e != nil {
			c.estimator = e
		}
	})
}

// WithPlanner replaces the Plan stage (default mre.Plan). The memory
// model, grouping, estimates, tiers and the final simulation stay.
func WithPlanner(p Planner) Option {
	return optionFunc(func(c *config) {
		if p != nil {
			c.planner, c.ownStages = p, false
		}
	})
}

// WithSimulator replaces the Simulate stage (default simulate.Run), both in
// the default planner's rounds and in the final check.
func WithSimulator(s Simulator) Option {
	return optionFunc(func(c *config) {
		if s != nil {
			c.sim, c.ownStages = s, false
		}
	})
}

// WithLink sets the host link the planner and the simulator model
// (default simulate.H200()). It overrides an mre.WithLink among the plan
// options, so the plan and its check see one link.
func WithLink(l simulate.Link) Option { return optionFunc(func(c *config) { c.link = l }) }

// WithPlanOptions passes settings to the planner (mre.WithScoreWeight,
// mre.WithPrefetchLayers, mre.WithMinBytes, mre.WithSafetyMargin); they
// are validated by Make and Validate. Repeated, the lists add up.
func WithPlanOptions(opts ...mre.Option) Option {
	return optionFunc(func(c *config) { c.planOpts = append(c.planOpts, opts...) })
}

// WithLayout sets what Make lays the plan's blocks out in (Layout): memory
// mapped page bytes at a time (0: one range of memory, no pages), budget
// bytes of it (0: the limit). The default is the page CUDA maps for a
// budget of the limit (device.PageFor: 2 to 16 MiB) and the limit: the
// H200's, as the link's default is. The Engine sets its allocator's.
func WithLayout(page, budget int64) Option {
	return optionFunc(func(c *config) { c.page, c.budget, c.noLayout = page, budget, false })
}

// WithoutLayout plans for the byte count alone: the plan's blocks are not
// laid out, and nothing says they fit the limit as blocks.
func WithoutLayout() Option { return optionFunc(func(c *config) { c.noLayout = true }) }

// WithOneGrouping plans over the grouper's logical layers alone. By
// default, with the package's own planner and simulator, Make also plans
// over each of them halved (layer.Halved), side by side, and keeps the
// better plan (Result.PlanGroups says which): the planner counts its
// prefetch distance in these layers, and neither the finer nor the
// coarser count is the faster on every trace and limit.
func WithOneGrouping() Option { return optionFunc(func(c *config) { c.oneGrouping = true }) }

// WithTiers sets the shares of the limit, in percent and increasing,
// planned for in turn (default DefaultTiers: the limit alone), each then
// laid out (WithLayout). Lower tiers are an escape hatch: WithTiers(100)
// plans for the limit alone.
func WithTiers(pcts ...int) Option { return optionFunc(func(c *config) { c.tiers = pcts }) }

// WithRecordedCurve plans against the iteration's recorded allocated-bytes
// curve (op.Mem, torch.cuda.memory_allocated in a PyTorch trace) where it
// has one, instead of the memory model's curve. The command line uses it on
// recorded traces, whose curve is the ground truth; the Engine plans what
// its own allocator will hold, the model's curve.
func WithRecordedCurve() Option { return optionFunc(func(c *config) { c.recorded = true }) }

// WithObserver sets a function told of each stage as it starts and ends
// (default none).
func WithObserver(o Observer) Option { return optionFunc(func(c *config) { c.observer = o }) }

// WithCancel stops Make between the plans it tries once ctx is done, with
// ctx's error: an Engine closing while a plan runs on its worker. The
// result is the same as without it while ctx is not done.
func WithCancel(ctx context.Context) Option { return optionFunc(func(c *config) { c.cancel = ctx }) }

// WithRecompute lets the planner drop tensors and make them again by
// running their producing op once more, where ok marks the op (per op of
// the iteration) as safe to run again: mre.Recomputable for a recorded
// trace, the ops its host can run again for the Engine. Default: swaps only.
func WithRecompute(ok func(it *trace.Iteration) []bool) Option {
	return optionFunc(func(c *config) { c.recompute = ok })
}

// WithHostLimit caps the pinned host memory a policy's swaps may hold at
// once (HostCurve), in bytes: a tier whose policy holds more is refused as
// infeasible (a HostLimitError) and the next tier is tried. 0, the
// default, is no cap; a negative cap is refused.
func WithHostLimit(bytes int64) Option {
	return optionFunc(func(c *config) { c.hostLimit = bytes })
}
