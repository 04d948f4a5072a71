package replay

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// Timing turns a replay into a timed one: each op is a kernel of the op's
// time on the Engine's compute stream, and each iteration's step is
// measured (IterationReport.MeasuredMS) beside the simulator's
// (SimulatedMS) and the same kernels run alone (UnlimitedMS).
//
// Bytes are not written or checked, except those of every VerifyEvery-th
// storage: writing and reading a tensor from the host waits for the device
// to finish everything queued, which would serialize the kernels with the
// host and measure the checks instead of the step.
type Timing struct {
	// Launch queues on stream a kernel that runs for d: HostKernel on the
	// host backend, a driver.Spinner's Spin on CUDA.
	Launch func(stream device.Stream, d time.Duration) error
	// VerifyEvery, when positive, writes a pattern into every storage whose
	// trace id is a multiple of it when an op produces it, and checks it at
	// each of its uses (and at each recompute). 0 checks nothing.
	VerifyEvery int
	// Timeline, when set, launches the op kernels instead of Launch and
	// stamps them on the device's clock: each iteration's report then says
	// where the device stood idle and why (IterationReport.HostStallMS,
	// DeviceStallMS), and Report.Timeline holds one iteration's ops.
	// Launch still runs the unlimited steps and the recomputes.
	Timeline Timeline
}

// DefaultVerifyEvery is the sampling of --verify under --timing: the
// storages whose trace id is a multiple of 64 are written and checked.
const DefaultVerifyEvery = 64

// Where an iteration's op times come from (IterationReport.OpTimes).
const (
	// TimesKernels: the kernel-times file, which times the iteration's op
	// sequence.
	TimesKernels = "kernels"
	// TimesEstimated: the planning path's estimate for the iteration
	// (plan.Prepare: the default estimator spread over the iteration's
	// recorded time).
	TimesEstimated = "estimated"
)

// OpTimes returns, for each of tr's iterations, each op's time in
// microseconds as a timed replay runs it, and where they come from: the
// kernel times of kernels for an iteration whose op sequence it times (the
// same number of ops, the same name at each position), the planning path's
// estimate (plan.Prepare) for the others. kernels may be nil; when given,
// it must time at least one iteration, else the error (naming from, the
// file) says how the first one differs.
func OpTimes(tr *trace.Trace, kernels *trace.Kernels, from string) ([][]float64, []string, error) {
	times := make([][]float64, len(tr.Iterations))
	bases := make([]string, len(tr.Iterations))
	var firstDiff error
	for k, it := range tr.Iterations {
		if kernels != nil {
			err := kernelsMatch(kernels, it)
			if err == nil {
				times[k] = make([]float64, len(it.Ops))
				for i, op := range kernels.Ops {
					times[k][i] = op.KernelUS
				}
				bases[k] = TimesKernels
				continue
			}
			if firstDiff == nil {
				firstDiff = fmt.Errorf("iteration %d (%s): %w", it.Index, where(tr, firstLine(it)), err)
			}
		}
		r, err := plan.Prepare(plan.Input{Iter: it, LiveOut: memory.LiveOutFromTrace(tr, k)})
		if err != nil {
			return nil, nil, fmt.Errorf("replay: op times of iteration %d (%s): %w", it.Index, where(tr, firstLine(it)), err)
		}
		times[k], bases[k] = r.OpTimes, TimesEstimated
	}
	if kernels != nil && !slices.Contains(bases, TimesKernels) {
		return nil, nil, fmt.Errorf("replay: kernel times %s time none of %s's iterations: %w", from, tr.Name, firstDiff)
	}
	return times, bases, nil
}

// kernelsMatch says why k does not time its op sequence, or nil.
func kernelsMatch(k *trace.Kernels, it *trace.Iteration) error {
	if len(k.Ops) != len(it.Ops) {
		return fmt.Errorf("%d ops timed, the iteration has %d", len(k.Ops), len(it.Ops))
	}
	for i := range it.Ops {
		if k.Ops[i].Name != it.Ops[i].Name {
			return fmt.Errorf("timed op %d is %s, the iteration's op %d (seq %d) is %s", i, k.Ops[i].Name, i, it.Ops[i].Seq, it.Ops[i].Name)
		}
	}
	return nil
}

func firstLine(it *trace.Iteration) int {
	if len(it.Ops) > 0 {
		return it.Ops[0].Line
	}
	return 0
}

// Estimator is the op time estimator a replay gives the Engine when it
// runs known op times (Config.Timing or Config.Kernels), so that the
// Engine plans, and its simulator predicts, with the times the kernels
// take: measured and simulated steps can then agree. A profiled iteration
// with the op count and the op names of one of the trace's iterations gets
// that iteration's times, by position (the one being replayed first, when
// it matches); any other gets Fallback's estimate.
type Estimator struct {
	Trace *trace.Trace
	// Times holds each of Trace's iterations' op times, in microseconds
	// (OpTimes).
	Times [][]float64
	// Fallback estimates an iteration of no recorded op sequence
	// (layer.Default when nil).
	Fallback layer.Estimator
	// current is the position of the iteration being replayed. The replay
	// sets it before End, in which the Engine plans: both run on the
	// replay's goroutine.
	current int
}

