package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/samber/lo"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
)

// errInfeasible is plan's error when no plan meets the limit: the command
// has printed its report (the lowest feasible limit in it) and exits 1.
type errInfeasible struct{ msg string }

func (e errInfeasible) Error() string { return e.msg }

func (errInfeasible) Unwrap() error { return mre.ErrInfeasible }

// movedBy is how the plan may move tensors: "by swapping", or "by swapping
// and recomputing" with recomputes.
func movedBy(recompute bool) string {
	if recompute {
		return "by swapping and recomputing"
	}
	return "by swapping"
}

// limitAtLeast is the --limit, a whole percentage, that is at least pct.
func limitAtLeast(pct float64) string {
	return strconv.Itoa(int(math.Min(math.Ceil(pct-1e-9), 100))) + "%"
}

// planInfeasible reports a limit no plan meets: the lowest limit one does
// meet, the plot of the curve under both (--plot; --perfetto has no
// timeline to write), the report on stdout (--json: the object with the
// error), and the error, so that the command exits 1.
func planInfeasible(stdout, stderr io.Writer, rep *planReport, cfg planConfig, asJSON bool, plotPath, perfetto string) error {
	pct := func(b int64) float64 { return 100 * float64(b) / float64(max(rep.PeakBytesBefore, 1)) }
	fmt.Fprintf(stderr, "the limit cannot be met %s: finding the lowest limit a plan meets\n", movedBy(rep.recompute))
	low, err := lowestFeasible(rep, cfg)
	msg := fmt.Sprintf("iteration %d: the limit of %s (%.1f%% of the peak of %s) cannot be met %s: %s over it with every idle tensor %s, at %s",
		rep.Iter, fmtBytes(rep.LimitBytes), pct(rep.LimitBytes), fmtBytes(rep.PeakBytesBefore), movedBy(rep.recompute),
		fmtBytes(rep.Shortfall.Bytes), lo.Ternary(rep.recompute, "swapped or recomputed", "swapped"), rep.Shortfall)
	if err != nil {
		msg += fmt.Sprintf("; the lowest limit a plan meets was not found: %v", err)
	} else {
		rep.LowestFeasibleBytes, rep.LowestFeasiblePct = low, math.Round(pct(low)*100)/100
		msg += fmt.Sprintf("; the lowest feasible limit is %s (%.1f%% of the peak): --limit %s", fmtBytes(low), pct(low), limitAtLeast(pct(low)))
	}
	rep.Error = msg
	if plotPath != "" {
		if len(rep.curve) == 0 {
			fmt.Fprintf(stderr, "--plot: no file written: no plan, and no curve to draw\n")
		} else if err := plotInfeasible(plotPath, rep); err != nil {
			fmt.Fprintf(stderr, "--plot: no file written: %v\n", err)
		} else {
			fmt.Fprintf(stderr, "wrote %s (no plan: the curve, the limit and the lowest feasible limit)\n", plotPath)
		}
	}
	if perfetto != "" {
		fmt.Fprintf(stderr, "--perfetto: no file written: no plan was made, so there is no timeline\n")
	}
	if asJSON {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	} else {
		printPlan(stdout, rep)
	}
	return errInfeasible{msg}
}

// lowestFeasible is the lowest limit the planning path meets for the
// iteration rep could not be planned for. Swapping every idle tensor over
// its whole gap leaves the planner's shortfall over the limit at the worst
// op, so the limit raised by that shortfall is met: it is checked, and
// raised again by any new shortfall. Recomputes free nothing swaps cannot
// (a plan may stall, so a swap covers any gap), so the threshold of swaps
// alone is that of swaps and recomputes; with recomputes, the shortfall
// reported becomes that of swaps alone (which the limit plus it meets)
// and the limit found is checked with them too. The layout is left out:
// it plans again until it fits, and never makes a limit infeasible. At
// the curve's peak nothing moves, so the search ends there at the latest.
func lowestFeasible(rep *planReport, cfg planConfig) (int64, error) {
	cfg.noLayout = true
	swaps := cfg
	swaps.recompute = false
	peak := rep.PeakBytesBefore
	short := func(c planConfig, limit int64) (*mre.InfeasibleError, error) {
		opts, err := c.planOptions()
		if err != nil {
			return nil, err
		}
		in := rep.in
		in.Limit = limit
		_, err = plan.Make(in, opts...)
		var ie *mre.InfeasibleError
		switch {
		case err == nil:
			return nil, nil
		case errors.As(err, &ie):
			return ie, nil
		}
		return nil, err
	}
	limit, ie := rep.LimitBytes, rep.infeasible
	if cfg.recompute {
		sw, err := short(swaps, limit)
		if err != nil {
			return 0, err
		}
		if sw != nil {
			ie = sw
			rep.Shortfall = newShortfall(rep.in.Iter, sw.Op, sw.Shortfall)
			rep.shortAt = sw.Op
		}
	}
	// raise is the limit over which ie falls short: ie.Limit is the tier
	// planned for, a share of limit.
	raise := func(limit int64, ie *mre.InfeasibleError) int64 {
		if ie.Limit == limit || ie.Limit <= 0 {
			return limit + max(ie.Shortfall, 1)
		}
		return limit + max(int64(math.Ceil(float64(ie.Shortfall)*float64(limit)/float64(ie.Limit))), 1)
	}
	// met raises limit by what the plans of c fall short of it until one
	// meets it.
	met := func(c planConfig) error {
		for try := 0; ie != nil; try++ {
			if limit = raise(limit, ie); try == 8 || limit >= peak {
				limit, ie = peak, nil
				return nil
			}
			var err error
			if ie, err = short(c, limit); err != nil {
				return err
			}
		}
		return nil
	}
	if err := met(swaps); err != nil {
		return 0, err
	}
	if cfg.recompute && limit < peak {
		var err error
		if ie, err = short(cfg, limit); err != nil {
			return 0, err
		}
		if err := met(cfg); err != nil {
			return 0, err
		}
	}
	return limit, nil
}
