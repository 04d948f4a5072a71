// Package simulate plays a swap policy on a virtual timeline: one compute
// stream running the iteration's ops back to back, and two copy engines (D2H
// and H2D) sharing one host link. It is pure: op times, a memory curve and
// the swaps go in; start and end times, stalls, the memory curve under the
// policy and link figures come out.
//
// The semantics follow what an engine on a real device does:
//   - A swap-out is queued on the D2H engine when its op Out ends on compute.
//   - Its device memory is reused from the start of op Free, and op Free
//     waits for the copy to be complete (the allocator makes the stream that
//     reuses a block wait on the copy's event). Free < 0 means "whenever the
//     copy is done": the memory counts as free from the first op that starts
//     after it, with no wait (what a framework that frees behind an async copy
//     does, e.g. the save_on_cpu baseline).
//   - A swap that copies nothing out (NoCopyOut: its host copy is
//     current) never reaches the D2H engine: its memory is free from the
//     end of op Out (from op Free when that is set), with no wait.
//   - A swap-in is queued on the H2D engine at the start of op In, and its
//     memory is taken again from then. Op Use waits for it.
//   - A swap that wraps the iteration (out after the tensor's last use,
//     back before its first use in the next) is simulated in steady state:
//     a copy out still running when the iteration ends holds the D2H engine
//     at the start of the next, and op 0, which reuses its memory, waits
//     for it.
//   - Each engine runs one copy at a time; among the copies issued and not
//     started it takes the one whose waiting op comes first (a host-side
//     queue that feeds the copy stream in deadline order). Alone, a direction gets its full
//     rate; while the other direction is busy, both run at their shared rates
//     (the measured congestion of the H200 link). The rate of a copy in flight
//     changes when the other direction starts or stops: the simulation is
//     event-driven, not per op.
//
// Only the waits above delay compute: an op never waits for a copy it does
// not depend on.
package simulate

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/chameleon-go/chameleon/trace"
)

// Link is the host link's bandwidth in bytes per second: each direction
// alone and each direction while the other is busy.
type Link struct {
	D2H, H2D             float64
	D2HShared, H2DShared float64
}

// H200 is the link measured on one NVIDIA H200 over PCIe Gen5 x16 with
// pinned host memory: 55 GB/s each way alone, 48 (D2H) + 51 (H2D) GB/s when
// both directions are busy.
func H200() Link { return Link{D2H: 55e9, H2D: 55e9, D2HShared: 48e9, H2DShared: 51e9} }

// Scaled returns the link with every rate scaled so that one direction
// alone runs at bw bytes per second, keeping the measured congestion ratios.
func (l Link) Scaled(bw float64) Link {
	if l.D2H <= 0 || bw <= 0 {
		return l
	}
	s := bw / l.D2H
	return Link{D2H: bw, H2D: l.H2D * s, D2HShared: l.D2HShared * s, H2DShared: l.H2DShared * s}
}

func (l Link) validate() error {
	if !(l.D2H > 0 && l.H2D > 0 && l.D2HShared > 0 && l.H2DShared > 0) {
		return fmt.Errorf("simulate: link rates must be positive: %+v", l)
	}
	return nil
}

// Swap is one tensor moved to host memory and back over one idle gap.
// Op numbers index the iteration's ops. The JSON names match the plan
// report of cmd/chameleon.
type Swap struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	// Out is the op after which the copy to the host starts (the tensor's
	// last use before the gap).
	Out int `json:"out_after_op"`
	// Free is the op from whose start the device memory counts as free; it
	// waits for the copy. Negative: free as soon as the copy is done.
	Free int `json:"freed_at_op"`
	// In is the op at whose start the copy back is issued and the device
	// memory taken again.
	In int `json:"in_issue_op"`
	// Use is the next op that uses the tensor; it waits for the copy back.
	Use int `json:"in_before_op"`
	// NoCopyOut marks a tensor whose host copy is current when it leaves
	// (a frozen weight, or one no op wrote since it last came back): its
	// device memory is released with no copy to the host, free from the
	// end of op Out, and only the copy back crosses the link. In JSON it
	// is "d2h": false; a swap with "d2h" absent or true copies out.
	NoCopyOut bool `json:"-"`
	// Early says the copy out is a write-back: issued after op CopyAfter,
	// the tensor's last write before Out, while the tensor stays on the
	// device and is read on; at Out its device memory is released with
	// nothing left to copy, counting free from Free once the copy is done
	// (the planner makes Free Out+1: the executor releases it at Out, the
	// compute stream waiting there for a copy still running).
	// CopyAfter < Out is within the iteration; CopyAfter past the gap's
	// use (a swap that does not wrap) is the previous iteration's last
	// write, whose copy the step before issued. In JSON it is
	// "copy_out_after_op", absent when not Early.
	Early     bool `json:"-"`
	CopyAfter int  `json:"-"`
}

// EarlyWraps reports a write-back issued in the previous iteration: the
// tensor's last write before Out is that iteration's.
func (s Swap) EarlyWraps() bool { return s.Early && s.CopyAfter > s.Out }

// swapJSON is Swap as JSON: D2H is written only as false.
type swapJSON struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Out    int            `json:"out_after_op"`
	Free   int            `json:"freed_at_op"`
	In     int            `json:"in_issue_op"`
	Use    int            `json:"in_before_op"`
	D2H    *bool          `json:"d2h,omitempty"`
	After  *int           `json:"copy_out_after_op,omitempty"`
}

