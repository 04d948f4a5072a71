package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

func init() {
	register("detect", "run Encode+Detect over every iteration of a trace", runDetect)
}

type detectIter struct {
	Iter        int       `json:"iter"`
	Ops         int       `json:"ops"`
	Stage       seq.Stage `json:"stage"`
	Changed     bool      `json:"changed"`
	Similarity  float64   `json:"similarity"`
	LengthDelta float64   `json:"length_delta"`
	MemoryDelta float64   `json:"memory_delta"`
	Reason      string    `json:"reason,omitempty"`
}

type detectReport struct {
	Schema          int          `json:"schema"`
	Command         string       `json:"command"`
	Trace           string       `json:"trace"`
	Iterations      []detectIter `json:"iterations"`
	DetectNsPerIter int64        `json:"detect_ns_per_iter"`
}

func runDetect(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("detect", "--trace FILE [--kineto FILE] [--rounds R] [--json]", stderr)
	tf := addTraceFlags(fs)
	fs.Lookup("kernels").Usage = "refused: detect compares op sequences and reads no kernel times"
	asJSON := fs.Bool("json", false, "print one JSON object (docs/json.md)")
	rounds := fs.Int("rounds", 1, "replay the trace's iterations this many times in order")
	cfg := detectionFlags(fs)
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := tf.check(); err != nil {
		return err
	}
	if *tf.kernels != "" {
		// A flag read and then ignored would let a wrong or damaged file
		// pass for a checked one.
		return usagef("--kernels %s: detect compares op sequences and reads no kernel times; leave --kernels to plan, profile and replay", *tf.kernels)
	}
	if *rounds < 1 {
		return usagef("--rounds %d: want at least 1", *rounds)
	}
	if _, err := seq.NewDetector(*cfg); err != nil {
		return usageError{err}
	}
	withDebugLog(cfg, stderr)
	rep, err := detect(tf, *cfg, *rounds)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "iter\tops\tstage\tchanged\tsimilarity\tlength Δ\tmemory Δ\treason\n")
	for _, it := range rep.Iterations {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%v\t%.4f\t%.2f%%\t%.2f%%\t%s\n", it.Iter, it.Ops, it.Stage, it.Changed,
			it.Similarity, 100*it.LengthDelta, 100*it.MemoryDelta, it.Reason)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\n%s: %d iterations, detect %.1f µs per iteration\n", rep.Trace, len(rep.Iterations), float64(rep.DetectNsPerIter)/1000)
	return nil
}

// detect streams the trace (one iteration in memory at a time, per round)
// through Encode and Detect.
func detect(tf traceFlags, cfg seq.Config, rounds int) (*detectReport, error) {
	path := *tf.path
	det, err := seq.NewDetector(cfg)
	if err != nil {
		return nil, err
	}
	enc := seq.NewEncoder(nil)
	rep := &detectReport{Schema: schemaVersion, Command: "detect", Trace: path}
	var spent time.Duration
	next := func() (func() (*trace.Iteration, error), func() error, error) {
		if *tf.kineto != "" {
			tr, err := tf.load()
			if err != nil {
				return nil, nil, err
			}
			i := 0
			return func() (*trace.Iteration, error) {
				if i == len(tr.Iterations) {
					return nil, io.EOF
				}
				i++
				return tr.Iterations[i-1], nil
			}, func() error { return nil }, nil
		}
		r, err := trace.Open(path)
		if err != nil {
			return nil, nil, tf.hinted(err)
		}
		next := func() (*trace.Iteration, error) {
			it, err := r.Next()
			if err != nil && err != io.EOF {
				err = tf.hinted(err)
			}
			return it, err
		}
		return next, r.Close, nil
	}
	for range rounds {
		nextIter, closeTrace, err := next()
		if err != nil {
			return nil, err
		}
		for {
			it, err := nextIter()
			if err == io.EOF {
				break
			}
			if err != nil {
				closeTrace()
				return nil, err
			}
			p := seq.EncodeIteration(enc, it)
			t0 := time.Now()
			res := det.Observe(p)
			spent += time.Since(t0)
			rep.Iterations = append(rep.Iterations, detectIter{
				Iter: it.Index, Ops: p.Len, Stage: res.Stage, Changed: res.Changed, Similarity: res.Similarity,
				LengthDelta: res.LengthDelta, MemoryDelta: res.MemoryDelta, Reason: res.Reason,
			})
		}
		closeTrace()
	}
	if n := len(rep.Iterations); n > 0 {
		rep.DetectNsPerIter = spent.Nanoseconds() / int64(n)
	}
	return rep, nil
}
