package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/chameleon-go/chameleon"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

func init() {
	register("plan", "plan swaps for one iteration under a memory limit and simulate them", runPlan)
}

// estimators are the op-time estimators --estimator picks from.
var estimators = map[string]layer.Estimator{
	"opcount": layer.OpCount{},
	"cost":    layer.Default(),
}

// defaultEstimator is the --estimator default; it names an entry of
// estimators: the H200 cost model, which the Group stage measured closest
// to the kernel timeline (docs/estimation.md).
var defaultEstimator = "cost"

// planConfig is what the plan subcommand needs besides the trace.
type planConfig struct {
	iter      int
	limit     string
	bandwidth float64 // bytes/s, one direction alone
	estimator layer.Estimator
	groups    int
	minBytes  int64
	prefetch  int
	margin    float64
}

// planReport is the --json output: one object.
type planReport struct {
	Trace           string  `json:"trace"`
	Iter            int     `json:"iter"`
	Ops             int     `json:"ops"`
	LimitBytes      int64   `json:"limit_bytes"`
	PeakBytesBefore int64   `json:"peak_bytes_before"`
	PeakBytesAfter  int64   `json:"peak_bytes_after"`
	IterationMSBase float64 `json:"iteration_ms_base"`
	IterationMSSim  float64 `json:"iteration_ms_simulated"`
	// IterationMSExec is the plan run as the Engine's executor runs it:
	// copy streams in issue order, copies issued per simulate.Issue.
	IterationMSExec  float64         `json:"iteration_ms_executor"`
	PeakBytesExec    int64           `json:"peak_bytes_executor"`
	OverheadPct      float64         `json:"overhead_pct"`
	OverheadPctBound float64         `json:"overhead_pct_bound"`
	Feasible         bool            `json:"feasible"`
	Shortfall        *shortfall      `json:"shortfall,omitempty"`
	BytesOut         int64           `json:"bytes_d2h"`
	BytesIn          int64           `json:"bytes_h2d"`
	UtilD2H          float64         `json:"link_util_d2h"`
	UtilH2D          float64         `json:"link_util_h2d"`
	Swaps            []simulate.Swap `json:"swaps"`
	Baselines        struct {
		SwapAll baseline `json:"swap_all"`
	} `json:"baselines"`

	policy *mre.Policy
	names  []string
}

type shortfall struct {
	Op    int   `json:"op"`
	Bytes int64 `json:"bytes"`
}

type baseline struct {
	PeakBytes   int64   `json:"peak_bytes"`
	IterationMS float64 `json:"iteration_ms"`
	OverheadPct float64 `json:"overhead_pct"`
}

func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tf := addTraceFlags(fs)
	path := tf.path
	iter := fs.Int("iter", 1, "iteration to plan (falls back to 0 when the trace has one)")
	limit := fs.String("limit", "", "memory limit: bytes (12GiB, 12e9, 12GB) or a percentage of the iteration's recorded peak (70%)")
	bw := fs.String("bandwidth", "55GB/s", "host link rate, one direction alone; congestion keeps the measured H200 ratios")
	est := fs.String("estimator", defaultEstimator, "op-time estimator: "+strings.Join(estimatorNames(), ", "))
	groups := fs.Int("groups", 32, "logical layers per forward and backward (uniform grouping)")
	minBytes := fs.String("min-bytes", "1MiB", "smallest candidate tensor")
	prefetch := fs.Int("prefetch", mre.DefaultPrefetchLayers, "swap-in trigger, in logical layers ahead of the next use")
	margin := fs.Float64("margin", 0, "safety margin on copy times (0.15 for Ascend-like devices)")
	asJSON := fs.Bool("json", false, "print one JSON object; an infeasible limit prints feasible:false with the shortfall and exits 0")
	plotPath := fs.String("plot", "", "draw memory before/after, the limit and the swap spans (`file`.svg or .png)")
	perfetto := fs.String("perfetto", "", "write the simulated timeline as Chrome trace JSON (`file`, opens in Perfetto)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" || *limit == "" {
		return errors.New("--trace and --limit are required")
	}
	rate, err := parseBandwidth(*bw)
	if err != nil {
		return fmt.Errorf("--bandwidth: %w", err)
	}
	e, ok := estimators[*est]
	if !ok {
		return fmt.Errorf("--estimator: unknown %q (have %s)", *est, strings.Join(estimatorNames(), ", "))
	}
	mb, err := chameleon.ParseBytes(*minBytes)
	if err != nil {
		return fmt.Errorf("--min-bytes: %w", err)
	}
	fmt.Fprintf(stderr, "reading %s\n", *path)
	tr, err := tf.load()
	if err != nil {
		return err
	}
	cfg := planConfig{iter: *iter, limit: *limit, bandwidth: rate, estimator: e, groups: *groups, minBytes: mb, prefetch: *prefetch, margin: *margin}
	fmt.Fprintf(stderr, "planning iteration %d\n", cfg.iter)
	rep, err := planTrace(tr, cfg)
	if err != nil && !(*asJSON && errors.Is(err, mre.ErrInfeasible)) {
		return err
	}
	if *plotPath != "" && rep.policy != nil {
		if err := plotPlan(*plotPath, rep); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
	}
	if *perfetto != "" && rep.policy != nil {
		f, err := os.Create(*perfetto)
		if err != nil {
			return fmt.Errorf("--perfetto: %w", err)
		}
		werr := rep.policy.Sim.WriteChromeTrace(f, rep.names, rep.policy.Swaps)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("--perfetto: %w", werr)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(rep)
	}
	printPlan(stdout, rep)
	return nil
}

