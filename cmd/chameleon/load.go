package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/chameleon-go/chameleon/trace/pytorch"
)

// traceFlags are the flags every command reads a trace with: an optrace/v1
// file, or a PyTorch Execution Trace with the Kineto profile of the same
// step.
type traceFlags struct {
	path, kineto, kernels *string
	// split runs the ops made of independent pieces piece by piece
	// (trace.Split).
	split *bool
	// hoist also moves each piece up to just after the last op that
	// lists what it lists (trace.Hoist): the optimizer step in the
	// backward.
	hoist *bool
	// kt is what load found of kernel times: the --kernels file, or the
	// Kineto profile's GPU kernels of an imported Execution Trace.
	kt *kernelTimes
}

// kernelTimes are measured per-op kernel times and where they come from.
type kernelTimes struct {
	est  *layer.Measured
	file *trace.Kernels // the --kernels file as read, nil for Kineto kernels
	from string         // the file
	iter int            // the trace position they time; -1: any iteration of their op sequence
}

func addTraceFlags(fs *flag.FlagSet) traceFlags {
	return traceFlags{
		path:    fs.String("trace", "", "trace `file`: optrace/v1, or a PyTorch Execution Trace with --kineto (gzip or plain)"),
		kineto:  fs.String("kineto", "", "Kineto (Chrome trace) `file` of the same step as the Execution Trace given by --trace"),
		kernels: fs.String("kernels", "", "optrace-kernels/v1 `file`: each op's GPU kernel time, to plan with instead of estimates"),
		hoist:   fs.Bool("hoist", false, "--split, and run each piece as soon as what it lists is final, as a host that steps each parameter in the backward does (a hook after its gradient is accumulated): an optimizer step's piece right after its gradient's last write and its weight's last read; ops that read every gradient (clipping by their norm, the mixed-precision unscale) hold the pieces after them"),
		split:   fs.Bool("split", false, "run each op made of independent pieces (fused and _foreach_ optimizer steps, multi-tensor copies and zeroing, the mixed-precision unscale) piece by piece, as a host that splits it would: the op's working set is one piece, not every parameter, gradient and optimizer state at once"),
		kt:      &kernelTimes{},
	}
}

// check refuses a missing --trace before any work.
func (f traceFlags) check() error {
	if *f.path == "" {
		return usagef("--trace is required")
	}
	return nil
}

// load reads the whole trace, and the kernel times the flags give. An
// error on a file that looks like the other kind of trace gets a hint.
func (f traceFlags) load() (*trace.Trace, error) { return f.loadWarn(io.Discard) }

// loadWarn is load; what the import warns of (an Execution Trace whose
// profiled step was host-bound) goes to warn.
func (f traceFlags) loadWarn(warn io.Writer) (*trace.Trace, error) {
	// The kernels file first: it is the smaller, and a bad one is said
	// before minutes go into the trace.
	var k *trace.Kernels
	if *f.kernels != "" {
		var err error
		if k, err = trace.ReadKernelsFile(*f.kernels); err != nil {
			return nil, fmt.Errorf("--kernels: %w", err)
		}
	}
	var tr *trace.Trace
	if *f.kineto != "" {
		res, err := pytorch.LoadFiles(*f.path, *f.kineto)
		if err != nil {
			return nil, f.hinted(err)
		}
		tr = res.Trace
		for _, w := range res.Warnings {
			fmt.Fprintf(warn, "warning: %s\n", w)
		}
		us := make([]float64, len(res.Ops))
		for i, oi := range res.Ops {
			us[i] = oi.KernelUS
		}
		if res.KernelUS > 0 {
			*f.kt = kernelTimes{est: &layer.Measured{US: us}, from: *f.kineto, iter: 0}
		}
	} else {
		var err error
		if tr, err = trace.ReadFile(*f.path); err != nil {
			return nil, f.hinted(err)
		}
	}
	if k != nil {
		*f.kt = kernelTimes{est: layer.FromKernels(k), file: k, from: *f.kernels, iter: -1}
	}
	if *f.split || *f.hoist {
		split, origins := trace.SplitTrace(tr)
		if *f.hoist {
			split, origins = memory.HoistTrace(split, origins)
		}
		if err := f.kt.split(tr, origins); err != nil {
			return nil, err
		}
		tr = split
	}
	return tr, nil
}

