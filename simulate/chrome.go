package simulate

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
)

// ChromeEvent is one event of a Chrome trace (the format chrome://tracing
// and Perfetto open), timestamps in microseconds.
type ChromeEvent struct {
	Name string         `json:"name"`
	Ph   string         `json:"ph"`
	TS   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	PID  int            `json:"pid"`
	TID  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// ChromeTracks says where ChromeEvents puts a result: the process, and the
// thread of each stream and of the stalls (the compute thread's own, or
// one apart).
type ChromeTracks struct {
	PID, Compute, Stalls, D2H, H2D int
}

// WriteChromeTrace writes the timeline as Chrome trace JSON: one process
// with three threads, compute (its stalls on it), d2h and h2d (see
// ChromeEvents).
func (r *Result) WriteChromeTrace(w io.Writer, names []string, swaps []Swap, rcs ...Recompute) error {
	return r.WriteChromeTraceWith(w, names, swaps, rcs, nil)
}

// WriteChromeTraceWith is WriteChromeTrace with the events more hands its
// emit after the timeline's (a counter track on the same clock); more nil:
// none.
func (r *Result) WriteChromeTraceWith(w io.Writer, names []string, swaps []Swap, rcs []Recompute, more func(emit func(ChromeEvent) error) error) error {
	bw := bufio.NewWriter(w)
	if _, err := bw.WriteString("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"); err != nil {
		return err
	}
	first := true
	emit := func(e ChromeEvent) error {
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
	if err := emit(ChromeEvent{Name: "process_name", Ph: "M", PID: 1, Args: map[string]any{"name": "chameleon simulation"}}); err != nil {
		return err
	}
	if err := r.ChromeEvents(ChromeTracks{PID: 1, Compute: 1, Stalls: 1, D2H: 2, H2D: 3}, names, swaps, rcs, emit); err != nil {
		return err
	}
	if more != nil {
		if err := more(emit); err != nil {
			return err
		}
	}
	if _, err := bw.WriteString("\n]}\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// ChromeEvents hands emit the timeline as Chrome trace events on tr: the
// threads' names, then each op (labelled by names, "op N" where it has
// none) after its stall, each recompute on the compute thread, named after
// its producer, before the op that needs it (rcs: the recomputes the
// result was simulated with; nil leaves them unnamed), and each copy with
// the swap it serves (swaps: those the result was simulated with).
func (r *Result) ChromeEvents(tr ChromeTracks, names []string, swaps []Swap, rcs []Recompute, emit func(ChromeEvent) error) error {
	threads := []ChromeEvent{
		{Name: "thread_name", Ph: "M", PID: tr.PID, TID: tr.Compute, Args: map[string]any{"name": "compute"}},
		{Name: "thread_name", Ph: "M", PID: tr.PID, TID: tr.D2H, Args: map[string]any{"name": "d2h"}},
		{Name: "thread_name", Ph: "M", PID: tr.PID, TID: tr.H2D, Args: map[string]any{"name": "h2d"}},
	}
	if tr.Stalls != tr.Compute {
		threads = append(threads, ChromeEvent{Name: "thread_name", Ph: "M", PID: tr.PID, TID: tr.Stalls, Args: map[string]any{"name": "stalls"}})
	}
	for _, e := range threads {
		if err := emit(e); err != nil {
			return err
		}
	}
	opName := func(t int) string {
		if t < len(names) && names[t] != "" {
			return names[t]
		}
		return fmt.Sprintf("op %d", t)
	}
	for t, op := range r.Ops {
		if op.Stall > 0 {
			if err := emit(ChromeEvent{Name: "stall", Ph: "X", TS: op.Start - op.Stall, Dur: op.Stall, PID: tr.PID, TID: tr.Stalls,
				Args: map[string]any{"op": t}}); err != nil {
				return err
			}
		}
		if err := emit(ChromeEvent{Name: opName(t), Ph: "X", TS: op.Start, Dur: op.End - op.Start, PID: tr.PID, TID: tr.Compute,
			Args: map[string]any{"op": t, "mem": op.Mem}}); err != nil {
			return err
		}
	}
	for k, sp := range r.Recomputed {
		name, args := fmt.Sprintf("recompute #%d", k), map[string]any{}
		if k < len(rcs) {
			rc := rcs[k]
			name = "recompute " + opName(rc.Op)
			args["tensor"], args["bytes"], args["op"], args["dropped_after_op"], args["before_op"] = rc.Tensor, rc.Bytes, rc.Op, rc.Drop, rc.Before
			if len(rc.Remade) > 0 {
				args["remade_inputs"] = len(rc.Remade)
			}
		}
		if err := emit(ChromeEvent{Name: name, Ph: "X", TS: sp.Start, Dur: sp.End - sp.Start, PID: tr.PID, TID: tr.Compute,
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
				args["tensor"], args["bytes"], args["out_after_op"], args["freed_at_op"], args["in_issue_op"], args["in_before_op"] =
					s.Tensor, s.Bytes, s.Out, s.Free, s.In, s.Use
			}
			if err := emit(ChromeEvent{Name: fmt.Sprintf("%s #%d", dir, c.Swap), Ph: "X", TS: c.Start, Dur: c.End - c.Start,
				PID: tr.PID, TID: tid, Args: args}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := copies(r.Out, tr.D2H, "out"); err != nil {
		return err
	}
	return copies(r.In, tr.H2D, "in")
}
