package main

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/examples/internal/backend"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// DefaultLR is a learning rate that trains the residual MLP stably at a
// given width: 0.02 up to width 64, then shrinking as 1/width. The update a
// step makes to a block's output grows with the width it sums over; at
// width 512, 0.02 already oscillates and at 2048 it diverges to NaN within
// a few steps.
func DefaultLR(width int) float32 {
	if width <= 64 {
		return 0.02
	}
	return 0.02 * 64 / float32(width)
}

// Config is one training run.
type Config struct {
	Model
	Steps        int
	LR, Momentum float32
	Seed         uint64
	// Limit is the Engine's device memory limit in bytes.
	Limit int64
	// Dynamic leaves a random set of blocks out for Phase steps at a time,
	// choosing among Patterns sets (see skipPatterns).
	Dynamic         bool
	Phase, Patterns int
	// MinSwap is the smallest tensor the planner swaps (0: the Engine's
	// default, 1 MiB).
	MinSwap int64
	// Link is the host link's bandwidth each way in bytes/s the planner
	// models (0: the Engine's default, the measured H200 link).
	Link float64
	// StepMS, when positive, is the step time of the same model with no
	// limit: the planner's op times are fitted to it instead of to the
	// profiled step (see backend.EngineOptions).
	StepMS float64
	// Estimator prices ops before fitting (nil: layer.Default, the H200
	// cost model).
	Estimator layer.Estimator
	// PhaseSync waits for the device at the end of the forward, so that a
	// step's forward and backward times are known (Step.Forward). It costs
	// one more host synchronization per step.
	PhaseSync bool
	// Recompute hands the Engine each forward op's kernel to run again, so
	// that it may drop activations and recompute them instead of swapping.
	Recompute bool
	// Hoist runs each parameter's optimizer step in the backward, as soon
	// as its gradient is final (a host that steps parameters from a hook
	// on their gradients): the step's losses are the same bits, and the
	// Engine streams the momentum buffers during the backward instead of
	// holding them all at the step's end.
	Hoist bool
	// SyncPlanning: each step that ends a profile waits for its plan
	// (chameleon.WithSyncPlanning), so that the policy runs from the next
	// step whatever the machine's speed; default: plans run off the step.
	SyncPlanning bool
	// Rank, with data-parallel ranks, places this run's Batch rows in the
	// global batch: they are rows [Rank*Batch, (Rank+1)*Batch) of it, drawn
	// as the global batch draws them (0: the first rows, a run of its own).
	Rank int
	// Reduce, with data-parallel ranks, makes the Reducer that averages the
	// gradients and the loss over the ranks, on the Engine's compute
	// stream (nil: no all-reduce, one rank). See TrainRanks.
	Reduce func(compute device.Stream) (Reducer, error)
	// Options are passed to chameleon.New last.
	Options []chameleon.Option
	// Progress, when set, gets each step as it ends.
	Progress func(Step)
}

// Step is what one step did.
type Step struct {
	// Forward is the time to the end of the forward on the device, when
	// Config.PhaseSync is set.
	Forward time.Duration
	Index   int
	Loss    float32
	Time    time.Duration
	Result  chameleon.Result
	// Bytes copied to the host and back during the step, planned and
	// forced (Result counts only planned swap-outs).
	Out, In int64
	// Recomputes is the activations dropped and made again during the step.
	Recomputes int64
	// Peak device bytes the Engine's allocator handed out so far.
	Peak int64
	// Evictions forced, and the device allocator's pages mapped, host
	// waits and blocks served at their planned place, during the step.
	Evictions, Pages, HostWaits, Placed int64
	// HostAllocs is the pinned host buffers the Engine's pool allocated
	// in the step (each a driver call that may take milliseconds).
	HostAllocs int64
	Pattern    int // the skip pattern in force (dynamic runs)
}

// Report is a whole run.
type Report struct {
	Config Config
	Steps  []Step
	Stats  chameleon.Stats
	// Sims are the simulated timelines of the policies planned, in order,
	// as the executor issues their copies, and SimForwardUS when each
	// one's forward ends.
	Sims         []*simulate.Result
	SimForwardUS []float64
	// Groups are the logical layers of the policy in force at the end,
	// with their planned, simulated and sampled times; Link the host link
	// as the executor's copies measured it (chameleon.Engine.Link).
	Groups []chameleon.GroupTime
	Link   chameleon.LinkStats
}

