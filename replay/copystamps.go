package replay

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// CopyTimeline is a Timeline that also stamps the copies the Engine
// queues: a device wrapped to stamp them (StampHostCopies, or the CUDA
// one of cmd/chameleon) queues each copy through Around, and the replay
// reads them with Copies after each iteration, on the kernels' clock. A
// stamped copy is bracketed by two empty stamp kernels on its stream, a
// few microseconds of launch each: the link's figures, not a step to
// compare with the simulation.
type CopyTimeline interface {
	Timeline
	// Around queues copy on s between two stamps.
	Around(s device.Stream, toHost bool, bytes int64, copy func() error) error
	// AroundRecompute queues run, the kernels of a recompute of op, on s
	// between two stamps; Copies returns it with Recompute set.
	AroundRecompute(s device.Stream, op int, run func() error) error
	// Copies returns the stamped copies whose stamps are in since the
	// last call, oldest first; one still running is returned by a later
	// call.
	Copies() ([]CopyStamp, error)
}

// CopyStamp is one stamped copy: when its stream reached it (its waits
// met, the copy ahead of it done) and when it ended, nanoseconds of the
// Timeline's clock.
type CopyStamp struct {
	ToHost bool
	Bytes  int64
	// Recompute marks the stamps of a recompute of op Op (AroundRecompute),
	// not a copy.
	Recompute bool
	Op        int
	Stamp
}

// CopyStamps is the copy half of a CopyTimeline: it keeps a timeline's
// slots [base, base+2n) for copies, two per copy, handed out in turn (a
// slot's stamps are fresh when they are later than those last read
// there). stamp queues an empty stamp kernel into a slot; read returns the
// stamps of slots [lo, hi).
type CopyStamps struct {
	stamp   func(s device.Stream, slot int) error // an empty stamp kernel
	read    func(lo, hi int) ([]Stamp, error)
	base, n int

	mu      sync.Mutex
	next    int
	pending []pendingCopy
	last    []int64 // per copy slot, the end of the copy last read there
}

type pendingCopy struct {
	toHost    bool
	bytes     int64
	recompute bool
	op        int
	k         int // copy slot
	tries     int
}

// CopySlots is the copies a timeline stamps before it reuses their slots:
// a CopyTimeline's slots for copies are 2*CopySlots.
const CopySlots = 8192

// dropAfter is the reads a copy's stamps may be missing before it is
// dropped: a copy ends long before that.
const dropAfter = 8

// NewCopyStamps returns copy stamps in slots [base, base+2n) of a timeline.
func NewCopyStamps(stamp func(device.Stream, int) error, read func(lo, hi int) ([]Stamp, error), base, n int) *CopyStamps {
	return &CopyStamps{stamp: stamp, read: read, base: base, n: n, last: make([]int64, n)}
}

// Around implements CopyTimeline.
func (c *CopyStamps) Around(s device.Stream, toHost bool, bytes int64, copy func() error) error {
	return c.around(s, pendingCopy{toHost: toHost, bytes: bytes}, copy)
}

// AroundRecompute implements CopyTimeline.
func (c *CopyStamps) AroundRecompute(s device.Stream, op int, run func() error) error {
	return c.around(s, pendingCopy{recompute: true, op: op}, run)
}

func (c *CopyStamps) around(s device.Stream, p pendingCopy, copy func() error) error {
	c.mu.Lock()
	k := c.next % c.n
	c.next++
	c.mu.Unlock()
	if err := c.stamp(s, c.base+2*k); err != nil {
		return fmt.Errorf("timeline: copy stamp: %w", err)
	}
	if err := copy(); err != nil {
		return err
	}
	if c.stamp(s, c.base+2*k+1) != nil {
		// The copy is queued: its caller must not take it for failed.
		// It goes unstamped.
		return nil
	}
	p.k = k
	c.mu.Lock()
	c.pending = append(c.pending, p)
	c.mu.Unlock()
	return nil
}

// Copies implements CopyTimeline.
func (c *CopyStamps) Copies() ([]CopyStamp, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		return nil, nil
	}
	st, err := c.read(c.base, c.base+2*c.n)
	if err != nil {
		return nil, err
	}
	var out []CopyStamp
	keep := c.pending[:0]
	for _, p := range c.pending {
		a, b := st[2*p.k], st[2*p.k+1]
		if a.Start > c.last[p.k] && a.End >= a.Start && b.Start >= a.End && b.End >= b.Start {
			c.last[p.k] = b.End
			out = append(out, CopyStamp{ToHost: p.toHost, Bytes: p.bytes, Recompute: p.recompute, Op: p.op, Stamp: Stamp{a.End, b.Start}})
			continue
		}
		if p.tries++; p.tries < dropAfter {
			keep = append(keep, p)
		}
	}
	c.pending = keep
	slices.SortStableFunc(out, func(x, y CopyStamp) int { return cmp.Compare(x.Start, y.Start) })
	return out, nil
}

