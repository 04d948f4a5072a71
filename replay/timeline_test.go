package replay_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
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
	var buf bytes.Buffer
	require.NoError(t, replay.WriteTimeline(&buf, "llama4-small", rep.Timeline))
	var ct struct {
		TraceEvents []struct {
			Ph  string `json:"ph"`
			TID int    `json:"tid"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &ct))
	kernels := 0
	for _, e := range ct.TraceEvents {
		if e.Ph == "X" && e.TID == 1 {
			kernels++
		}
	}
	assert.Equal(t, len(rep.Timeline), kernels)
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
