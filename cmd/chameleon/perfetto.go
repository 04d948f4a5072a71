package main

import (
	"bufio"
	"encoding/json"
	"io"

	"github.com/chameleon-go/chameleon/simulate"
)

// writePerfetto writes r's simulated timeline as Chrome trace JSON, as
// simulate.Result.WriteChromeTrace does, with a memory counter track: at
// the end of each op, the bytes allocated after it with the plan
// ("after") and without it ("before", the curve the plan keeps under the
// limit, op for op on the same timeline).
func writePerfetto(w io.Writer, r *planReport) error {
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"); err != nil {
		return err
	}
	first := true
	emit := func(e simulate.ChromeEvent) error {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if !first {
			bw.WriteString(",\n")
		}
		first = false
		_, err = bw.Write(b)
		return err
	}
	if err := emit(simulate.ChromeEvent{Name: "process_name", Ph: "M", PID: 1, Args: map[string]any{"name": "chameleon simulation"}}); err != nil {
		return err
	}
	sim := r.sim
	if err := sim.ChromeEvents(simulate.ChromeTracks{PID: 1, Compute: 1, Stalls: 1, D2H: 2, H2D: 3}, r.names, r.policy.Swaps, r.policy.Recomputes, emit); err != nil {
		return err
	}
	for t, op := range sim.Ops {
		args := map[string]any{"after": op.Mem}
		if t < len(r.before) {
			args["before"] = r.before[t]
		}
		if err := emit(simulate.ChromeEvent{Name: "device memory (bytes)", Ph: "C", TS: op.End, PID: 1, Args: args}); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("\n]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}
