package chameleon

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/chameleon-go/chameleon/device"
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

// mark is an event on the compute stream after op's work.
type mark struct {
	op int
	ev device.Event
}

// bracket is a pair of events around a wait (or recompute) on a stream.
type bracket struct {
	op    int
	a, b  device.Event
	dir   int // copies: 0 D2H, 1 H2D
	bytes int64
	ended bool
}

// timedIter is one iteration's events.
type timedIter struct {
	perOp  bool // every op (profiled), else the policy's group ends
	pol    *policy
	start  device.Event
	marks  []mark
	stalls []bracket
	copies []bracket
	depth  int // nested stall brackets open
	used   []device.Event
}

// timer owns the Engine's timing events and what they measured. Its
// methods run with the Engine's lock held.
type timer struct {
	e    *Engine
	cfg  timingConfig
	off  bool // not timing: turned off, or the device cannot
	free []device.Event
	all  []device.Event
	cur  *timedIter // the iteration being timed
	wait *timedIter // a sample whose events are still to complete
	// since counts iterations under the policy in force since its sample.
	since   int
	sincePl *policy
	drifted int // samples in a row that drifted
	// drift: two samples in a row drifted; the next Begin takes it
	// (takeDrift) and the controller plans again.
	drift bool
	// measured is the profiled iteration's per-op compute times (µs) for
	// the plan being made.
	measured []float64
	link     [4]LinkRate // D2H, H2D, D2HShared, H2DShared
}

func newTimer(e *Engine) *timer {
	tm := &timer{e: e, cfg: e.cfg.timing, off: e.cfg.timing.off}
	if tm.off {
		return tm
	}
	e.alloc.OnStreamWait(func(s device.Stream, after bool) {
		if s != e.compute {
			return
		}
		if after {
			tm.waitEnd()
		} else {
			tm.waitBegin()
		}
	})
	e.onClose = append(e.onClose, tm.close)
	return tm
}

func (tm *timer) close() error {
	var errs []error
	for _, ev := range tm.all {
		errs = append(errs, tm.e.dev.DestroyEvent(ev))
	}
	tm.all, tm.free, tm.cur, tm.wait = nil, nil, nil, nil
	return errors.Join(errs...)
}

// fail stops timing the iteration under way after a device error; a device
// that cannot time at all turns timing off.
func (tm *timer) fail(what string, err error) {
	tm.e.stats.TimingErrors++
	if errors.Is(err, device.ErrNotSupported) {
		tm.off = true
		tm.e.cfg.logger.Warn("chameleon: the device has no timing events: plans use estimated times", "err", err)
	} else {
		tm.e.cfg.logger.Warn("chameleon: timing events failed: this iteration's times are estimated", "step", what, "err", err)
	}
	if tm.cur != nil {
		tm.release(tm.cur)
		tm.cur = nil
	}
}

// event takes a timing event from the pool, making one when it is empty.
func (tm *timer) event() (device.Event, bool) {
	if n := len(tm.free); n > 0 {
		ev := tm.free[n-1]
		tm.free = tm.free[:n-1]
		tm.cur.used = append(tm.cur.used, ev)
		return ev, true
	}
	ev, err := tm.e.dev.NewTimingEvent()
	if err != nil {
		tm.fail("new timing event", err)
		return 0, false
	}
	tm.all = append(tm.all, ev)
	tm.cur.used = append(tm.cur.used, ev)
	return ev, true
}

// record records a fresh timing event on s.
func (tm *timer) record(s device.Stream) (device.Event, bool) {
	ev, ok := tm.event()
	if !ok {
		return 0, false
	}
	if err := tm.e.dev.Record(ev, s); err != nil {
		tm.fail("record", err)
		return 0, false
	}
	return ev, true
}

func (tm *timer) release(ti *timedIter) {
	tm.free = append(tm.free, ti.used...)
	ti.used = nil
}

