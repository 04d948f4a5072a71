package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/samber/lo"
	"golang.org/x/sync/errgroup"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

func init() {
	register("plan", "plan swaps for one iteration under a memory limit and simulate them", runPlan)
}

// estimators are the op-time estimators --estimator picks from.
var estimators = map[string]layer.Estimator{
	"opcount":  layer.OpCount{},
	"cost":     layer.Default(),
	"recorded": layer.Recorded{},
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
	grouping  string // discovered or uniform
	minBytes  int64
	prefetch  int // logical layers; the flag's default is mre's
	margin    float64
	curve     string       // recorded or model
	tiers     []int        // percent of the limit; nil: the planning path's
	recompute bool         // drop and recompute what mre.Recomputable allows
	noLayout  bool         // plan for the byte count alone (--layout=false)
	page      int64        // the layout's page (--page); 0: CUDA's for the limit
	grouper   plan.Grouper // --boundaries; nil: grouping and groups
	timeBase  string       // where the op times come from (layer.Base*)
	plotTime  bool         // --plot-x time
	// hostBudget is the pinned host memory the swaps may hold at once
	// (--host-budget, plan.WithHostLimit); 0: none.
	hostBudget int64
}

// planOptions are cfg's settings of the planning path; what a field leaves
// at its zero value keeps the planning path's default, which is the
// Engine's.
func (cfg planConfig) planOptions() ([]plan.Option, error) {
	var opts []plan.Option
	groups := cmp.Or(cfg.groups, plan.DefaultGroups)
	switch cfg.grouping {
	case "", "uniform":
		opts = append(opts, plan.WithGrouper(plan.Uniform(groups)))
	case "discovered":
		opts = append(opts, plan.WithGrouper(plan.Discovered(groups)))
	default:
		return nil, fmt.Errorf("--grouping: %q, want discovered or uniform", cfg.grouping)
	}
	if cfg.grouper != nil {
		opts = append(opts, plan.WithGrouper(cfg.grouper))
	}
	switch cfg.curve {
	case "", "recorded":
		opts = append(opts, plan.WithRecordedCurve())
	case "model":
	default:
		return nil, fmt.Errorf("--curve: %q, want recorded or model", cfg.curve)
	}
	if cfg.estimator != nil {
		opts = append(opts, plan.WithEstimator(cfg.estimator))
	}
	if cfg.tiers != nil {
		opts = append(opts, plan.WithTiers(cfg.tiers...))
	}
	if cfg.recompute {
		opts = append(opts, plan.WithRecompute(mre.Recomputable))
	}
	if cfg.noLayout {
		opts = append(opts, plan.WithoutLayout())
	} else if cfg.page > 0 {
		opts = append(opts, plan.WithLayout(cfg.page, 0))
	}
	if cfg.bandwidth > 0 {
		opts = append(opts, plan.WithLink(simulate.H200().Scaled(cfg.bandwidth)))
	}
	if cfg.hostBudget > 0 {
		opts = append(opts, plan.WithHostLimit(cfg.hostBudget))
	}
	mo := []mre.Option{mre.WithPrefetchLayers(cfg.prefetch)}
	if cfg.minBytes > 0 {
		mo = append(mo, mre.WithMinBytes(cfg.minBytes))
	}
	if cfg.margin > 0 {
		mo = append(mo, mre.WithSafetyMargin(cfg.margin))
	}
	return append(opts, plan.WithPlanOptions(mo...)), nil
}

// waits is the time ops waited for copies, in milliseconds: the step's
// first op for the copies out the step before left running, ops for
// copies out to end before their memory counts free, and ops for copies
// back before their use.
type waits struct {
	StepStart  float64 `json:"step_start"`
	CopiesOut  float64 `json:"copies_out"`
	CopiesBack float64 `json:"copies_back"`
}

// layoutReport is plan.Layout in the --json output.
type layoutReport struct {
	PageBytes    int64 `json:"page_bytes"`
	NeedBytes    int64 `json:"need_bytes"`
	TouchedPages int64 `json:"touched_pages"`
	MostPages    int64 `json:"most_pages"`
	Blocks       int   `json:"blocks"`
	Fits         bool  `json:"fits"`
	Replans      int   `json:"replans"`
}

