package chameleon

// The timer records timing events around an iteration's layers and copies
// (timing.go says what is measured and why); timesample.go reads them.

import (
	"errors"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/plan"
)

// mark is an event on the compute stream after op's work.
type mark struct {
	op int
	ev device.Event
}

// bracket is a pair of events around a wait (or recompute) on a stream.
type bracket struct {
	op    int
	a, b  device.Event
	dir   linkDir // copies: which way
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
	link     [linkDirs]LinkRate // per linkDir
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
// linkDir is a way copies go, and whether they shared the link with
// copies the other way for at least half their time.
type linkDir uint8

const (
	d2h linkDir = iota
	h2d
	d2hShared
	h2dShared
	linkDirs
)

// shared is the same way, sharing the link.
func (d linkDir) shared() linkDir { return d + d2hShared }

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
	dir := d2h
	if s == tm.e.h2d {
		dir = h2d
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

// stats is the link as measured, and the model the next plan uses.
func (tm *timer) stats() LinkStats {
	l := LinkStats{D2H: tm.link[d2h], H2D: tm.link[h2d], D2HShared: tm.link[d2hShared], H2DShared: tm.link[h2dShared]}
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
