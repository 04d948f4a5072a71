package chameleon

// Reading the timing events an iteration recorded: the per-op times a
// profile is planned on (measure), the per-group samples of a policy's
// iterations and their drift (readSample), and the copies' link rates
// (readCopies). The events are polled, never waited for on the step.

import (
	"math"
	"slices"
	"time"

	"github.com/chameleon-go/chameleon/device"
)

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
		dir        linkDir
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
			k = k.shared()
		}
		r := &tm.link[k]
		r.Copies++
		r.Bytes += a.bytes
		r.Seconds += (a.end - a.start) / 1e6
	}
}
