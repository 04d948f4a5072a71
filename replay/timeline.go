package replay

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/simulate"
)

// Timeline stamps the op kernels of a timed replay on the device's own
// clock, so that a step's time splits into what the device ran and where
// it stood idle, and why: waiting for the host to queue the next kernel, or
// waiting with the kernel queued (for a copy back, an event, a recompute).
type Timeline interface {
	// Launch queues on stream a kernel that runs for d and records, in
	// slot, when it started and ended on the device.
	Launch(stream device.Stream, d time.Duration, slot int) error
	// Stamps returns the stamps of slots [0, n), once the stream they were
	// queued on has synchronized; nanoseconds of one clock.
	Stamps(n int) ([]Stamp, error)
}

// Stamp is one kernel's start and end on the device, nanoseconds.
type Stamp struct{ Start, End int64 }

// HostTimeline is Timeline on the host backend: each kernel is a function
// queued with d.Launch (like HostKernel) that reads the host's clock when
// the stream's goroutine starts and ends it. It holds up to n slots for
// kernels, and stamps copies too (a CopyTimeline: StampHostCopies).
func HostTimeline(d *host.Device, n int) CopyTimeline {
	h := &hostTimeline{d: d, n: n, st: make([]Stamp, n+2*CopySlots)}
	h.CopyStamps = NewCopyStamps(func(s device.Stream, slot int) error { return h.launch(s, 0, slot) }, h.slots, n, CopySlots)
	return h
}

type hostTimeline struct {
	*CopyStamps
	d  *host.Device
	n  int // kernel slots; the copies' follow
	mu sync.Mutex
	st []Stamp
}

func (h *hostTimeline) slots(lo, hi int) ([]Stamp, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.st[lo:hi]), nil
}

func (h *hostTimeline) Launch(s device.Stream, t time.Duration, slot int) error {
	if slot < 0 || slot >= h.n {
		return fmt.Errorf("timeline: slot %d of %d: %w", slot, h.n, device.ErrInvalidValue)
	}
	return h.launch(s, t, slot)
}

func (h *hostTimeline) launch(s device.Stream, t time.Duration, slot int) error {
	return h.d.Launch(s, func() {
		start := time.Now().UnixNano()
		Wait(t)
		end := time.Now().UnixNano()
		h.mu.Lock()
		h.st[slot] = Stamp{start, end}
		h.mu.Unlock()
	})
}

func (h *hostTimeline) Stamps(n int) ([]Stamp, error) {
	if n < 0 || n > h.n {
		return nil, fmt.Errorf("timeline: %d stamps of %d: %w", n, h.n, device.ErrInvalidValue)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.st[:n]), nil
}

// stallFloor is the shortest idle stretch between two kernels counted as a
// stall: below it, the device's own launch gap.
const stallFloor = 2 * time.Microsecond

// OpSpan is one op of a stamped iteration, microseconds from the start of
// its first kernel on the device: when the host queued the kernel
// (IssuedUS, on the device's clock through the first kernel, whose device
// is idle when it is queued), when it ran, and how long the device stood
// idle before it, split into the part the host had not queued it yet
// (HostStallUS) and the rest (DeviceStallUS: queued, waiting for an event
// such as a copy back).
type OpSpan struct {
	Op                         int
	Name                       string
	IssuedUS, StartUS, EndUS   float64
	HostStallUS, DeviceStallUS float64
}

// Stall is one of an iteration's longest idle stretches of the device.
type Stall struct {
	Op     int     `json:"op"`
	Name   string  `json:"name"`
	MS     float64 `json:"ms"`
	OnHost bool    `json:"on_host"` // the host had not queued the op's kernel yet
}

