package replay_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
)

// TestPerIterationReport: one entry per replayed iteration, whose counts
// add up to the run's, and the policy's iterations say what it planned.
func TestPerIterationReport(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := replay.PeakBytes(tr) / scale * 8 / 10
	dev, err := host.New(limit)
	require.NoError(t, err)
	defer dev.Close()
	d := seq.DefaultConfig()
	d.M, d.N = 2, 1
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: 3, Limit: limit, Options: []chameleon.Option{chameleon.WithDetection(d)}})
	require.NoError(t, err)
	defer rep.Engine.Close()
	require.Len(t, rep.PerIteration, 3*len(tr.Iterations))
	var ev, od int64
	stable := 0
	for i, x := range rep.PerIteration {
		assert.Equal(t, i/len(tr.Iterations), x.Round)
		assert.Equal(t, rep.Stages[i], x.Stage)
		ev += x.Evictions
		od += x.OnDemandSwapIns
		if x.Stage == "STABLE" {
			stable++
			assert.Positive(t, x.PlannedSwaps, "a policy in force swaps as planned")
			assert.Positive(t, x.SimulatedMS, "and says what it should take")
		}
	}
	assert.Positive(t, stable)
	assert.Equal(t, rep.Evictions, ev)
	assert.Equal(t, rep.OnDemandSwapIns, od)
}
