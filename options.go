package chameleon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/simulate"
)

// Option configures an Engine. Options are applied after the defaults and
// the environment (CHAMELEON_DEBUG); nil options are ignored; New validates
// the result and refuses what cannot work.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	limit   int64
	noPlace bool
	// evictor is WithEvictor's (nil: the allocator's window).
	evictor Evictor
	// device is WithDevice's (Open).
	device device.Device
	// syncPlanning: End waits for the plans it starts (WithSyncPlanning).
	syncPlanning bool
	detect       seq.Config
	detector     Detector
	match        match.Config
	groups       int
	linkBW       float64
	linkSet      bool
	planOpts     []plan.Option // stages replaced, in the order given
	mreOpts      []mre.Option
	planning     []plan.Option // all of the planning path's settings, made by New
	logger       *slog.Logger
	tp           trace.TracerProvider
	clock        func() time.Time
	hostReserve  int64
	staleMatch   float64
	evictLog     *slog.Logger
	layoutLog    *slog.Logger
	policyFile   string
	// strictPolicy: a damaged policy file fails New
	strictPolicy bool
	ranks        rankConfig // WithRank, WithHostBudget
	timing       timingConfig
}

func defaultConfig() config {
	return config{
		detect:       seq.DefaultConfig(),
		match:        engineMatch(),
		groups:       plan.DefaultGroups,
		logger:       slog.New(slog.DiscardHandler),
		syncPlanning: syncByDefault,
		tp:           noop.NewTracerProvider(),
		clock:        time.Now,
		staleMatch:   0.5,
		timing:       defaultTiming(),
	}
}

// engineMatch is the paper's weights with a threshold of 0.55 instead of
// 0.85. The paper's threshold makes the device address mandatory, but the
// Engine's own swaps move tensors: after the first swapped iteration the
// addresses of a static model no longer repeat, and nothing would match;
// and a mixture of experts routes another number of tokens to each expert
// every step, so an expert's tensors change shape too. 0.55 with the call
// site required (Site) asks for the call site with its ordinal and the
// producer to agree (0.6); the address and the shape may move, but never
// outvote the site (a checkpointed model's forward and backward trips of
// one call site often share an address). On the recorded traces that is 98.8-100% precise
// (docs/match.md). A wrong match costs only time: a swapped tensor is
// always brought back before its use.
func engineMatch() match.Config {
	c := match.DefaultConfig()
	c.Threshold, c.Site = 0.55, true
	return c
}

// fromEnv reads CHAMELEON_DEBUG, a comma-separated list of topics:
// seqchange (each iteration's sequence hash and why a change was declared),
// evict (each forced swap-out and the allocator's state) and layout (each
// block served away from its place in the policy's layout, with what holds
// that place).
func (c *config) fromEnv() {
	env := os.Getenv("CHAMELEON_DEBUG")
	debug := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if seq.DebugEnabled(env, "seqchange") {
		c.detect.Logger = debug
	}
	if seq.DebugEnabled(env, "evict") {
		c.evictLog = debug
	}
	if seq.DebugEnabled(env, "layout") {
		c.layoutLog = debug
	}
}

// planPath is the settings of the planning path: the grouping and the link
// first, then what the options gave, in their order.
func (c *config) planPath() []plan.Option {
	opts := []plan.Option{plan.WithGrouper(plan.Uniform(c.groups))}
	if c.linkSet {
		opts = append(opts, plan.WithLink(simulate.H200().Scaled(c.linkBW)))
	}
	opts = append(opts, c.hostPlan()...)
	return append(append(opts, c.planOpts...), plan.WithPlanOptions(c.mreOpts...))
}

// maxLimit is the largest memory limit New takes: 1 PiB, far above any
// device, and far from the rounding that would overflow an int64.
const maxLimit = 1 << 50

