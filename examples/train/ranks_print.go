package main

import (
	"fmt"
	"io"
	"math"

	"github.com/chameleon-go/chameleon/seq"
)

// ncclVersion is the loaded NCCL's version, for the log.
func ncclVersion(j *job) string {
	if j.lib == nil {
		return "?"
	}
	v, err := j.lib.Version()
	if err != nil {
		return "?"
	}
	return v.String()
}

// stepMS is a run's median step time: of its STABLE steps after the
// first, else of all its steps after the first.
func stepMS(rep *Report) float64 {
	steady := rep.Steps[min(1, len(rep.Steps)-1):]
	ms := medianMS(steady, func(s Step) bool { return s.Result.Stage == seq.Stable })
	if math.IsNaN(ms) {
		ms = medianMS(steady, nil)
	}
	return ms
}

// rankCheck is the checks of a run of ranks.
type rankCheck struct {
	// Agree: every rank reported the same losses, bit for bit; else
	// Rank's first differs from rank 0's at Step.
	Agree      bool
	Rank, Step int
	// Verified: every rank's limited run repeats its unlimited run's
	// losses bit for bit; else VerifyRank's first differs at VerifyStep.
	Verified               bool
	VerifyRank, VerifyStep int
	// RefDiff is the largest relative difference of rank 0's losses from
	// those of one device at the global batch (NaN: no such run).
	RefDiff float64
	// WithinLimit: every rank's peak stayed within the limit.
	WithinLimit bool
	// Adopted: rank 0 shared its policies and every other rank adopted
	// them, with no rank planning on its own.
	Adopted bool
}

// check runs the checks on res.
func (res *outcome) check() rankCheck {
	runs := res.Limited
	if runs == nil {
		runs = res.Base
	}
	c := rankCheck{Agree: true, Verified: true, RefDiff: math.NaN(), WithinLimit: true, Adopted: true}
	l0 := runs[0].Losses()
	for r, rep := range runs {
		if i := firstDiff(l0, rep.Losses()); i >= 0 && c.Agree {
			c.Agree, c.Rank, c.Step = false, r, i
		}
		if res.Limited != nil {
			if i := firstDiff(res.Base[r].Losses(), rep.Losses()); i >= 0 && c.Verified {
				c.Verified, c.VerifyRank, c.VerifyStep = false, r, i
			}
			c.WithinLimit = c.WithinLimit && rep.Stats.PeakDeviceBytes <= res.Limit
		}
		st := rep.Stats
		if st.RankFallbacks > 0 || (r == 0 && len(runs) > 1 && st.SharedPolicies == 0) || (r > 0 && st.AdoptedPolicies == 0) {
			c.Adopted = false
		}
	}
	if res.Ref != nil {
		c.RefDiff = relDiff(l0, res.Ref.Losses())
	}
	return c
}

// printRanks is the summary's part on the ranks.
func printRanks(out io.Writer, o *options, res *outcome) {
	fmt.Fprintf(out, "ranks: %d, %d rows each of a global batch of %d, policies over the %s channel", res.Ranks, res.Model.Batch, res.GlobalBatch, res.Channel)
	if res.SyncPlanning {
		fmt.Fprint(out, ", plans in the step that ends a profile (--sync-planning)")
	}
	fmt.Fprintln(out)
	if res.HostBudget > 0 && res.Limited != nil {
		fmt.Fprintf(out, "  pinned host budget %s for the node, %s a rank\n", bytesStr(res.HostBudget), bytesStr(res.HostBudget/int64(res.Ranks)))
	}
	for r := range res.Base {
		st := res.Base[r].Stats
		line := fmt.Sprintf("  rank %d: step %.2f ms without the limit", r, stepMS(res.Base[r]))
		if res.Limited != nil {
			rep := res.Limited[r]
			st = rep.Stats
			line += fmt.Sprintf(", %.2f ms with it (median); peak %s (%s), pinned peak %s",
				stepMS(rep), bytesStr(st.PeakDeviceBytes), okStr(st.PeakDeviceBytes <= res.Limit, "within the limit", "OVER THE LIMIT"), bytesStr(st.PeakHostBytes))
		}
		line += fmt.Sprintf("; policies: %d planned, %d shared, %d adopted from rank 0, %d planned on its own after no policy came", st.Replans, st.SharedPolicies, st.AdoptedPolicies, st.RankFallbacks)
		fmt.Fprintln(out, line)
	}
	c := res.check()
	steps := len(res.Base[0].Steps)
	if res.Limited != nil {
		steps = len(res.Limited[0].Steps)
	}
	if res.Ranks > 1 {
		fmt.Fprintf(out, "  policy: %s\n", okStr(c.Adopted, "rank 0 planned and shared, every other rank adopted", "NOT ADOPTED by every rank (see the counts above)"))
	}
	if c.Agree {
		fmt.Fprintf(out, "  losses: identical on every rank, bit for bit, over %d steps\n", steps)
	} else {
		fmt.Fprintf(out, "  losses: DIFFER between ranks: rank %d from rank 0's at step %d\n", c.Rank, c.Step)
	}
	if o.verify && res.Limited != nil {
		if c.Verified {
			fmt.Fprintln(out, "  verify: every rank's loss curve is bitwise that of its unlimited run")
		} else {
			fmt.Fprintf(out, "  verify: rank %d's loss curve DIFFERS from its unlimited run (first at step %d)\n", c.VerifyRank, c.VerifyStep)
		}
	}
	if res.Ref != nil {
		what := "within"
		if !(c.RefDiff <= RankTolerance) {
			what = "OUTSIDE"
		}
		if c.RefDiff == 0 {
			what = "bit for bit, " + what
		}
		fmt.Fprintf(out, "  one device at the global batch of %d: largest relative loss difference %.3g over %d steps, %s the tolerance %.0e (fp32 sums in another order)\n",
			res.GlobalBatch, c.RefDiff, len(res.Ref.Steps), what, RankTolerance)
	}
}
