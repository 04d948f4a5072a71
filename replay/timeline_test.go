package replay_test

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// TestTimelineSplitsTheStep: with a timeline, every op kernel of every
// iteration is stamped on the stream's clock, in order; each iteration
// reports the device's busy time and its idle time by cause, its worst
// stalls longest first; the kept iteration is a STABLE one and its
// Chrome trace holds one kernel slice per op. No time is asserted beyond
// its order.
func TestTimelineSplitsTheStep(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	n := 0
	for _, it := range tr.Iterations {
		n = max(n, len(it.Ops))
	}
	rep, _ := timedOn(t, tr, 1024, 3, func(dev *host.Device) replay.Timing {
		return replay.Timing{Launch: replay.HostKernel(dev), Timeline: replay.HostTimeline(dev, n)}
	}, replay.Config{})
	for i, x := range rep.PerIteration {
		assert.Positive(t, x.DeviceBusyMS, "iteration %d", i)
		assert.GreaterOrEqual(t, x.HostStallMS, 0.0)
		assert.GreaterOrEqual(t, x.DeviceStallMS, 0.0)
		assert.LessOrEqual(t, len(x.WorstStalls), 5)
		for j := 1; j < len(x.WorstStalls); j++ {
			assert.GreaterOrEqual(t, x.WorstStalls[j-1].MS, x.WorstStalls[j].MS, "longest first")
		}
	}
	assert.Contains(t, rep.TimelineOf, "STABLE")
	k := len(rep.PerIteration) - 1
	require.Len(t, rep.Timeline, len(tr.Iterations[k%len(tr.Iterations)].Ops))
	for i, s := range rep.Timeline {
		assert.Equal(t, i, s.Op)
		assert.LessOrEqual(t, s.StartUS, s.EndUS, "op %d", i)
		if i > 0 {
			assert.GreaterOrEqual(t, s.StartUS, rep.Timeline[i-1].EndUS, "one stream runs its kernels in order")
			assert.GreaterOrEqual(t, s.IssuedUS, rep.Timeline[i-1].IssuedUS, "the host queues them in order")
		}
	}
	assert.Equal(t, len(rep.Timeline), tracks(t, rep)[1])
}