// split makes the kernel times those of tr split by origins (--split): a
// kernels file's, by the first iteration of tr it times; the Kineto
// kernels', by the iteration they time.
func (kt *kernelTimes) split(tr *trace.Trace, origins [][]trace.Origin) error {
	if kt.est == nil {
		return nil
	}
	k := kt.iter
	if k < 0 {
		k = slices.IndexFunc(tr.Iterations, kt.est.Matches)
		if k < 0 {
			return nil // times no iteration: said where they are used
		}
	}
	file := kt.file
	if file == nil {
		file = &trace.Kernels{Ops: make([]trace.KernelOp, len(kt.est.US))}
		for i, us := range kt.est.US {
			file.Ops[i] = trace.KernelOp{Seq: i, Name: tr.Iterations[k].Ops[i].Name, KernelUS: us}
		}
	}
	split, err := file.Split(origins[k])
	if err != nil {
		return fmt.Errorf("--split: %s: %w", kt.from, err)
	}
	est := layer.FromKernels(split)
	if kt.file != nil {
		kt.file = split
	} else {
		est.Names = nil
	}
	kt.est = est
	return nil
}

// hinted is err reading the trace, with a hint when the file looks like the
// other kind of trace.
func (f traceFlags) hinted(err error) error {
	if hint := sniffTrace(*f.path, *f.kineto != ""); hint != "" {
		return fmt.Errorf("%w\n  hint: %s: %s", err, *f.path, hint)
	}
	return err
}

// opTimes returns the estimator of measured kernel times for iteration k
// of tr and the time base, or (nil, "") when the flags give none. A
// --kernels file that does not time iteration k is an error naming both.
func (f traceFlags) opTimes(tr *trace.Trace, k int) (layer.Estimator, string, error) {
	kt := f.kt
	if kt == nil || kt.est == nil {
		return nil, "", nil
	}
	if kt.iter >= 0 && kt.iter != k {
		return nil, "", fmt.Errorf("%s times iteration %d, not %d", kt.from, kt.iter, k)
	}
	if err := kt.est.Check(tr.Iterations[k]); err != nil {
		return nil, "", fmt.Errorf("--kernels %s: iteration %d of %s: %w", kt.from, k, *f.path, err)
	}
	return kt.est, layer.BaseKernels, nil
}

// detectionFlags registers the change-detection thresholds and stage
// counts; the returned config holds them once the flags are parsed.
func detectionFlags(fs *flag.FlagSet) *seq.Config {
	cfg := seq.DefaultConfig()
	fs.Float64Var(&cfg.MinSimilarity, "cosine", cfg.MinSimilarity, "minimum bigram cosine of an unchanged sequence")
	fs.Float64Var(&cfg.MaxLengthDelta, "length", cfg.MaxLengthDelta, "maximum relative op-count change of an unchanged sequence")
	fs.Float64Var(&cfg.MaxMemoryDelta, "memory", cfg.MaxMemoryDelta, "maximum relative allocated-bytes change of an unchanged sequence")
	fs.IntVar(&cfg.M, "m", cfg.M, "unchanged iterations spent in WARMUP")
	fs.IntVar(&cfg.N, "n", cfg.N, "iterations spent in GEN_POLICY")
	return &cfg
}

