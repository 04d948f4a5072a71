package main

import (
	"flag"
	"io"
	"log/slog"
	"os"

	"github.com/chameleon-go/chameleon/seq"

	"github.com/chameleon-go/chameleon/trace"
	"github.com/chameleon-go/chameleon/trace/pytorch"
)

// traceFlags are the flags every command reads a trace with: an optrace/v1
// file, or a PyTorch Execution Trace with the Kineto profile of the same
// step.
type traceFlags struct {
	path, kineto *string
}

func addTraceFlags(fs *flag.FlagSet) traceFlags {
	return traceFlags{
		path:   fs.String("trace", "", "trace `file`: optrace/v1, or a PyTorch Execution Trace with --kineto (gzip or plain)"),
		kineto: fs.String("kineto", "", "Kineto (Chrome trace) `file` of the same step as the Execution Trace given by --trace"),
	}
}

// load reads the whole trace.
func (f traceFlags) load() (*trace.Trace, error) {
	if *f.kineto != "" {
		return pytorch.Import(*f.path, *f.kineto)
	}
	return trace.ReadFile(*f.path)
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