// MarshalJSON writes the swap with "d2h": false when it copies nothing
// out, and no "d2h" otherwise.
func (s Swap) MarshalJSON() ([]byte, error) {
	j := swapJSON{Tensor: s.Tensor, Bytes: s.Bytes, Out: s.Out, Free: s.Free, In: s.In, Use: s.Use}
	if s.NoCopyOut {
		f := false
		j.D2H = &f
	}
	if s.Early {
		a := s.CopyAfter
		j.After = &a
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes: "d2h" absent or true is a
// swap that copies out.
func (s *Swap) UnmarshalJSON(b []byte) error {
	var j swapJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("simulate: swap: %w", err)
	}
	*s = Swap{Tensor: j.Tensor, Bytes: j.Bytes, Out: j.Out, Free: j.Free, In: j.In, Use: j.Use, NoCopyOut: j.D2H != nil && !*j.D2H}
	if j.After != nil {
		s.Early, s.CopyAfter = true, *j.After
	}
	return nil
}

// Wraps reports a swap over a gap that crosses the iteration boundary:
// Use <= Out, the tensor goes out after its last use Out of one iteration
// and comes back for its first use Use of the next (optimizer state, idle
// from one step's optimizer to the next). The run is taken in steady state:
// the tensor is on the host when the iteration starts, its memory is free
// over [0, In) and [Free, nops), and Free == nops means its copy out ends
// after the iteration, op 0 of the next waiting for it. Free past nops
// frees it in the next iteration, from op Free-nops (before In), which
// waits for the copy out in its place: the memory is free over
// [Free-nops, In) alone, and the ops before keep running while the last
// writes of one step cross out.
func (s Swap) Wraps() bool { return s.Use <= s.Out }

// FreeSpans is where swap s's memory counts free in an iteration of n
// ops, from freed, the op its memory counts free from (Result.Freed; Free
// where not simulated), to the op its copy back is issued at: one span, or
// for a swap that wraps the iteration, [0, In) and [freed, n), or
// [freed-n, In) when it is freed in the next iteration. Empty spans are
// left out.
func (s Swap) FreeSpans(freed, n int) [][2]int {
	var out [][2]int
	add := func(a, b int) {
		if a < b {
			out = append(out, [2]int{a, b})
		}
	}
	switch {
	case s.Wraps() && freed > n:
		add(freed-n, s.In)
	case s.Wraps():
		add(0, s.In)
		add(min(max(freed, s.Out+1), n), n)
	default:
		if freed < 0 || freed <= s.Out {
			freed = s.Out + 1
		}
		add(freed, s.In)
	}
	return out
}

// ErrInvalid is wrapped by errors about malformed input.
var ErrInvalid = errors.New("invalid simulation input")

// Validate checks the ordering rules Out < Free <= In <= Use < nops (Free
// may be negative: dynamic free), or for a swap that wraps, 0 <= In <= Use
// <= Out < Free <= nops, or Free in the next iteration, before its In:
// nops < Free < nops+In.
func (s Swap) Validate(nops int) error {
	if err := s.validateEarly(nops); err != nil {
		return err
	}
	if s.Wraps() {
		if s.Bytes < 0 || s.In < 0 || s.In > s.Use || s.Use < 0 || s.Out >= nops || s.Free <= s.Out || s.Free >= nops+max(s.In, 1) {
			return fmt.Errorf("tensor %d: wrapping swap out %d free %d in %d use %d breaks 0 <= in <= use <= out < free <= %d (or %d < free < %d+in, freed in the next iteration): %w",
				s.Tensor, s.Out, s.Free, s.In, s.Use, nops, nops, nops, ErrInvalid)
		}
		return nil
	}
	switch {
	case s.Bytes < 0:
		return fmt.Errorf("tensor %d: negative bytes: %w", s.Tensor, ErrInvalid)
	case s.Out < 0 || s.Use >= nops || s.Out >= s.Use:
		return fmt.Errorf("tensor %d: out %d, use %d outside [0,%d): %w", s.Tensor, s.Out, s.Use, nops, ErrInvalid)
	case s.In <= s.Out || s.In > s.Use:
		return fmt.Errorf("tensor %d: in %d not in (%d,%d]: %w", s.Tensor, s.In, s.Out, s.Use, ErrInvalid)
	case s.Free >= 0 && (s.Free <= s.Out || s.Free > s.In):
		return fmt.Errorf("tensor %d: free %d not in (%d,%d]: %w", s.Tensor, s.Free, s.Out, s.In, ErrInvalid)
	}
	return nil
}

// validateEarly checks a write-back's op: a swap that copies out, its
// copy issued before Out within the iteration (after the gap's use when
// the swap wraps), or, for one that does not wrap, after the gap's use in
// the previous iteration.
func (s Swap) validateEarly(nops int) error {
	if !s.Early {
		return nil
	}
	lo := 0
	if s.Wraps() {
		lo = s.Use
	}
	ok := !s.NoCopyOut && s.CopyAfter >= lo && s.CopyAfter < nops && s.CopyAfter != s.Out
	if ok && s.CopyAfter > s.Out {
		ok = !s.Wraps() && s.CopyAfter >= s.Use
	}
	if !ok {
		return fmt.Errorf("tensor %d: write-back after op %d for out %d use %d (no copy out: %v): want it before out, or after use when the swap does not wrap: %w",
			s.Tensor, s.CopyAfter, s.Out, s.Use, s.NoCopyOut, ErrInvalid)
	}
	return nil
}

// Recompute is a tensor dropped after op Drop, its last use before an idle
// gap, and made again by running its producer, op Op, on the compute stream
// just before op Before, its next use. Its memory counts as free over
// [Drop+1, Before). Kept lists the producer's inputs that would be freed
// before Before and are held for the recompute instead. The JSON names
// match the plan report of cmd/chameleon.
type Recompute struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Op     int            `json:"op"`
	Drop   int            `json:"dropped_after_op"`
	Before int            `json:"before_op"`
	Kept   []Kept         `json:"kept_inputs,omitempty"`
	// Remade lists the producer's inputs that are freed before Before and
	// made again for the recompute, by their own producers, just before it,
	// in the order they run (an input of one of them made again first).
	Remade []Remade `json:"remade_inputs,omitempty"`
}

// Remade is an input made again for a recompute by running its producer,
// op Op, first; it lives only through the recompute.
type Remade struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	Op     int            `json:"op"`
}

// Kept is an input held past its release for a recompute: its memory counts
// from op From, where it would have been freed, to the recompute. Inputs
// kept for several recomputes count once, to the last of them.
type Kept struct {
	Tensor trace.TensorID `json:"tensor"`
	Bytes  int64          `json:"bytes"`
	From   int            `json:"from_op"`
}