// spans lines the host's issue times (ns from Begin) up with the device's
// stamps of the same kernels: the first kernel is queued on an idle device,
// so its start less its issue time is the offset between the two clocks
// (plus one launch latency, which every issue time then carries too).
func spans(names []string, issued []int64, st []Stamp) []OpSpan {
	if len(st) == 0 {
		return nil
	}
	t0 := st[0].Start
	off := st[0].Start - issued[0]
	out := make([]OpSpan, len(st))
	prevEnd := t0
	for i, s := range st {
		sp := OpSpan{Op: i, Name: names[i], IssuedUS: float64(issued[i]+off-t0) / 1e3,
			StartUS: float64(s.Start-t0) / 1e3, EndUS: float64(s.End-t0) / 1e3}
		if gap := s.Start - prevEnd; gap > int64(stallFloor) {
			host := min(max(issued[i]+off-prevEnd, 0), gap)
			sp.HostStallUS, sp.DeviceStallUS = float64(host)/1e3, float64(gap-host)/1e3
		}
		prevEnd = max(prevEnd, s.End)
		out[i] = sp
	}
	return out
}

// stallsOf sums an iteration's stamped spans into its report: the time the
// device ran kernels, its idle time by cause, and the worst stalls.
func stallsOf(ir *IterationReport, sp []OpSpan, worst int) {
	var busy, hostS, devS float64
	var all []Stall
	for _, s := range sp {
		busy += s.EndUS - s.StartUS
		hostS += s.HostStallUS
		devS += s.DeviceStallUS
		if g := s.HostStallUS + s.DeviceStallUS; g > 0 {
			all = append(all, Stall{Op: s.Op, Name: s.Name, MS: g / 1e3, OnHost: s.HostStallUS >= s.DeviceStallUS})
		}
	}
	slices.SortStableFunc(all, func(a, b Stall) int { return cmp.Compare(b.MS, a.MS) })
	ir.DeviceBusyMS, ir.HostStallMS, ir.DeviceStallMS = busy/1e3, hostS/1e3, devS/1e3
	ir.WorstStalls = all[:min(worst, len(all))]
}

// worstLayers is the n layers of gs that ran longest over their simulated
// time on sp's clock, longest first, with the time each waited: its ops'
// stalls less the stamped recomputes (cp) that ran in them.
func worstLayers(sp []OpSpan, cp []CopySpan, gs []chameleon.GroupTime, n int) []LayerTime {
	var out []LayerTime
	for _, g := range gs {
		if g.First < 0 || g.Last >= len(sp) || g.First > g.Last {
			return nil // not this iteration's ops
		}
		from := 0.0
		if g.First > 0 {
			from = sp[g.First-1].EndUS
		}
		to := sp[g.Last].EndUS
		var wait float64
		for _, s := range sp[g.First : g.Last+1] {
			wait += s.HostStallUS + s.DeviceStallUS
		}
		for _, c := range cp {
			if c.Recompute {
				wait -= max(min(c.EndUS, to)-max(c.StartUS, from), 0)
			}
		}
		out = append(out, LayerTime{FirstOp: g.First, LastOp: g.Last, Phase: g.Phase.String(),
			SimulatedMS: g.SimulatedUS / 1e3, MeasuredMS: (to - from) / 1e3,
			SimulatedWaitMS: g.SimulatedStallUS / 1e3, MeasuredWaitMS: max(wait, 0) / 1e3})
	}
	slices.SortStableFunc(out, func(a, b LayerTime) int {
		return cmp.Compare(b.MeasuredMS-b.SimulatedMS, a.MeasuredMS-a.SimulatedMS)
	})
	return out[:min(n, len(out))]
}

// ev is one Chrome trace event.
type ev = simulate.ChromeEvent

