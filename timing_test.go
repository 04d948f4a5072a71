package chameleon_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// clockNet is a forward of layers ops, each saving an activation, and a
// backward reading them in reverse, every op a kernel of cost(op) on the
// host backend's modeled clock: the stream time the Engine's timing events
// read is known to the microsecond.
type clockNet struct {
	dev    *host.Device
	eng    *chameleon.Engine
	layers int
	size   int64
	cost   func(op int) time.Duration
	// endTook is the host time the last step's End took.
	endTook time.Duration
	// recompute, when set, is each forward op's Op.Recompute.
	recompute func() error
}

func newClockNet(t testing.TB, layers int, size, limit int64, bw float64, opts ...chameleon.Option) *clockNet {
	t.Helper()
	dev, err := host.New(limit, host.WithBandwidth(bw, bw), host.WithSleep(func(time.Duration) {}))
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	c := seq.DefaultConfig()
	c.M, c.N = 2, 1
	eng, err := chameleon.New(dev, append([]chameleon.Option{chameleon.WithMemoryLimit(limit), chameleon.WithDetection(c),
		chameleon.WithGroups(4), chameleon.WithMinSwapBytes(1)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	n := &clockNet{dev: dev, eng: eng, layers: layers, size: size}
	n.cost = func(op int) time.Duration { return time.Duration(100*(op%5+1)) * time.Microsecond }
	return n
}

// ops is the number of ops of a step.
func (n *clockNet) ops() int { return 2 * n.layers }

// step runs one iteration and returns its result and the compute stream's
// modeled time from Begin to End.
func (n *clockNet) step(t testing.TB) (chameleon.Result, time.Duration) {
	t.Helper()
	e := n.eng
	s := e.ComputeStream()
	t0, err := n.dev.NewTimingEvent()
	require.NoError(t, err)
	t1, err := n.dev.NewTimingEvent()
	require.NoError(t, err)
	defer n.dev.DestroyEvent(t0)
	defer n.dev.DestroyEvent(t1)
	require.NoError(t, n.dev.Record(t0, s))
	it := e.Begin()
	op := 0
	run := func(o *chameleon.Op) {
		require.NoError(t, it.Before(o))
		require.NoError(t, n.dev.LaunchFor(s, n.cost(op), nil))
		require.NoError(t, it.After(o))
		op++
	}
	saved := make([]*chameleon.Tensor, n.layers)
	for i := range n.layers {
		x, err := e.NewTensor(n.size, chameleon.Activation, "uint8", []int64{n.size})
		require.NoError(t, err)
		o := &chameleon.Op{Name: "aten::linear", Module: fmt.Sprintf("layers.%d", i), Phase: trace.PhaseForward, Out: []*chameleon.Tensor{x},
			Recompute: n.recompute}
		if i > 0 {
			o.In = []*chameleon.Tensor{saved[i-1]}
		}
		run(o)
		saved[i] = x
	}
	for i := n.layers - 1; i >= 0; i-- {
		run(&chameleon.Op{Name: "aten::linear_backward", Module: fmt.Sprintf("layers.%d", i), Phase: trace.PhaseBackward,
			In: []*chameleon.Tensor{saved[i]}})
		require.NoError(t, e.Release(saved[i]))
	}
	endAt := time.Now()
	r := it.End()
	n.endTook = time.Since(endAt)
	require.NoError(t, r.Err)
	require.NoError(t, n.dev.Record(t1, s))
	require.NoError(t, n.dev.SyncEvent(t1))
	wall, err := n.dev.Elapsed(t0, t1)
	require.NoError(t, err)
	return r, wall
}

// untilPlanned runs steps until one is planned, at most max.
func (n *clockNet) untilPlanned(t *testing.T, max int) (chameleon.Result, time.Duration) {
	t.Helper()
	for range max {
		r, wall := n.step(t)
		if r.Planned {
			return r, wall
		}
	}
	t.Fatalf("no plan in %d steps", max)
	return chameleon.Result{}, 0
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// TestMeasuredGroupTimesEqualStreamClock: the plan's layer times are the
// compute stream's modeled time, op by op, with the waits for copies of
// the profiled iteration's forced swaps left out; the estimator only split
// them.
func TestMeasuredGroupTimesEqualStreamClock(t *testing.T) {
	// 1 MiB activations at 1 GB/s: 1049 µs a copy, longer than an op, so
	// the forced swaps stall the compute stream.
	n := newClockNet(t, 8, 1<<20, 5<<20, 1e9)
	r, wall := n.untilPlanned(t, 8)
	require.NotNil(t, r.Plan)
	assert.True(t, r.Plan.Measured, "planned on measured times")
	st := n.eng.Stats()
	assert.Positive(t, st.OnDemandIn, "the profiled iteration waited for copies")
	assert.Equal(t, 1, st.MeasuredPlans)
	var sum float64
	for _, g := range r.Plan.Groups {
		var want, got float64
		for i := g.First; i <= g.Last; i++ {
			want += us(n.cost(i))
			got += r.Plan.OpTimes[i]
		}
		assert.InDelta(t, want, got, 1e-6, "group %+v", g)
		sum += want
	}
	assert.Greater(t, us(wall), sum+100, "the stream clock ran the stalls too, which the plan leaves out")
	assert.InDelta(t, sum, r.Plan.Exec.BaseUS, 1e-6)
}

// TestStableSamples: under the policy, the sampled layer times are the
// stream clock's again, beside the simulator's.
func TestStableSamples(t *testing.T) {
	n := newClockNet(t, 8, 1<<20, 5<<20, 1e9, chameleon.WithTimingEvery(2))
	n.untilPlanned(t, 8)
	for range 5 {
		n.step(t)
	}
	gs := n.eng.GroupTimes()
	require.NotEmpty(t, gs)
	for _, g := range gs {
		var want float64
		for i := g.First; i <= g.Last; i++ {
			want += us(n.cost(i))
		}
		assert.InDelta(t, want, g.PlannedUS, 1e-6)
		assert.InDelta(t, want, g.MeasuredUS, 1e-6, "sampled compute, stalls left out")
		assert.GreaterOrEqual(t, g.MeasuredWallUS, g.MeasuredUS-1e-6)
		assert.Positive(t, g.SimulatedUS)
		assert.GreaterOrEqual(t, g.Samples, 2)
	}
	assert.Zero(t, n.eng.Stats().DriftReplans)
}

// TestDriftReplans: layer times that change by more than the threshold make
// the Engine plan again, on the new times; a change under it does not.
func TestDriftReplans(t *testing.T) {
	n := newClockNet(t, 8, 1<<20, 5<<20, 1e9, chameleon.WithTimingEvery(1))
	n.untilPlanned(t, 8)
	base := n.cost
	n.cost = func(op int) time.Duration { return base(op) * 110 / 100 } // 10%: under the threshold
	for range 4 {
		n.step(t)
	}
	st := n.eng.Stats()
	assert.Zero(t, st.DriftReplans)
	replans := st.Replans

	n.cost = func(op int) time.Duration {
		if op >= n.layers {
			return base(op) * 2 // the backward slows down
		}
		return base(op)
	}
	var planned *chameleon.Result
	for range 6 {
		r, _ := n.step(t)
		if r.Planned {
			planned = &r
			break
		}
	}
	require.NotNil(t, planned, "planned again")
	st = n.eng.Stats()
	assert.Equal(t, 1, st.DriftReplans)
	assert.Equal(t, replans+1, st.Replans)
	for _, g := range planned.Plan.Groups {
		var want, got float64
		for i := g.First; i <= g.Last; i++ {
			want += us(n.cost(i))
			got += planned.Plan.OpTimes[i]
		}
		assert.InDelta(t, want, got, 1e-6, "the new plan has the new times")
	}
}

// TestLinkMeasured: the executor's copies measure the host link per
// direction, the next plan models it, and WithLinkBandwidth keeps the link
// given.
func TestLinkMeasured(t *testing.T) {
	const bw = 2e9
	n := newClockNet(t, 8, 1<<20, 5<<20, bw, chameleon.WithTimingEvery(1))
	n.untilPlanned(t, 8)
	for range 8 {
		n.step(t)
	}
	l := n.eng.Link()
	require.True(t, l.Measured, "%+v", l)
	for _, r := range []chameleon.LinkRate{l.D2H, l.H2D, l.D2HShared, l.H2DShared} {
		if r.Copies > 0 {
			assert.InEpsilon(t, bw, r.BytesPerSecond(), 1e-6, "the link model's rate")
		}
	}
	assert.Positive(t, l.D2H.Copies+l.D2HShared.Copies)
	assert.Positive(t, l.H2D.Copies+l.H2DShared.Copies)
	assert.InEpsilon(t, bw, l.Model.D2H, 1e-6)
	assert.InEpsilon(t, bw, l.Model.H2D, 1e-6)

	// The next plan models the measured link: a copy of 1 MiB takes
	// 524 µs on its simulated timeline, not the H200's 19 µs.
	n.cost = func(op int) time.Duration { return time.Duration(300*(op%3+1)) * time.Microsecond }
	var planned *chameleon.Result
	for range 8 {
		r, _ := n.step(t)
		if r.Planned {
			planned = &r
			break
		}
	}
	require.NotNil(t, planned)
	require.NotEmpty(t, planned.Plan.Exec.Out)
	for k, c := range planned.Plan.Exec.Out {
		sw := planned.Plan.Swaps()[c.Swap]
		assert.InEpsilon(t, float64(sw.Bytes)/bw*1e6, c.End-c.Start, 0.05, "copy %d", k)
	}

	fixed := newClockNet(t, 8, 1<<20, 5<<20, bw, chameleon.WithTimingEvery(1), chameleon.WithLinkBandwidth(10e9))
	fixed.untilPlanned(t, 8)
	fixed.step(t)
	fl := fixed.eng.Link()
	assert.False(t, fl.Measured, "a link given is kept")
	assert.Positive(t, fl.D2H.Copies+fl.D2HShared.Copies, "and still reported")
	assert.InEpsilon(t, 10e9, fl.Model.D2H, 1e-9)
}

// timingFaults is a host device whose timing calls fail on demand.
type timingFaults struct {
	*host.Device
	mu          sync.Mutex
	elapsedErr  error
	newTimedErr error
}

func (f *timingFaults) Elapsed(a, b device.Event) (time.Duration, error) {
	f.mu.Lock()
	err := f.elapsedErr
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return f.Device.Elapsed(a, b)
}

func (f *timingFaults) NewTimingEvent() (device.Event, error) {
	f.mu.Lock()
	err := f.newTimedErr
	f.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return f.Device.NewTimingEvent()
}

// records collects the log records at Warn and above.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// TestTimingErrorsFallBack: a failing Elapsed leaves the plan to the
// estimator with a warning; a device without timing events turns timing
// off; neither fails the iteration.
func TestTimingErrorsFallBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		elapsed error
		newEv   error
		warn    string
	}{
		{"elapsed fails", errors.New("injected elapsed fault"), nil, "chameleon: timing events failed: this iteration's times are estimated"},
		{"no timing events", nil, fmt.Errorf("no timing: %w", device.ErrNotSupported), "chameleon: the device has no timing events: plans use estimated times"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hd, err := host.New(5<<20, host.WithBandwidth(1e9, 1e9), host.WithSleep(func(time.Duration) {}))
			require.NoError(t, err)
			defer hd.Close()
			dev := &timingFaults{Device: hd, elapsedErr: tc.elapsed, newTimedErr: tc.newEv}
			log := &records{}
			c := seq.DefaultConfig()
			c.M, c.N = 2, 1
			eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(5<<20), chameleon.WithDetection(c), chameleon.WithGroups(4),
				chameleon.WithMinSwapBytes(1), chameleon.WithLogger(slog.New(log)), chameleon.WithTimingEvery(1))
			require.NoError(t, err)
			defer eng.Close()
			n := &clockNet{dev: hd, eng: eng, layers: 8, size: 1 << 20,
				cost: func(op int) time.Duration { return time.Duration(100*(op%5+1)) * time.Microsecond }}
			r, _ := n.untilPlanned(t, 8)
			assert.False(t, r.Plan.Measured, "the estimator's times")
			for range 3 {
				n.step(t)
			}
			st := eng.Stats()
			assert.Positive(t, st.TimingErrors)
			assert.Zero(t, st.MeasuredPlans)
			assert.Zero(t, st.DriftReplans)
			log.mu.Lock()
			defer log.mu.Unlock()
			assert.Contains(t, log.msgs, tc.warn)
			if tc.newEv != nil {
				assert.Equal(t, 1, st.TimingErrors, "turned off at the first refusal")
			}
		})
	}
}

