package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/chameleon-go/chameleon/replay"
)

func init() {
	register("matrix", "run the timed replays of every recorded trace at 90%, 80%, 60% of its peak and at its checkpointing peak, one table (docs/replay.md)", runMatrix)
}

// matrixTraces are the traces the matrix replays, in order, each found as
// <name>.jsonl.gz in the first --traces folder that holds it (and its
// <name>.kernels.json.gz beside it, when there is one).
//
// ckpt is the peak of the same training step run with activation
// checkpointing, measured on the H200 (empty: none known); the "ckpt"
// limit replays the trace at it. dynamic marks the traces whose op
// sequence or sizes change between iterations: their verdict tolerates
// on-demand swap-ins up to matrixDynamicOnDemand of the planned swaps.
var matrixTraces = []struct {
	name, ckpt string
	dynamic    bool
}{
	{name: "llama4-small"},
	// ../shared/DESIGN.md, the peers on the H200 (2026-12-03): checkpointing
	// at 8.29 GiB (../shared/traces/README.md, llama16-bf16-ckpt, agrees).
	{name: "llama16-bf16", ckpt: "8.29GiB"},
	// ../shared/DESIGN.md, the same table: 15.55 GiB (its earlier line and
	// ../shared/traces/README.md say 15.43 GiB, a batch of other runs).
	{name: "llama7b-8l-bf16", ckpt: "15.55GiB"},
	{name: "llama16-bf16-ckpt"},
	{name: "llama16-lora"},
	{name: "llama16-fp16-scaler", dynamic: true},
	{name: "llama16-bf16-dynseq", dynamic: true},
	{name: "mixtral8-eager-bf16", dynamic: true},
	{name: "llama7b-8l-decode", dynamic: true},
	// testdata/README.md, "activation checkpointing" column, for the four
	// below: each recorded again with --ckpt, same run otherwise.
	{name: "gpt2-24l", ckpt: "7.08GiB"},
	{name: "gpt2-xl-24l", ckpt: "7.36GiB"},
	{name: "qwen2-12l", ckpt: "5.56GiB"},
	{name: "qwen2-7b-8l", ckpt: "16.39GiB"},
}

// The verdict's tolerances: measured within matrixSimTolerance of
// simulated, and on a dynamic trace on-demand swap-ins up to
// matrixDynamicOnDemand of the planned swaps.
const (
	matrixSimTolerance    = 0.05
	matrixDynamicOnDemand = 0.05
)

// matrixCkpt is the --limits token for a trace's checkpointing peak.
const matrixCkpt = "ckpt"

// matrixRow is one replay of the matrix: what was run and, from the
// replay's --json report, its STABLE figures. The times are medians over
// the STABLE iterations, the counts sums over them; VsSimulatedPct and
// VsUnlimitedPct are the medians of each STABLE iteration's measured step
// over its own simulated and unlimited ones.
type matrixRow struct {
	Name    string `json:"name"` // <trace>@<limit>, what --only matches
	Trace   string `json:"trace"`
	File    string `json:"file"`
	Kernels string `json:"kernels,omitempty"`
	Limit   string `json:"limit"`     // the --limits token: 90%, ckpt
	LimitAt string `json:"limit_arg"` // what the replay's --limit got
	Dynamic bool   `json:"dynamic,omitempty"`

	TimeBase          string   `json:"time_base,omitempty"`
	Scale             int64    `json:"scale,omitempty"`
	LimitBytes        int64    `json:"limit_bytes,omitempty"`
	StableIterations  int      `json:"stable_iterations"`
	UnlimitedMS       float64  `json:"unlimited_ms,omitempty"`
	MeasuredMS        float64  `json:"measured_ms,omitempty"`
	SimulatedMS       float64  `json:"simulated_ms,omitempty"`
	VsSimulatedPct    *float64 `json:"vs_simulated_pct,omitempty"`
	VsUnlimitedPct    *float64 `json:"vs_unlimited_pct,omitempty"`
	Evictions         int64    `json:"evictions"`
	OnDemandSwapIns   int64    `json:"on_demand_swap_ins"`
	PlacedIterations  int      `json:"placed_iterations"`
	PlannedSwaps      int64    `json:"planned_swaps"`
	PlannedRecomputes int64    `json:"planned_recomputes"`
	Tightened         int      `json:"tightened"`
	Seconds           float64  `json:"seconds"`
	Error             string   `json:"error,omitempty"`
	Verdict           string   `json:"verdict"`
}

