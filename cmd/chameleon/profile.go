package main

import (
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

func init() {
	register("profile", "memory model vs the recorded curve, and logical layers with time estimates", runProfile)
}

// profileReport is the --json output of profile.
type profileReport struct {
	Schema            int            `json:"schema"`
	Command           string         `json:"command"`
	Trace             string         `json:"trace"`
	Iter              int            `json:"iter"`
	Ops               int            `json:"ops"`
	IterationMS       float64        `json:"iteration_ms"`
	PeakBytesRecorded int64          `json:"peak_bytes_recorded"`
	PeakBytesModel    int64          `json:"peak_bytes_model"`
	MaxOpErrorPct     float64        `json:"max_op_error_pct"`
	Groups            []profileGroup `json:"groups"`
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
	tr, err := tf.load()
	if err != nil {
		return fmt.Errorf("--trace: %w", err)
	}
	k, err := pickIter(*iter, len(tr.Iterations))
	if err != nil {
		return err
	}
	rep, err := buildProfile(tr, k, *groups)
	if err != nil {
		return err
	}
	rep.Schema, rep.Command, rep.Trace = schemaVersion, "profile", *tf.path
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	writeProfileTable(stdout, rep)
	return nil
}

func buildProfile(tr *trace.Trace, k, n int) (profileReport, error) {
	it := tr.Iterations[k]
	// The planning path's Group stage, over the model's discovered layers.
	pre, err := plan.Prepare(plan.Input{Iter: it, LiveOut: memory.LiveOutFromTrace(tr, k)}, plan.WithGrouper(plan.Discovered(n)))
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
	return rep, nil
}

func writeProfileTable(w io.Writer, r profileReport) {
	const gib = float64(1 << 30)
	fmt.Fprintf(w, "trace %s  iteration %d  %d ops  %.3f ms\n", r.Trace, r.Iter, r.Ops, r.IterationMS)
	fmt.Fprintf(w, "peak: recorded %.3f GiB, model %.3f GiB", float64(r.PeakBytesRecorded)/gib, float64(r.PeakBytesModel)/gib)
	if r.PeakBytesRecorded > 0 {
		fmt.Fprintf(w, " (%+.2f%%)", 100*float64(r.PeakBytesModel-r.PeakBytesRecorded)/float64(r.PeakBytesRecorded))
	}
	fmt.Fprintf(w, "; worst op error %.2f%%\n\n", r.MaxOpErrorPct)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "group\tphase\tfirst\tlast\tops\test ms\tmeasured ms\tpeak GiB\t")
	for i, g := range r.Groups {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%.3f\t%.3f\t%.3f\t\n", i, g.Phase, g.FirstOp, g.LastOp, g.Ops, g.EstimatedMS, g.MeasuredMS, float64(g.PeakBytes)/gib)
	}
	tw.Flush()
}