// TestMeasuredTimesOff: WithMeasuredTimes(false) plans on the estimator.
func TestMeasuredTimesOff(t *testing.T) {
	n := newClockNet(t, 8, 1<<20, 5<<20, 1e9, chameleon.WithMeasuredTimes(false))
	r, _ := n.untilPlanned(t, 8)
	assert.False(t, r.Plan.Measured)
	assert.Zero(t, n.eng.Stats().TimedIterations)
	assert.False(t, n.eng.Link().Measured)
	for _, g := range n.eng.GroupTimes() {
		assert.Zero(t, g.Samples, "not sampled")
	}
}

// TestRefineAfterEvictions: the first policy is planned on a profile taken
// while the executor forced evictions; once it runs an iteration without
// any, the Engine profiles the next under it and plans once more, and then
// holds that policy. Planned on the estimator's times instead, it does not.
func TestRefineAfterEvictions(t *testing.T) {
	n := newClockNet(t, 8, 1<<20, 5<<20, 1e9)
	r, _ := n.untilPlanned(t, 8)
	require.True(t, r.Plan.Measured)
	require.Positive(t, r.Evictions, "the first profile forced evictions")
	r, _ = n.untilPlanned(t, 4)
	assert.Zero(t, r.Evictions, "the refining profile ran under the first policy, with no eviction")
	assert.True(t, r.Plan.Measured)
	for range 6 {
		r, _ = n.step(t)
		assert.False(t, r.Planned, "iteration %d: refined once", r.Index)
		assert.Zero(t, r.Evictions)
	}
	st := n.eng.Stats()
	assert.Equal(t, 1, st.Refined)
	assert.Equal(t, 2, st.Replans)

	off := newClockNet(t, 8, 1<<20, 5<<20, 1e9, chameleon.WithMeasuredTimes(false))
	off.untilPlanned(t, 8)
	for range 6 {
		r, _ = off.step(t)
		assert.False(t, r.Planned, "iteration %d: estimated times are not refined", r.Index)
	}
	assert.Zero(t, off.eng.Stats().Refined)
}