func (c *config) validate() error {
	if c.limit <= 0 {
		return errors.New("chameleon: a memory limit is required (WithMemoryLimit)")
	}
	if c.limit > maxLimit {
		return fmt.Errorf("chameleon: WithMemoryLimit(%d): more than the %d bytes (1 PiB) any device holds", c.limit, int64(maxLimit))
	}
	if err := c.detect.Validate(); err != nil {
		return fmt.Errorf("chameleon: WithDetection: %w", err)
	}
	if c.match.Threshold <= 0 || c.match.Threshold > 1 {
		return fmt.Errorf("chameleon: WithMatching: threshold %g outside (0, 1]", c.match.Threshold)
	}
	if c.match.Ptr < 0 || c.match.Stack < 0 || c.match.Producer < 0 || c.match.Shape < 0 {
		return fmt.Errorf("chameleon: WithMatching: negative weight in %+v", c.match)
	}
	if c.groups < 1 {
		return fmt.Errorf("chameleon: WithGroups(%d): want at least 1", c.groups)
	}
	if c.linkSet && !(c.linkBW > 0) {
		return fmt.Errorf("chameleon: WithLinkBandwidth(%g): want a positive rate", c.linkBW)
	}
	if err := c.timing.validate(); err != nil {
		return err
	}
	if c.hostReserve < 0 {
		return fmt.Errorf("chameleon: WithHostReserve(%d): negative", c.hostReserve)
	}
	if err := c.validateRanks(); err != nil {
		return err
	}
	if err := plan.Validate(c.planPath()...); err != nil {
		return fmt.Errorf("chameleon: %w", err)
	}
	return nil
}

// WithMemoryLimit sets the device bytes the Engine may hold for the tensors
// it manages (required). The Engine reserves them up front, so no device
// allocation happens on the hot path.
func WithMemoryLimit(bytes int64) Option {
	return optionFunc(func(c *config) { c.limit = bytes })
}

// WithPlacement turns planned placement on or off (default on). While a
// policy runs in STABLE, every iteration asks the device allocator for the
// same blocks in the same order. Best fit online can scatter them, so
// that a step's largest find no run of free memory: on mapped pages the
// allocator then moves pages for them every step (tens of microseconds of
// driver calls a page on CUDA), on segments of memory it refuses them and
// the Engine evicts. After an iteration in which best fit did so, the
// allocator packs the step's blocks from that iteration and serves each
// at its planned address from then on (see device.Allocator.Repeat); where
// best fit does not strain it stays, since it hands out memory no copy
// still uses. Placement changes where blocks go, not what they hold.
// Stats.Placed and Stats.Missed count the blocks served at their place
// and elsewhere.
func WithPlacement(on bool) Option { return optionFunc(func(c *config) { c.noPlace = !on }) }

// WithDetection sets the change-detection thresholds and stage counts.
// Zero fields keep their defaults (seq.DefaultConfig: cosine 0.95, length
// and memory 5%, m=5, n=3), so WithDetection(seq.Config{M: 2}) changes m
// alone; a threshold of exactly 0 is not expressible (use a tiny one).
func WithDetection(d seq.Config) Option {
	return optionFunc(func(c *config) {
		def := seq.DefaultConfig()
		fill := func(v *float64, dv float64) {
			if *v == 0 {
				*v = dv
			}
		}
		fill(&d.MinSimilarity, def.MinSimilarity)
		fill(&d.MaxLengthDelta, def.MaxLengthDelta)
		fill(&d.MaxMemoryDelta, def.MaxMemoryDelta)
		if d.M == 0 {
			d.M = def.M
		}
		if d.N == 0 {
			d.N = def.N
		}
		if d.Logger == nil {
			d.Logger = c.detect.Logger
		}
		c.detect = d
	})
}

// WithDetector replaces the Detect stage (default seq.Detector over
// WithDetection's settings). The Engine still takes M and the memory
// threshold from WithDetection: they say when a recurring sequence is
// planned and when two signatures are one sequence.
func WithDetector(d Detector) Option {
	return optionFunc(func(c *config) {
		if d != nil {
			c.detector = d
		}
	})
}

// WithMatching sets the tensor-matching weights and threshold (default:
// the paper's weights, address 0.3, call stack 0.4, producer 0.2, shape 0.1,
// with threshold 0.55 and the call site required; see engineMatch for why
// not the paper's 0.85). A zero threshold keeps the default threshold and
// requirement; the weights keep theirs when all four are zero.
func WithMatching(m match.Config) Option {
	return optionFunc(func(c *config) {
		def := engineMatch()
		if m.Threshold == 0 {
			m.Threshold, m.Site = def.Threshold, def.Site
		}
		if m.Ptr == 0 && m.Stack == 0 && m.Producer == 0 && m.Shape == 0 {
			m.Ptr, m.Stack, m.Producer, m.Shape = def.Ptr, def.Stack, def.Producer, def.Shape
		}
		c.match = m
	})
}