func estimatorNames() []string {
	var out []string
	for n := range estimators {
		out = append(out, n)
	}
	return out
}

// planTrace plans one iteration of tr. On an infeasible limit it returns
// the report (Feasible false, Shortfall set) with the error.
func planTrace(tr *trace.Trace, cfg planConfig) (*planReport, error) {
	k := cfg.iter
	if k >= len(tr.Iterations) && len(tr.Iterations) == 1 {
		k = 0
	}
	if k < 0 || k >= len(tr.Iterations) {
		return nil, fmt.Errorf("iteration %d: trace has %d", cfg.iter, len(tr.Iterations))
	}
	it := tr.Iterations[k]
	if len(it.Ops) == 0 {
		return nil, fmt.Errorf("iteration %d has no ops", k)
	}
	m := memory.Build(it, memory.LiveOutFromTrace(tr, k))
	in := mre.Input{Model: m}
	curve := in.ResolveCurve()
	in.Curve = curve
	peak := int64(0)
	for _, v := range curve {
		peak = max(peak, v)
	}
	limit, err := chameleon.ParseLimit(cfg.limit, peak)
	if err != nil {
		return nil, fmt.Errorf("--limit: %w", err)
	}
	in.Limit = limit
	if it.TimeMS <= 0 {
		// No uninstrumented time: fall back to the instrumented one.
		var sum float64
		for _, op := range it.Ops {
			sum += op.DurUS
		}
		it.TimeMS = sum / 1000
	}
	est := cfg.estimator
	if est == nil {
		est = estimators[defaultEstimator]
	}
	in.OpTimes = est.Estimate(it)
	in.Groups = layer.Uniform(it.Ops, cfg.groups)
	link := simulate.H200()
	if cfg.bandwidth > 0 {
		link = link.Scaled(cfg.bandwidth)
	}
	rep := &planReport{Trace: filepath.Base(tr.Name), Iter: k, Ops: len(it.Ops), LimitBytes: limit, PeakBytesBefore: peak}
	rep.names = make([]string, len(it.Ops))
	for t := range it.Ops {
		rep.names[t] = it.Ops[t].Name
	}
	var base float64
	for _, d := range in.OpTimes {
		base += d
	}
	rep.IterationMSBase = base / 1000
	b := mre.LowerBound(curve, limit, in.OpTimes, link.D2H, link.H2D)
	rep.OverheadPctBound = b.OverheadPct
	// The baseline and the plan are independent: simulate them at once.
	var g errgroup.Group
	g.Go(func() error {
		sim, err := simulate.Run(simulate.Input{OpTimes: in.OpTimes, Curve: curve, Swaps: mre.SwapAll(m), Link: link})
		if err != nil {
			return fmt.Errorf("swap-all baseline: %w", err)
		}
		rep.Baselines.SwapAll = baseline{PeakBytes: sim.Peak, IterationMS: sim.IterationUS / 1000, OverheadPct: sim.OverheadPct()}
		return nil
	})
	var pol *mre.Policy
	g.Go(func() error {
		pol, err = mre.Plan(in,
			mre.WithLink(link), mre.WithMinBytes(cfg.minBytes), mre.WithPrefetchLayers(cfg.prefetch), mre.WithSafetyMargin(cfg.margin))
		return nil // reported below, with the report it leaves
	})
	if gerr := g.Wait(); gerr != nil {
		return nil, gerr
	}
	if err != nil {
		var ie *mre.InfeasibleError
		if errors.As(err, &ie) {
			rep.Shortfall = &shortfall{Op: it.Ops[ie.Op].Seq, Bytes: ie.Shortfall}
			rep.PeakBytesAfter = peak
			rep.IterationMSSim = rep.IterationMSBase
			rep.Swaps = []simulate.Swap{}
		}
		return rep, fmt.Errorf("iteration %d, limit %d bytes: %w", k, limit, err)
	}
	rep.policy = pol
	rep.Feasible = true
	rep.PeakBytesAfter = pol.Sim.Peak
	rep.IterationMSSim = pol.Sim.IterationUS / 1000
	exec, err := simulate.Run(simulate.Input{OpTimes: in.OpTimes, Curve: curve, Swaps: pol.Swaps, Link: link,
		Issue: simulate.Issue(pol.Swaps, pol.Sim)})
	if err != nil {
		return nil, fmt.Errorf("executor order: %w", err)
	}
	rep.IterationMSExec, rep.PeakBytesExec = exec.IterationUS/1000, exec.Peak
	rep.OverheadPct = pol.Sim.OverheadPct()
	rep.BytesOut, rep.BytesIn = pol.Sim.BytesD2H, pol.Sim.BytesH2D
	rep.UtilD2H, rep.UtilH2D = pol.Sim.UtilD2H(), pol.Sim.UtilH2D()
	// Report op numbers as the trace's seq numbers.
	rep.Swaps = make([]simulate.Swap, len(pol.Swaps))
	for x, s := range pol.Swaps {
		seqOf := func(x int) int {
			if x == len(it.Ops) { // a wrapping swap's copy out ends after the iteration
				return it.Ops[x-1].Seq + 1
			}
			return it.Ops[x].Seq
		}
		s.Out, s.Free, s.In, s.Use = seqOf(s.Out), seqOf(s.Free), seqOf(s.In), seqOf(s.Use)
		rep.Swaps[x] = s
	}
	return rep, nil
}