// Losses returns the loss of every step.
func (r *Report) Losses() []float32 {
	out := make([]float32, len(r.Steps))
	for i, s := range r.Steps {
		out[i] = s.Loss
	}
	return out
}

// Kernels makes the kernel set for the Engine's compute stream.
type Kernels func(compute device.Stream) (compute.Kernels, error)

// Train runs cfg on dev: a fresh Engine and a freshly initialized model,
// so two runs with the same seed start from the same bits.
func Train(dev device.Device, newKernels Kernels, cfg Config) (rep *Report, err error) {
	if cfg.Steps < 1 {
		return nil, fmt.Errorf("steps %d: want at least 1", cfg.Steps)
	}
	opts := append(backend.EngineOptions(cfg.Limit, cfg.Estimator, cfg.StepMS, cfg.MinSwap, cfg.Link), chameleon.WithSyncPlanning(cfg.SyncPlanning))
	eng, err := chameleon.New(dev, append(opts, cfg.Options...)...)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := eng.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	k, err := newKernels(eng.ComputeStream())
	if err != nil {
		return nil, err
	}
	n, err := newNet(eng, k, cfg.Model, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	n.recompute = cfg.Recompute
	n.hoist = cfg.Hoist
	n.row0 = cfg.Rank * cfg.Batch
	if cfg.Reduce != nil {
		if n.reduce, err = cfg.Reduce(eng.ComputeStream()); err != nil {
			return nil, fmt.Errorf("all-reduce: %w", err)
		}
	}
	var pats [][]bool
	if cfg.Dynamic {
		pats = skipPatterns(cfg.Layers, max(cfg.Patterns, 2), cfg.Seed)
	}
	choose := newChooser(cfg.Seed, len(pats), max(cfg.Phase, 1))
	rep = &Report{Config: cfg}
	var prev chameleon.Stats
	for i := range cfg.Steps {
		var skip []bool
		pat := 0
		if pats != nil {
			pat = choose(i)
			skip = pats[pat]
		}
		start := time.Now()
		n.phaseSync = cfg.PhaseSync
		loss, res, err := n.step(i, skip, cfg.LR, cfg.Momentum)
		if err != nil {
			return rep, err
		}
		st := eng.Stats()
		s := Step{Index: i, Loss: loss, Time: time.Since(start), Forward: n.fwdEnd.Sub(start), Result: res, Pattern: pat,
			Out: st.SwappedOutBytes - prev.SwappedOutBytes, In: st.SwappedInBytes - prev.SwappedInBytes, Peak: st.PeakDeviceBytes,
			Recomputes: st.Recomputes - prev.Recomputes, Evictions: st.Evictions - prev.Evictions,
			Pages: st.MappedPages - prev.MappedPages, HostWaits: st.HostWaits - prev.HostWaits, Placed: st.Placed - prev.Placed,
			HostAllocs: st.HostAllocs - prev.HostAllocs}
		prev = st
		rep.Steps = append(rep.Steps, s)
		if pr := res.Plan; res.Planned && pr.Exec != nil {
			rep.Sims = append(rep.Sims, pr.Exec)
			rep.SimForwardUS = append(rep.SimForwardUS, forwardEnd(pr))
		}
		if cfg.Progress != nil {
			cfg.Progress(s)
		}
	}
	if err := dev.SyncStream(eng.ComputeStream()); err != nil {
		return rep, err
	}
	rep.Groups, rep.Link = eng.GroupTimes(), eng.Link()
	rep.Stats = eng.Stats()
	return rep, nil
}

// newChooser picks the skip pattern of each step: pattern 0 for the first
// phase, then every pattern in a seeded order, over and over, so that each
// phase switches and every pattern comes back (with 3 patterns and 12-step
// phases, 60 steps run 0 a b 0 a: two returns the policy cache serves).
func newChooser(seed uint64, patterns, phase int) func(step int) int {
	order := []int{0}
	if patterns > 1 {
		rest := rand.New(rand.NewPCG(seed, 0xd1a)).Perm(patterns - 1)
		for _, p := range rest {
			order = append(order, p+1)
		}
	}
	return func(step int) int {
		return order[(step/phase)%len(order)]
	}
}

// forwardEnd is when the forward ends on a plan's simulated timeline (µs).
func forwardEnd(pr *plan.Result) float64 {
	end := 0.0
	for i, op := range pr.Model.Iter.Ops {
		if op.Phase == trace.PhaseForward && i < len(pr.Exec.Ops) {
			end = pr.Exec.Ops[i].End
		}
	}
	return end
}