// withDebugLog sets cfg's logger when CHAMELEON_DEBUG asks for seqchange.
func withDebugLog(cfg *seq.Config, stderr io.Writer) {
	if seq.DebugEnabled(os.Getenv("CHAMELEON_DEBUG"), "seqchange") {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// schemaVersion is the version of every command's --json output
// (docs/json.md); it changes when a field changes meaning or goes away.
const schemaVersion = 1

// writeJSON prints v as the one JSON object of a command's --json output,
// the same formatting for every command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Command-line errors. errHelp: -h was asked for (the usage is printed,
// exit 0); errFlag: the flag package has printed the problem and the usage
// (exit 2); a usageError is a bad flag value or a stray argument (printed,
// exit 2). Any other error is a failure of the work (exit 1).
var (
	errHelp = errors.New("help requested")
	errFlag = errors.New("bad flag")
)

type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef is a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// newFlagSet is a command's flag set: errors and usage go to stderr, the
// usage headed by the command's synopsis.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: chameleon %s %s\n\n%s\n\nflags:\n", name, synopsis, commands[name].summary)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses a command's arguments: flags only, no positional ones.
func parseArgs(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return errFlag
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q: every input is a flag (see chameleon %s -h)", fs.Arg(0), fs.Name())
	}
	return onceEach(fs, args)
}

// onceEach refuses a flag given twice: every flag holds one value, and
// the flag package would keep the last one silently (a second --plot
// would replace the first, a --recompute=false undone by a later
// --recompute). args parsed into fs without error.
func onceEach(fs *flag.FlagSet, args []string) error {
	seen := map[string]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return nil
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		name, _, hasValue := strings.Cut(name, "=")
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		given := a
		if !hasValue {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				if i+1 < len(args) {
					i++
					given = a + " " + args[i]
				}
			}
		}
		if first, ok := seen[name]; ok {
			return usagef("--%s given twice (%s, then %s): it holds one value; give it once", name, first, given)
		}
		seen[name] = given
	}
	return nil
}

// checkLimit applies the one rule every --limit follows, before any work:
// a percentage of a peak in (0%, 100%], or a byte count with a unit
// (12GiB, 12e9B, 12GB). A bare number is refused ("90": did you mean
// 90%?), so are 0, negative sizes and shares above 100%.
func checkLimit(s string) error {
	_, err := parseLimit(s, 1<<40)
	return err
}

// parseLimit reads a --limit by checkLimit's rule; a percentage is of peak.
func parseLimit(s string, peak int64) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, usagef("--limit: required (a share of the peak, 80%%, or bytes, 12GiB)")
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		switch {
		case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
			return 0, usagef("--limit %q: not a percentage", s)
		case v <= 0:
			return 0, usagef("--limit %q: a share of the peak must be above 0%%", s)
		case v > 100:
			return 0, usagef("--limit %q: above 100%% of the peak limits nothing; give bytes (12GiB) for a larger device", s)
		}
		return int64(float64(peak) * v / 100), nil
	}
	if strings.HasPrefix(s, "-") {
		return 0, usagef("--limit %q: a size cannot be negative", s)
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if v > 0 && v < 1 {
			// A fraction of the peak: 0.9 is 90%.
			return 0, usagef("--limit %q has no unit: did you mean %s%%, %s of the peak? (bytes need a unit: %sGiB, %sB)", s, strconv.FormatFloat(math.Round(v*1e6)/1e4, 'f', -1, 64), s, s, s)
		}
		if v >= 1 && v <= 100 {
			return 0, usagef("--limit %q has no unit: did you mean %s%%? (bytes need a unit: %sGiB, %sGB, %sB)", s, s, s, s, s)
		}
		return 0, usagef("--limit %q has no unit: give a share of the peak (80%%) or bytes with a unit (%sB, 12GiB)", s, s)
	}
	n, err := chameleon.ParseBytes(s)
	if err != nil {
		return 0, usagef("--limit %q: %v", s, err)
	}
	if n <= 0 {
		return 0, usagef("--limit %q: a limit of 0 bytes holds nothing", s)
	}
	return n, nil
}

// isShare reports whether a --limit is a share of the peak (80%).
func isShare(limit string) bool { return strings.HasSuffix(strings.TrimSpace(limit), "%") }

