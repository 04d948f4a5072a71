package replay_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func shared(t *testing.T, name string) *trace.Trace {
	t.Helper()
	if testing.Short() {
		t.Skip("replays of the large traces are skipped in -short mode")
	}
	return testtraces.Read(t, name)
}

// run replays tr at pct of its largest peak and checks what must always
// hold: no byte lost, device memory never above the limit.
func run(t *testing.T, tr *trace.Trace, pct float64, scale int64, rounds int, m, n int) *replay.Report {
	t.Helper()
	limit := int64(float64(replay.PeakBytes(tr)/scale) * pct)
	dev, err := host.New(limit)
	require.NoError(t, err)
	defer dev.Close()
	d := seq.DefaultConfig()
	d.M, d.N = m, n
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: rounds, Limit: limit,
		Options: []chameleon.Option{chameleon.WithDetection(d)}})
	require.NoError(t, err)
	defer rep.Engine.Close()
	assert.Zero(t, rep.FailedUses, rep.Failures)
	assert.Positive(t, rep.VerifiedUses)
	assert.LessOrEqual(t, dev.PeakAllocated(), limit, "device bytes above the limit")
	t.Logf("%s: %d iterations, verified %d uses, swapped %d bytes, %d evictions, on-demand %d, replans %d, cache hits %d, stages %v",
		tr.Name, rep.Iterations, rep.VerifiedUses, rep.SwappedBytes, rep.Evictions, rep.OnDemandSwapIns, rep.Replans, rep.CacheHits, rep.Stages)
	return rep
}

func TestStaticReachesStableWithDefaults(t *testing.T) {
	tr := shared(t, "llama16-bf16.jsonl.gz")
	rep := run(t, tr, 0.8, 4096, 2, 5, 3)
	want := []string{"WARMUP", "WARMUP", "WARMUP", "WARMUP", "WARMUP", "GEN_POLICY", "GEN_POLICY", "GEN_POLICY", "STABLE", "STABLE", "STABLE", "STABLE"}
	assert.Equal(t, want, rep.Stages)
	assert.Equal(t, 1, rep.Replans)
	for _, r := range rep.Results[6:] {
		assert.Positive(t, r.SwapsOut, "iteration %d runs the policy", r.Index)
	}
}

func TestDynseqReplansAndHitsCache(t *testing.T) {
	tr := shared(t, "llama16-bf16-dynseq.jsonl.gz")
	rep := run(t, tr, 0.8, 4096, 2, 1, 1)
	// One policy per sequence length (2048, 1024, 4096), then every return
	// to a length seen before reuses its policy with no new warm-up.
	assert.Equal(t, 3, rep.Replans)
	assert.GreaterOrEqual(t, rep.CacheHits, 3)
	// Round 2 starts where round 1 ended (2048 -> 2048): STABLE at once.
	assert.Equal(t, "STABLE", rep.Stages[8])
	// 2048 -> 1024 in round 2: a change, then STABLE from the cache.
	assert.Equal(t, "WARMUP", rep.Stages[11])
	assert.Equal(t, "STABLE", rep.Stages[12])
}

// TestDynseqPlansShortRuns: with the default detection (five warm-up
// iterations), the two 4096-token iterations of each round never hold
// long enough to leave warm-up, and used to run every round on forced
// evictions alone. Seen five times, such a run's second iteration is
// profiled and planned; from then on the run runs its policy (the first
// of the two because the 1024-token run before it, as long as the last
// one, is expected to be followed by it as then): planned swaps, no
// forced eviction. The 2048-token iteration after them is expected too,
// and runs its own policy, of no swaps, rather than theirs.
func TestDynseqPlansShortRuns(t *testing.T) {
	if raceEnabled {
		t.Skip("four rounds of a large trace: not under the race detector")
	}
	tr := shared(t, "llama16-bf16-dynseq.jsonl.gz")
	rep := run(t, tr, 0.8, 4096, 4, 5, 3)
	n := len(tr.Iterations)
	peakOf := func(it *trace.Iteration) int64 {
		var p int64
		for _, o := range it.Ops {
			p = max(p, o.Mem)
		}
		return p
	}
	var top int64
	for _, it := range tr.Iterations {
		top = max(top, peakOf(it))
	}
	var long []int // the 4096-token iterations: the trace's peak is theirs
	for i, it := range tr.Iterations {
		if peakOf(it) > top*9/10 {
			long = append(long, i)
		}
	}
	require.Len(t, long, 2, "two 4096-token iterations")
	for _, i := range long {
		x := rep.PerIteration[3*n+i]
		assert.Positive(t, x.PlannedSwaps, "iteration %d", i)
		assert.Zero(t, x.Evictions, "iteration %d", i)
		assert.Positive(t, rep.PerIteration[i].Evictions, "the first round runs iteration %d on forced evictions", i)
	}
	assert.Equal(t, "STABLE", rep.PerIteration[3*n+long[1]].Stage)
	after := rep.PerIteration[3*n+(long[1]+1)%n]
	assert.Zero(t, after.PlannedSwaps, "the iteration after them, under a limit it fits")
	assert.Positive(t, rep.Stats.Expected)
}

func TestScalerChangesResetAndReuse(t *testing.T) {
	tr := shared(t, "llama16-fp16-scaler.jsonl.gz")
	rep := run(t, tr, 0.8, 4096, 1, 1, 1)
	// Skipped steps (4174 ops) alternate with real ones (5646/6087): every
	// switch is a change. The 4174-op sequence is planned once it holds
	// (iteration 1) and comes back from the cache; the 5646-op one never
	// holds two iterations in a row, but it recurs, so it is planned on
	// its second occurrence (iteration 7) and reused on its third.
	for i, r := range rep.Results {
		if i > 0 && r.Ops != rep.Results[i-1].Ops {
			assert.True(t, r.Detect.Changed, "iteration %d", i)
			assert.Equal(t, "WARMUP", r.Stage.String())
		}
	}
	assert.Equal(t, 2, rep.Replans)
	assert.True(t, rep.Results[1].Planned)
	assert.True(t, rep.Results[7].Planned)
	for _, i := range []int{4, 6, 8, 9} {
		assert.True(t, rep.Results[i].CacheHit, "iteration %d", i)
	}
}

func TestMixtralUnderLimit(t *testing.T) {
	tr := shared(t, "mixtral8-eager-bf16.jsonl.gz")
	rep := run(t, tr, 0.8, 4096, 2, 1, 1)
	assert.Contains(t, rep.Stages, "STABLE")
}

func TestBundledSmall(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	rep := run(t, tr, 0.85, 1024, 3, 2, 1)
	assert.Equal(t, 1, rep.Replans)
	assert.True(t, slices.Equal(rep.Stages[3:], []string{"STABLE", "STABLE", "STABLE", "STABLE", "STABLE", "STABLE"}))
}
