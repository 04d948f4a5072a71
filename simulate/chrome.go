package simulate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// Thread ids of the Chrome trace: one per stream.
const (
	tidCompute = 1
	tidD2H     = 2
	tidH2D     = 3
)

type chromeEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// WriteChromeTrace writes the timeline as Chrome trace JSON (the format
// chrome://tracing and Perfetto open): one process with three threads,
// compute, d2h and h2d, timestamps in microseconds. names gives each op's
// label (nil: "op N"); swaps must be the swaps the result was simulated
// with. Each recompute is a slice on the compute track, named after its
// producer, before the op that needs it (rcs: the recomputes the result
// was simulated with; nil leaves them unnamed).
func (r *Result) WriteChromeTrace(w io.Writer, names []string, swaps []Swap, rcs ...Recompute) error {
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"); err != nil {
		return err
	}
	first := true
	emit := func(e chromeEvent) error {
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
	meta := []chromeEvent{
		{Name: "process_name", Ph: "M", PID: 1, Args: map[string]any{"name": "chameleon simulation"}},
		{Name: "thread_name", Ph: "M", PID: 1, TID: tidCompute, Args: map[string]any{"name": "compute"}},
		{Name: "thread_name", Ph: "M", PID: 1, TID: tidD2H, Args: map[string]any{"name": "d2h"}},
		{Name: "thread_name", Ph: "M", PID: 1, TID: tidH2D, Args: map[string]any{"name": "h2d"}},
	}
	for _, e := range meta {
		if err := emit(e); err != nil {
			return err
		}
	}
	for t, op := range r.Ops {
		name := fmt.Sprintf("op %d", t)
		if t < len(names) && names[t] != "" {
			name = names[t]
		}
		if op.Stall > 0 {
			if err := emit(chromeEvent{Name: "stall", Ph: "X", TS: op.Start - op.Stall, Dur: op.Stall, PID: 1, TID: tidCompute,
				Args: map[string]any{"op": t}}); err != nil {
				return err
			}
		}
		if err := emit(chromeEvent{Name: name, Ph: "X", TS: op.Start, Dur: op.End - op.Start, PID: 1, TID: tidCompute,
			Args: map[string]any{"op": t, "mem": op.Mem}}); err != nil {
			return err
		}
	}
	for k, sp := range r.Recomputed {
		name, args := fmt.Sprintf("recompute #%d", k), map[string]any{}
		if k < len(rcs) {
			rc := rcs[k]
			op := fmt.Sprintf("op %d", rc.Op)
			if rc.Op < len(names) && names[rc.Op] != "" {
				op = names[rc.Op]
			}
			name = "recompute " + op
			args["tensor"], args["bytes"], args["op"], args["dropped_after_op"], args["before_op"] = rc.Tensor, rc.Bytes, rc.Op, rc.Drop, rc.Before
			if len(rc.Remade) > 0 {
				args["remade_inputs"] = len(rc.Remade)
			}
		}
		if err := emit(chromeEvent{Name: name, Ph: "X", TS: sp.Start, Dur: sp.End - sp.Start, PID: 1, TID: tidCompute,
			Args: args}); err != nil {
			return err
		}
	}
	copies := func(ts []Transfer, tid int, dir string) error {
		for _, c := range ts {
			if math.IsNaN(c.Start) || math.IsNaN(c.End) {
				continue
			}
			args := map[string]any{"issued": c.Issue}
			if c.Swap < len(swaps) {
				s := swaps[c.Swap]
				args["tensor"], args["bytes"], args["out_after_op"], args["in_before_op"] = s.Tensor, s.Bytes, s.Out, s.Use
			}
			if err := emit(chromeEvent{Name: fmt.Sprintf("%s #%d", dir, c.Swap), Ph: "X", TS: c.Start, Dur: c.End - c.Start,
				PID: 1, TID: tid, Args: args}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := copies(r.Out, tidD2H, "out"); err != nil {
		return err
	}
	if err := copies(r.In, tidH2D, "in"); err != nil {
		return err
	}
	if _, err := bw.WriteString("\n]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}
