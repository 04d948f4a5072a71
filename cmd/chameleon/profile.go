package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

func init() {
	register("profile", "memory model vs the recorded curve, and logical layers with time estimates", runProfile)
}

// profileReport is the --json output of profile.
type profileReport struct {
	Schema            int     `json:"schema"`
	Command           string  `json:"command"`
	Trace             string  `json:"trace"`
	Iter              int     `json:"iter"`
	Ops               int     `json:"ops"`
	IterationMS       float64 `json:"iteration_ms"`
	PeakBytesRecorded int64   `json:"peak_bytes_recorded"`
	PeakBytesModel    int64   `json:"peak_bytes_model"`
	MaxOpErrorPct     float64 `json:"max_op_error_pct"`
	// TimeBase is where the estimated op times come from: "kernels" (a
	// --kernels file, or the Kineto kernels of an Execution Trace) or
	// "estimated" (the cost model).
	TimeBase string `json:"time_base"`
	// GroupsAsked is --groups; GroupsNote says how the group count follows
	// from it (or from --boundaries).
	GroupsAsked int            `json:"groups_asked"`
	GroupsNote  string         `json:"groups_note"`
	Groups      []profileGroup `json:"groups"`

	groups []layer.Group
}

type profileGroup struct {
	Phase       string  `json:"phase"`
	FirstOp     int     `json:"first_op"`
	LastOp      int     `json:"last_op"`
	Ops         int     `json:"ops"`
	EstimatedMS float64 `json:"estimated_ms"`
	MeasuredMS  float64 `json:"measured_ms"`
	PeakBytes   int64   `json:"peak_bytes"`
}

func runProfile(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("profile", "--trace FILE [--kineto FILE] [--iter K] [--groups N] [--json]", stderr)
	tf := addTraceFlags(fs)
	iter := iterFlag(fs)
	groups := groupsFlag(fs)
	bounds := fs.String("boundaries", "", "layer boundaries by hand: op seq numbers (`120,240,360`) or a module-path pattern (model.layers.*); replaces --groups")
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table (docs/json.md)")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := tf.check(); err != nil {
		return err
	}
	if err := checkIterGroups(*iter, *groups); err != nil {
		return err
	}
	grouper, how := plan.Discovered(*groups), "discovered"
	if *bounds != "" {
		g, err := plan.ParseBoundaries(*bounds)
		if err != nil {
			return fmt.Errorf("--boundaries: %w", err)
		}
		grouper, how = g, "boundaries"
	}
	tr, err := tf.loadWarn(stderr)
	if err != nil {
		if *tf.kernels != "" && strings.HasPrefix(err.Error(), "--kernels") {
			return err
		}
		return fmt.Errorf("--trace: %w", err)
	}
	k, err := pickIter(*iter, len(tr.Iterations))
	if err != nil {
		return err
	}
	est, base, err := tf.opTimes(tr, k)
	if err != nil {
		return err
	}
	opts := []plan.Option{plan.WithGrouper(grouper)}
	if est != nil {
		opts = append(opts, plan.WithEstimator(est))
	} else {
		base = layer.BaseEstimated
	}
	fmt.Fprintf(stderr, "profiling iteration %d of %s (time base: %s)\n", k, *tf.path, base)
	rep, err := buildProfile(tr, k, opts...)
	if err != nil {
		return err
	}
	rep.Schema, rep.Command, rep.Trace = schemaVersion, "profile", *tf.path
	rep.TimeBase, rep.GroupsAsked = base, *groups
	rep.GroupsNote = groupsNote(tr.Iterations[k].Ops, rep.groups, *groups, how)
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	writeProfileTable(stdout, rep)
	return nil
}

