package main

import (
	"flag"

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