// TestTimelineStampsCopies: on a device that stamps its copies, each
// iteration reports the copies each way that the link moved, every copy
// out a swap's (none is lost, none counted twice; a tensor whose host copy
// is current comes back without one), and the kept
// iteration's Chrome trace holds them on the link's tracks. No time is
// asserted beyond its order.
func TestTimelineStampsCopies(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	n := 0
	for _, it := range tr.Iterations {
		n = max(n, len(it.Ops))
	}
	var tl replay.CopyTimeline
	rep, _ := timedWrapped(t, tr, 1024, 3, func(dev *host.Device) replay.Timing {
		tl = replay.HostTimeline(dev, n)
		return replay.Timing{Launch: replay.HostKernel(dev), Timeline: tl}
	}, func(d *host.Device) device.Device { return replay.StampHostCopies(d, tl) }, replay.Config{})
	var out, in int64
	stable := 0
	for i, x := range rep.PerIteration {
		for _, f := range []*replay.LinkFigures{x.D2H, x.H2D} {
			if f == nil {
				continue
			}
			assert.Positive(t, f.Copies, "iteration %d", i)
			assert.Positive(t, f.GBps, "iteration %d", i)
			assert.Positive(t, f.BusyMS, "iteration %d", i)
		}
		if x.D2H != nil {
			out += x.D2H.Bytes
		}
		if x.H2D != nil {
			in += x.H2D.Bytes
		}
		if x.Stage == "STABLE" {
			stable++
			assert.NotNil(t, x.D2H, "iteration %d swaps out", i)
			// By part of the step, measured and simulated: the same parts,
			// each busy a share of it, and no more link time than the
			// iteration's.
			require.NotEmpty(t, x.LinkParts, "iteration %d", i)
			require.Len(t, x.LinkPartsSimulated, len(x.LinkParts), "iteration %d", i)
			var d2h, waited float64
			for j, p := range x.LinkParts {
				assert.Equal(t, p.Part, x.LinkPartsSimulated[j].Part)
				assert.Positive(t, p.MS, "iteration %d %s", i, p.Part)
				for _, v := range []float64{p.D2H, p.H2D, x.LinkPartsSimulated[j].D2H, x.LinkPartsSimulated[j].H2D} {
					assert.InDelta(t, 0.5, v, 0.5+1e-9, "iteration %d %s", i, p.Part)
				}
				d2h += p.D2H * p.MS
				for _, w := range []float64{p.WaitMS, x.LinkPartsSimulated[j].WaitMS} {
					assert.InDelta(t, p.MS/2, w, p.MS/2+1e-9, "iteration %d %s: a wait within the part", i, p.Part)
				}
				waited += p.WaitMS
			}
			assert.LessOrEqual(t, waited, x.DeviceStallMS+1e-6, "iteration %d: waits are the device's stalls", i)
			assert.Equal(t, trace.PartForward, x.LinkParts[0].Part)
			assert.Positive(t, d2h, "iteration %d: the copies out ran in its parts", i)
			assert.LessOrEqual(t, d2h, x.D2H.BusyMS+1e-6, "iteration %d", i)
		}
	}
	require.Positive(t, stable)
	t.Logf("stamped %d bytes out, %d in; swapped %d", out, in, rep.SwappedBytes)
	assert.Positive(t, in)
	assert.LessOrEqual(t, out, rep.SwappedBytes)
	assert.GreaterOrEqual(t, out, rep.SwappedBytes*9/10, "copies left unread")
	require.NotEmpty(t, rep.TimelineCopies)
	shown := 0
	for _, c := range rep.TimelineCopies {
		assert.LessOrEqual(t, c.StartUS, c.EndUS)
		if c.EndUS >= 0 {
			shown++
		}
	}
	per := tracks(t, rep)
	assert.Equal(t, shown, per[4]+per[5], "one slice per copy on the link tracks")
	// Beside what ran, the simulation of the policy it ran under: an op
	// each, on the same ops, and its copies.
	sim := rep.TimelineSim
	require.NotNil(t, sim, "a STABLE iteration runs under a planned policy")
	require.Len(t, sim.Result.Ops, len(rep.Timeline))
	assert.Equal(t, len(sim.Result.Ops)+len(sim.Recomputes), per[11])
	var copies int
	for k := range sim.Swaps {
		for _, c := range []simulate.Transfer{sim.Result.Out[k], sim.Result.In[k]} {
			if !math.IsNaN(c.Start) {
				copies++
			}
		}
	}
	assert.Positive(t, copies)
	assert.Equal(t, copies, per[14]+per[15], "one slice per simulated copy")
}

