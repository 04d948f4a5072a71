package chameleon

import (
	"fmt"
	"math"
	"slices"

	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Measured times. The Engine times its own iterations with the device's
// timing events (device.Device's NewTimingEvent and Elapsed):
//
//   - the profiled iteration: an event on the compute stream at Begin and
//     after every op, so that once the planning path has grouped the ops,
//     each logical layer's time is measured; the estimator only splits it
//     among the layer's ops (plan.WithMeasured). The time the compute
//     stream waits for a copy (a swapped tensor coming back, memory freed
//     behind a copy out) or runs a recompute is bracketed by a pair of
//     events and left out: a plan counts its own stalls.
//   - in STABLE, every WithTimingEvery iterations: an event at each layer's
//     end and the same brackets; a layer whose time drifts past
//     WithDriftThreshold of what the policy was planned with, two samples
//     in a row, makes the Engine profile and plan again
//     (Stats.DriftReplans).
//   - in both, a pair of events around each copy of the executor's, on its
//     copy stream: the link's rate per direction, alone and with the other
//     direction busy, which the next plan models (Engine.Link).

// Default timing settings.
const (
	// DefaultTimingEvery is how often, in iterations under a policy, the
	// Engine samples its layers' times (WithTimingEvery).
	DefaultTimingEvery = 10
	// DefaultDriftThreshold is the relative change of a layer's time that
	// makes the Engine plan again (WithDriftThreshold): the paper's 15%.
	DefaultDriftThreshold = 0.15
)

// Below these a layer's change is noise, and a link direction's sample too
// small to model the link on.
const (
	driftFloorUS  = 20
	linkMinBytes  = 16 << 20
	linkMinCopies = 4
	// maxTimedCopies bounds the copies timed in one iteration.
	maxTimedCopies = 1024
	// minComputeShare: measured compute under this share of the compute
	// stream's time is not a measurement of the ops.
	minComputeShare = 0.01
)

type timingConfig struct {
	off   bool
	every int
	drift float64
}

func defaultTiming() timingConfig {
	return timingConfig{every: DefaultTimingEvery, drift: DefaultDriftThreshold}
}

func (c timingConfig) validate() error {
	switch {
	case c.every < 0:
		return fmt.Errorf("chameleon: WithTimingEvery(%d): want 0 (never) or more", c.every)
	case !(c.drift > 0) || math.IsInf(c.drift, 0):
		return fmt.Errorf("chameleon: WithDriftThreshold(%g): want a positive fraction", c.drift)
	}
	return nil
}

// LinkRate is what the executor's timed copies in one direction moved.
type LinkRate struct {
	Copies  int
	Bytes   int64
	Seconds float64
}

// BytesPerSecond is the rate, 0 with nothing timed.
func (r LinkRate) BytesPerSecond() float64 {
	if r.Seconds <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Seconds
}

func (r LinkRate) enough() bool {
	return r.Copies >= linkMinCopies && r.Bytes >= linkMinBytes && r.Seconds > 0
}

// LinkStats is the host link as the executor's copies measured it: each
// direction alone, and with the other direction busy (Shared: a copy at
// least half of whose time overlapped one the other way).
type LinkStats struct {
	D2H, H2D, D2HShared, H2DShared LinkRate
	// Model is the link the next plan models: the measured rates where a
	// direction moved enough (16 MiB in 4 copies), a missing alone or
	// shared rate derived from the other by the configured link's ratio,
	// the configured link otherwise. WithLinkBandwidth fixes the link: the
	// measurement is then reported and not used.
	Model simulate.Link
	// Measured says Model holds a measured rate.
	Measured bool
}

// Congestion is, per direction, the shared rate over the alone rate: the
// slowdown of one copy when a second transfer, the other way, is in flight
// (0 where either is not measured).
func (l LinkStats) Congestion() (d2h, h2d float64) {
	ratio := func(shared, alone LinkRate) float64 {
		if !shared.enough() || !alone.enough() {
			return 0
		}
		return shared.BytesPerSecond() / alone.BytesPerSecond()
	}
	return ratio(l.D2HShared, l.D2H), ratio(l.H2DShared, l.H2D)
}

// GroupTime is one logical layer of the policy in force, timed.
type GroupTime struct {
	Phase       trace.Phase
	First, Last int // op indices
	// PlannedUS is the compute time the policy was planned with: measured
	// in the profiled iteration, or the estimator's.
	PlannedUS float64
	// SimulatedUS is the layer's time on the simulated timeline of the
	// policy as the executor issues it: compute, stalls and recomputes;
	// SimulatedStallUS the part its ops waited for copies.
	SimulatedUS, SimulatedStallUS float64
	// MeasuredUS and MeasuredWallUS are the latest sample's (0: none yet):
	// compute (waits for copies and recomputes left out), and everything on
	// the compute stream, to compare with SimulatedUS.
	MeasuredUS, MeasuredWallUS float64
	Samples                    int
}

// policyTiming is what the timer keeps of a policy planned here.
type policyTiming struct {
	groups []GroupTime
	endAt  []int32 // per op, the group it ends, -1
}

func newPolicyTiming(pr *plan.Result) *policyTiming {
	if pr == nil || len(pr.Groups) == 0 || len(pr.OpTimes) == 0 {
		return nil
	}
	pt := &policyTiming{endAt: make([]int32, len(pr.OpTimes))}
	for i := range pt.endAt {
		pt.endAt[i] = -1
	}
	for k, g := range pr.Groups {
		if g.First < 0 || g.Last >= len(pr.OpTimes) || g.First > g.Last {
			return nil
		}
		gt := GroupTime{Phase: g.Phase, First: g.First, Last: g.Last}
		for i := g.First; i <= g.Last; i++ {
			gt.PlannedUS += pr.OpTimes[i]
		}
		if ex := pr.Exec; ex != nil && g.Last < len(ex.Ops) {
			start := 0.0
			if g.First > 0 {
				start = ex.Ops[g.First-1].End
			}
			gt.SimulatedUS = ex.Ops[g.Last].End - start
			for i := g.First; i <= g.Last; i++ {
				gt.SimulatedStallUS += ex.Ops[i].Stall
			}
		}
		pt.groups = append(pt.groups, gt)
		pt.endAt[g.Last] = int32(k)
	}
	return pt
}

// Link reports the host link as the executor's timed copies measured it,
// and the link the next plan models.
func (e *Engine) Link() LinkStats {
	defer e.rlock()()
	return e.tm.stats()
}

// GroupTimes reports the logical layers of the policy in force with the
// times it was planned with, the simulator's, and the latest sample's
// (WithTimingEvery). A sample whose events are still running is waited for.
// Nil with no policy, or one not planned by this Engine.
func (e *Engine) GroupTimes() []GroupTime {
	defer e.rlock()()
	if !e.closed {
		e.tm.poll(true)
	}
	p := e.policy
	if p == nil || p.timing == nil {
		return nil
	}
	return slices.Clone(p.timing.groups)
}

// Simulation is the policy in force as the simulator ran it when it was
// planned, its copies issued as the executor issues them: the timeline the
// Engine expects each iteration under the policy to follow.
type Simulation struct {
	Swaps      []simulate.Swap
	Recomputes []simulate.Recompute
	// Result is the simulated iteration: Result.Out and Result.In are
	// indexed like Swaps, Result.Recomputed like Recomputes.
	Result *simulate.Result
}

// Simulation returns a copy of the simulation of the policy in force; nil
// with no policy, or one whose simulation the Engine does not have (a
// policy loaded from a file before it planned again).
func (e *Engine) Simulation() *Simulation {
	defer e.rlock()()
	p := e.policy
	if p == nil || p.exec == nil {
		return nil
	}
	r := *p.exec
	r.Ops, r.Out, r.In = slices.Clone(r.Ops), slices.Clone(r.Out), slices.Clone(r.In)
	r.Freed, r.Recomputed, r.SwapWaitUS = slices.Clone(r.Freed), slices.Clone(r.Recomputed), slices.Clone(r.SwapWaitUS)
	rcs := slices.Clone(p.recomputes)
	for i := range rcs {
		rcs[i].Remade = slices.Clone(rcs[i].Remade)
		rcs[i].Kept = slices.Clone(rcs[i].Kept)
	}
	return &Simulation{Swaps: slices.Clone(p.swaps), Recomputes: rcs, Result: &r}
}
