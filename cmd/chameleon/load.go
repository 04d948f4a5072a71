package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/seq"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/chameleon-go/chameleon/trace/pytorch"
)

// traceFlags are the flags every command reads a trace with: an optrace/v1
// file, or a PyTorch Execution Trace with the Kineto profile of the same
// step.
type traceFlags struct {
	path, kineto, kernels *string
	// kt is what load found of kernel times: the --kernels file, or the
	// Kineto profile's GPU kernels of an imported Execution Trace.
	kt *kernelTimes
}

// kernelTimes are measured per-op kernel times and where they come from.
type kernelTimes struct {
	est  *layer.Measured
	from string // the file
	iter int    // the trace position they time; -1: any iteration of their op sequence
}

func addTraceFlags(fs *flag.FlagSet) traceFlags {
	return traceFlags{
		path:    fs.String("trace", "", "trace `file`: optrace/v1, or a PyTorch Execution Trace with --kineto (gzip or plain)"),
		kineto:  fs.String("kineto", "", "Kineto (Chrome trace) `file` of the same step as the Execution Trace given by --trace"),
		kernels: fs.String("kernels", "", "optrace-kernels/v1 `file`: each op's GPU kernel time, to plan with instead of estimates"),
		kt:      &kernelTimes{},
	}
}

// load reads the whole trace, and the kernel times the flags give.
func (f traceFlags) load() (*trace.Trace, error) { return f.loadWarn(io.Discard) }

// loadWarn is load; what the import warns of (an Execution Trace whose
// profiled step was host-bound) goes to warn.
func (f traceFlags) loadWarn(warn io.Writer) (*trace.Trace, error) {
	var tr *trace.Trace
	if *f.kineto != "" {
		res, err := pytorch.LoadFiles(*f.path, *f.kineto)
		if err != nil {
			return nil, err
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
			return nil, err
		}
	}
	if *f.kernels != "" {
		k, err := trace.ReadKernelsFile(*f.kernels)
		if err != nil {
			return nil, fmt.Errorf("--kernels: %w", err)
		}
		*f.kt = kernelTimes{est: layer.FromKernels(k), from: *f.kernels, iter: -1}
	}
	return tr, nil
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