// planReport is the --json output: one object.
type planReport struct {
	Schema     int    `json:"schema"`
	Command    string `json:"command"`
	Trace      string `json:"trace"`
	Iter       int    `json:"iter"`
	Ops        int    `json:"ops"`
	LimitBytes int64  `json:"limit_bytes"`
	// PlannedBytes is what the plan was made for: the limit, or lower where
	// the plan's blocks, laid out in device memory, did not fit it (Layout).
	PlannedBytes int64 `json:"planned_limit_bytes"`
	// HeldBytes and HeldOps: where the plan's blocks did not fit, the
	// most bytes the plan keeps free below PlannedBytes at one op, and at
	// how many ops it keeps some (plan.Result.Held); 0 when none.
	HeldBytes int64 `json:"held_bytes"`
	HeldOps   int   `json:"held_ops"`
	// Layout is where the plan's blocks go (absent with --layout=false).
	Layout     *layoutReport `json:"layout,omitempty"`
	Groups     int           `json:"groups"`
	GroupsNote string        `json:"groups_note"`
	// PlanGroups is the logical layers the plan kept counted its prefetch
	// distances in: Groups, or each of them halved where that plan was
	// the better (plan.Result.PlanGroups).
	PlanGroups int `json:"plan_groups"`
	// TimeBase is where the op times come from: "kernels" (--kernels, or
	// the Kineto kernels of an Execution Trace), "recorded" (the trace's
	// per-op durations, --estimator recorded) or "estimated".
	TimeBase        string  `json:"time_base"`
	Curve           string  `json:"curve"`
	PeakBytesBefore int64   `json:"peak_bytes_before"`
	PeakBytesAfter  int64   `json:"peak_bytes_after"`
	IterationMSBase float64 `json:"iteration_ms_base"`
	IterationMSSim  float64 `json:"iteration_ms_simulated"`
	// IterationMSExec is the plan run as the Engine's executor runs it:
	// copy streams in issue order, copies issued per simulate.Issue.
	IterationMSExec  float64 `json:"iteration_ms_executor"`
	PeakBytesExec    int64   `json:"peak_bytes_executor"`
	OverheadPct      float64 `json:"overhead_pct"`
	OverheadPctBound float64 `json:"overhead_pct_bound"`
	// OverheadPctBoundPlanned is the bound at the planned limit tier.
	OverheadPctBoundPlanned float64 `json:"overhead_pct_bound_planned"`
	// OverheadPctBoundRecompute (with --recompute) is mre.RecomputeBound
	// at the limit: no plan of swaps and recomputes is faster.
	OverheadPctBoundRecompute *float64 `json:"overhead_pct_bound_recompute,omitempty"`
	// TrafficBoundBytes is mre.TrafficBound at the limit: no plan copies
	// fewer bytes in an iteration run over and over (with --recompute,
	// what may be made again counts as dropped for free), and
	// TrafficBoundMS the time the link takes to carry them in.
	TrafficBoundBytes int64      `json:"traffic_bound_bytes"`
	TrafficBoundMS    float64    `json:"traffic_bound_ms"`
	Feasible          bool       `json:"feasible"`
	Shortfall         *shortfall `json:"shortfall,omitempty"`
	// Error says why no plan was made when the limit cannot be met
	// (Feasible false), and LowestFeasible is the lowest limit a plan
	// meets, in bytes and in percent of PeakBytesBefore; absent otherwise.
	Error               string  `json:"error,omitempty"`
	LowestFeasibleBytes int64   `json:"lowest_feasible_limit_bytes,omitempty"`
	LowestFeasiblePct   float64 `json:"lowest_feasible_limit_pct,omitempty"`
	BytesOut            int64   `json:"bytes_d2h"`
	BytesIn             int64   `json:"bytes_h2d"`
	// BytesReleased is the bytes of swaps that copy nothing out (their
	// host copy is current: "d2h": false), released on the device.
	BytesReleased int64 `json:"bytes_released"`
	// WriteBacks and BytesWrittenBack count the swaps whose copy out is a
	// write-back (simulate.Swap.Early: "copy_out_after_op"), issued at the
	// tensor's last write while it stays on the device, and their bytes
	// (in bytes_d2h).
	WriteBacks       int   `json:"write_backs"`
	BytesWrittenBack int64 `json:"bytes_written_back"`
	// StreamingBoundMS bounds the step run over and over in steady state
	// (swaps may cross the iteration boundary): mre.StreamingBound at the
	// limit, and at the planned tier.
	StreamingBoundMS        float64 `json:"streaming_bound_ms"`
	StreamingBoundMSPlanned float64 `json:"streaming_bound_ms_planned"`
	// HostPeakBytes is the most pinned host memory the plan's swaps hold
	// at once (plan.HostPeak); HostBudgetBytes is --host-budget (0: none).
	HostPeakBytes   int64   `json:"host_peak_bytes"`
	HostBudgetBytes int64   `json:"host_budget_bytes,omitempty"`
	UtilD2H         float64 `json:"link_util_d2h"`
	UtilH2D         float64 `json:"link_util_h2d"`
	// LinkParts is the same by part of the step (trace.StepParts,
	// simulate.Result.PartsBusy): where the link in one direction is full
	// and the other idle.
	LinkParts []simulate.PartBusy `json:"link_util_by_part,omitempty"`
	// Waits is the time ops waited for copies on the simulated timeline,
	// by what they waited for (simulate.Result's WaitStartUS, WaitOutUS,
	// WaitInUS).
	Waits *waits `json:"waits_ms,omitempty"`
	// WaitsByKind is the same time by the kind of the tensor whose copy
	// the ops waited for (simulate.Result.SwapWaitUS); absent when no plan
	// was made.
	WaitsByKind *kindMS `json:"waits_by_kind_ms,omitempty"`
	// WaitsQueuedMS is the part of those waits during which none of the
	// copies the waiting op needs was on the link
	// (simulate.Result.WaitQueuedUS): queued behind a copy it does not
	// need, or not yet issued. Absent when no plan was made.
	WaitsQueuedMS *float64        `json:"waits_queued_ms,omitempty"`
	Swaps         []simulate.Swap `json:"swaps"`
	// LargestSwaps are the 10 largest swaps, largest first, with the op
	// that makes each tensor; PeakBreakdown the peak before and after the
	// plan by tensor kind. Both absent when no plan was made.
	LargestSwaps  []largeSwap     `json:"largest_swaps,omitempty"`
	PeakBreakdown *peakBreakdowns `json:"peak_breakdown,omitempty"`
	// Traffic is bytes_h2d and bytes_d2h by tensor kind; absent when no
	// plan was made.
	Traffic *trafficByKind `json:"traffic_by_kind,omitempty"`
	// Recomputes (with --recompute) name ops by their trace seq numbers;
	// overhead_pct includes their time.
	Recomputes      []simulate.Recompute `json:"recomputes"`
	BytesRecomputed int64                `json:"bytes_recomputed"`
	RecomputeMS     float64              `json:"recompute_ms"`
	Baselines       struct {
		SwapAll baseline `json:"swap_all"`
	} `json:"baselines"`

	policy *mre.Policy
	sim    *simulate.Result // the policy as the executor issues it
	names  []string
	before []int64 // the curve the plan keeps under the limit
	// plotTime (--plot-x time) draws --plot over opMS, each op's start
	// without the plan in ms, and the iteration's end.
	plotTime bool
	opMS     []float64
	// groups are the plan's logical layers, over which --plot draws how
	// busy the link is.
	groups []layer.Group

	// When the limit cannot be met: what was planned (in.Limit the
	// limit), the curve kept under it, the planner's shortfall, the op
	// index of Shortfall.Op, and whether recomputes were allowed.
	in         plan.Input
	curve      []int64
	infeasible *mre.InfeasibleError
	shortAt    int
	recompute  bool
}