// Validate checks Op <= Drop, Drop+1 < Before < nops, and that kept inputs
// are held from before the recompute.
func (r Recompute) Validate(nops int) error {
	if r.Bytes < 0 || r.Op < 0 || r.Op > r.Drop || r.Drop+1 >= r.Before || r.Before >= nops {
		return fmt.Errorf("tensor %d: recompute of op %d dropped after %d before %d breaks 0 <= op <= drop < drop+1 < before < %d: %w",
			r.Tensor, r.Op, r.Drop, r.Before, nops, ErrInvalid)
	}
	for _, m := range r.Remade {
		if m.Bytes < 0 || m.Op < 0 || m.Op >= r.Op {
			return fmt.Errorf("tensor %d: input %d remade by op %d: want 0 <= op < %d: %w", r.Tensor, m.Tensor, m.Op, r.Op, ErrInvalid)
		}
	}
	for _, k := range r.Kept {
		if k.Bytes < 0 || k.From <= r.Op || k.From > r.Before {
			return fmt.Errorf("tensor %d: input %d kept from op %d: want %d < from <= %d: %w", r.Tensor, k.Tensor, k.From, r.Op, r.Before, ErrInvalid)
		}
	}
	return nil
}

// HeldSpan is the memory an input of recomputes holds beyond its release:
// Bytes over the ops [From, To).
type HeldSpan struct {
	Tensor   trace.TensorID
	Bytes    int64
	From, To int
}

// Held is the memory the inputs of rcs hold beyond their release. A kept
// input counts from where it would be freed through the op of the last
// recompute that reads it: a recompute runs just before its op, whose own
// outputs the host has already made, so the op's memory holds the input
// too. An input made again for a recompute (Remade) counts over that op
// alone, once per op however many of its recomputes read it: it exists
// only while they run. One span per kept input, then one per remade input
// and op, in order of tensor and op.
func Held(rcs []Recompute) []HeldSpan {
	byID := map[trace.TensorID]*HeldSpan{}
	type at struct {
		id trace.TensorID
		op int
	}
	remade := map[at]int64{}
	for _, r := range rcs {
		for _, k := range r.Kept {
			h := byID[k.Tensor]
			if h == nil {
				h = &HeldSpan{Tensor: k.Tensor, Bytes: k.Bytes, From: k.From, To: r.Before + 1}
				byID[k.Tensor] = h
			}
			h.From, h.To = min(h.From, k.From), max(h.To, r.Before+1)
		}
		for _, m := range r.Remade {
			remade[at{m.Tensor, r.Before}] = m.Bytes
		}
	}
	out := make([]HeldSpan, 0, len(byID)+len(remade))
	for _, h := range byID {
		out = append(out, *h)
	}
	for k, b := range remade {
		out = append(out, HeldSpan{Tensor: k.id, Bytes: b, From: k.op, To: k.op + 1})
	}
	slices.SortFunc(out, func(a, b HeldSpan) int { return cmp.Or(cmp.Compare(a.Tensor, b.Tensor), cmp.Compare(a.From, b.From)) })
	return out
}

// Input is what Run needs.
type Input struct {
	// OpTimes is each op's compute time in microseconds.
	OpTimes []float64
	// Curve is the allocated bytes after each op without any swap; nil
	// leaves memory out of the result.
	Curve []int64
	Swaps []Swap
	// Recomputes run on the compute stream before the op that needs them:
	// they delay it and everything after it, and free memory as they say.
	Recomputes []Recompute
	Link       Link
	// Issue, when set, is how an executor with in-order copy streams
	// issues the copies (see IssuePlan); each engine then runs them in
	// issue order. Nil: copies are issued at Out and In, and each engine
	// serves, among those issued, the copy whose op waits first.
	Issue *IssuePlan
}

// IssuePlan says when, and in which order, an executor issues each swap's
// copies to streams that run them in issue order: the copy out after op
// OutOp[k], the copy back at the start of op InOp[k], and among copies of
// the same op, in the order of OutOrder and InOrder (swap indices).
type IssuePlan struct {
	OutOp, InOp       []int
	OutOrder, InOrder []int
}

// Issue derives, from a simulated schedule, the issue plan that makes
// in-order copy streams run that schedule: each copy out is issued after
// the op that ended last before it started on the simulated engine (never
// before Out), each copy back at the start of the op running when it
// started (never before In, never after Use), and copies are ordered by
// their simulated starts. A swap that wraps the iteration is issued the
// same way: its copy out no later than the op before Free (whose op waits
// for it), its copy back no later than Use. Issued at Out, a wrapping
// copy out sat on the in-order stream ahead of copies the step needed
// sooner, which the simulated engine served first. Without a result (nil)
// the plan's own Out and In are used.
func Issue(swaps []Swap, r *Result) *IssuePlan {
	ip := &IssuePlan{OutOp: make([]int, len(swaps)), InOp: make([]int, len(swaps)),
		OutOrder: make([]int, len(swaps)), InOrder: make([]int, len(swaps))}
	for i, s := range swaps {
		ip.OutOp[i], ip.InOp[i], ip.OutOrder[i], ip.InOrder[i] = s.Out, s.In, i, i
		if s.Early {
			ip.OutOp[i] = s.CopyAfter
		}
	}
	if r == nil || len(r.Out) != len(swaps) {
		return ip
	}
	n := len(r.Ops)
	for i, s := range swaps {
		if st := r.Out[i].Start; !math.IsNaN(st) {
			t := sort.Search(n, func(x int) bool { return r.Ops[x].End > st+1e-9 }) - 1
			switch {
			case s.EarlyWraps():
				// For the next iteration's release.
				ip.OutOp[i] = max(s.CopyAfter, min(t, n-1))
			case s.Early:
				// A write-back: issued before the release at Out at the
				// latest.
				ip.OutOp[i] = max(s.CopyAfter, min(t, s.Out))
			case s.Wraps():
				// Done before op Free, which reuses its memory.
				ip.OutOp[i] = max(s.Out, min(t, s.Free-1, n-1))
			default:
				ip.OutOp[i] = max(s.Out, min(t, s.Use-1))
			}
		}
		if st := r.In[i].Start; !math.IsNaN(st) {
			t := sort.Search(n, func(x int) bool { return r.Ops[x].Start > st+1e-9 }) - 1
			ip.InOp[i] = min(max(s.In, t), s.Use)
		}
	}
	byStart := func(ts []Transfer) func(a, b int) int {
		at := func(i int) float64 {
			if math.IsNaN(ts[i].Start) {
				return math.Inf(1)
			}
			return ts[i].Start
		}
		return func(a, b int) int { return cmp.Compare(at(a), at(b)) }
	}
	slices.SortStableFunc(ip.OutOrder, byStart(r.Out))
	slices.SortStableFunc(ip.InOrder, byStart(r.In))
	return ip
}

