package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
)

// rawRates is the host link's copy rate with nothing else running, in
// bytes per second: each direction alone and both at once.
type rawRates struct {
	Bytes                  int64
	D2H, H2D               float64
	BothD2H, BothH2D       float64
	d2hTime, h2dTime, both time.Duration
}

// rawCopyBytes is the buffer rawLink copies: 256 MiB, or an eighth of a
// small limit (at least 1 MiB).
func rawCopyBytes(limit int64) int64 {
	return max(1<<20, min(256<<20, limit/8))
}

// rawLink times reps copies of n bytes between pinned host memory and the
// device, on two fresh streams with timing events: D2H alone, H2D alone,
// then both directions at once.
func rawLink(dev device.Device, n int64, reps int) (r *rawRates, err error) {
	var undo []func() error
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			err = errors.Join(err, undo[i]())
		}
	}()
	dp, err := dev.Alloc(2 * n)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return dev.Free(dp) })
	hb, err := dev.AllocHost(2 * n)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return dev.FreeHost(hb) })
	var ss [2]device.Stream
	for i := range ss {
		if ss[i], err = dev.NewStream(); err != nil {
			return nil, err
		}
		s := ss[i]
		undo = append(undo, func() error { return dev.DestroyStream(s) })
	}
	var evs [4]device.Event
	for i := range evs {
		if evs[i], err = dev.NewTimingEvent(); err != nil {
			return nil, err
		}
		ev := evs[i]
		undo = append(undo, func() error { return dev.DestroyEvent(ev) })
	}
	d2h := func(s device.Stream) error {
		for range reps {
			if err := dev.CopyD2H(hb.Slice(0, n), dp, s); err != nil {
				return err
			}
		}
		return nil
	}
	h2d := func(s device.Stream) error {
		for range reps {
			if err := dev.CopyH2D(dp.Add(n), hb.Slice(n, n), s); err != nil {
				return err
			}
		}
		return nil
	}
	// timed runs copies on s between two of the events and returns their time.
	timed := func(s device.Stream, a, b device.Event, copies func(device.Stream) error) (time.Duration, error) {
		if err := dev.Record(a, s); err != nil {
			return 0, err
		}
		if err := copies(s); err != nil {
			return 0, err
		}
		if err := dev.Record(b, s); err != nil {
			return 0, err
		}
		if err := dev.SyncEvent(b); err != nil {
			return 0, err
		}
		return dev.Elapsed(a, b)
	}
	if err := h2d(ss[0]); err != nil { // warm the path
		return nil, err
	}
	if err := dev.SyncStream(ss[0]); err != nil {
		return nil, err
	}
	r = &rawRates{Bytes: n}
	if r.d2hTime, err = timed(ss[0], evs[0], evs[1], d2h); err != nil {
		return nil, err
	}
	if r.h2dTime, err = timed(ss[0], evs[0], evs[1], h2d); err != nil {
		return nil, err
	}
	// Both at once: the H2D stream waits for the D2H stream's start event.
	if err := dev.Record(evs[0], ss[0]); err != nil {
		return nil, err
	}
	if err := dev.StreamWait(ss[1], evs[0]); err != nil {
		return nil, err
	}
	if err := d2h(ss[0]); err != nil {
		return nil, err
	}
	if err := h2d(ss[1]); err != nil {
		return nil, err
	}
	if err := dev.Record(evs[1], ss[0]); err != nil {
		return nil, err
	}
	if err := dev.Record(evs[2], ss[1]); err != nil {
		return nil, err
	}
	for _, ev := range evs[1:3] {
		if err := dev.SyncEvent(ev); err != nil {
			return nil, err
		}
	}
	bd, err := dev.Elapsed(evs[0], evs[1])
	if err != nil {
		return nil, err
	}
	bh, err := dev.Elapsed(evs[0], evs[2])
	if err != nil {
		return nil, err
	}
	r.both = max(bd, bh)
	rate := func(d time.Duration) float64 {
		if d <= 0 {
			return 0
		}
		return float64(n) * float64(reps) / d.Seconds()
	}
	r.D2H, r.H2D, r.BothD2H, r.BothH2D = rate(r.d2hTime), rate(r.h2dTime), rate(bd), rate(bh)
	return r, nil
}

// printTiming prints the policy's layers with their planned, simulated and
// sampled times, and the link measured by the executor's copies against
// the raw copy rate.
func printTiming(out io.Writer, rep *Report, raw *rawRates) {
	st := rep.Stats
	fmt.Fprintf(out, "timing: %d policies planned on measured layer times of %d; %d iterations timed, %d drift re-plans, %d timing errors\n",
		st.MeasuredPlans, st.Replans, st.TimedIterations, st.DriftReplans, st.TimingErrors)
	if len(rep.Groups) == 0 {
		fmt.Fprintln(out, "  no policy planned by this run in force at the end: no layer times")
	} else {
		fmt.Fprintln(out, "  layer  phase     ops        planned ms  simulated ms  measured ms  measured wall ms  wall/simulated  samples")
		var p, s, m, w float64
		for k, g := range rep.Groups {
			fmt.Fprintf(out, "  %5d  %-8s  %4d-%-4d  %10.3f  %12.3f  %11.3f  %16.3f  %13s  %7d\n", k, g.Phase, g.First, g.Last,
				g.PlannedUS/1000, g.SimulatedUS/1000, g.MeasuredUS/1000, g.MeasuredWallUS/1000, ratioStr(g.MeasuredWallUS, g.SimulatedUS), g.Samples)
			p, s, m, w = p+g.PlannedUS, s+g.SimulatedUS, m+g.MeasuredUS, w+g.MeasuredWallUS
		}
		fmt.Fprintf(out, "  total                     %10.3f  %12.3f  %11.3f  %16.3f  %13s\n", p/1000, s/1000, m/1000, w/1000, ratioStr(w, s))
	}
	l := rep.Link
	gbs := func(r chameleon.LinkRate) string {
		if r.Copies == 0 {
			return "none"
		}
		return fmt.Sprintf("%.2f GB/s (%d copies, %.2f GB)", r.BytesPerSecond()/1e9, r.Copies, float64(r.Bytes)/1e9)
	}
	fmt.Fprintf(out, "  link, executor's copies: D2H alone %s, with H2D busy %s; H2D alone %s, with D2H busy %s\n",
		gbs(l.D2H), gbs(l.D2HShared), gbs(l.H2D), gbs(l.H2DShared))
	cd, ch := l.Congestion()
	fmt.Fprintf(out, "  link congestion (shared/alone): D2H %.3f, H2D %.3f (0: not measured both ways)\n", cd, ch)
	fmt.Fprintf(out, "  link the next plan models (measured=%v): D2H %.2f, H2D %.2f, shared %.2f + %.2f GB/s\n",
		l.Measured, l.Model.D2H/1e9, l.Model.H2D/1e9, l.Model.D2HShared/1e9, l.Model.H2DShared/1e9)
	if raw != nil {
		fmt.Fprintf(out, "  raw copy rate (%d MiB x 4, nothing else running): D2H %.2f GB/s, H2D %.2f GB/s, both at once %.2f + %.2f GB/s\n",
			raw.Bytes>>20, raw.D2H/1e9, raw.H2D/1e9, raw.BothD2H/1e9, raw.BothH2D/1e9)
	}
}

func ratioStr(a, b float64) string {
	if b <= 0 || a <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", a/b)
}