// WithPlanOptions passes settings to the planner (mre.WithScoreWeight,
// mre.WithPrefetchLayers, mre.WithMinBytes, mre.WithSafetyMargin, with
// mre's defaults); New validates them. A replacement Planner gets them too.
func WithPlanOptions(opts ...mre.Option) Option {
	return optionFunc(func(c *config) { c.mreOpts = append(c.mreOpts, opts...) })
}

// WithScoreWeight is WithPlanOptions(mre.WithScoreWeight(w)).
func WithScoreWeight(w float64) Option { return WithPlanOptions(mre.WithScoreWeight(w)) }

// WithPrefetchLayers is WithPlanOptions(mre.WithPrefetchLayers(n)).
func WithPrefetchLayers(n int) Option { return WithPlanOptions(mre.WithPrefetchLayers(n)) }

// WithMinSwapBytes is WithPlanOptions(mre.WithMinBytes(n)).
func WithMinSwapBytes(n int64) Option { return WithPlanOptions(mre.WithMinBytes(n)) }

// AscendSafetyMargin is the safety margin on copy times the Engine plans
// with on an Ascend NPU: every modeled copy is taken as 15% longer, because
// an NPU's host link rate varies more than a GPU's. It applies when the
// device's name says "npu:" (as device/ascend names its devices), before
// the options given, so WithPlanOptions(mre.WithSafetyMargin(m)) replaces
// it (m = 0 turns it off); on other devices the margin is mre's default, 0.
const AscendSafetyMargin = 0.15

// deviceDefaults are the planning settings dev calls for, placed before the
// Engine's own so that those override them.
func deviceDefaults(dev device.Device) []plan.Option {
	if strings.Contains(dev.Name(), "npu:") {
		return []plan.Option{plan.WithPlanOptions(mre.WithSafetyMargin(AscendSafetyMargin))}
	}
	return nil
}

// WithGroups sets the logical layers per forward and backward of the
// default grouping (plan.Uniform; default plan.DefaultGroups, 32).
// WithGrouper replaces the grouping itself. The planner counts its
// prefetch distances in these layers and, planning again over each of
// them halved, keeps the better plan (plan.Make).
func WithGroups(n int) Option { return optionFunc(func(c *config) { c.groups = n }) }

// WithLinkBandwidth sets the host link's bandwidth each way, in bytes per
// second, scaling the measured H200 figures (55 GB/s alone, 48 + 51 GB/s
// together) to it, for the planner and the simulator.
func WithLinkBandwidth(bytesPerSecond float64) Option {
	return optionFunc(func(c *config) { c.linkBW, c.linkSet = bytesPerSecond, true })
}

// WithGrouper replaces the Group stage's logical layers (default
// plan.Uniform over WithGroups; plan.Discovered groups by the model's
// repeating block).
func WithGrouper(g plan.Grouper) Option { return withPlan(plan.WithGrouper(g)) }

// WithEstimator replaces the op time estimator (default layer.Default, a
// cost model calibrated on the H200).
func WithEstimator(e layer.Estimator) Option { return withPlan(plan.WithEstimator(e)) }

// WithTiers sets the shares of the limit, in percent and increasing, that
// a plan aims at in turn, the lowest that can be met winning (default
// plan.DefaultTiers: 100, the limit alone). It is an escape hatch: the
// room a plan leaves under the limit comes from its layout, which lays the
// plan's blocks out in the allocator's pages and plans again for less
// where they need more than the limit (plan.Layout), and the Engine serves every block at
// its place. Lower tiers only cost recomputes and swaps beyond that.
func WithTiers(pcts ...int) Option { return withPlan(plan.WithTiers(pcts...)) }

// WithPlanner replaces the Plan stage (plan.Planner; default mre.Plan,
// plan.PlannerFunc adapts a function) and nothing else: the memory model,
// grouping and estimates are made as usual, the planner gets the
// iteration's memory model, curve, op times, logical layers and a limit,
// with the Engine's planner settings (WithPlanOptions and the link), once
// per limit tried (WithTiers, and the layout's fit) until it returns a
// policy or an error other than mre.ErrInfeasible, and its policy is
// simulated as the executor will issue it.
func WithPlanner(p plan.Planner) Option { return withPlan(plan.WithPlanner(p)) }

// WithSimulator replaces the Simulate stage (default simulate.Run), in the
// planner's rounds and in the final check.
func WithSimulator(s plan.Simulator) Option { return withPlan(plan.WithSimulator(s)) }