// OpStat is one op on the simulated timeline (microseconds from the start
// of the iteration).
type OpStat struct {
	Start, End float64
	// Stall is how long the op waited for copies after the previous op
	// ended.
	Stall float64
	// Mem is the allocated bytes after the op: the input curve minus the
	// bytes swapped out (copy complete, not yet brought back).
	Mem int64
}

// Transfer is one copy on an engine.
type Transfer struct {
	Swap              int // index into Input.Swaps
	Issue, Start, End float64
}

// Result is the simulated iteration.
type Result struct {
	Ops []OpStat
	// Out and In are the copies of each swap, indexed like Input.Swaps.
	// A swap that copies nothing out (NoCopyOut) has an Out with only its
	// Issue set (Start and End NaN).
	Out, In []Transfer
	// Freed is, per swap, the op from which its memory counted as free
	// (Free itself unless it was dynamic).
	Freed []int
	// BaseUS is the sum of op times, IterationUS the simulated end, which
	// includes RecomputeUS, the time the recomputes took on the compute
	// stream, and StallUS, the time ops waited for copies.
	BaseUS, IterationUS float64
	StallUS             float64
	RecomputeUS         float64
	// StallUS in parts, by what the ops waited for: the first op for the
	// copies out the previous iteration left running (WaitStartUS), ops
	// for copies out to end before their memory counts free (WaitOutUS),
	// and for copies back to end before their use (WaitInUS).
	WaitStartUS, WaitOutUS, WaitInUS float64
	// SwapWaitUS is, per swap (indexed like Input.Swaps), the time ops
	// waited for its copies: the three waits above by the swap that held
	// them (an op that waits for two copies waits for the one that ends
	// last, after the first). They sum to StallUS.
	SwapWaitUS []float64
	// WaitQueuedUS is the part of StallUS during which none of the copies
	// the waiting op needs was on the link: each engine runs one copy at
	// a time and never stops one it has begun, so a needed copy can sit
	// behind one the op does not need (or not be issued yet). The rest of
	// StallUS some copy the op needs was moving.
	WaitQueuedUS float64
	// Recomputed is, per recompute (indexed like Input.Recomputes), when it
	// ran on the compute stream.
	Recomputed []Span
	// Peak is the largest Mem, PeakOp where.
	Peak   int64
	PeakOp int
	// Bytes moved and engine busy time per direction.
	BytesD2H, BytesH2D int64
	BusyD2H, BusyH2D   float64
}

// Span is a stretch of the timeline, microseconds.
type Span struct{ Start, End float64 }

// OverheadPct is the simulated slowdown over the op times alone, in percent.
func (r *Result) OverheadPct() float64 {
	if r.BaseUS <= 0 {
		return 0
	}
	return (r.IterationUS/r.BaseUS - 1) * 100
}

// UtilD2H is the share of the iteration the D2H engine was busy.
func (r *Result) UtilD2H() float64 { return ratio(r.BusyD2H, r.IterationUS) }

// UtilH2D is the share of the iteration the H2D engine was busy.
func (r *Result) UtilH2D() float64 { return ratio(r.BusyH2D, r.IterationUS) }

// LinkBusy is how long each copy engine is busy within [from, to) of the
// iteration, in µs: the copies of r's swaps, with the part of a copy that
// runs past the iteration's end counted from its start, where it runs
// when the iteration repeats (steady state). Over [0, IterationUS) it
// sums to BusyD2H and BusyH2D.
func (r *Result) LinkBusy(from, to float64) (d2h, h2d float64) {
	return busyIn(r.Out, from, to, r.IterationUS), busyIn(r.In, from, to, r.IterationUS)
}

// PartBusy is how busy each direction of the link is over one part of a
// step: the part's length, the share of it each copy engine is busy, and
// how long compute stood waiting for copies in it (WaitMS).
type PartBusy struct {
	Part   string  `json:"part"`
	MS     float64 `json:"ms"`
	D2H    float64 `json:"d2h"`
	H2D    float64 `json:"h2d"`
	WaitMS float64 `json:"wait_ms"`
}

// PartsBusy is LinkBusy over each part of r's step (trace.StepParts of its
// ops), with the ops' waits (Waited), as PartsOver counts them; nil when
// parts do not index r's ops.
func (r *Result) PartsBusy(parts []trace.Part) []PartBusy {
	if len(parts) == 0 || parts[len(parts)-1].Last >= len(r.Ops) {
		return nil
	}
	return PartsOver(parts, func(op int) float64 { return r.Ops[op].Start }, r.IterationUS, r.LinkBusy, r.Waited)
}

// Waited is the time, µs, within [from, to) that compute stood waiting for
// copies: each op's Stall, which ends at its start.
func (r *Result) Waited(from, to float64) float64 {
	var w float64
	for _, o := range r.Ops {
		if o.Stall > 0 {
			w += max(0, min(o.Start, to)-max(o.Start-o.Stall, from))
		}
	}
	return w
}