type shortfall struct {
	Op    int   `json:"op"`
	Bytes int64 `json:"bytes"`
	// Name and Module are the op's; Lists is the bytes of the tensors it
	// lists, which are all resident while it runs; Pieces says it is made
	// of independent pieces (trace.Divide), which --split runs one by one.
	Name   string `json:"name"`
	Module string `json:"module,omitempty"`
	Lists  int64  `json:"lists_bytes"`
	Pieces bool   `json:"pieces,omitempty"`
}

// newShortfall is the shortfall of bytes at op index i of it.
func newShortfall(it *trace.Iteration, i int, bytes int64) *shortfall {
	op := &it.Ops[i]
	s := &shortfall{Op: op.Seq, Bytes: bytes, Name: op.Name, Module: op.Module}
	seen := make(map[trace.TensorID]bool, len(op.In)+len(op.Out))
	for _, id := range slices.Concat(op.In, op.Out) {
		if t := it.Tensors[id]; t != nil && !seen[id] {
			seen[id] = true
			s.Lists += t.Bytes
		}
	}
	_, s.Pieces = trace.Divide(it, op)
	return s
}

// String says where the shortfall is: the op, what it lists itself, and
// whether --split would run it in pieces.
func (s *shortfall) String() string {
	where := s.Name
	if s.Module != "" {
		where += " in " + s.Module
	}
	msg := fmt.Sprintf("op %d (%s, which lists %s itself)", s.Op, where, fmtBytes(s.Lists))
	if s.Pieces {
		msg += ", an op made of independent pieces that --split runs one by one"
	}
	return msg
}

type baseline struct {
	PeakBytes   int64   `json:"peak_bytes"`
	IterationMS float64 `json:"iteration_ms"`
	OverheadPct float64 `json:"overhead_pct"`
}

