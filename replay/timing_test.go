package replay_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// timed replays tr on the host backend as a timed replay: sizes at scale,
// the link modeled at the same scale so copies take their full size's
// time, each op a host kernel of its time.
func timed(t *testing.T, tr *trace.Trace, scale int64, rounds int, tm replay.Timing, cfg replay.Config) (*replay.Report, *host.Device) {
	t.Helper()
	return timedOn(t, tr, scale, rounds, func(dev *host.Device) replay.Timing {
		tm.Launch = replay.HostKernel(dev)
		return tm
	}, cfg)
}

// timedOn is timed with the Timing made for the host device.
func timedOn(t *testing.T, tr *trace.Trace, scale int64, rounds int, timing func(*host.Device) replay.Timing, cfg replay.Config) (*replay.Report, *host.Device) {
	t.Helper()
	return timedWrapped(t, tr, scale, rounds, timing, nil, cfg)
}

// timedWrapped is timedOn on the device wrap returns (nil: the host device).
func timedWrapped(t *testing.T, tr *trace.Trace, scale int64, rounds int, timing func(*host.Device) replay.Timing, wrap func(*host.Device) device.Device, cfg replay.Config) (*replay.Report, *host.Device) {
	t.Helper()
	limit := replay.PeakBytes(tr) / scale * 8 / 10
	l := replay.HostLink(scale)
	dev, err := host.New(limit, host.WithBandwidth(l.H2D, l.D2H), host.WithSleep(replay.Wait))
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	tm := timing(dev)
	d := seq.DefaultConfig()
	d.M, d.N = 2, 1
	cfg.Scale, cfg.Rounds, cfg.Limit, cfg.Timing = scale, rounds, limit, &tm
	cfg.Options = append(cfg.Options, chameleon.WithDetection(d), chameleon.WithLinkBandwidth(l.D2H))
	var run device.Device = dev
	if wrap != nil {
		run = wrap(dev)
	}
	rep, err := replay.Run(tr, run, cfg)
	if rep != nil && rep.Engine != nil {
		t.Cleanup(func() { rep.Engine.Close() })
	}
	require.NoError(t, err)
	assert.LessOrEqual(t, dev.PeakAllocated(), limit, "device bytes above the limit")
	return rep, dev
}

// plannedWith asserts that every policy the Engine planned was planned
// with the op times the replay ran.
func plannedWith(t *testing.T, rep *replay.Report, tr *trace.Trace, times [][]float64) {
	t.Helper()
	plans := 0
	for i, res := range rep.Results {
		if res.Plan == nil {
			continue
		}
		plans++
		k := i % len(tr.Iterations)
		assert.Equal(t, times[k], res.Plan.OpTimes, "iteration %d was planned with other times than its kernels take", i)
	}
	assert.Positive(t, plans, "the Engine planned")
}

// TestTimedReplayHost: each iteration has a measured step, the kernels
// alone and, once a policy is in force, the simulator's step; the Engine
// plans with the very op times the kernels take; nothing is verified.
// No time is asserted beyond being there.
func TestTimedReplayHost(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	times, bases, err := replay.OpTimes(tr, nil, "")
	require.NoError(t, err)
	rep, _ := timed(t, tr, 1024, 3, replay.Timing{}, replay.Config{})
	assert.True(t, rep.Timing)
	assert.Zero(t, rep.VerifiedUses, "no bytes checked without VerifyEvery")
	assert.Zero(t, rep.FailedUses)
	require.Len(t, rep.PerIteration, 3*len(tr.Iterations))
	stable := 0
	for i, x := range rep.PerIteration {
		k := i % len(tr.Iterations)
		t.Logf("round %d iter %d %s: kernels %.2f ms, alone %.2f ms, measured %.2f ms, simulated %.2f ms, %d swaps, %d on-demand, %d evictions",
			x.Round, x.Iter, x.Stage, x.KernelMS, x.UnlimitedMS, x.MeasuredMS, x.SimulatedMS, x.PlannedSwaps, x.OnDemandSwapIns, x.Evictions)
		assert.Equal(t, bases[k], x.OpTimes)
		assert.Equal(t, replay.TimesEstimated, x.OpTimes)
		assert.InDelta(t, sumOf(times[k])/1000, x.KernelMS, 1e-9)
		assert.InDelta(t, tr.Iterations[k].TimeMS, x.KernelMS, 1e-6, "the estimate spreads the recorded step")
		assert.Positive(t, x.MeasuredMS)
		assert.Positive(t, x.UnlimitedMS)
		if x.Stage == "STABLE" {
			stable++
			assert.Positive(t, x.SimulatedMS, "iteration %d", i)
			assert.Positive(t, x.PlannedSwaps, "iteration %d", i)
		}
	}
	assert.Positive(t, stable, "stages %v", rep.Stages)
	require.NotNil(t, rep.Stable)
	assert.Equal(t, stable, rep.Stable.Iterations)
	assert.Positive(t, rep.Stable.MeasuredMS)
	assert.Positive(t, rep.Stable.SimulatedMS)
	plannedWith(t, rep, tr, times)
}