// Match is the position in Trace of the iteration whose op sequence it
// is, or -1.
func (e *Estimator) Match(it *trace.Iteration) int {
	same := func(k int) bool {
		ops := e.Trace.Iterations[k].Ops
		if len(ops) != len(it.Ops) || len(e.Times[k]) != len(ops) {
			return false
		}
		for i := range ops {
			if ops[i].Name != it.Ops[i].Name {
				return false
			}
		}
		return true
	}
	if e.current >= 0 && e.current < len(e.Trace.Iterations) && same(e.current) {
		return e.current
	}
	for k := range e.Trace.Iterations {
		if same(k) {
			return k
		}
	}
	return -1
}

// Estimate implements layer.Estimator. The times are those of the matched
// iteration as they are: not spread over its measured time, which a timed
// replay measures with the Engine's own work in it.
func (e *Estimator) Estimate(it *trace.Iteration) []float64 {
	if k := e.Match(it); k >= 0 {
		return slices.Clone(e.Times[k])
	}
	fb := e.Fallback
	if fb == nil {
		fb = layer.Default()
	}
	return fb.Estimate(it)
}

// HostKernel is Timing.Launch on the host backend: a function queued with
// d.Launch that waits for the op's time (Wait) on the stream's goroutine.
func HostKernel(d *host.Device) func(device.Stream, time.Duration) error {
	return func(s device.Stream, t time.Duration) error {
		if t <= 0 {
			return nil
		}
		return d.Launch(s, func() { Wait(t) })
	}
}

// HostLink is the link a timed replay on the host backend models at scale:
// the planning path's default link (simulate.H200) with every rate divided
// by scale, so that a copy of a tensor scaled down takes the time the full
// tensor's copy takes on the GPU. Give the host device its H2D and D2H
// (host.WithBandwidth, with host.WithSleep(Wait)) and the Engine the same
// (chameleon.WithLinkBandwidth(l.D2H)) so the simulator plans on the link
// the copies run on.
func HostLink(scale int64) simulate.Link {
	l := simulate.H200()
	return l.Scaled(l.D2H / float64(max(scale, 1)))
}

// spinBelow is how much of a wait Wait spins instead of sleeping: the
// sleep of the Go runtime can overshoot by a millisecond on a loaded
// machine.
const spinBelow = 2 * time.Millisecond

// Wait blocks for d, within a few microseconds: it sleeps for all but the
// last spinBelow and spins the rest, yielding the processor in between so
// that other goroutines (the streams) keep running.
func Wait(d time.Duration) {
	if d <= 0 {
		return
	}
	end := time.Now().Add(d)
	if d > spinBelow {
		time.Sleep(d - spinBelow)
	}
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}

// usDuration is a time in microseconds as a Duration.
func usDuration(us float64) time.Duration { return time.Duration(us * 1e3) }

// unlimited runs each iteration's kernels alone on stream, one after the
// other with nothing between them, and returns how long each took (ms):
// the step with no limit and no Engine. A first short kernel loads what
// the backend loads at its first launch.
func unlimited(dev device.Device, stream device.Stream, t *Timing, times [][]float64) ([]float64, error) {
	if err := t.Launch(stream, time.Microsecond); err != nil {
		return nil, err
	}
	if err := dev.SyncStream(stream); err != nil {
		return nil, err
	}
	out := make([]float64, len(times))
	for k, ts := range times {
		start := time.Now()
		for _, us := range ts {
			if err := t.Launch(stream, usDuration(us)); err != nil {
				return nil, err
			}
		}
		if err := dev.SyncStream(stream); err != nil {
			return nil, err
		}
		out[k] = float64(time.Since(start)) / 1e6
	}
	return out, nil
}

func sum(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

// StableReport is what a timed replay's STABLE iterations took: the
// median of each figure over them, and the forced evictions and on-demand
// copies back they made in all.
type StableReport struct {
	Iterations      int     `json:"iterations"`
	UnlimitedMS     float64 `json:"unlimited_ms"`
	MeasuredMS      float64 `json:"measured_ms"`
	SimulatedMS     float64 `json:"simulated_ms"`
	Evictions       int64   `json:"evictions"`
	OnDemandSwapIns int64   `json:"on_demand_swap_ins"`
}

// stableOf sums up the STABLE iterations of per, nil when there are none.
func stableOf(per []IterationReport) *StableReport {
	var unl, meas, sim []float64
	s := &StableReport{}
	for _, x := range per {
		if x.Stage != "STABLE" {
			continue
		}
		s.Iterations++
		unl, meas, sim = append(unl, x.UnlimitedMS), append(meas, x.MeasuredMS), append(sim, x.SimulatedMS)
		s.Evictions += x.Evictions
		s.OnDemandSwapIns += x.OnDemandSwapIns
	}
	if s.Iterations == 0 {
		return nil
	}
	s.UnlimitedMS, s.MeasuredMS, s.SimulatedMS = Median(unl), Median(meas), Median(sim)
	return s
}

// Median of v (not empty); v is sorted in place.
func Median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// PageAtScale is the page of a host device that models, at scale, the CUDA
// device's pages for a limit of limit bytes (scaled): the page CUDA picks
// for the full-size limit (device.PageFor, 2 to 16 MiB), divided by scale,
// rounded up to a power of two of at least device.BlockSize.
func PageAtScale(limit, scale int64) int64 {
	scale = max(scale, 1)
	full := device.PageFor(limit*scale, 2<<20, 16<<20)
	p := int64(device.BlockSize)
	for p*scale < full {
		p *= 2
	}
	return p
}