func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", "--trace FILE [--kineto FILE] --limit 12GiB|70% [--iter K] [--json] [--plot F.svg|F.png] [--perfetto F.json] ...", stderr)
	tf := addTraceFlags(fs)
	path := tf.path
	iter := iterFlag(fs)
	limit := fs.String("limit", "", "memory limit: a share of the iteration's recorded peak in (0%, 100%] (70%), or bytes with a unit (12GiB, 12GB, 12e9B)")
	bw := fs.String("bandwidth", "55GB/s", "host link rate, one direction alone, in "+bandwidthHelp+"; congestion keeps the measured H200 ratios")
	est := fs.String("estimator", defaultEstimator, "op-time estimator: "+strings.Join(estimatorNames(), ", "))
	groups := groupsFlag(fs)
	grouping := fs.String("grouping", "uniform", "logical layers: uniform (equal op counts, as the Engine groups) or discovered (the repeating block)")
	curve := fs.String("curve", "recorded", "the curve kept under the limit: recorded (op.mem, where the trace has it) or model (the memory model's, as the Engine plans)")
	minBytes := fs.String("min-bytes", "1MiB", "smallest candidate tensor")
	prefetch := fs.Int("prefetch", mre.DefaultPrefetchLayers, "swap-in trigger, in logical layers ahead of the next use (0 or more)")
	margin := fs.Float64("margin", 0, "safety margin on copy times (0.15 for Ascend-like devices)")
	recompute := fs.Bool("recompute", true, "drop tensors of ops that can run again (no random numbers, no in-place writes) and recompute them before their next use, beside swaps; --recompute=false plans swaps alone")
	layout := fs.Bool("layout", true, "lay the plan's blocks out in device memory and plan again for less until they fit, as the Engine does; --layout=false plans for the byte count alone")
	page := fs.String("page", "", "the page the layout counts in, a power of two with a unit (2MiB); default CUDA's for the limit, 2 to 16 MiB")
	bounds := fs.String("boundaries", "", "layer boundaries by hand: op seq numbers (`120,240,360`) or a module-path pattern (model.layers.*); replaces --grouping and --groups")
	tiers := fs.String("tiers", "", "shares of the limit planned for in turn, in percent (default the Engine's: 100, the limit alone, lowered by the layout as needed); an escape hatch")
	asJSON := fs.Bool("json", false, "print one JSON object (docs/json.md); a limit no plan meets prints feasible:false with the error, the shortfall and the lowest feasible limit, and exits 1")
	plotPath := fs.String("plot", "", "draw memory before/after, the limit, the swap spans and the recompute spans (`file`.svg or .png); for a limit no plan meets, the curve, the limit and the lowest feasible limit")
	plotX := fs.String("plot-x", "op", "--plot's x axis: op (op index) or time (ms, each op at its start by the op times without the plan)")
	hostBudget := fs.String("host-budget", "0", "pinned host memory the plan's swaps may hold at once, bytes with a unit (64GiB; chameleon.WithHostBudget's share): a plan over it is refused and the error says the host budget binds; 0: none")
	perfetto := fs.String("perfetto", "", "write the simulated timeline as Chrome trace JSON (`file`, opens in Perfetto), with a memory counter track before and after the plan")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	cfg, err := planFlags{trace: tf, iter: *iter, limit: *limit, bandwidth: *bw, estimator: *est, groups: *groups, grouping: *grouping,
		curve: *curve, minBytes: *minBytes, prefetch: *prefetch, margin: *margin, recompute: *recompute, tiers: *tiers, plot: *plotPath, plotX: *plotX,
		boundaries: *bounds, noLayout: !*layout, page: *page, hostBudget: *hostBudget}.check()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "reading %s\n", *path)
	tr, err := tf.loadWarn(stderr)
	if err != nil {
		return err
	}
	if err := allocatesNothing(tr, *path); err != nil {
		return err
	}
	if k := planIter(tr, cfg.iter); k >= 0 {
		kest, base, err := tf.opTimes(tr, k)
		if err != nil {
			return err
		}
		if kest != nil {
			cfg.estimator, cfg.timeBase = kest, base
		}
	}
	shown := planIter(tr, cfg.iter)
	if shown < 0 {
		shown = cfg.iter
	}
	fmt.Fprintf(stderr, "planning iteration %d of %s (time base: %s; link %s each way alone)\n", shown, *path, cfg.timeBase, rateString(cfg.bandwidth))
	rep, err := planTrace(tr, cfg)
	if err != nil && (rep == nil || rep.infeasible == nil) {
		return err
	}
	rep.Schema, rep.Command, rep.Trace = schemaVersion, "plan", *path
	if err != nil {
		return planInfeasible(stdout, stderr, rep, cfg, *asJSON, *plotPath, *perfetto)
	}
	if *plotPath != "" && rep.policy != nil {
		if err := plotPlan(*plotPath, rep); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		fmt.Fprintf(stderr, "wrote %s\n", *plotPath)
	}
	if *perfetto != "" && rep.policy != nil {
		f, err := os.Create(*perfetto)
		if err != nil {
			return fmt.Errorf("--perfetto: %w", err)
		}
		werr := writePerfetto(f, rep)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("--perfetto: %w", werr)
		}
		fmt.Fprintf(stderr, "wrote %s\n", *perfetto)
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	printPlan(stdout, rep)
	return nil
}