// PartsOver is how busy each direction of the link is over each part of a
// step whose op op starts at start(op) and which ends at end, busy giving
// the time each direction is busy within a stretch and wait the time
// compute waited for copies in it (nil: not known): a part runs from its
// first op's start (0 for the first part) to the next part's first op's
// start (end for the last), so a wait before an op counts in the part
// before it. A part that takes no time (profiler marks) is left out. The
// simulated step (PartsBusy) and a measured one (replay's timeline) are
// split the same way.
func PartsOver(parts []trace.Part, start func(op int) float64, end float64, busy func(from, to float64) (d2h, h2d float64), wait func(from, to float64) float64) []PartBusy {
	var out []PartBusy
	for k, p := range parts {
		from, to := start(p.First), end
		if k == 0 {
			from = 0
		}
		if k+1 < len(parts) {
			to = start(parts[k+1].First)
		}
		if to <= from {
			continue
		}
		d, h := busy(from, to)
		pb := PartBusy{Part: p.Name, MS: (to - from) / 1000, D2H: d / (to - from), H2D: h / (to - from)}
		if wait != nil {
			pb.WaitMS = wait(from, to) / 1000
		}
		out = append(out, pb)
	}
	return out
}

// busyIn is the time of transfers within [from, to), each folded into
// [0, period) (0: not folded).
func busyIn(ts []Transfer, from, to, period float64) float64 {
	overlap := func(s, e float64) float64 { return max(0, min(e, to)-max(s, from)) }
	var b float64
	for _, x := range ts {
		s, e := x.Start, x.End
		if !(e > s) { // no copy (NaN), or none of it
			continue
		}
		if period > 0 {
			k := math.Floor(s / period)
			s, e = s-k*period, e-k*period
			for e > period {
				b += overlap(s, period)
				s, e = 0, e-period
			}
		}
		b += overlap(s, e)
	}
	return b
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// engine is one copy direction: a FIFO of transfers.
type engine struct {
	queue []int   // swap indices, in issue order
	head  int     // next in queue to run
	rem   float64 // bytes left of the running copy
	busy  bool
	cur   int
	since float64 // when the running copy started (for busy time)
}

// Run simulates the input. It returns an error wrapping ErrInvalid when a
// swap breaks the ordering rules or the op times are not finite and
// non-negative.
func Run(in Input) (*Result, error) {
	r, backlog, err := run(in, nil)
	if err != nil || len(backlog) == 0 {
		return r, err
	}
	// Steady state: the copies out of swaps that wrap, still in flight
	// when the iteration ends, hold the D2H engine at the start of the
	// next, whose op 0 waits for them (it reuses their memory), or the op
	// each is freed at (Free past the end).
	r, _, err = run(in, backlog)
	return r, err
}

// backCopy is a copy out an iteration leaves running for the next: swap
// k's, with rem bytes to go.
type backCopy struct {
	k   int
	rem float64
}

// run simulates one iteration whose D2H engine starts with backlog, the
// previous one's copies out still to go, in order, and returns what it
// leaves the next. Its steps: check the input, lay out the per-op lists,
// play the ops in order (each op: issue its copies back, run its
// recomputes, wait for its copies, compute, issue its copies out), measure
// the backlog and drain the engines, then derive the memory curve.
func run(in Input, backlog []backCopy) (*Result, []backCopy, error) {
	n := len(in.OpTimes)
	// The per-op lists and the flags are made here, not in the steps that
	// fill them, the engines are held by pointer and the result is
	// returned as r, not s.r: escape analysis does not tell s's fields
	// apart, so this keeps small lists and flags on the stack (the lists'
	// entries and the engines' queues grow on the heap).
	var d2h, h2d engine
	s := sim{in: in, d2h: &d2h, h2d: &h2d}
	s.recAt = make([][]int, n)
	if err := check(in, s.recAt); err != nil {
		return nil, nil, err
	}
	r := newResult(in)
	s.r = r
	s.outAfter = bucket(n, in.Swaps, func(sw Swap) int {
		if sw.Early {
			return sw.CopyAfter
		}
		return sw.Out
	})
	s.inAt = bucket(n, in.Swaps, func(sw Swap) int { return sw.In })
	if in.Issue != nil {
		if err := checkIssue(in); err != nil {
			return nil, nil, err
		}
		s.outAfter, s.inAt = make([][]int, n), make([][]int, n)
		s.issueOrder()
	}
	s.waitFree = bucket(n, in.Swaps, func(sw Swap) int { return sw.Free })
	s.waitUse = bucket(n, in.Swaps, func(sw Swap) int { return sw.Use })
	s.outDone, s.inDone = make([]bool, len(in.Swaps)), make([]bool, len(in.Swaps))
	s.back, s.backDone = backlog, make([]bool, len(in.Swaps))
	s.waitBack = make([][]int, n)
	for k, sw := range in.Swaps {
		// Written back in the previous iteration.
		s.outDone[k] = sw.EarlyWraps()
	}
	for _, b := range backlog {
		sw := &in.Swaps[b.k]
		switch {
		case sw.Wraps() && n > 0:
			t := min(max(sw.Free-n, 0), n-1)
			s.waitBack[t] = append(s.waitBack[t], b.k)
		case sw.EarlyWraps():
			t := sw.Free
			if t < 0 {
				t = sw.Out + 1
			}
			s.waitBack[min(t, n-1)] = append(s.waitBack[min(t, n-1)], b.k)
		}
	}
	for t := range n {
		if err := s.op(t); err != nil {
			return nil, nil, err
		}
	}
	left := s.finish()
	s.memory()
	return r, left, nil
}

// check validates the input: the link, the curve's length, the op times,
// every swap and every recompute, in that order (the first error found is
// returned). It fills recAt (one entry per op): the recomputes that run
// before each op, in input order.
func check(in Input, recAt [][]int) error {
	n := len(in.OpTimes)
	if err := in.Link.validate(); err != nil {
		return err
	}
	if in.Curve != nil && len(in.Curve) != n {
		return fmt.Errorf("simulate: %d op times, %d curve points: %w", n, len(in.Curve), ErrInvalid)
	}
	for t, d := range in.OpTimes {
		if !(d >= 0) || math.IsInf(d, 0) {
			return fmt.Errorf("simulate: op %d: time %g: %w", t, d, ErrInvalid)
		}
	}
	for _, s := range in.Swaps {
		if err := s.Validate(n); err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
	}
	for k, rc := range in.Recomputes {
		if err := rc.Validate(n); err != nil {
			return fmt.Errorf("simulate: %w", err)
		}
		recAt[rc.Before] = append(recAt[rc.Before], k)
	}
	return nil
}

// newResult allocates the result of simulating in: one OpStat per op, and
// per swap an Out and an In transfer with every time NaN (not issued).
func newResult(in Input) *Result {
	r := &Result{
		Ops:        make([]OpStat, len(in.OpTimes)),
		Out:        make([]Transfer, len(in.Swaps)),
		In:         make([]Transfer, len(in.Swaps)),
		Freed:      make([]int, len(in.Swaps)),
		SwapWaitUS: make([]float64, len(in.Swaps)),
		Recomputed: make([]Span, len(in.Recomputes)),
	}
	for k := range r.Out {
		r.Out[k] = Transfer{Swap: k, Issue: math.NaN(), Start: math.NaN(), End: math.NaN()}
		r.In[k] = r.Out[k]
	}
	return r
}

// opLists are the per-op lists of swaps and recomputes, by index, that
// drive the op loop. Each list is in the order its entries are issued or
// waited for.
type opLists struct {
	// outAfter: the swaps whose copy out is issued after the op; inAt:
	// those whose copy back is issued at its start.
	outAfter, inAt [][]int
	// waitFree: the swaps whose copy out the op waits for (it reuses their
	// memory); waitUse: those whose copy back it waits for.
	waitFree, waitUse [][]int
	// recAt: the recomputes that run before the op.
	recAt [][]int
}

// sim is the state of one simulated iteration: the input, the result being
// filled in, the two copy engines and the compute clock.
//
// Invariants: now only grows; a swap's outDone (inDone) flag is set once,
// when its copy out (back) completes or, for a swap that copies nothing
// out, when its copy out is issued; an engine is busy with one copy at a
// time (cur < 0 on the D2H engine: the previous iteration's copy
// back[backHead], whose swap's backDone flag is set when it completes).
type sim struct {
	opLists
	in              Input
	r               *Result
	d2h, h2d        *engine
	now             float64
	outDone, inDone []bool
	// back is the previous iteration's copies out still to go, run first
	// on the D2H engine; waitBack, per op, the swaps whose copy of them
	// the op waits for.
	back     []backCopy
	backHead int
	backDone []bool
	waitBack [][]int
}

// checkIssue checks that in.Issue has an entry per swap in each of its
// lists: an error wrapping ErrInvalid when not.
func checkIssue(in Input) error {
	ip := in.Issue
	if len(ip.OutOp) != len(in.Swaps) || len(ip.InOp) != len(in.Swaps) || len(ip.OutOrder) != len(in.Swaps) || len(ip.InOrder) != len(in.Swaps) {
		return fmt.Errorf("simulate: issue plan for %d swaps: %w", len(in.Swaps), ErrInvalid)
	}
	return nil
}

// issueOrder fills outAfter and inAt (made empty, one entry per op) from
// the issue plan: each swap's copy out after op OutOp, its copy back at
// op InOp (none where that is outside the iteration), each op's copies in
// the plan's order.
func (s *sim) issueOrder() {
	ip, n := s.in.Issue, len(s.in.OpTimes)
	for _, k := range ip.OutOrder {
		if t := ip.OutOp[k]; t >= 0 && t < n {
			s.outAfter[t] = append(s.outAfter[t], k)
		}
	}
	for _, k := range ip.InOrder {
		if t := ip.InOp[k]; t >= 0 && t < n {
			s.inAt[t] = append(s.inAt[t], k)
		}
	}
}

// rates are the engines' current rates in bytes per microsecond: shared
// while both directions are busy, full otherwise.
func (s *sim) rates() (float64, float64) {
	link := s.in.Link
	if s.d2h.busy && s.h2d.busy {
		return link.D2HShared / 1e6, link.H2DShared / 1e6
	}
	return link.D2H / 1e6, link.H2D / 1e6
}

// deadline is the op that waits first for swap k's copy out (out) or copy
// back: the op that reuses its memory (In when its Free is dynamic), or
// its next use.
func (s *sim) deadline(k int, out bool) int {
	sw := &s.in.Swaps[k]
	if !out {
		return sw.Use
	}
	if sw.EarlyWraps() {
		// For the next iteration's release.
		return len(s.in.OpTimes) + max(sw.Free, sw.Out+1)
	}
	if sw.Free >= 0 {
		return sw.Free
	}
	return sw.In
}

// startable reports whether swap k's copy out (out) or copy back may
// start. A copy out always may; a copy back only once its copy out is
// complete, or when the swap wraps: its copy back brings what the previous
// iteration sent out and waits for no copy of this one (op 0 waited for
// those).
func (s *sim) startable(k int, out bool) bool {
	return out || s.outDone[k] || s.in.Swaps[k].Wraps()
}

// pick takes from e's queue the copy it runs next and moves it to the
// head, keeping the others in issue order; -1 when none may start. Without
// an issue plan it is, among the startable copies issued and not started,
// the one whose op waits first (earliest deadline first: a copy that no
// op is waiting for yet never blocks one that is needed sooner); with
// one, the head of the queue or nothing (a stream does not pass a copy
// that waits). out says which engine e is.
func (s *sim) pick(e *engine, out bool) int {
	inOrder := s.in.Issue != nil
	best := -1
	for x := e.head; x < len(e.queue); x++ {
		k := e.queue[x]
		if !s.startable(k, out) {
			if inOrder {
				break // a stream does not pass a copy that waits
			}
			continue
		}
		if best < 0 || (!inOrder && s.deadline(k, out) < s.deadline(e.queue[best], out)) {
			best = x
		}
		if inOrder {
			break // in issue order: the head or nothing
		}
	}
	if best < 0 {
		return -1
	}
	// Move the pick to the head, keeping the others in issue order.
	k := e.queue[best]
	copy(e.queue[e.head+1:best+1], e.queue[e.head:best])
	e.queue[e.head] = k
	e.head++
	return k
}

// startCopies starts a copy on each idle engine that has one to run,
// recording its start.
func (s *sim) startCopies() {
	if !s.d2h.busy && s.backHead < len(s.back) {
		s.d2h.busy, s.d2h.cur, s.d2h.rem = true, -1, s.back[s.backHead].rem
	}
	if !s.d2h.busy {
		if k := s.pick(s.d2h, true); k >= 0 {
			s.d2h.busy, s.d2h.cur, s.d2h.rem, s.d2h.since = true, k, float64(s.in.Swaps[k].Bytes), s.now
			s.r.Out[k].Start = s.now
		}
	}
	// A copy back cannot start before its copy out is complete.
	if !s.h2d.busy {
		if k := s.pick(s.h2d, false); k >= 0 {
			s.h2d.busy, s.h2d.cur, s.h2d.rem, s.h2d.since = true, k, float64(s.in.Swaps[k].Bytes), s.now
			s.r.In[k].Start = s.now
		}
	}
}

// step runs the engines to the earlier of t and the next copy
// completion (rates change there), and reports whether a copy completed.
// With both engines idle it only moves the clock to t (if finite).
func (s *sim) step(t float64) bool {
	s.startCopies()
	if !s.d2h.busy && !s.h2d.busy {
		if !math.IsInf(t, 1) {
			s.now = max(s.now, t)
		}
		return false
	}
	rd, rh := s.rates()
	next, cd, ch := t, math.Inf(1), math.Inf(1)
	if s.d2h.busy {
		cd = s.now + s.d2h.rem/rd
		next = min(next, cd)
	}
	if s.h2d.busy {
		ch = s.now + s.h2d.rem/rh
		next = min(next, ch)
	}
	dt := next - s.now
	if s.d2h.busy {
		s.d2h.rem -= dt * rd
	}
	if s.h2d.busy {
		s.h2d.rem -= dt * rh
	}
	s.now = next
	done := s.complete(cd, ch, next)
	if done {
		s.startCopies()
	}
	return done
}

// complete ends the copies due by next (cd and ch: when the D2H and H2D
// copies in flight end), recording their figures and flags, and reports
// whether any ended. Completion is decided on time, not on the bytes left,
// so float rounding can never leave a copy a sliver short forever.
func (s *sim) complete(cd, ch, next float64) bool {
	done := false
	if s.d2h.busy && cd <= next && s.d2h.cur < 0 {
		// A copy of the previous iteration's.
		s.d2h.busy, done = false, true
		s.backDone[s.back[s.backHead].k] = true
		s.backHead++
	} else if s.d2h.busy && cd <= next {
		k := s.d2h.cur
		s.d2h.busy = false
		s.r.Out[k].End = s.now
		s.r.BusyD2H += s.now - s.d2h.since
		s.r.BytesD2H += s.in.Swaps[k].Bytes
		s.outDone[k] = true
		done = true
	}
	if s.h2d.busy && ch <= next {
		k := s.h2d.cur
		s.h2d.busy = false
		s.r.In[k].End = s.now
		s.r.BusyH2D += s.now - s.h2d.since
		s.r.BytesH2D += s.in.Swaps[k].Bytes
		s.inDone[k] = true
		done = true
	}
	return done
}

// advance runs the engines until the clock reaches t.
func (s *sim) advance(t float64) {
	for s.step(t) || s.now < t {
	}
}

// wait runs the engines until swap k's flag (outDone or inDone) is set; an
// error wrapping ErrInvalid when both engines go idle first. The time it
// runs counts to the swap (SwapWaitUS).
func (s *sim) wait(k int, flag []bool) error {
	from := s.now
	for !flag[k] {
		if !s.step(math.Inf(1)) && !s.d2h.busy && !s.h2d.busy {
			return fmt.Errorf("simulate: swap %d (tensor %d) never completes: %w", k, s.in.Swaps[k].Tensor, ErrInvalid)
		}
	}
	s.r.SwapWaitUS[k] += s.now - from
	return nil
}

// op plays op t: it issues the op's copies back, runs the recomputes
// before it, waits for the copies it depends on, computes it, then issues
// the copies out after it. The copies go on throughout.
func (s *sim) op(t int) error {
	s.issueIns(t)
	s.recompute(t)
	ready := s.now
	if err := s.waitFor(t); err != nil {
		return err
	}
	s.compute(t, ready)
	s.issueOuts(t)
	return nil
}

// issueIns queues on the H2D engine the copies back issued at the start
// of op t.
func (s *sim) issueIns(t int) {
	for _, k := range s.inAt[t] {
		s.r.In[k].Issue = s.now
		s.h2d.queue = append(s.h2d.queue, k)
	}
}

// recompute runs the recomputes for op t, in order, on the compute stream
// (each its op and the ops of its remade inputs), while the copies go on.
func (s *sim) recompute(t int) {
	for _, k := range s.recAt[t] {
		rc := &s.in.Recomputes[k]
		d := s.in.OpTimes[rc.Op]
		for _, m := range rc.Remade {
			d += s.in.OpTimes[m.Op]
		}
		s.r.Recomputed[k].Start = s.now
		s.advance(s.now + d)
		s.r.Recomputed[k].End = s.now
		s.r.RecomputeUS += d
	}
}

// waitFor waits for the copies op t depends on: the copies out the
// previous iteration left running of the swaps whose memory it takes (op 0
// those that wrap, or the op each is freed at); then the copies out of the
// swaps whose memory it reuses and the copies back of those it uses.
func (s *sim) waitFor(t int) error {
	from := s.now
	begin := from
	for _, k := range s.waitBack[t] {
		if err := s.wait(k, s.backDone); err != nil {
			return err
		}
	}
	s.r.WaitStartUS += s.now - from
	from = s.now
	started := from // the previous iteration's copies waited for are done
	for _, k := range s.waitFree[t] {
		if err := s.wait(k, s.outDone); err != nil {
			return err
		}
	}
	s.r.WaitOutUS += s.now - from
	from = s.now
	for _, k := range s.waitUse[t] {
		if err := s.wait(k, s.inDone); err != nil {
			return err
		}
	}
	s.r.WaitInUS += s.now - from
	if s.now > begin {
		s.r.WaitQueuedUS += s.queued(t, begin, started)
	}
	return nil
}

// queued is the time from begin to now during which none of the copies op
// t waited for was on the link: the previous iteration's copies it waited
// for count as on the link until started, then each copy out it waited for
// (waitFree) and copy back (waitUse) from its start to its end.
func (s *sim) queued(t int, begin, started float64) float64 {
	spans := []Span{{begin, started}}
	add := func(tr Transfer) {
		if !math.IsNaN(tr.Start) {
			spans = append(spans, Span{max(tr.Start, begin), min(tr.End, s.now)})
		}
	}
	for _, k := range s.waitFree[t] {
		add(s.r.Out[k])
	}
	for _, k := range s.waitUse[t] {
		add(s.r.In[k])
	}
	slices.SortFunc(spans, func(a, b Span) int { return cmp.Compare(a.Start, b.Start) })
	on, reach := 0.0, begin
	for _, sp := range spans {
		if lo := max(sp.Start, reach); sp.End > lo {
			on += sp.End - lo
			reach = sp.End
		}
	}
	return max(0, s.now-begin-on)
}

// compute runs op t on the compute stream from now, recording its start,
// end and stall (the wait since ready, when it could have started).
// Issues made while waiting are still at the op's start: the copy back
// was queued before the wait.
func (s *sim) compute(t int, ready float64) {
	op := &s.r.Ops[t]
	op.Start = s.now
	op.Stall = s.now - ready
	s.r.StallUS += op.Stall
	s.advance(s.now + s.in.OpTimes[t])
	op.End = s.now
	s.r.BaseUS += s.in.OpTimes[t]
}

// issueOuts queues on the D2H engine the copies out issued after op t; a
// swap that copies nothing out is released there, its copy out done.
func (s *sim) issueOuts(t int) {
	for _, k := range s.outAfter[t] {
		s.r.Out[k].Issue = s.now
		if s.in.Swaps[k].NoCopyOut {
			s.outDone[k] = true // released: nothing to copy
			continue
		}
		s.d2h.queue = append(s.d2h.queue, k)
	}
}

// finish ends the iteration at the clock and returns its backlog: the
// copies out not yet done, in the order the engine runs them. It then
// drains the copies still in flight (their time is not on the iteration's
// critical path, but their figures belong to the result).
func (s *sim) finish() []backCopy {
	s.r.IterationUS = s.now
	var left []backCopy // this iteration's backlog
	if s.d2h.busy {
		k := s.d2h.cur
		if k < 0 {
			k = s.back[s.backHead].k
		}
		left = append(left, backCopy{k, s.d2h.rem})
	}
	if s.d2h.busy && s.d2h.cur < 0 {
		for _, b := range s.back[s.backHead+1:] {
			left = append(left, b)
		}
	}
	for x := s.d2h.head; x < len(s.d2h.queue); x++ {
		k := s.d2h.queue[x]
		left = append(left, backCopy{k, float64(s.in.Swaps[k].Bytes)})
	}
	for s.step(math.Inf(1)) || s.d2h.busy || s.h2d.busy {
	}
	return left
}

// memory fills in each swap's Freed and, when the input has a curve, each
// op's Mem and the peak: the curve plus the change (delta, from freeDeltas)
// swaps, recomputes and held inputs make to it.
func (s *sim) memory() {
	n := len(s.in.OpTimes)
	delta := make([]int64, n+1)
	s.freeDeltas(delta)
	if s.in.Curve != nil {
		r := s.r
		var cur int64
		for t := range n {
			cur += delta[t]
			r.Ops[t].Mem = s.in.Curve[t] + cur
			if t == 0 || r.Ops[t].Mem > r.Peak {
				r.Peak, r.PeakOp = r.Ops[t].Mem, t
			}
		}
	}
}

// freeDeltas records which op each swap's memory counts as free from
// (Freed), and adds to delta (n+1 entries, zero) the change to the
// allocated bytes from each op on: the swaps' bytes off the device, the
// recomputes' dropped bytes, the held inputs' bytes. A dynamic Free is the
// first op that starts after the copy out ends (the op after Out for a
// swap that copies nothing out), In if none.
func (s *sim) freeDeltas(delta []int64) {
	in, r, n := &s.in, s.r, len(s.in.OpTimes)
	for k, sw := range in.Swaps {
		if sw.Wraps() {
			// Free over [0, In) and [Free, n), or [Free-n, In).
			r.Freed[k] = sw.Free
			for _, sp := range sw.FreeSpans(sw.Free, n) {
				delta[sp[0]] -= sw.Bytes
				delta[sp[1]] += sw.Bytes
			}
			continue
		}
		f := sw.Free
		if f < 0 && sw.NoCopyOut {
			f = sw.Out + 1
		}
		if f < 0 {
			end := r.Out[k].End
			f = sw.In
			for t := sw.Out + 1; t < sw.In; t++ {
				if r.Ops[t].Start >= end {
					f = t
					break
				}
			}
		}
		r.Freed[k] = f
		delta[f] -= sw.Bytes
		delta[sw.In] += sw.Bytes
	}
	for _, rc := range in.Recomputes {
		delta[rc.Drop+1] -= rc.Bytes
		delta[rc.Before] += rc.Bytes
	}
	for _, h := range Held(in.Recomputes) {
		delta[h.From] += h.Bytes
		delta[h.To] -= h.Bytes
	}
}

func bucket(n int, swaps []Swap, at func(Swap) int) [][]int {
	b := make([][]int, n)
	for k, s := range swaps {
		if t := at(s); t >= 0 && t < n {
			b[t] = append(b[t], k)
		}
	}
	return b
}