func withPlan(o plan.Option) Option {
	return optionFunc(func(c *config) { c.planOpts = append(c.planOpts, o) })
}

// WithLogger sets the logger (default: discard). Debug records are written
// for each planning run and policy-cache event.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithTracerProvider sets where the Engine's OpenTelemetry spans go
// (default: a no-op provider; the library never installs an SDK).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tp = tp
		}
	})
}

// WithClock sets the clock the Engine measures iteration times with
// (default time.Now). Only Execute reads it; the planning stages get times
// as values.
func WithClock(now func() time.Time) Option {
	return optionFunc(func(c *config) {
		if now != nil {
			c.clock = now
		}
	})
}

// WithHostReserve pins this many bytes of host memory for swapped tensors
// up front (default: grown on first need during warm-up, then reused).
func WithHostReserve(bytes int64) Option {
	return optionFunc(func(c *config) { c.hostReserve = bytes })
}

// WithPolicyFile loads a policy cache written by Engine.SavePolicyFile when
// the Engine starts, so a restarted or migrated job runs STABLE from its
// second iteration on a sequence it has seen; a policy planned under
// another limit, link or device is updated to this Engine's first
// (Stats.PolicyUpdates). A missing file is a first run: the Engine starts
// with an empty cache. A damaged or foreign file is not used: the Engine
// warns through its logger (WithLogger), says why in PolicyFileError and
// starts without it, unless WithStrictPolicyFile makes it an error from
// New. The host saves the cache with Engine.SavePolicyFile.
func WithPolicyFile(path string) Option { return optionFunc(func(c *config) { c.policyFile = path }) }

// WithStrictPolicyFile makes a damaged or foreign file of WithPolicyFile
// an error from New (default: a warning, and the Engine starts without
// it). A missing file is still a first run.
func WithStrictPolicyFile() Option { return optionFunc(func(c *config) { c.strictPolicy = true }) }

// WithMeasuredTimes turns the Engine's timing events on (the default) or
// off. Off, plans take the estimator's times and the configured link, and
// nothing is sampled in STABLE. The events time the device's spans between
// layer boundaries: where the host cannot queue kernels as fast as the
// device runs them (small kernels, a host-bound step), a span holds the
// device's idle time too and overstates the layer. A host that knows its
// kernels' times (a kernel-times file: replay does so) plans better with
// them and the events off.
func WithMeasuredTimes(on bool) Option { return optionFunc(func(c *config) { c.timing.off = !on }) }

// WithTimingEvery sets how often, in iterations under a policy, the Engine
// samples its logical layers' times: the first iteration under a new
// policy, then every n-th (default DefaultTimingEvery; 0: never).
func WithTimingEvery(n int) Option { return optionFunc(func(c *config) { c.timing.every = n }) }

// WithDriftThreshold sets the relative change of a logical layer's time,
// against the time its policy was planned with, that makes the Engine plan
// again when two samples in a row show it (default DefaultDriftThreshold).
// Changes under 20 µs are not counted.
func WithDriftThreshold(f float64) Option { return optionFunc(func(c *config) { c.timing.drift = f }) }

// WithDevice is the device Open runs the Engine over (default: the first
// accelerator whose runtime loads). The caller keeps it: Close does not
// close it.
func WithDevice(dev device.Device) Option { return optionFunc(func(c *config) { c.device = dev }) }

// syncByDefault is WithSyncPlanning's default: off, set by the package's
// tests (export_test.go) so that each runs the same whatever the machine's
// speed; the tests of planning off the step turn it off again.
var syncByDefault = false

// WithEvictor replaces the choice of the tensors an allocation that does
// not fit swaps out (default: the allocator's cheapest window, Evictor's
// window): a forced-eviction heuristic of the host's own.
func WithEvictor(ev Evictor) Option { return optionFunc(func(c *config) { c.evictor = ev }) }

// WithSyncPlanning makes End wait for the plan it starts, and for rank 0's
// broadcast, so that each policy applies from the iteration right after
// its profile, whatever the machine's speed: reproducible, as a replay or
// a test needs. The training step then waits for each plan (30-300 ms on
// the traces of docs/plan.md). Default: off; plans run on the Engine's
// worker while iterations go on, and a policy applies from the first
// iteration whose End finds it ready, when its sequence is still the one
// running.
func WithSyncPlanning(on bool) Option { return optionFunc(func(c *config) { c.syncPlanning = on }) }