func estimatorNames() []string {
	names := lo.Keys(estimators)
	slices.Sort(names)
	return names
}

// planTrace plans one iteration of tr on the planning path the Engine
// uses (plan.Make), with the recorded curve unless cfg says otherwise. On
// an infeasible limit it returns the report (Feasible false, Shortfall set)
// with the error.
func planTrace(tr *trace.Trace, cfg planConfig) (*planReport, error) {
	k := cfg.iter
	if k >= len(tr.Iterations) && len(tr.Iterations) == 1 {
		k = 0
	}
	return planIterOf(tr, k, cfg)
}

// planIter is the iteration --iter plans: itself, or 0 in a trace of one;
// -1 when out of range.
func planIter(tr *trace.Trace, iter int) int {
	if iter >= len(tr.Iterations) && len(tr.Iterations) == 1 {
		return 0
	}
	if iter < 0 || iter >= len(tr.Iterations) {
		return -1
	}
	return iter
}

func planIterOf(tr *trace.Trace, k int, cfg planConfig) (*planReport, error) {
	if k < 0 || k >= len(tr.Iterations) {
		return nil, fmt.Errorf("iteration %d: trace has %d", cfg.iter, len(tr.Iterations))
	}
	it := tr.Iterations[k]
	if len(it.Ops) == 0 {
		return nil, fmt.Errorf("iteration %d has no ops", k)
	}
	return planIteration(filepath.Base(tr.Name), k, plan.Input{Iter: it, LiveOut: memory.LiveOutFromTrace(tr, k)}, cfg)
}