// begin starts an iteration: timed per op when it is profiled, by group
// when a sample of the policy in force is due. A sample still waiting for
// its events is read first if they are done.
func (tm *timer) begin(profiled bool) {
	if tm.off {
		return
	}
	tm.poll(false)
	if tm.cur != nil { // an iteration timed but not read (no plan came of it)
		tm.release(tm.cur)
		tm.cur = nil
	}
	p := tm.e.policy
	if p != tm.sincePl {
		tm.sincePl, tm.since, tm.drifted = p, 0, 0
	}
	sample := false
	if !profiled && p != nil && p.timing != nil && tm.cfg.every > 0 && tm.wait == nil {
		sample = tm.since%tm.cfg.every == 0
		tm.since++
	}
	if !profiled && !sample {
		return
	}
	tm.cur = &timedIter{perOp: profiled, pol: p}
	ev, ok := tm.record(tm.e.compute)
	if !ok {
		return
	}
	tm.cur.start = ev
}

// after marks the end of op's work on the compute stream.
func (tm *timer) after(op int) {
	ti := tm.cur
	if ti == nil {
		return
	}
	if !ti.perOp {
		pt := ti.pol.timing
		if op >= len(pt.endAt) || pt.endAt[op] < 0 {
			return
		}
	}
	if ev, ok := tm.record(tm.e.compute); ok {
		ti.marks = append(ti.marks, mark{op: op, ev: ev})
	}
}

// waitBegin and waitEnd bracket a wait (or a recompute) on the compute
// stream; nested brackets count once.
func (tm *timer) waitBegin() {
	ti := tm.cur
	if ti == nil {
		return
	}
	ti.depth++
	if ti.depth > 1 {
		return
	}
	if ev, ok := tm.record(tm.e.compute); ok {
		tm.cur.stalls = append(tm.cur.stalls, bracket{op: tm.e.it.op, a: ev})
	}
}

func (tm *timer) waitEnd() {
	ti := tm.cur
	if ti == nil || ti.depth == 0 {
		return
	}
	ti.depth--
	if ti.depth > 0 || len(ti.stalls) == 0 || ti.stalls[len(ti.stalls)-1].ended {
		return
	}
	if ev, ok := tm.record(tm.e.compute); ok {
		b := &tm.cur.stalls[len(tm.cur.stalls)-1]
		b.b, b.ended = ev, true
	}
}

// copyBegin marks the start of a copy on s (the d2h or h2d stream), once
// the copy's waits are queued; copyEnd, after the copy is queued, its end.
// copyBegin returns -1 when the copy is not timed.
func (tm *timer) copyBegin(s device.Stream) int {
	ti := tm.cur
	if ti == nil || len(ti.copies) >= maxTimedCopies {
		return -1
	}
	ev, ok := tm.record(s)
	if !ok {
		return -1
	}
	dir := 0
	if s == tm.e.h2d {
		dir = 1
	}
	tm.cur.copies = append(tm.cur.copies, bracket{a: ev, dir: dir})
	return len(tm.cur.copies) - 1
}

func (tm *timer) copyEnd(k int, s device.Stream, bytes int64) {
	if k < 0 || tm.cur == nil || k >= len(tm.cur.copies) {
		return
	}
	if ev, ok := tm.record(s); ok {
		c := &tm.cur.copies[k]
		c.b, c.bytes, c.ended = ev, bytes, true
	}
}

// end closes the timed iteration: a sample waits for its events (read at a
// later Begin, never blocking the host); a profiled iteration is read by
// measure if it is planned, else dropped at the next Begin.
func (tm *timer) end() {
	ti := tm.cur
	if ti == nil || ti.perOp {
		return
	}
	tm.cur = nil
	tm.wait = ti
	tm.poll(false)
}

// elapsedUS is the time from ti's start to ev, µs.
func (tm *timer) elapsedUS(ti *timedIter, ev device.Event) (float64, error) {
	d, err := tm.e.dev.Elapsed(ti.start, ev)
	if err != nil {
		return 0, err
	}
	return float64(d) / float64(time.Microsecond), nil
}