func buildProfile(tr *trace.Trace, k int, opts ...plan.Option) (profileReport, error) {
	it := tr.Iterations[k]
	// The planning path's Group stage, over the model's discovered layers
	// unless opts say otherwise.
	pre, err := plan.Prepare(plan.Input{Iter: it, LiveOut: memory.LiveOutFromTrace(tr, k)}, opts...)
	if err != nil {
		return profileReport{}, err
	}
	m := pre.Model
	rep := profileReport{
		Trace: tr.Name, Iter: it.Index, Ops: len(it.Ops), IterationMS: it.TimeMS,
		PeakBytesRecorded: it.PeakBytes, PeakBytesModel: m.Peak,
	}
	if it.HasMem() {
		var rec int64
		for i, op := range it.Ops {
			rec = max(rec, op.Mem)
			if op.Mem > 0 {
				rep.MaxOpErrorPct = max(rep.MaxOpErrorPct, 100*math.Abs(float64(m.Curve[i]-op.Mem))/float64(op.Mem))
			}
		}
		if rep.PeakBytesRecorded == 0 {
			rep.PeakBytesRecorded = rec
		}
	}
	// measured: dur_us as relative weights, scaled to the iteration time.
	var durSum float64
	for _, op := range it.Ops {
		durSum += op.DurUS
	}
	for _, g := range pre.Groups {
		pg := profileGroup{
			Phase: g.Phase.String(), FirstOp: it.Ops[g.First].Seq, LastOp: it.Ops[g.Last].Seq, Ops: g.Len(),
		}
		var dur float64
		for i := g.First; i <= g.Last; i++ {
			pg.EstimatedMS += pre.OpTimes[i] / 1000
			dur += it.Ops[i].DurUS
			pg.PeakBytes = max(pg.PeakBytes, m.Curve[i])
		}
		if durSum > 0 {
			pg.MeasuredMS = dur / durSum * it.TimeMS
		}
		rep.Groups = append(rep.Groups, pg)
	}
	rep.groups = pre.Groups
	return rep, nil
}

// groupsNote says how many groups a grouping made of ops and why that is
// not n per forward and backward where it is not: the optimizer and other
// phases are one group each, a phase may have fewer discovered layers (or
// ops) than n, and boundaries given by hand set the groups themselves.
func groupsNote(ops []trace.Op, gs []layer.Group, n int, how string) string {
	count := map[trace.Phase]int{}
	opsIn := map[trace.Phase]int{}
	for _, g := range gs {
		count[g.Phase]++
		opsIn[g.Phase] += g.Len()
	}
	other := len(gs) - count[trace.PhaseForward] - count[trace.PhaseBackward]
	note := fmt.Sprintf("%d groups: %d forward, %d backward, %d other (optimizer step)", len(gs),
		count[trace.PhaseForward], count[trace.PhaseBackward], other)
	if how == "boundaries" {
		return note + "; set by --boundaries (and phase changes), --groups not used"
	}
	note += fmt.Sprintf("; --groups %d is per forward and backward", n)
	var why []string
	for _, ph := range []trace.Phase{trace.PhaseForward, trace.PhaseBackward} {
		c := count[ph]
		switch {
		case c == 0 || c == n:
		case opsIn[ph] < n:
			why = append(why, fmt.Sprintf("the %s has only %d ops", phaseWord(ph), opsIn[ph]))
		case how == "discovered" && c < n:
			why = append(why, fmt.Sprintf("the %s has %d discovered layers with its prologue and epilogue, fewer than %d", phaseWord(ph), c, n))
		default:
			why = append(why, fmt.Sprintf("the %s got %d", phaseWord(ph), c))
		}
	}
	if len(why) > 0 {
		note += "; " + strings.Join(why, "; ")
	}
	return note
}

func phaseWord(p trace.Phase) string {
	switch p {
	case trace.PhaseForward:
		return "forward"
	case trace.PhaseBackward:
		return "backward"
	}
	return p.String()
}

func writeProfileTable(w io.Writer, r profileReport) {
	const gib = float64(1 << 30)
	fmt.Fprintf(w, "trace %s  iteration %d  %d ops  %.3f ms\n", r.Trace, r.Iter, r.Ops, r.IterationMS)
	fmt.Fprintf(w, "peak: recorded %.3f GiB, model %.3f GiB", float64(r.PeakBytesRecorded)/gib, float64(r.PeakBytesModel)/gib)
	if r.PeakBytesRecorded > 0 {
		fmt.Fprintf(w, " (%+.2f%%)", 100*float64(r.PeakBytesModel-r.PeakBytesRecorded)/float64(r.PeakBytesRecorded))
	}
	fmt.Fprintf(w, "; worst op error %.2f%%\n", r.MaxOpErrorPct)
	fmt.Fprintf(w, "time base: %s; %s\n\n", r.TimeBase, r.GroupsNote)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\tphase\tfirst\tlast\tops\test ms\tmeasured ms\tpeak GiB\t")
	for i, g := range r.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%.3f\t%.3f\t%.3f\t\n", i, g.Phase, g.FirstOp, g.LastOp, g.Ops, g.EstimatedMS, g.MeasuredMS, float64(g.PeakBytes)/gib)
	}
	tw.Flush()
}