func printPlan(w io.Writer, r *planReport) {
	fmt.Fprintf(w, "trace %s, iteration %d, %d ops\n", r.Trace, r.Iter, r.Ops)
	fmt.Fprintf(w, "limit %s, peak %s\n", fmtBytes(r.LimitBytes), fmtBytes(r.PeakBytesBefore))
	if !r.Feasible {
		fmt.Fprintf(w, "infeasible: %s over the limit at op %d\n", fmtBytes(r.Shortfall.Bytes), r.Shortfall.Op)
		return
	}
	fmt.Fprintf(w, "peak after %s, %d swaps, %s out, %s in\n", fmtBytes(r.PeakBytesAfter), len(r.Swaps), fmtBytes(r.BytesOut), fmtBytes(r.BytesIn))
	fmt.Fprintf(w, "iteration %.2f ms -> %.2f ms simulated: overhead %.2f%% (bound %.2f%%)\n",
		r.IterationMSBase, r.IterationMSSim, r.OverheadPct, r.OverheadPctBound)
	fmt.Fprintf(w, "link busy: d2h %.0f%%, h2d %.0f%%\n", r.UtilD2H*100, r.UtilH2D*100)
	sa := r.Baselines.SwapAll
	fmt.Fprintf(w, "swap-all (save_on_cpu): peak %s, %.2f ms, overhead %.1f%%\n", fmtBytes(sa.PeakBytes), sa.IterationMS, sa.OverheadPct)
}

func fmtBytes(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// parseBandwidth reads "55GB/s" (bytes per second; "/s" optional).
func parseBandwidth(s string) (float64, error) {
	v, err := chameleon.ParseBytes(strings.TrimSuffix(strings.TrimSpace(s), "/s"))
	if err != nil {
		return 0, err
	}
	if v <= 0 {
		return 0, fmt.Errorf("bandwidth must be positive: %q", s)
	}
	return float64(v), nil
}

// plotPlan draws the recorded curve before and after the plan, the limit
// and each swap's span (from its free op to its trigger, at the height of
// its size above the axis), to SVG or PNG by the file's extension.
func plotPlan(path string, r *planReport) error {
	pol := r.policy
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s iter %d: limit %s, overhead %.1f%% (bound %.1f%%)",
		r.Trace, r.Iter, fmtBytes(r.LimitBytes), r.OverheadPct, r.OverheadPctBound)
	p.X.Label.Text = "op"
	p.Y.Label.Text = "GiB"
	gib := func(b int64) float64 { return float64(b) / (1 << 30) }
	n := len(pol.Curve)
	before := make(plotter.XYs, n)
	after := make(plotter.XYs, n)
	for t := range n {
		before[t] = plotter.XY{X: float64(t), Y: gib(pol.Curve[t])}
		after[t] = plotter.XY{X: float64(t), Y: gib(pol.Sim.Ops[t].Mem)}
	}
	lb, err := plotter.NewLine(before)
	if err != nil {
		return err
	}
	lb.Color = plotColor(120, 120, 120)
	la, err := plotter.NewLine(after)
	if err != nil {
		return err
	}
	la.Color = plotColor(20, 90, 200)
	lim, err := plotter.NewLine(plotter.XYs{{X: 0, Y: gib(r.LimitBytes)}, {X: float64(n - 1), Y: gib(r.LimitBytes)}})
	if err != nil {
		return err
	}
	lim.Color = plotColor(210, 30, 30)
	lim.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(lb, la, lim)
	p.Legend.Add("recorded", lb)
	p.Legend.Add("with swaps", la)
	p.Legend.Add("limit", lim)
	for x, s := range pol.Swaps {
		y := gib(s.Bytes)
		seg, err := plotter.NewLine(plotter.XYs{{X: float64(pol.Sim.Freed[x]), Y: y}, {X: float64(s.In), Y: y}})
		if err != nil {
			return err
		}
		seg.Color = plotColor(30, 160, 80)
		p.Add(seg)
		if x == 0 {
			p.Legend.Add("swap span (height: size)", seg)
		}
	}
	p.Legend.Top = true
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}

func plotColor(r, g, b uint8) color.Color { return color.RGBA{R: r, G: g, B: b, A: 255} }