// measure reads the profiled iteration of n ops, waiting for the device to
// finish it: per op, the compute stream's time less its stalls. It returns
// nil (and the plan takes the estimator's times) when the iteration was not
// timed whole, or when reading the events failed, with a warning.
func (tm *timer) measure(n int) []float64 {
	tm.measured = nil
	ti := tm.cur
	if ti == nil || !ti.perOp {
		return nil
	}
	tm.cur = nil
	defer tm.release(ti)
	if len(ti.marks) != n || n == 0 || ti.start == 0 {
		return nil
	}
	if err := tm.e.dev.SyncEvent(ti.marks[n-1].ev); err != nil {
		tm.fail("sync", err)
		return nil
	}
	out := make([]float64, n)
	prev := 0.0
	for i, m := range ti.marks {
		at, err := tm.elapsedUS(ti, m.ev)
		if err != nil {
			tm.fail("elapsed", err)
			return nil
		}
		out[i], prev = at-prev, at
	}
	for _, s := range ti.stalls {
		if !s.ended || s.op < 0 || s.op >= n {
			continue
		}
		d, err := tm.e.dev.Elapsed(s.a, s.b)
		if err != nil {
			tm.fail("elapsed", err)
			return nil
		}
		out[s.op] -= float64(d) / float64(time.Microsecond)
	}
	var total float64
	for i := range out {
		out[i] = max(out[i], 0)
		total += out[i]
	}
	tm.readCopies(ti)
	tm.e.stats.TimedIterations++
	if !(total > 0 && total >= minComputeShare*prev) {
		// Nothing measured but the waits: a device whose clock only the
		// copies move (the host backend without LaunchFor).
		return nil
	}
	tm.measured = out
	return out
}

// poll reads the sample waiting for its events once they are complete
// (block: wait for them).
func (tm *timer) poll(block bool) {
	ti := tm.wait
	if ti == nil {
		return
	}
	if len(ti.marks) > 0 {
		last := ti.marks[len(ti.marks)-1].ev
		if block {
			if err := tm.e.dev.SyncEvent(last); err != nil {
				tm.wait = nil
				tm.fail("sync", err)
				tm.release(ti)
				return
			}
		} else if done, err := tm.e.dev.Query(last); err != nil || !done {
			if err != nil {
				tm.wait = nil
				tm.fail("query", err)
				tm.release(ti)
			}
			return
		}
	}
	tm.wait = nil
	defer tm.release(ti)
	if err := tm.readSample(ti); err != nil {
		tm.fail("elapsed", err)
	}
}

// readSample turns a sample's events into its groups' times and judges the
// drift against the policy's plan.
func (tm *timer) readSample(ti *timedIter) error {
	pt := ti.pol.timing
	if ti.start == 0 || len(ti.marks) != len(pt.groups) {
		return nil // the iteration did not run the policy's ops through
	}
	wall := make([]float64, len(pt.groups))
	prev := 0.0
	for k, m := range ti.marks {
		if int(pt.endAt[m.op]) != k {
			return nil
		}
		at, err := tm.elapsedUS(ti, m.ev)
		if err != nil {
			return err
		}
		wall[k], prev = at-prev, at
	}
	comp := slices.Clone(wall)
	for _, s := range ti.stalls {
		if !s.ended {
			continue
		}
		k := groupOf(pt.groups, s.op)
		if k < 0 {
			continue
		}
		d, err := tm.e.dev.Elapsed(s.a, s.b)
		if err != nil {
			return err
		}
		comp[k] -= float64(d) / float64(time.Microsecond)
	}
	tm.readCopies(ti)
	tm.e.stats.TimedIterations++
	var total, compute float64
	for k := range wall {
		total += wall[k]
		compute += max(comp[k], 0)
	}
	if !(compute > 0 && compute >= minComputeShare*total) {
		return nil // nothing measured but the waits, as in measure
	}
	drift := false
	for k := range pt.groups {
		g := &pt.groups[k]
		g.MeasuredUS, g.MeasuredWallUS = max(comp[k], 0), max(wall[k], 0)
		g.Samples++
		diff := math.Abs(g.MeasuredUS - g.PlannedUS)
		if g.PlannedUS > 0 && diff > tm.cfg.drift*g.PlannedUS && diff > driftFloorUS {
			drift = true
		}
	}
	if ti.pol != tm.e.policy {
		return nil // replaced meanwhile: nothing to re-plan
	}
	if !drift {
		tm.drifted = 0
		return nil
	}
	if tm.drifted++; tm.drifted >= 2 {
		tm.drifted = 0
		tm.drift = true // profile the next iteration and plan from it (takeDrift)
	}
	return nil
}

// groupOf is the index of the group holding op, -1.
func groupOf(gs []GroupTime, op int) int {
	k, found := slices.BinarySearchFunc(gs, op, func(g GroupTime, op int) int {
		switch {
		case op < g.First:
			return 1
		case op > g.Last:
			return -1
		}
		return 0
	})
	if !found {
		return -1
	}
	return k
}