// matrixReport is matrix --json.
type matrixReport struct {
	Schema  int         `json:"schema"`
	Command string      `json:"command"`
	Device  string      `json:"device"`
	Rounds  int         `json:"rounds"`
	Scale   int64       `json:"scale,omitempty"` // passed to every replay; absent: full size
	Traces  []string    `json:"traces"`          // the folders searched
	Rows    []matrixRow `json:"rows"`
	Skipped []string    `json:"skipped,omitempty"` // traces of selected rows found in no folder
}

// matrixConfig is matrix's flags, checked.
type matrixConfig struct {
	device       string
	dirs, limits []string
	rounds       int
	scale        int64 // 0: not passed
	only         *regexp.Regexp
	timeout      time.Duration
	json, md     bool
	strict       bool
	split        bool // --split: every replay runs ops made of pieces piece by piece
	hoist        bool // --hoist: and each piece as soon as what it lists is final
}

func runMatrix(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("matrix", "[--device host|cuda] [--traces DIR,...] [--rounds N] [--scale N] [--only REGEX] [--limits 90%,80%,60%,ckpt] [--timeout 150s] [--split] [--hoist] [--json|--markdown] [--strict]", stderr)
	devName := fs.String("device", "host", "device of every replay: host (pure Go, modeled link) or cuda")
	traces := fs.String("traces", "testdata,../shared/traces", "comma-separated `folders` to look for the traces in (the first that holds one wins)")
	rounds := fs.Int("rounds", 4, "replay each trace's iterations this many times (short traces need 9 iterations to reach STABLE)")
	scale := fs.Int64("scale", 0, "divide every tensor size by `N` (default 4096 on host, none on cuda: full size)")
	only := fs.String("only", "", "run only the rows whose name, <trace>@<limit> (llama16-bf16@80%), matches this `regex`")
	limits := fs.String("limits", "90%,80%,60%,ckpt", "comma-separated limits of each trace: shares of its peak, bytes with a unit, or ckpt (its activation-checkpointing peak, where known)")
	timeout := fs.Duration("timeout", 150*time.Second, "longest a row may run; one that runs longer is a row with its error")
	asJSON := fs.Bool("json", false, "print one JSON object with every row")
	asMD := fs.Bool("markdown", false, "print the table as a Markdown table")
	strict := fs.Bool("strict", false, "exit 1 when any row's verdict is not ok")
	split := fs.Bool("split", false, "every replay runs each op made of independent pieces (a fused optimizer step) piece by piece (replay --split)")
	hoist := fs.Bool("hoist", false, "every replay runs ops made of pieces piece by piece, each piece as soon as what it lists is final (replay --hoist)")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	cfg := matrixConfig{device: *devName, rounds: *rounds, timeout: *timeout, json: *asJSON, md: *asMD, strict: *strict, split: *split, hoist: *hoist}
	if cfg.device != "host" && cfg.device != "cuda" {
		return usagef("--device %q: want host or cuda", cfg.device)
	}
	if cfg.rounds < 1 {
		return usagef("--rounds %d: want at least 1", cfg.rounds)
	}
	switch {
	case isSet(fs, "scale") && *scale < 1:
		return usagef("--scale %d: want at least 1", *scale)
	case isSet(fs, "scale"):
		cfg.scale = *scale
	case cfg.device == "host":
		// Full size may not fit the host's memory, and a large scale keeps
		// the host's copies modeled rather than memcpy'd (docs/replay.md).
		cfg.scale = 4096
	}
	if cfg.timeout <= 0 {
		return usagef("--timeout %v: want a positive duration", cfg.timeout)
	}
	if cfg.json && cfg.md {
		return usagef("--json and --markdown: pick one")
	}
	if cfg.dirs = splitList(*traces); len(cfg.dirs) == 0 {
		return usagef("--traces %q: want at least one folder", *traces)
	}
	if cfg.limits = splitList(*limits); len(cfg.limits) == 0 {
		return usagef("--limits %q: want at least one limit", *limits)
	}
	for _, l := range cfg.limits {
		if l == matrixCkpt {
			continue
		}
		if err := checkLimit(l); err != nil {
			return usagef("--limits: %v", err)
		}
	}
	var err error
	if cfg.only, err = regexp.Compile(*only); err != nil {
		return usagef("--only: %v", err)
	}
	rows, skipped := matrixRows(cfg)
	if len(rows) == 0 && len(skipped) == 0 {
		return usagef("--only %q selects no row (rows are named <trace>@<limit>: llama16-bf16@80%%, qwen2-12l@ckpt)", *only)
	}
	if len(rows) == 0 {
		return fmt.Errorf("none of the traces selected (%s) is in %s", strings.Join(skipped, ", "), strings.Join(cfg.dirs, ", "))
	}

	for i := range rows {
		r := &rows[i]
		runMatrixRow(r, cfg)
		fmt.Fprintf(stderr, "matrix [%d/%d] %s (%.1fs): %s%s\n", i+1, len(rows), r.Name, r.Seconds, rowSummary(*r), r.Verdict)
	}

	rep := matrixReport{Schema: schemaVersion, Command: "matrix", Device: cfg.device, Rounds: cfg.rounds, Scale: cfg.scale,
		Traces: cfg.dirs, Rows: rows, Skipped: skipped}
	switch {
	case cfg.json:
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	case cfg.md:
		writeMatrixMarkdown(stdout, rep)
	default:
		writeMatrixText(stdout, rep)
	}
	if len(skipped) > 0 && cfg.json {
		fmt.Fprintf(stderr, "skipped, not in %s: %s\n", strings.Join(cfg.dirs, ", "), strings.Join(skipped, ", "))
	}
	if cfg.strict {
		bad := 0
		for _, r := range rows {
			if r.Verdict != "ok" {
				bad++
			}
		}
		if bad > 0 {
			return fmt.Errorf("--strict: %d of %d rows not ok", bad, len(rows))
		}
	}
	return nil
}