// WriteTimeline writes an iteration's stamped spans as Chrome trace JSON
// (opens in Perfetto): the device's kernels on one track, its stalls on
// another named by their cause, the host's queueing on a third, and the
// stamped copies (cp, may be nil) each way on two more. With sim, a second
// process shows the simulation of the policy the iteration ran under on
// the same clock (both start at the iteration's first kernel): its ops and
// recomputes, the waits it planned, and each copy with the swap it serves.
func WriteTimeline(w io.Writer, title string, sp []OpSpan, cp []CopySpan, sim *chameleon.Simulation) error {
	evs := []ev{
		{Name: "process_name", Ph: "M", PID: 1, Args: map[string]any{"name": title}},
		{Name: "thread_name", Ph: "M", PID: 1, TID: 1, Args: map[string]any{"name": "device: kernels"}},
		{Name: "thread_name", Ph: "M", PID: 1, TID: 2, Args: map[string]any{"name": "device: idle"}},
		{Name: "thread_name", Ph: "M", PID: 1, TID: 3, Args: map[string]any{"name": "host: queueing"}},
	}
	if len(cp) > 0 {
		evs = append(evs, ev{Name: "thread_name", Ph: "M", PID: 1, TID: 4, Args: map[string]any{"name": "link: device to host"}},
			ev{Name: "thread_name", Ph: "M", PID: 1, TID: 5, Args: map[string]any{"name": "link: host to device"}})
	}
	for _, c := range cp {
		if c.EndUS < 0 {
			continue // done before the iteration's first kernel
		}
		if c.Recompute {
			evs = append(evs, ev{Name: "recompute", Ph: "X", PID: 1, TID: 1, TS: c.StartUS, Dur: c.EndUS - c.StartUS,
				Args: map[string]any{"op": c.Op}})
			continue
		}
		name, tid := "to host", 4
		if !c.ToHost {
			name, tid = "to device", 5
		}
		evs = append(evs, ev{Name: name, Ph: "X", PID: 1, TID: tid, TS: c.StartUS, Dur: c.EndUS - c.StartUS,
			Args: map[string]any{"bytes": c.Bytes, "gb_per_s": float64(c.Bytes) / max(c.EndUS-c.StartUS, 1e-3) / 1e3}})
	}
	for i, s := range sp {
		evs = append(evs, ev{Name: s.Name, Ph: "X", PID: 1, TID: 1, TS: s.StartUS, Dur: s.EndUS - s.StartUS,
			Args: map[string]any{"op": s.Op}})
		if s.HostStallUS > 0 {
			evs = append(evs, ev{Name: "waiting for the host", Ph: "X", PID: 1, TID: 2,
				TS: s.StartUS - s.HostStallUS - s.DeviceStallUS, Dur: s.HostStallUS, Args: map[string]any{"op": s.Op}})
		}
		if s.DeviceStallUS > 0 {
			evs = append(evs, ev{Name: "waiting queued (copy or event)", Ph: "X", PID: 1, TID: 2,
				TS: s.StartUS - s.DeviceStallUS, Dur: s.DeviceStallUS, Args: map[string]any{"op": s.Op}})
		}
		if i+1 < len(sp) {
			evs = append(evs, ev{Name: s.Name, Ph: "X", PID: 1, TID: 3, TS: s.IssuedUS, Dur: max(sp[i+1].IssuedUS-s.IssuedUS, 0),
				Args: map[string]any{"op": s.Op}})
		}
	}
	if sim != nil && sim.Result != nil {
		// The simulation as process 2: its ops named as they ran, its
		// waits on a thread of their own.
		evs = append(evs, ev{Name: "process_name", Ph: "M", PID: 2, Args: map[string]any{"name": "simulated: the policy as the executor issues it"}})
		names := make([]string, len(sp))
		for i, s := range sp {
			names[i] = s.Name
		}
		tr := simulate.ChromeTracks{PID: 2, Compute: 1, Stalls: 2, D2H: 4, H2D: 5}
		if err := sim.Result.ChromeEvents(tr, names, sim.Swaps, sim.Recomputes, func(e ev) error { evs = append(evs, e); return nil }); err != nil {
			return err
		}
	}
	return json.NewEncoder(w).Encode(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms"})
}