// StampHostCopies returns d with each copy to or from the host stamped on
// tl (a HostTimeline): what a timed replay with a timeline runs on, so its
// iterations report the link.
func StampHostCopies(d *host.Device, tl CopyTimeline) device.Device {
	return &stampedHost{Device: d, tl: tl}
}

type stampedHost struct {
	*host.Device
	tl CopyTimeline
}

func (h *stampedHost) CopyD2H(dst device.HostBuf, src device.DevPtr, s device.Stream) error {
	return h.tl.Around(s, true, dst.Len(), func() error { return h.Device.CopyD2H(dst, src, s) })
}

func (h *stampedHost) CopyH2D(dst device.DevPtr, src device.HostBuf, s device.Stream) error {
	return h.tl.Around(s, false, src.Len(), func() error { return h.Device.CopyH2D(dst, src, s) })
}

// CopySpan is one stamped copy of an iteration, microseconds from the
// start of its first kernel (negative: it started in the iteration
// before).
type CopySpan struct {
	ToHost         bool
	Bytes          int64
	Recompute      bool // a recompute of op Op, not a copy
	Op             int
	StartUS, EndUS float64
}

// LinkFigures is what an iteration's stamped copies one way moved: how
// many, their bytes, the time the link was busy that way (copies that
// overlap counted once) and the rate of a copy (bytes over the copies'
// summed times), GB/s.
type LinkFigures struct {
	Copies int     `json:"copies"`
	Bytes  int64   `json:"bytes"`
	BusyMS float64 `json:"busy_ms"`
	GBps   float64 `json:"gb_per_s"`
}

// copySpans turns stamps into spans from t0.
func copySpans(cs []CopyStamp, t0 int64) []CopySpan {
	out := make([]CopySpan, len(cs))
	for i, c := range cs {
		out[i] = CopySpan{ToHost: c.ToHost, Bytes: c.Bytes, Recompute: c.Recompute, Op: c.Op, StartUS: float64(c.Start-t0) / 1e3, EndUS: float64(c.End-t0) / 1e3}
	}
	return out
}

// partsOf is how busy each direction of the link was over each part of a
// stamped iteration (trace.StepParts; sp its ops, cp its copies), split as
// simulate.PartsOver splits the simulated step, the last part ending with
// the last kernel; copies that overlap count once. A part's wait is its
// device stalls less the recomputes run in them (waitedWithin).
func partsOf(parts []trace.Part, sp []OpSpan, cp []CopySpan) []simulate.PartBusy {
	if len(parts) == 0 || len(sp) == 0 || parts[len(parts)-1].Last >= len(sp) {
		return nil
	}
	return simulate.PartsOver(parts, func(op int) float64 { return sp[op].StartUS }, sp[len(sp)-1].EndUS,
		func(from, to float64) (float64, float64) {
			return busyWithin(cp, true, from, to), busyWithin(cp, false, from, to)
		},
		func(from, to float64) float64 { return waitedWithin(sp, cp, from, to) })
}

// waitedWithin is the time, µs, within [from, to) that the device stood
// idle with the next op's kernel queued (each op's DeviceStallUS, which
// ends at its start), less the time recomputes (cp's) ran in those
// stretches: what the simulation counts as waits for copies. The host's
// stalls are not counted.
func waitedWithin(sp []OpSpan, cp []CopySpan, from, to float64) float64 {
	var rcs []CopySpan
	for _, c := range cp {
		if c.Recompute && c.EndUS > from && c.StartUS < to {
			rcs = append(rcs, c)
		}
	}
	var w float64
	for _, s := range sp {
		if s.DeviceStallUS <= 0 {
			continue
		}
		lo, hi := max(s.StartUS-s.DeviceStallUS, from), min(s.StartUS, to)
		if hi <= lo {
			continue
		}
		w += hi - lo
		for _, c := range rcs {
			w -= max(0, min(c.EndUS, hi)-max(c.StartUS, lo))
		}
	}
	return max(w, 0)
}

// busyWithin is the time, µs, within [from, to) that copies one way (sp by
// start) kept the link busy, overlapping copies counted once.
func busyWithin(sp []CopySpan, toHost bool, from, to float64) float64 {
	var b float64
	reach := from
	for _, s := range sp {
		if s.Recompute || s.ToHost != toHost {
			continue
		}
		lo, hi := max(s.StartUS, reach), min(s.EndUS, to)
		if hi > lo {
			b += hi - lo
		}
		reach = max(reach, min(s.EndUS, to))
	}
	return b
}

// linkOf sums an iteration's copies one way (nil with none).
func linkOf(sp []CopySpan, toHost bool) *LinkFigures {
	var f LinkFigures
	var sum float64
	for _, s := range sp {
		if s.Recompute || s.ToHost != toHost {
			continue
		}
		f.Copies++
		f.Bytes += s.Bytes
		sum += s.EndUS - s.StartUS
	}
	if f.Copies == 0 {
		return nil
	}
	f.BusyMS = busyWithin(sp, toHost, math.Inf(-1), math.Inf(1)) / 1e3
	if sum > 0 {
		f.GBps = float64(f.Bytes) / sum / 1e3
	}
	return &f
}