// TestTimedReplayVerifySamples: with VerifyEvery, the sampled storages
// are written and checked at every use, recomputes included, and all
// read back what was written.
func TestTimedReplayVerifySamples(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	rep, _ := timed(t, tr, 1024, 2, replay.Timing{VerifyEvery: 8}, replay.Config{Recompute: true})
	assert.Equal(t, 8, rep.VerifyEvery)
	assert.Positive(t, rep.VerifiedUses)
	assert.Zero(t, rep.FailedUses, rep.Failures)
	var uses int64
	for _, it := range tr.Iterations {
		for _, op := range it.Ops {
			for _, id := range op.In {
				if id%8 == 0 {
					uses++
				}
			}
		}
	}
	// Every sampled use of both rounds, and the recomputes' inputs beside.
	assert.GreaterOrEqual(t, rep.VerifiedUses, 2*uses)
}

// kernelsOf is a kernel-times document for iteration k of tr, timing each
// op by its recorded duration.
func kernelsOf(tr *trace.Trace, k int) *trace.Kernels {
	it := tr.Iterations[k]
	kt := &trace.Kernels{Model: tr.Header.Model}
	for i, op := range it.Ops {
		kt.Ops = append(kt.Ops, trace.KernelOp{Seq: i, Name: op.Name, Overload: op.Overload, KernelUS: op.DurUS})
	}
	return kt
}

// TestTimedReplayKernels: a kernel-times file of the trace's op sequence
// times every iteration, and the Engine plans with those times.
func TestTimedReplayKernels(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	kt := kernelsOf(tr, 1)
	times, bases, err := replay.OpTimes(tr, kt, "small.kernels.json")
	require.NoError(t, err)
	for k := range tr.Iterations {
		assert.Equal(t, replay.TimesKernels, bases[k])
		for i, op := range kt.Ops {
			assert.Equal(t, op.KernelUS, times[k][i])
		}
	}
	rep, _ := timed(t, tr, 1024, 2, replay.Timing{}, replay.Config{Kernels: kt, KernelsFrom: "small.kernels.json"})
	for _, x := range rep.PerIteration {
		assert.Equal(t, replay.TimesKernels, x.OpTimes)
		assert.Positive(t, x.MeasuredMS)
	}
	plannedWith(t, rep, tr, times)
}

// A kernel-times file of another op sequence is refused, naming the file
// and the first difference.
func TestOpTimesRefusesOtherSequence(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	kt := kernelsOf(tr, 0)
	short := &trace.Kernels{Ops: kt.Ops[:len(kt.Ops)-1]}
	_, _, err := replay.OpTimes(tr, short, "short.kernels.json")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "short.kernels.json")
	assert.Contains(t, err.Error(), "993 ops timed, the iteration has 994")

	renamed := &trace.Kernels{Ops: slices.Clone(kt.Ops)}
	renamed.Ops[5].Name = "aten::bogus"
	_, _, err = replay.OpTimes(tr, renamed, "renamed.kernels.json")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "timed op 5 is aten::bogus")
}