// planIteration plans iteration k of the named trace (in.Limit is taken
// from cfg.limit).
func planIteration(name string, k int, in plan.Input, cfg planConfig) (*planReport, error) {
	it := in.Iter
	opts, err := cfg.planOptions()
	if err != nil {
		return nil, err
	}
	// The limit may be a share of the peak of the curve the plan keeps
	// under it, which the Group stage makes.
	pre, err := plan.Prepare(in, opts...)
	if err != nil {
		return nil, err
	}
	peak := slices.Max(pre.Curve)
	curve := cmp.Or(cfg.curve, "recorded")
	if !it.HasMem() {
		curve = "model"
	}
	if peak <= 0 && isShare(cfg.limit) {
		return nil, fmt.Errorf("--limit %s: the peak of iteration %d of %s is 0 bytes (%s curve), so no share of it is a limit: give the limit in bytes (--limit 12GiB)",
			strings.TrimSpace(cfg.limit), k, name, curve)
	}
	if in.Limit, err = parseLimit(cfg.limit, peak); err != nil {
		return nil, err
	}
	if in.Limit <= 0 {
		return nil, fmt.Errorf("--limit %s of the peak of %d bytes of iteration %d of %s is under one byte: give the limit in bytes (--limit 12GiB)",
			strings.TrimSpace(cfg.limit), peak, k, name)
	}
	link := simulate.H200()
	if cfg.bandwidth > 0 {
		link = link.Scaled(cfg.bandwidth)
	}
	rep := &planReport{Trace: name, Iter: k, Ops: len(it.Ops), LimitBytes: in.Limit, PeakBytesBefore: peak,
		Groups: len(pre.Groups), Curve: curve, TimeBase: cmp.Or(cfg.timeBase, layer.BaseEstimated),
		GroupsNote: groupsNote(it.Ops, pre.Groups, cmp.Or(cfg.groups, plan.DefaultGroups), lo.Ternary(cfg.grouper != nil, "boundaries", cmp.Or(cfg.grouping, "uniform")))}
	rep.names = make([]string, len(it.Ops))
	for t := range it.Ops {
		rep.names[t] = it.Ops[t].Name
	}
	// The swap-all baseline needs only what the Group stage made: simulate
	// it while the plan is made.
	var g errgroup.Group
	baselineOf := func(r *plan.Result) {
		// What the Group stage made, taken now: plan.Make goes on writing
		// r while the baseline runs.
		opTimes, curve, model := r.OpTimes, r.Curve, r.Model
		g.Go(func() error {
			sim, err := simulate.Run(simulate.Input{OpTimes: opTimes, Curve: curve, Swaps: mre.SwapAll(model), Link: link})
			if err != nil {
				return fmt.Errorf("swap-all baseline: %w", err)
			}
			rep.Baselines.SwapAll = baseline{PeakBytes: sim.Peak, IterationMS: sim.IterationUS / 1000, OverheadPct: sim.OverheadPct()}
			return nil
		})
	}
	observe := plan.WithObserver(func(s plan.Stage) func(*plan.Result, error) {
		return func(r *plan.Result, err error) {
			if s == plan.StageGroup && err == nil {
				baselineOf(r)
			}
		}
	})
	res, err := plan.Make(in, append(opts, observe)...)
	if gerr := g.Wait(); gerr != nil {
		return nil, gerr
	}
	if res == nil {
		return nil, err
	}
	var base float64
	for _, d := range res.OpTimes {
		base += d
	}
	rep.IterationMSBase = base / 1000
	rep.plotTime = cfg.plotTime
	rep.groups = res.Groups
	rep.PlanGroups = len(res.PlanGroups)
	rep.opMS = make([]float64, len(res.OpTimes)+1)
	for t, d := range res.OpTimes {
		rep.opMS[t+1] = rep.opMS[t] + d/1000
	}
	kept := mre.KeptIdle(res.Model)
	rep.OverheadPctBound = mre.LowerBoundKept(res.Curve, in.Limit, res.OpTimes, link.D2H, link.H2D, kept).OverheadPct
	rep.StreamingBoundMS = mre.StreamingBound(res.Curve, in.Limit, res.OpTimes, link.D2H, link.H2D, kept) / 1000
	bin := mre.Input{Model: res.Model, Curve: res.Curve, OpTimes: res.OpTimes, Limit: in.Limit}
	if cfg.recompute {
		bin.Recomputable = mre.Recomputable(it)
		rb := mre.RecomputeBound(bin, link.D2H, link.H2D).OverheadPct
		rep.OverheadPctBoundRecompute = &rb
	}
	rep.TrafficBoundBytes = mre.TrafficBound(bin)
	rep.TrafficBoundMS = float64(rep.TrafficBoundBytes) / link.H2D * 1e3
	rep.HostBudgetBytes = cfg.hostBudget
	if err != nil {
		var ie *mre.InfeasibleError
		var he *plan.HostLimitError
		if errors.As(err, &he) {
			return rep, fmt.Errorf("iteration %d: the host budget binds before the device limit: the plan that meets the limit holds %s of pinned host memory at once (at op %d), above --host-budget %s; give the job more pinned host memory or a higher device limit",
				k, fmtBytes(he.Peak), it.Ops[he.Op].Seq, fmtBytes(he.Limit))
		}
		if errors.As(err, &ie) {
			rep.Shortfall = newShortfall(it, ie.Op, ie.Shortfall)
			rep.PeakBytesAfter = peak
			rep.IterationMSSim = rep.IterationMSBase
			rep.Swaps, rep.Recomputes = []simulate.Swap{}, []simulate.Recompute{}
			rep.in, rep.curve, rep.infeasible, rep.shortAt, rep.recompute = in, res.Curve, ie, ie.Op, cfg.recompute
		}
		return rep, fmt.Errorf("iteration %d: %w", k, err)
	}
	pol := res.Policy
	rep.policy, rep.sim = pol, res.Exec
	rep.Feasible = true
	rep.PlannedBytes = res.Planned
	for _, h := range res.Held {
		if h > 0 {
			rep.HeldBytes = max(rep.HeldBytes, h)
			rep.HeldOps++
		}
	}
	if l := res.Layout; l != nil {
		rep.Layout = &layoutReport{PageBytes: l.Page, NeedBytes: l.Need(), TouchedPages: l.Touched, MostPages: l.Most,
			Blocks: len(l.Blocks), Fits: l.Fits(), Replans: res.Tries}
	}
	rep.OverheadPctBoundPlanned = mre.LowerBoundKept(res.Curve, res.Planned, res.OpTimes, link.D2H, link.H2D, kept).OverheadPct
	rep.StreamingBoundMSPlanned = mre.StreamingBound(res.Curve, res.Planned, res.OpTimes, link.D2H, link.H2D, kept) / 1000
	rep.PeakBytesAfter = pol.Sim.Peak
	rep.HostPeakBytes = plan.HostPeak(it, pol.Swaps)
	rep.IterationMSSim = pol.Sim.IterationUS / 1000
	rep.IterationMSExec, rep.PeakBytesExec = res.Exec.IterationUS/1000, res.Exec.Peak
	rep.OverheadPct = pol.Sim.OverheadPct()
	rep.BytesOut, rep.BytesIn = pol.Sim.BytesD2H, pol.Sim.BytesH2D
	rep.UtilD2H, rep.UtilH2D = pol.Sim.UtilD2H(), pol.Sim.UtilH2D()
	rep.LinkParts = pol.Sim.PartsBusy(trace.StepParts(it.Ops))
	rep.Waits = &waits{StepStart: pol.Sim.WaitStartUS / 1000, CopiesOut: pol.Sim.WaitOutUS / 1000, CopiesBack: pol.Sim.WaitInUS / 1000}
	queued := pol.Sim.WaitQueuedUS / 1000
	rep.WaitsQueuedMS = &queued
	// Report op numbers as the trace's seq numbers.
	seqOf := func(x int) int {
		if n := len(it.Ops); x >= n { // a wrapping swap's copy out ends after the iteration
			return it.Ops[n-1].Seq + 1 + x - n
		}
		return it.Ops[x].Seq
	}
	rep.Swaps = make([]simulate.Swap, len(pol.Swaps))
	for x, s := range pol.Swaps {
		if s.NoCopyOut {
			rep.BytesReleased += s.Bytes
		}
		if s.Early {
			rep.WriteBacks++
			rep.BytesWrittenBack += s.Bytes
			s.CopyAfter = seqOf(s.CopyAfter)
		}
		s.Out, s.Free, s.In, s.Use = seqOf(s.Out), seqOf(s.Free), seqOf(s.In), seqOf(s.Use)
		rep.Swaps[x] = s
	}
	rep.Recomputes = make([]simulate.Recompute, len(pol.Recomputes))
	for x, rc := range pol.Recomputes {
		rep.BytesRecomputed += rc.Bytes
		rc.Op, rc.Drop, rc.Before = seqOf(rc.Op), seqOf(rc.Drop), seqOf(rc.Before)
		rep.Recomputes[x] = rc
	}
	rep.RecomputeMS = pol.Sim.RecomputeUS / 1000
	rep.LargestSwaps = largestSwaps(res.Model, pol, seqOf)
	bd := peakBreakdownsOf(res.Model, res.Curve, pol)
	rep.PeakBreakdown = &bd
	tr := trafficOf(res.Model, pol)
	rep.Traffic = &tr
	wk := waitsOf(res.Model, pol)
	rep.WaitsByKind = &wk
	rep.before = res.Curve
	return rep, nil
}