// tracks writes rep's timeline as Chrome trace JSON and counts its
// slices per track: process 1's (what ran) by their thread, process 2's
// (the simulation) by 10 plus theirs.
func tracks(t *testing.T, rep *replay.Report) map[int]int {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, replay.WriteTimeline(&buf, "llama4-small", rep.Timeline, rep.TimelineCopies, rep.TimelineSim))
	var ct struct {
		TraceEvents []struct {
			Ph  string `json:"ph"`
			PID int    `json:"pid"`
			TID int    `json:"tid"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &ct))
	n := map[int]int{}
	for _, e := range ct.TraceEvents {
		if e.Ph == "X" {
			n[10*(e.PID-1)+e.TID]++
		}
	}
	return n
}

// TestTimelineSlotsAreChecked: a slot outside the timeline is an error,
// not a write past its end.
func TestTimelineSlotsAreChecked(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	tl := replay.HostTimeline(dev, 2)
	assert.Error(t, tl.Launch(dev.DefaultStream(), 0, 2))
	assert.Error(t, tl.Launch(dev.DefaultStream(), 0, -1))
	require.NoError(t, tl.Launch(dev.DefaultStream(), 0, 1))
	require.NoError(t, dev.SyncStream(dev.DefaultStream()))
	st, err := tl.Stamps(2)
	require.NoError(t, err)
	assert.Positive(t, st[1].Start)
	assert.LessOrEqual(t, st[1].Start, st[1].End)
	_, err = tl.Stamps(3)
	assert.Error(t, err)
}

// TestTimelineStampsRecomputes: with recompute on, each recompute's
// kernels are stamped on the compute stream: the iterations report the
// time they ran, apart from the link's figures, and the Chrome trace shows
// each as a slice on the kernels' track.
func TestTimelineStampsRecomputes(t *testing.T) {
	tr, kt, path := publicWithKernels(t, "llama16-bf16")
	const scale = 4096
	limit := replay.PeakBytes(tr) / scale * 45 / 100
	l := replay.HostLink(scale)
	dev, err := host.New(limit, host.WithPageSize(replay.PageAtScale(limit, scale)), host.WithBandwidth(l.H2D, l.D2H), host.WithSleep(replay.Wait))
	require.NoError(t, err)
	defer dev.Close()
	n := 0
	for _, it := range tr.Iterations {
		n = max(n, len(it.Ops))
	}
	tl := replay.HostTimeline(dev, n)
	tm := replay.Timing{Launch: replay.HostKernel(dev), Timeline: tl}
	rep, err := replay.Run(tr, replay.StampHostCopies(dev, tl), replay.Config{Scale: scale, Rounds: 2, Limit: limit, Recompute: true,
		Kernels: kt, KernelsFrom: path, Timing: &tm,
		Options: []chameleon.Option{chameleon.WithDetection(seq.DefaultConfig()), chameleon.WithLinkBandwidth(l.D2H)}})
	if rep != nil && rep.Engine != nil {
		defer rep.Engine.Close()
	}
	require.NoError(t, err)
	require.Positive(t, rep.Recomputes, "the plan recomputes")
	var out int64
	stamped := 0
	for i, x := range rep.PerIteration {
		if x.D2H != nil {
			out += x.D2H.Bytes
		}
		if x.PlannedRecomputes > 0 {
			t.Logf("iteration %d: %d recomputes ran %.2f ms of %.2f ms; device stalls %.2f ms", i, x.PlannedRecomputes, x.RecomputeKernelMS, x.MeasuredMS, x.DeviceStallMS)
			assert.Positive(t, x.RecomputeKernelMS, "iteration %d", i)
			assert.Less(t, x.RecomputeKernelMS, x.MeasuredMS, "iteration %d", i)
			stamped++
			require.NotEmpty(t, x.WorstLayers, "iteration %d", i)
			for _, l := range x.WorstLayers {
				assert.LessOrEqual(t, l.MeasuredWaitMS, l.MeasuredMS, "iteration %d layer %d", i, l.FirstOp)
				assert.LessOrEqual(t, l.SimulatedWaitMS, l.SimulatedMS, "iteration %d layer %d", i, l.FirstOp)
				assert.GreaterOrEqual(t, l.MeasuredWaitMS, 0.0)
			}
		}
	}
	require.Positive(t, stamped)
	assert.LessOrEqual(t, out, rep.SwappedBytes, "recomputes counted as copies")
	shown, rc := 0, 0
	for _, c := range rep.TimelineCopies {
		if c.EndUS < 0 {
			continue
		}
		if c.Recompute {
			rc++
			continue
		}
		shown++
	}
	assert.Positive(t, rc, "the timeline's iteration has its recomputes")
	per := tracks(t, rep)
	assert.Equal(t, shown, per[4]+per[5], "one slice per copy on the link tracks")
	assert.Equal(t, len(rep.Timeline)+rc, per[1], "a slice per op and per recompute on the kernels' track")
}
