package main

import (
	"io"

	"github.com/chameleon-go/chameleon/simulate"
)

// writePerfetto writes r's simulated timeline as Chrome trace JSON, as
// simulate.Result.WriteChromeTrace does, with a memory counter track: at
// the end of each op, the bytes allocated after it with the plan
// ("after") and without it ("before", the curve the plan keeps under the
// limit, op for op on the same timeline).
func writePerfetto(w io.Writer, r *planReport) error {
	sim := r.sim
	return sim.WriteChromeTraceWith(w, r.names, r.policy.Swaps, r.policy.Recomputes, func(emit func(simulate.ChromeEvent) error) error {
		for t, op := range sim.Ops {
			args := map[string]any{"after": op.Mem}
			if t < len(r.before) {
				args["before"] = r.before[t]
			}
			if err := emit(simulate.ChromeEvent{Name: "device memory (bytes)", Ph: "C", TS: op.End, PID: 1, Args: args}); err != nil {
				return err
			}
		}
		return nil
	})
}