// publicKernels reads the kernel-times file of public trace name (no
// extension) and returns it with its path.
func publicKernels(t *testing.T, name string) (*trace.Kernels, string) {
	t.Helper()
	path := testtraces.Path(t, name+".kernels.json.gz")
	kt, err := trace.ReadKernelsFile(path)
	require.NoError(t, err)
	return kt, path
}

// publicWithKernels reads public trace name and its kernel times, and
// skips under the race detector, where its replays are too slow.
func publicWithKernels(t *testing.T, name string) (*trace.Trace, *trace.Kernels, string) {
	t.Helper()
	if raceEnabled {
		t.Skip("the public traces are slow under the race detector")
	}
	tr := shared(t, name+".jsonl.gz")
	kt, path := publicKernels(t, name)
	return tr, kt, path
}

// The kernel-times files of the public traces time their traces.
func TestOpTimesPublicKernels(t *testing.T) {
	for _, name := range []string{"llama16-bf16", "llama7b-8l-bf16", "mixtral8-eager-bf16"} {
		t.Run(name, func(t *testing.T) {
			tr := shared(t, name+".jsonl.gz")
			kt, path := publicKernels(t, name)
			times, bases, err := replay.OpTimes(tr, kt, path)
			require.NoError(t, err)
			n := 0
			for k := range tr.Iterations {
				if bases[k] == replay.TimesKernels {
					n++
					assert.InDelta(t, kt.KernelMSTotal, sumOf(times[k])/1000, 0.01*kt.KernelMSTotal)
				}
			}
			t.Logf("%s: %d of %d iterations timed by %s", name, n, len(tr.Iterations), path)
			assert.Positive(t, n)
		})
	}
}

// The Estimator gives an iteration of the trace's op sequence its times,
// and any other the fallback's estimate.
func TestEstimatorMatchesByPosition(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	times, _, err := replay.OpTimes(tr, nil, "")
	require.NoError(t, err)
	e := &replay.Estimator{Trace: tr, Times: times}
	it := *tr.Iterations[2]
	it.TimeMS *= 3 // the measured step does not rescale them
	assert.Equal(t, 0, e.Match(&it), "the first iteration of the same op names")
	assert.Equal(t, times[0], e.Estimate(&it))

	it.Ops = slices.Clone(it.Ops)
	it.Ops[7].Name = "aten::other"
	assert.Equal(t, -1, e.Match(&it))
	assert.Equal(t, layer.Default().Estimate(&it), e.Estimate(&it))
	it.Ops = it.Ops[:10]
	assert.Equal(t, -1, e.Match(&it))
	assert.Len(t, e.Estimate(&it), 10)
}

func sumOf(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s
}

// TestTimedReplayPublicKernels: llama16 at its recorded kernel times
// (about 112 ms a step, so a few seconds): every STABLE iteration has its
// measured and simulated step, and the Engine planned with the kernels'
// times.
func TestTimedReplayPublicKernels(t *testing.T) {
	tr, kt, path := publicWithKernels(t, "llama16-bf16")
	times, _, err := replay.OpTimes(tr, kt, path)
	require.NoError(t, err)
	rep, _ := timed(t, tr, 4096, 2, replay.Timing{}, replay.Config{Kernels: kt, KernelsFrom: path})
	require.NotNil(t, rep.Stable)
	t.Logf("llama16-bf16 at 80%%, scale 1/4096: %d STABLE iterations, unlimited %.2f ms, measured %.2f ms, simulated %.2f ms, %d forced evictions",
		rep.Stable.Iterations, rep.Stable.UnlimitedMS, rep.Stable.MeasuredMS, rep.Stable.SimulatedMS, rep.Stable.Evictions)
	for i, x := range rep.PerIteration {
		assert.Equal(t, replay.TimesKernels, x.OpTimes)
		assert.Positive(t, x.MeasuredMS, "iteration %d", i)
		if x.Stage == "STABLE" {
			assert.Positive(t, x.SimulatedMS, "iteration %d", i)
		}
	}
	plannedWith(t, rep, tr, times)
}
