package chameleon_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/match"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// quick detection so a 3-iteration trace reaches STABLE in a few rounds.
func quick() seq.Config {
	c := seq.DefaultConfig()
	c.M, c.N = 2, 1
	return c
}

// replaySmall replays the bundled trace at pct of its peak.
func replaySmall(t *testing.T, pct float64, rounds int, opts ...chameleon.Option) (*replay.Report, *host.Device) {
	t.Helper()
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	limit := int64(float64(replay.PeakBytes(tr)/scale) * pct)
	dev, err := host.New(limit)
	require.NoError(t, err)
	t.Cleanup(func() { dev.Close() })
	rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: rounds, Limit: limit,
		Options: append([]chameleon.Option{chameleon.WithDetection(quick())}, opts...)})
	require.NoError(t, err)
	t.Cleanup(func() { rep.Engine.Close() })
	return rep, dev
}

func TestEngineKeepsLimitAndBytes(t *testing.T) {
	rep, dev := replaySmall(t, 0.85, 3)
	assert.Zero(t, rep.FailedUses, rep.Failures)
	assert.Positive(t, rep.VerifiedUses)
	assert.LessOrEqual(t, dev.PeakAllocated(), rep.LimitBytes, "device memory above the limit")
	assert.LessOrEqual(t, rep.PeakDeviceBytes, rep.LimitBytes)
	assert.Positive(t, rep.SwappedBytes)
	assert.Equal(t, 1, rep.Replans)
	// WARMUP for m=2, GEN_POLICY for n=1, then STABLE with the policy
	// applied: its swaps run ahead of use.
	assert.Equal(t, []string{"WARMUP", "WARMUP", "GEN_POLICY", "STABLE", "STABLE", "STABLE", "STABLE", "STABLE", "STABLE"}, rep.Stages)
	for _, r := range rep.Results[3:] {
		assert.Positive(t, r.SwapsOut, "iteration %d", r.Index)
		assert.Positive(t, r.Matched, "iteration %d", r.Index)
	}
}

func TestEngineWithoutPressureDoesNotSwap(t *testing.T) {
	rep, _ := replaySmall(t, 1.1, 2)
	assert.Zero(t, rep.FailedUses)
	assert.Zero(t, rep.SwappedBytes)
	assert.Zero(t, rep.Stats.Evictions)
}

func TestEngineSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(t.Context())
	rep, _ := replaySmall(t, 0.85, 2, chameleon.WithTracerProvider(tp))
	require.Zero(t, rep.FailedUses)
	count := map[string]int{}
	// Each of the two plans made side by side has its stages' spans,
	// told apart by the layers it counted; choose names the one kept.
	planned := map[int64]bool{} // the plan_groups of each plan laid out
	var kept map[string]any
	for _, s := range rec.Ended() {
		count[s.Name()]++
		attrs := map[string]any{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.AsInterface()
		}
		switch s.Name() {
		case "chameleon.plan":
			assert.Positive(t, attrs["swaps"])
			assert.Positive(t, attrs["bytes"])
			assert.Positive(t, attrs["plan_groups"])
		case "chameleon.layout":
			planned[attrs["plan_groups"].(int64)] = true
		case "chameleon.choose":
			kept = attrs
		}
	}
	assert.Equal(t, 6, count["chameleon.execute"])
	assert.Equal(t, 6, count["chameleon.encode"])
	assert.Equal(t, 6, count["chameleon.detect"])
	assert.Equal(t, 1, count["chameleon.group"])
	assert.Equal(t, 2, count["chameleon.plan"])
	assert.Equal(t, 2, count["chameleon.simulate"])
	assert.Equal(t, 2, count["chameleon.layout"])
	require.Equal(t, 1, count["chameleon.choose"])
	assert.Len(t, planned, 2, "the two plans count their prefetches over different layers")
	assert.Contains(t, planned, kept["plan_groups"], "the plan kept is one of the two")
	sim := rep.Engine.Simulation()
	require.NotNil(t, sim)
	assert.InDelta(t, sim.Result.IterationUS, kept["iteration_us"], 1e-6, "choose reports the simulated step of the plan in force")
}