// isSet says whether the flag name was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// splitList is a comma-separated list, each item trimmed, empty ones
// dropped.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// matrixRows are the rows cfg selects, in matrixTraces order and each
// trace's limits in --limits order, and the traces of selected rows that
// no folder holds.
func matrixRows(cfg matrixConfig) (rows []matrixRow, skipped []string) {
	for _, t := range matrixTraces {
		var sel []matrixRow
		for _, l := range cfg.limits {
			at := l
			if l == matrixCkpt {
				if t.ckpt == "" {
					continue
				}
				at = t.ckpt
			}
			r := matrixRow{Name: t.name + "@" + l, Trace: t.name, Limit: l, LimitAt: at, Dynamic: t.dynamic}
			if cfg.only.MatchString(r.Name) {
				sel = append(sel, r)
			}
		}
		if len(sel) == 0 {
			continue
		}
		file, kernels := findTrace(cfg.dirs, t.name)
		if file == "" {
			skipped = append(skipped, t.name)
			continue
		}
		for _, r := range sel {
			r.File, r.Kernels = file, kernels
			rows = append(rows, r)
		}
	}
	return rows, skipped
}

// findTrace is <name>.jsonl.gz in the first of dirs that holds it, and the
// <name>.kernels.json.gz beside it ("" when there is none).
func findTrace(dirs []string, name string) (file, kernels string) {
	for _, d := range dirs {
		f := filepath.Join(d, name+".jsonl.gz")
		if st, err := os.Stat(f); err != nil || st.IsDir() {
			continue
		}
		k := filepath.Join(d, name+".kernels.json.gz")
		if st, err := os.Stat(k); err != nil || st.IsDir() {
			k = ""
		}
		return f, k
	}
	return "", ""
}

