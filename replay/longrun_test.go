package replay_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
)

// TestLongRunAfterAlternation replays the fp16 trace's skipped steps
// alternating with real ones, then eight real steps in a row, as a run
// does once the loss scale settles. The real steps' policy is cached by
// then. Each run of one real step taught the Engine to expect a skipped
// step after one, so the long run's second iteration runs under the
// skipped step's policy and is dropped at its end (foreign); from its
// third on, the run must run under its own policy, with no copy back on
// demand and no forced eviction, and every byte verified.
func TestLongRunAfterAlternation(t *testing.T) {
	if raceEnabled {
		t.Skip("a replay of a large trace: not under the race detector")
	}
	tr := shared(t, "llama16-fp16-scaler.jsonl.gz")
	const real, long = 7, 8 // a real step (5646 ops) between skipped ones
	require.Equal(t, 5646, len(tr.Iterations[real].Ops))
	var order []int
	for k := range tr.Iterations {
		order = append(order, k)
	}
	for range 3 {
		order = append(order, 4, 5, 6, 7)
	}
	alternated := len(order)
	for range long {
		order = append(order, real)
	}
	const scale = 1024
	limit := int64(float64(replay.PeakBytes(tr)/scale) * 0.6)
	dev, err := host.New(limit)
	require.NoError(t, err)
	defer dev.Close()
	// Estimated op times and a link of a set bandwidth: the plans, and so
	// the test, are the same on every machine.
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Order: order, Limit: limit,
		Options: []chameleon.Option{chameleon.WithMeasuredTimes(false), chameleon.WithLinkBandwidth(55e9)}})
	require.NoError(t, err)
	defer rep.Engine.Close()
	require.Len(t, rep.Results, len(order))

	assert.Zero(t, rep.FailedUses, rep.Failures)
	assert.Positive(t, rep.VerifiedUses)
	assert.LessOrEqual(t, dev.PeakAllocated(), limit, "device bytes above the limit")

	// The real steps' policy, as the last alternating real step ran it.
	own := rep.Results[alternated-1]
	require.Positive(t, own.SimulatedMS, "the alternating real steps run a policy")
	for i := alternated + 2; i < len(order); i++ {
		r := rep.Results[i]
		assert.Equal(t, own.SimulatedMS, r.SimulatedMS, "run iteration %d: under another policy", i-alternated+1)
		assert.Equal(t, own.Matched, r.Matched, "run iteration %d", i-alternated+1)
		if i > alternated+2 { // the third follows a foreign iteration's misses
			assert.Zero(t, r.OnDemand, "run iteration %d: copies back on demand", i-alternated+1)
			assert.Zero(t, r.Evictions, "run iteration %d: forced evictions", i-alternated+1)
		}
	}
}

// TestCarriedCopiesBack replays the fp16 trace's rounds: skipped steps
// and real ones, each sequence under its own policy once both are
// planned, with a run of three skipped steps where a round starts again.
// A skipped step under the real step's policy (the run's second: the
// Engine expected a real step) ends before that policy's copies back of
// the weights for the optimizer step; a real step after a skipped one
// finds the skipped step's copies back across the step's end unissued.
// The Engine starts both where the last policy had them (Stats.Carried),
// so the STABLE steps bring almost nothing back at its use.
func TestCarriedCopiesBack(t *testing.T) {
	if raceEnabled {
		t.Skip("a replay of a large trace: not under the race detector")
	}
	tr := shared(t, "llama16-fp16-scaler.jsonl.gz")
	const scale = 1024
	limit := int64(float64(replay.PeakBytes(tr)/scale) * 0.6)
	dev, err := host.New(limit)
	require.NoError(t, err)
	defer dev.Close()
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: 4, Limit: limit,
		Options: []chameleon.Option{chameleon.WithMeasuredTimes(false), chameleon.WithLinkBandwidth(55e9)}})
	require.NoError(t, err)
	defer rep.Engine.Close()
	assert.Zero(t, rep.FailedUses, rep.Failures)
	assert.LessOrEqual(t, dev.PeakAllocated(), limit, "device bytes above the limit")
	var stable, in, onDemand int64
	for _, r := range rep.Results {
		if r.Stage.String() == "STABLE" {
			stable++
			in += r.SwapsIn
			onDemand += r.OnDemand
		}
	}
	require.Positive(t, stable)
	assert.Positive(t, rep.Stats.Carried)
	t.Logf("%d STABLE steps: %d planned copies back, %d on demand; %d carried", stable, in, onDemand, rep.Stats.Carried)
	assert.LessOrEqual(t, 100*onDemand, in, "STABLE steps: more than one copy back in a hundred at its use")
}

func TestOrderOutsideTheTrace(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	dev, err := host.New(1 << 30)
	require.NoError(t, err)
	defer dev.Close()
	n := len(tr.Iterations)
	_, err = replay.Run(tr, dev, replay.Config{Scale: 1024, Order: []int{0, n}, Limit: 1 << 30})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "order[1]")
}