// readCopies adds a timed iteration's complete copies to the link's
// figures: each copy's time from its start to its end on its stream, as
// alone or shared by whether the other direction copied for most of it.
func (tm *timer) readCopies(ti *timedIter) {
	type span struct {
		dir        int
		bytes      int64
		start, end float64
	}
	var spans []span
	for _, c := range ti.copies {
		if !c.ended || c.bytes <= 0 {
			continue
		}
		if done, err := tm.e.dev.Query(c.b); err != nil || !done {
			continue
		}
		s, err1 := tm.elapsedUS(ti, c.a)
		e, err2 := tm.elapsedUS(ti, c.b)
		if err1 != nil || err2 != nil || e <= s {
			continue
		}
		spans = append(spans, span{c.dir, c.bytes, s, e})
	}
	for i, a := range spans {
		var shared float64
		for j, b := range spans {
			if j != i && b.dir != a.dir {
				shared += max(0, min(a.end, b.end)-max(a.start, b.start))
			}
		}
		k := a.dir
		if shared >= (a.end-a.start)/2 {
			k += 2
		}
		r := &tm.link[k]
		r.Copies++
		r.Bytes += a.bytes
		r.Seconds += (a.end - a.start) / 1e6
	}
}

// stats is the link as measured, and the model the next plan uses.
func (tm *timer) stats() LinkStats {
	l := LinkStats{D2H: tm.link[0], H2D: tm.link[1], D2HShared: tm.link[2], H2DShared: tm.link[3]}
	l.Model = tm.e.cfg.link()
	if tm.e.cfg.linkSet {
		return l
	}
	pick := func(alone, shared LinkRate, a, s *float64) {
		ratio := *s / *a
		switch {
		case alone.enough() && shared.enough():
			*a, *s = alone.BytesPerSecond(), shared.BytesPerSecond()
		case alone.enough():
			*a = alone.BytesPerSecond()
			*s = *a * ratio
		case shared.enough():
			*s = shared.BytesPerSecond()
			*a = *s / ratio
		default:
			return
		}
		l.Measured = true
	}
	pick(l.D2H, l.D2HShared, &l.Model.D2H, &l.Model.D2HShared)
	pick(l.H2D, l.H2DShared, &l.Model.H2D, &l.Model.H2DShared)
	return l
}

// takeDrift reports whether the layer times drifted since the last look.
func (tm *timer) takeDrift() bool {
	d := tm.drift
	tm.drift = false
	return d
}

// planOptions are the measured times and link for the plan being made.
func (tm *timer) planOptions() []plan.Option {
	if tm.off {
		return nil
	}
	var opts []plan.Option
	if tm.measured != nil {
		opts = append(opts, plan.WithMeasured(tm.measured))
	}
	if l := tm.stats(); l.Measured {
		opts = append(opts, plan.WithLink(l.Model))
	}
	return opts
}

// planned records what a fresh policy was planned with, for its samples.
func (tm *timer) planned(p *policy, pr *plan.Result) {
	if pr != nil && pr.Measured {
		tm.e.stats.MeasuredPlans++
	}
	tm.measured = nil
	if p != nil {
		p.timing = newPolicyTiming(pr)
	}
}

// Link reports the host link as the executor's timed copies measured it,
// and the link the next plan models.
func (e *Engine) Link() LinkStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tm.stats()
}

// GroupTimes reports the logical layers of the policy in force with the
// times it was planned with, the simulator's, and the latest sample's
// (WithTimingEvery). A sample whose events are still running is waited for.
// Nil with no policy, or one not planned by this Engine.
func (e *Engine) GroupTimes() []GroupTime {
	e.mu.Lock()
	defer e.mu.Unlock()
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
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.policy
	if p == nil || p.exec == nil {
		return nil
	}
	r := *p.exec
	r.Ops, r.Out, r.In = slices.Clone(r.Ops), slices.Clone(r.Out), slices.Clone(r.In)
	r.Freed, r.Recomputed = slices.Clone(r.Freed), slices.Clone(r.Recomputed)
	rcs := slices.Clone(p.recomputes)
	for i := range rcs {
		rcs[i].Remade = slices.Clone(rcs[i].Remade)
		rcs[i].Kept = slices.Clone(rcs[i].Kept)
	}
	return &Simulation{Swaps: slices.Clone(p.swaps), Recomputes: rcs, Result: &r}
}