// replayArgs are the arguments of the row's timed replay: the replay's
// defaults for everything the matrix does not set.
func (r matrixRow) replayArgs(cfg matrixConfig) []string {
	args := []string{"--timing", "--json", "--device", cfg.device, "--trace", r.File, "--limit", r.LimitAt,
		"--rounds", strconv.Itoa(cfg.rounds)}
	if r.Kernels != "" {
		args = append(args, "--kernels", r.Kernels)
	}
	if cfg.scale > 0 {
		args = append(args, "--scale", strconv.FormatInt(cfg.scale, 10))
	}
	if cfg.hoist {
		args = append(args, "--hoist")
	} else if cfg.split {
		args = append(args, "--split")
	}
	return args
}

// errRowTimeout is what a row's progress writer panics with once the row
// has run past its deadline: the replay has no other way to be stopped, and
// a replay left running would share the device with the next rows.
var errRowTimeout = errors.New("row timed out")

// rowOutput is the stderr a row's replay writes to. Its progress lines
// (what --quiet turns off) are dropped, the rest (warnings) kept; a write
// past the deadline panics with errRowTimeout, which stops the replay
// between two iterations, its deferred closes run as it unwinds.
type rowOutput struct {
	deadline time.Time
	kept     bytes.Buffer
	partial  []byte
}