func TestPolicyCacheSurvivesRestart(t *testing.T) {
	rep, _ := replaySmall(t, 0.85, 2)
	require.Equal(t, 1, rep.Engine.CachedPolicies())
	path := filepath.Join(t.TempDir(), "policies.json")
	require.NoError(t, rep.Engine.SavePolicyFile(path))

	// A restarted job loads the cache: its first iteration adopts the
	// policy, the next ones run STABLE with no warm-up.
	tr := testtraces.Read(t, testtraces.Small)
	dev, err := host.New(rep.LimitBytes)
	require.NoError(t, err)
	defer dev.Close()
	var loaded *chameleon.Engine
	rep2, err := replay.Run(tr, dev, replay.Config{Scale: 1024, Rounds: 1, Limit: rep.LimitBytes,
		Options: []chameleon.Option{chameleon.WithDetection(quick()), chameleon.WithPolicyFile(path)}})
	require.NoError(t, err)
	loaded = rep2.Engine
	defer loaded.Close()
	assert.Equal(t, []string{"WARMUP", "STABLE", "STABLE"}, rep2.Stages)
	assert.Equal(t, 1, rep2.CacheHits)
	assert.Zero(t, rep2.Replans)
	assert.Zero(t, rep2.FailedUses)

	// A damaged file is an error naming it (strict).
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"format":"other"}`), 0o644))
	dev2, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev2.Close()
	_, err = chameleon.New(dev2, chameleon.WithMemoryLimit(1<<20), chameleon.WithPolicyFile(bad), chameleon.WithStrictPolicyFile())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.json")
}

func TestNewValidates(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	_, err = chameleon.New(dev)
	assert.ErrorContains(t, err, "memory limit")
	_, err = chameleon.New(nil, chameleon.WithMemoryLimit(1))
	assert.Error(t, err)
	// More than the device has.
	_, err = chameleon.New(dev, chameleon.WithMemoryLimit(2<<20))
	assert.Error(t, err)
	_, err = chameleon.New(dev, chameleon.WithMemoryLimit(math.MaxInt64))
	assert.ErrorContains(t, err, "more than the 1125899906842624 bytes (1 PiB) any device holds")
	bad := seq.DefaultConfig()
	bad.M = -1
	tests := []struct {
		name string
		give chameleon.Option
		want string // in the error
	}{
		{"negative stage count", chameleon.WithDetection(bad), "WithDetection"},
		{"threshold above 1", chameleon.WithDetection(seq.Config{MinSimilarity: 2}), "similarity"},
		{"negative score weight", chameleon.WithScoreWeight(-1), "score weight"},
		{"negative prefetch", chameleon.WithPrefetchLayers(-1), "prefetch"},
		{"negative size threshold", chameleon.WithMinSwapBytes(-1), "size threshold"},
		{"negative margin", chameleon.WithPlanOptions(mre.WithSafetyMargin(-1)), "margin"},
		{"no groups", chameleon.WithGroups(0), "WithGroups"},
		{"zero link", chameleon.WithLinkBandwidth(0), "WithLinkBandwidth"},
		{"matching threshold above 1", chameleon.WithMatching(match.Config{Threshold: 1.5}), "threshold"},
		{"negative matching weight", chameleon.WithMatching(match.Config{Ptr: -1, Stack: 1}), "weight"},
		{"negative host reserve", chameleon.WithHostReserve(-1), "WithHostReserve"},
		{"tiers out of order", chameleon.WithTiers(100, 90), "limit tiers"},
		{"no tiers", chameleon.WithTiers(), "no limit tiers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(1<<10), tt.give)
			if eng != nil {
				eng.Close()
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestStructOptionsFillDefaults: a struct option names what it changes;
// its zero fields keep their defaults, so seq.Config{M: 2} is m=2 with the
// paper's thresholds, not thresholds of 0.
func TestStructOptionsFillDefaults(t *testing.T) {
	dev, err := host.New(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(1<<10), chameleon.WithDetection(seq.Config{M: 2}),
		chameleon.WithMatching(match.Config{Threshold: 0.9}))
	require.NoError(t, err)
	defer eng.Close()
	// m=2, n=3 (the default): WARMUP for two iterations, GEN_POLICY for three.
	var stages []seq.Stage
	for range 6 {
		it := eng.Begin()
		stages = append(stages, it.End().Stage)
	}
	assert.Equal(t, []seq.Stage{seq.Warmup, seq.Warmup, seq.GenPolicy, seq.GenPolicy, seq.GenPolicy, seq.Stable}, stages)
}

func TestOutOfMemoryIsAnError(t *testing.T) {
	dev, err := host.New(64 << 10)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(64<<10))
	require.NoError(t, err)
	defer eng.Close()
	it := eng.Begin()
	a, err := eng.NewTensor(40<<10, chameleon.Activation, "float32", []int64{10240})
	require.NoError(t, err)
	fill := &chameleon.Op{Name: "fill", Out: []*chameleon.Tensor{a}}
	require.NoError(t, it.Before(fill))
	require.NoError(t, it.After(fill))
	b, err := eng.NewTensor(40<<10, chameleon.Activation, "float32", []int64{10240})
	require.NoError(t, err, "a is idle: it is swapped out to make room")
	op := &chameleon.Op{Name: "add", In: []*chameleon.Tensor{a}, Out: []*chameleon.Tensor{b}}
	// a and b together cannot be resident under 64 KiB.
	err = it.Before(op)
	require.Error(t, err)
	assert.True(t, errors.Is(err, chameleon.ErrOutOfMemory), err)
	it.End()
}

func TestSwappedTensorComesBackIdentical(t *testing.T) {
	dev, err := host.New(96 << 10)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(96<<10))
	require.NoError(t, err)
	defer eng.Close()
	it := eng.Begin()
	a, err := eng.NewTensor(40<<10, chameleon.Activation, "uint8", []int64{40 << 10})
	require.NoError(t, err)
	op := &chameleon.Op{Name: "fill", Out: []*chameleon.Tensor{a}}
	require.NoError(t, it.Before(op))
	want := bytes.Repeat([]byte{1, 2, 3, 5, 8, 13, 21}, (40<<10)/7+1)[:40<<10]
	require.NoError(t, dev.WriteDevice(a.Ptr(), want))
	require.NoError(t, it.After(op))
	// Two more tensors force a out.
	var others []*chameleon.Tensor
	for range 2 {
		b, err := eng.NewTensor(40<<10, chameleon.Activation, "uint8", []int64{40 << 10})
		require.NoError(t, err)
		op := &chameleon.Op{Name: "fill", Out: []*chameleon.Tensor{b}}
		require.NoError(t, it.Before(op))
		require.NoError(t, it.After(op))
		others = append(others, b)
	}
	assert.Positive(t, eng.Stats().SwapsOut)
	require.NoError(t, eng.Release(others[0]))
	use := &chameleon.Op{Name: "read", In: []*chameleon.Tensor{a}}
	require.NoError(t, it.Before(use))
	got := make([]byte, len(want))
	require.NoError(t, dev.ReadDevice(got, a.Ptr()))
	assert.True(t, bytes.Equal(want, got))
	require.NoError(t, it.After(use))
	it.End()
	assert.Positive(t, eng.Stats().SwapsIn)
	assert.True(t, slices.Contains([]int64{1, 2}, eng.Stats().OnDemandIn))
}

// Optimizer state used only by the step's last op sits idle from one
// optimizer step to the next: the plan moves it over the iteration
// boundary, and in STABLE no allocation has to force anything out.
func TestEngineMovesStateAcrossIterations(t *testing.T) {
	const kib = 1 << 10
	dev, err := host.New(48 * kib)
	require.NoError(t, err)
	defer dev.Close()
	d := seq.DefaultConfig()
	d.M, d.N = 1, 1
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(48*kib), chameleon.WithDetection(d), chameleon.WithMinSwapBytes(1))
	require.NoError(t, err)
	defer eng.Close()
	state, err := eng.NewTensor(24*kib, chameleon.Persistent, "f32", nil)
	require.NoError(t, err)
	var last chameleon.Result
	var evictionsStable int64
	for step := range 6 {
		before := eng.Stats().Evictions
		it := eng.Begin()
		a, err := eng.NewTensor(26*kib, chameleon.Activation, "f32", nil) // with the state, over the limit
		require.NoError(t, err)
		for i := range 10 {
			op := &chameleon.Op{Name: fmt.Sprintf("op%d", i), Overload: "default", Phase: trace.PhaseForward}
			var tmp *chameleon.Tensor
			switch i {
			case 0:
				op.Out = []*chameleon.Tensor{a}
			case 1:
				op.In = []*chameleon.Tensor{a}
			case 9:
				op.Phase, op.In, op.Out = trace.PhaseOptimizer, []*chameleon.Tensor{state}, []*chameleon.Tensor{state}
			default:
				tmp, err = eng.NewTensor(kib, chameleon.Activation, "f32", nil)
				require.NoError(t, err)
				op.Out = []*chameleon.Tensor{tmp}
			}
			require.NoError(t, it.Before(op))
			require.NoError(t, it.After(op))
			if i == 1 {
				require.NoError(t, eng.Release(a))
			}
			if tmp != nil {
				require.NoError(t, eng.Release(tmp))
			}
		}
		last = it.End()
		if step >= 3 {
			evictionsStable += eng.Stats().Evictions - before
		}
	}
	require.Equal(t, 1, eng.Stats().Replans)
	assert.Equal(t, "STABLE", last.Stage.String())
	assert.Positive(t, last.SwapsOut, "the state goes out after its use")
	assert.Positive(t, last.SwapsIn, "and comes back before it")
	assert.Zero(t, last.OnDemand)
	assert.Zero(t, evictionsStable, "no forced swap once the policy runs")
	assert.LessOrEqual(t, dev.PeakAllocated(), int64(48*kib))
}

// TestKeptCopyIsNotCopiedAgain: a weight that comes back only to be read
// still has a current host copy, so its next swap-out releases the device
// memory and copies nothing; once an op writes it, the next one copies, and
// its bytes come back as written.
func TestKeptCopyIsNotCopiedAgain(t *testing.T) {
	const kib = 1 << 10
	dev, err := host.New(64 * kib)
	require.NoError(t, err)
	defer dev.Close()
	eng, err := chameleon.New(dev, chameleon.WithMemoryLimit(64*kib))
	require.NoError(t, err)
	defer eng.Close()
	w, err := eng.NewTensor(32*kib, chameleon.Persistent, "u8", nil)
	require.NoError(t, err)
	fill := func(b byte) {
		buf := bytes.Repeat([]byte{b}, 32*kib)
		require.NoError(t, dev.WriteDevice(w.Ptr(), buf))
	}
	check := func(b byte) {
		got := make([]byte, 32*kib)
		require.NoError(t, dev.ReadDevice(got, w.Ptr()))
		require.Equal(t, bytes.Repeat([]byte{b}, 32*kib), got)
	}
	it := eng.Begin()
	op := func(name string, in, out []*chameleon.Tensor, body func()) {
		o := &chameleon.Op{Name: name, In: in, Out: out}
		require.NoError(t, it.Before(o))
		if body != nil {
			body()
		}
		require.NoError(t, it.After(o))
	}
	// pressure pushes w out: an activation as large as the rest of the limit.
	pressure := func() {
		a, err := eng.NewTensor(48*kib, chameleon.Activation, "u8", nil)
		require.NoError(t, err)
		op("fill", nil, []*chameleon.Tensor{a}, nil)
		require.NoError(t, eng.Release(a))
	}
	op("init", nil, []*chameleon.Tensor{w}, func() { fill(7) })
	pressure() // w goes out, copied
	st := eng.Stats()
	require.Equal(t, int64(1), st.SwapsOut)
	op("read", []*chameleon.Tensor{w}, nil, func() { check(7) })
	pressure() // w goes out again: read only, its host copy is current
	st = eng.Stats()
	assert.Equal(t, int64(2), st.SwapsOut)
	assert.Equal(t, int64(1), st.KeptEvictions)
	assert.Equal(t, int64(32*kib), st.SwappedOutBytes, "the second swap-out copied nothing")
	op("update", []*chameleon.Tensor{w}, []*chameleon.Tensor{w}, func() { check(7); fill(9) })
	pressure() // written since it came back: copied
	st = eng.Stats()
	assert.Equal(t, int64(1), st.KeptEvictions)
	assert.Equal(t, int64(64*kib), st.SwappedOutBytes)
	op("read", []*chameleon.Tensor{w}, nil, func() { check(9) })
	it.End()
}