func printPlan(w io.Writer, r *planReport) {
	fmt.Fprintf(w, "trace %s, iteration %d, %d ops\n", r.Trace, r.Iter, r.Ops)
	fmt.Fprintf(w, "limit %s, peak %s (%s curve), %d logical layers\n", fmtBytes(r.LimitBytes), fmtBytes(r.PeakBytesBefore), r.Curve, r.Groups)
	fmt.Fprintf(w, "time base: %s; %s\n", r.TimeBase, r.GroupsNote)
	if !r.Feasible {
		fmt.Fprintf(w, "infeasible %s: %s over the limit with every idle tensor %s, at %s\n", movedBy(r.recompute), fmtBytes(r.Shortfall.Bytes),
			lo.Ternary(r.recompute, "swapped or recomputed", "swapped"), r.Shortfall)
		if r.LowestFeasibleBytes > 0 {
			fmt.Fprintf(w, "lowest feasible limit: %s (%.1f%% of the peak): --limit %s\n", fmtBytes(r.LowestFeasibleBytes), r.LowestFeasiblePct, limitAtLeast(r.LowestFeasiblePct))
		}
		return
	}
	fmt.Fprintf(w, "planned for %s (%.0f%% of the limit)", fmtBytes(r.PlannedBytes), 100*float64(r.PlannedBytes)/float64(r.LimitBytes))
	if r.HeldOps > 0 {
		fmt.Fprintf(w, ", less up to %s at %d of %d ops for the layout", fmtBytes(r.HeldBytes), r.HeldOps, r.Ops)
	}
	if r.PlanGroups != r.Groups {
		fmt.Fprintf(w, "; prefetches counted over %d logical layers (the %d halved: the better plan)", r.PlanGroups, r.Groups)
	}
	fmt.Fprintln(w)
	if l := r.Layout; l != nil {
		fits := "fits"
		if !l.Fits {
			fits = "does not fit: the allocator serves what is over by best fit"
		}
		fmt.Fprintf(w, "layout: %d blocks in %d pages of %d KiB (%d in use at most), %s of %s, %s; planned %d more times for it\n",
			l.Blocks, l.TouchedPages, l.PageBytes>>10, l.MostPages, fmtBytes(l.NeedBytes), fmtBytes(r.LimitBytes), fits, l.Replans)
	}
	fmt.Fprintf(w, "peak after %s, %d swaps, %s copied out, %s released without a copy, %s in\n", fmtBytes(r.PeakBytesAfter), len(r.Swaps),
		fmtBytes(r.BytesOut), fmtBytes(r.BytesReleased), fmtBytes(r.BytesIn))
	if r.WriteBacks > 0 {
		fmt.Fprintf(w, "write-backs: %d copies out (%s) issued at the tensor's last write, before it leaves\n", r.WriteBacks, fmtBytes(r.BytesWrittenBack))
	}
	fmt.Fprintf(w, "iteration %.2f ms -> %.2f ms simulated: overhead %.2f%% (bound %.2f%% at the limit, %.2f%% at the planned tier)\n",
		r.IterationMSBase, r.IterationMSSim, r.OverheadPct, r.OverheadPctBound, r.OverheadPctBoundPlanned)
	fmt.Fprintf(w, "streaming bound %.2f ms at the limit, %.2f ms at the planned tier (steady state, swaps across the step boundary allowed)\n",
		r.StreamingBoundMS, r.StreamingBoundMSPlanned)
	if len(r.Recomputes) > 0 {
		fmt.Fprintf(w, "%d recomputes: %s dropped and made again, %.2f ms of compute\n", len(r.Recomputes), fmtBytes(r.BytesRecomputed), r.RecomputeMS)
	}
	if r.OverheadPctBoundRecompute != nil {
		fmt.Fprintf(w, "bound of plans with recompute: %.2f%% at the limit\n", *r.OverheadPctBoundRecompute)
	}
	if r.TrafficBoundBytes > 0 {
		fmt.Fprintf(w, "least traffic of any plan: %s in per iteration (%.2f ms at the link's rate in), this plan %.2fx it\n",
			fmtBytes(r.TrafficBoundBytes), r.TrafficBoundMS, float64(r.BytesIn)/float64(r.TrafficBoundBytes))
	}
	fmt.Fprintf(w, "link busy: d2h %.0f%%, h2d %.0f%%", r.UtilD2H*100, r.UtilH2D*100)
	if len(r.LinkParts) > 0 {
		fmt.Fprint(w, "; ")
		writeParts(w, r.LinkParts, nil)
	}
	fmt.Fprintln(w)
	if wt := r.Waits; wt != nil {
		fmt.Fprintf(w, "waits for copies: %.2f ms: %.2f ms for copies out to end before their memory counts free, %.2f ms for copies back, %.2f ms for the last step's copies out where the step takes their memory",
			wt.StepStart+wt.CopiesOut+wt.CopiesBack, wt.CopiesOut, wt.CopiesBack, wt.StepStart)
		if q := r.WaitsQueuedMS; q != nil {
			fmt.Fprintf(w, "; %.2f ms of it with none of the copies waited for on the link", *q)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "pinned host memory: the swaps hold %s at most", fmtBytes(r.HostPeakBytes))
	if r.HostBudgetBytes > 0 {
		fmt.Fprintf(w, " of a --host-budget of %s", fmtBytes(r.HostBudgetBytes))
	}
	fmt.Fprintln(w)
	sa := r.Baselines.SwapAll
	fmt.Fprintf(w, "swap-all (save_on_cpu): peak %s, %.2f ms, overhead %.1f%%\n", fmtBytes(sa.PeakBytes), sa.IterationMS, sa.OverheadPct)
	printSwapsAndBreakdown(w, r)
}

func fmtBytes(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// writeParts writes how busy each direction of the link is over each part
// of a step and how long compute waited for copies in it, "forward 74.86
// ms, waiting 8.15 ms: d2h 98%, h2d 27%; backward ...", with in
// parentheses the same of sim where it has as many parts (nil: none).
func writeParts(w io.Writer, ps, sim []simulate.PartBusy) {
	for j, p := range ps {
		if j > 0 {
			fmt.Fprint(w, "; ")
		}
		if len(sim) != len(ps) {
			fmt.Fprintf(w, "%s %.2f ms, waiting %.2f ms: d2h %.0f%%, h2d %.0f%%", p.Part, p.MS, p.WaitMS, p.D2H*100, p.H2D*100)
			continue
		}
		q := sim[j]
		fmt.Fprintf(w, "%s %.2f ms (%.2f), waiting %.2f ms (%.2f): d2h %.0f%% (%.0f%%), h2d %.0f%% (%.0f%%)",
			p.Part, p.MS, q.MS, p.WaitMS, q.WaitMS, p.D2H*100, q.D2H*100, p.H2D*100, q.H2D*100)
	}
}