func (w *rowOutput) Write(p []byte) (int, error) {
	if time.Now().After(w.deadline) {
		panic(errRowTimeout)
	}
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		line := w.partial[:i+1]
		if !bytes.HasPrefix(line, []byte("round ")) && !bytes.HasPrefix(line, []byte("iter ")) {
			w.kept.Write(line)
		}
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// matrixGrace is how long past its deadline a row may take to reach the
// end of an iteration, where it stops, before the matrix leaves it running
// and goes on.
const matrixGrace = 30 * time.Second

// runMatrixRow runs r's timed replay in-process (runReplay) and fills r
// from its --json report and the verdict.
func runMatrixRow(r *matrixRow, cfg matrixConfig) {
	start := time.Now()
	type result struct {
		out, kept []byte
		err       error
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		w := &rowOutput{deadline: start.Add(cfg.timeout)}
		defer func() {
			if p := recover(); p != nil {
				err, ok := p.(error)
				if !ok || !errors.Is(err, errRowTimeout) {
					err = fmt.Errorf("panic: %v", p)
				} else {
					err = fmt.Errorf("timed out after %v", cfg.timeout)
				}
				done <- result{err: err}
			}
		}()
		err := runReplay(r.replayArgs(cfg), &out, w)
		done <- result{out: out.Bytes(), kept: w.kept.Bytes(), err: err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(cfg.timeout + matrixGrace):
		res.err = fmt.Errorf("timed out after %v, still running: left running beside the next rows", cfg.timeout)
	}
	r.Seconds = math.Round(time.Since(start).Seconds()*10) / 10
	if len(res.out) > 0 {
		if err := r.fill(res.out); err != nil && res.err == nil {
			res.err = err
		}
	}
	if res.err != nil {
		r.Error = res.err.Error()
		if kept := strings.TrimSpace(string(res.kept)); kept != "" && !strings.Contains(r.Error, kept) {
			r.Error += " (" + strings.ReplaceAll(kept, "\n", "; ") + ")"
		}
	}
	r.Verdict = matrixVerdict(*r)
}

// fill reads the replay's --json report into r.
func (r *matrixRow) fill(out []byte) error {
	var rep replayJSON
	if err := json.Unmarshal(out, &rep); err != nil {
		return fmt.Errorf("the replay's report: %w", err)
	}
	if rep.Report == nil {
		return errors.New("the replay's report is empty")
	}
	r.TimeBase, r.Scale, r.LimitBytes, r.Tightened = rep.TimeBase, rep.Scale, rep.LimitBytes, rep.Tightened
	if s := rep.Stable; s != nil {
		r.StableIterations = s.Iterations
		r.UnlimitedMS, r.MeasuredMS, r.SimulatedMS = s.UnlimitedMS, s.MeasuredMS, s.SimulatedMS
		r.Evictions, r.OnDemandSwapIns = s.Evictions, s.OnDemandSwapIns
	}
	// Each iteration against its own simulated and unlimited steps: on a
	// trace whose steps differ (skipped fp16 steps between real ones) the
	// medians of the three columns may be different iterations'.
	var vsSim, vsUnl []float64
	for _, x := range rep.PerIteration {
		if x.Stage != "STABLE" {
			continue
		}
		if x.MeasuredMS > 0 && x.SimulatedMS > 0 {
			vsSim = append(vsSim, x.MeasuredMS/x.SimulatedMS)
		}
		if x.MeasuredMS > 0 && x.UnlimitedMS > 0 {
			vsUnl = append(vsUnl, x.MeasuredMS/x.UnlimitedMS)
		}
		if x.Placed > 0 {
			r.PlacedIterations++
		}
		r.PlannedSwaps += x.PlannedSwaps
		r.PlannedRecomputes += x.PlannedRecomputes
	}
	r.VsSimulatedPct = medianRatioPct(vsSim, r.MeasuredMS, r.SimulatedMS)
	r.VsUnlimitedPct = medianRatioPct(vsUnl, r.MeasuredMS, r.UnlimitedMS)
	return nil
}

// medianRatioPct is the median of ratios in percent over 1, or, with no
// ratio, a over b (pctOver).
func medianRatioPct(ratios []float64, a, b float64) *float64 {
	if len(ratios) == 0 {
		return pctOver(a, b)
	}
	return pctOver(replay.Median(ratios), 1)
}

// pctOver is a over b in percent (+3.2: 3.2% longer), nil without b.
func pctOver(a, b float64) *float64 {
	if a <= 0 || b <= 0 {
		return nil
	}
	v := math.Round((a/b-1)*1000) / 10
	return &v
}

// matrixVerdict is "ok" for a row that ran as planned: STABLE iterations,
// none of them forcing an eviction or bringing a tensor back on demand
// (on a dynamic trace: at most matrixDynamicOnDemand of the planned
// swaps), every one of them placed, and the measured step within
// matrixSimTolerance of the simulated one. Otherwise it is the reasons,
// comma-separated.
func matrixVerdict(r matrixRow) string {
	if r.Error != "" {
		return "failed: " + r.Error
	}
	if r.StableIterations == 0 {
		return "no STABLE iteration"
	}
	var why []string
	if r.Evictions > 0 {
		why = append(why, plural(r.Evictions, "forced eviction"))
	}
	switch {
	case r.OnDemandSwapIns == 0:
	case !r.Dynamic:
		why = append(why, plural(r.OnDemandSwapIns, "on-demand swap-in"))
	case float64(r.OnDemandSwapIns) > matrixDynamicOnDemand*float64(r.PlannedSwaps):
		why = append(why, fmt.Sprintf("%s > %.0f%% of %s", plural(r.OnDemandSwapIns, "on-demand swap-in"), 100*matrixDynamicOnDemand, plural(r.PlannedSwaps, "planned swap")))
	}
	if r.PlacedIterations < r.StableIterations {
		why = append(why, fmt.Sprintf("placed %d/%d", r.PlacedIterations, r.StableIterations))
	}
	switch {
	case r.SimulatedMS <= 0 || r.MeasuredMS <= 0:
		why = append(why, "no simulated or measured step")
	case r.VsSimulatedPct != nil:
		if math.Abs(*r.VsSimulatedPct) > 100*matrixSimTolerance {
			why = append(why, fmt.Sprintf("measured %+.1f%% of simulated", *r.VsSimulatedPct))
		}
	case math.Abs(r.MeasuredMS/r.SimulatedMS-1) > matrixSimTolerance:
		why = append(why, fmt.Sprintf("measured %+.1f%% of simulated", 100*(r.MeasuredMS/r.SimulatedMS-1)))
	}
	if len(why) == 0 {
		return "ok"
	}
	return strings.Join(why, ", ")
}

// plural is n and what, with an s unless n is 1.
func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// rowSummary is the progress line's figures after the verdict.
func rowSummary(r matrixRow) string {
	if r.StableIterations == 0 {
		return ""
	}
	return fmt.Sprintf("measured %.2f ms, %s of simulated, %s of unlimited; ", r.MeasuredMS, pctCell(r.VsSimulatedPct), pctCell(r.VsUnlimitedPct))
}

var matrixHeader = []string{"trace", "limit", "stable", "unlimited ms", "measured ms", "simulated ms", "vs simulated", "vs unlimited",
	"evictions", "on-demand", "placed", "swaps", "recomputes", "verdict"}

// cells are the row's table cells, in matrixHeader's order; "-" where
// there is no figure.
func (r matrixRow) cells() []string {
	limit := r.Limit
	if r.Limit == matrixCkpt {
		limit = "ckpt " + r.LimitAt
	}
	verdict := r.Verdict
	if len(verdict) > 100 {
		verdict = verdict[:97] + "..."
	}
	if r.StableIterations == 0 {
		c := []string{r.Trace, limit, "0"}
		for range len(matrixHeader) - 4 {
			c = append(c, "-")
		}
		return append(c, verdict)
	}
	ms := func(v float64) string {
		if v <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", v)
	}
	return []string{r.Trace, limit, strconv.Itoa(r.StableIterations), ms(r.UnlimitedMS), ms(r.MeasuredMS), ms(r.SimulatedMS),
		pctCell(r.VsSimulatedPct), pctCell(r.VsUnlimitedPct), strconv.FormatInt(r.Evictions, 10), strconv.FormatInt(r.OnDemandSwapIns, 10),
		fmt.Sprintf("%d/%d", r.PlacedIterations, r.StableIterations), strconv.FormatInt(r.PlannedSwaps, 10),
		strconv.FormatInt(r.PlannedRecomputes, 10), verdict}
}

func pctCell(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", *p)
}

// matrixLegend says what the columns hold.
const matrixLegend = "times: medians over the STABLE iterations; evictions (forced), on-demand swap-ins, " +
	"swaps and recomputes (planned): their sums; placed: STABLE iterations with blocks placed"

func matrixTitle(rep matrixReport) string {
	scale := "full size"
	if rep.Scale > 0 {
		scale = fmt.Sprintf("scale 1/%d", rep.Scale)
	}
	return fmt.Sprintf("timed replays on %s, %s, %d rounds", rep.Device, scale, rep.Rounds)
}

func writeMatrixText(w io.Writer, rep matrixReport) {
	fmt.Fprintf(w, "%s\n%s\n\n", matrixTitle(rep), matrixLegend)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(matrixHeader, "\t"))
	for _, r := range rep.Rows {
		fmt.Fprintln(tw, strings.Join(r.cells(), "\t"))
	}
	tw.Flush()
	writeSkipped(w, rep)
}

func writeMatrixMarkdown(w io.Writer, rep matrixReport) {
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(matrixHeader, " | "), strings.Repeat("---|", len(matrixHeader)))
	for _, r := range rep.Rows {
		c := r.cells()
		for i := range c {
			c[i] = strings.ReplaceAll(c[i], "|", `\|`)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(c, " | "))
	}
	fmt.Fprintf(w, "\n%s; %s.\n", matrixTitle(rep), matrixLegend)
	writeSkipped(w, rep)
}

func writeSkipped(w io.Writer, rep matrixReport) {
	if len(rep.Skipped) > 0 {
		fmt.Fprintf(w, "\nskipped, not in %s: %s\n", strings.Join(rep.Traces, ", "), strings.Join(rep.Skipped, ", "))
	}
}