// allocatesNothing is the error for a trace with nothing to plan: no
// iteration, or none of the storages its ops use holds a byte. nil when
// one does. path names the trace.
func allocatesNothing(tr *trace.Trace, path string) error {
	if len(tr.Iterations) == 0 {
		return fmt.Errorf("%s holds no iterations: there is nothing to plan", path)
	}
	seen := make(map[trace.TensorID]bool)
	for _, it := range tr.Iterations {
		for id, t := range it.Tensors {
			if t.Bytes > 0 {
				return nil
			}
			seen[id] = true
		}
	}
	if len(seen) == 0 {
		return fmt.Errorf("%s allocates no bytes (its ops use no tensors): there is nothing to plan", path)
	}
	if len(seen) == 1 {
		return fmt.Errorf("%s allocates no bytes (the one tensor its ops use is of 0 bytes): there is nothing to plan", path)
	}
	return fmt.Errorf("%s allocates no bytes (the %d tensors its ops use are all of 0 bytes): there is nothing to plan", path, len(seen))
}

// sniffTrace says what a trace file that failed to read looks like, as a
// hint: a Kineto profile given as --trace, an Execution Trace without its
// --kineto. Empty when it looks like neither.
func sniffTrace(path string, kineto bool) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return ""
		}
		defer zr.Close()
		r = zr
	}
	head := make([]byte, 64<<10)
	n, _ := io.ReadFull(r, head)
	head = head[:n]
	switch {
	case bytes.Contains(head, []byte(`"traceEvents"`)) || bytes.Contains(head, []byte(`"displayTimeUnit"`)):
		return "this looks like a Kineto profile (Chrome trace): pass the Execution Trace as --trace and this file as --kineto"
	case !kineto && bytes.Contains(head, []byte(`"nodes"`)) && bytes.Contains(head, []byte(`"schema"`)):
		return "this looks like a PyTorch Execution Trace: it needs the Kineto profile of the same step, --kineto FILE"
	}
	return ""
}

// iterFlag is --iter, the same for every command that takes one iteration.
func iterFlag(fs *flag.FlagSet) *int {
	return fs.Int("iter", 1, "iteration `index` (position in the trace); 1 skips the first, often a warm-up, and falls back to 0 when the trace has one")
}

// groupsFlag is --groups, the same default for every command.
func groupsFlag(fs *flag.FlagSet) *int {
	return fs.Int("groups", plan.DefaultGroups, "logical layers per forward and backward (at most `N` when discovered)")
}

// checkIterGroups refuses --iter and --groups below their minimum.
func checkIterGroups(iter, groups int) error {
	if iter < 0 {
		return usagef("--iter %d: want 0 or more", iter)
	}
	if groups < 1 {
		return usagef("--groups %d: want at least 1", groups)
	}
	return nil
}

// pickIter is the iteration --iter names in a trace of n: the default 1
// falls back to 0 when the trace has one iteration.
func pickIter(iter, n int) (int, error) {
	if iter >= n && n == 1 {
		iter = 0
	}
	if iter < 0 || iter >= n {
		return 0, fmt.Errorf("--iter %d: out of range (the trace has %d iterations)", iter, n)
	}
	return iter, nil
}

// replayJSON is replay's --json output: the replay's report with the
// schema fields every command's output starts with.
type replayJSON struct {
	Schema  int    `json:"schema"`
	Command string `json:"command"`
	// Trace is the report's, here so that it comes third, as in every
	// command's output (the report's own is hidden behind it).
	Trace    string `json:"trace"`
	TimeBase string `json:"time_base"`
	// Library is the runtime library the device loaded (--device cuda:
	// the libcudart path), empty on the host backend.
	Library string `json:"library,omitempty"`
	*replay.Report
}

// checkReplayFlags validates replay's flags before any work.
func checkReplayFlags(tf traceFlags, limit string, scale int64, rounds int, dev string, cfg seq.Config) error {
	if err := tf.check(); err != nil {
		return err
	}
	if err := checkLimit(limit); err != nil {
		return err
	}
	if scale < 1 {
		return usagef("--scale %d: want at least 1", scale)
	}
	if rounds < 1 {
		return usagef("--rounds %d: want at least 1", rounds)
	}
	if dev != "host" && dev != "cuda" {
		return usagef("--device %q: want host or cuda", dev)
	}
	if _, err := seq.NewDetector(cfg); err != nil {
		return usageError{err}
	}
	return nil
}
