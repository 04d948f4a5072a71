package main

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/examples/train/compute"
	"github.com/chameleon-go/chameleon/seq"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// small is a model that trains in a few milliseconds a step, with
// activations several times the persistent state, so that half the peak
// can only be met by swapping activations.
func small(t *testing.T) Config {
	m := Model{Layers: 6, Width: 32, FFN: 32, In: 16, Out: 8, TeacherHidden: 32, Batch: 256}
	steps := 30
	if testing.Short() {
		steps = 16 // past WARMUP (5) and GEN_POLICY (3): STABLE steps run a policy
	}
	return Config{Model: m, Steps: steps, LR: 0.02, Momentum: 0.9, Seed: 7, MinSwap: 4 << 10, SyncPlanning: true}
}

func hostKernels(d *host.Device) Kernels {
	return func(s device.Stream) (compute.Kernels, error) { return compute.NewHost(d, s, 2), nil }
}

func newHost(t *testing.T) *host.Device {
	d, err := host.New(1 << 30)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// unlimited runs cfg on a reservation no step can fill.
func unlimited(t *testing.T, d *host.Device, cfg Config) *Report {
	cfg.Limit = cfg.UpperBoundBytes()
	rep, err := Train(d, hostKernels(d), cfg)
	require.NoError(t, err)
	require.Zero(t, rep.Stats.SwapsOut, "the unlimited run swapped: UpperBoundBytes is not an upper bound")
	return rep
}

// limited runs cfg under cfg.Limit on a new host device and checks what
// every limited run must hold: the Engine's peak and the device's within
// the limit.
func limited(t *testing.T, cfg Config) *Report {
	t.Helper()
	d := newHost(t)
	rep, err := Train(d, hostKernels(d), cfg)
	require.NoError(t, err)
	assert.LessOrEqual(t, rep.Stats.PeakDeviceBytes, cfg.Limit, "the Engine's allocator went over the limit")
	assert.LessOrEqual(t, d.PeakAllocated(), cfg.Limit, "the device held more than the Engine's reservation")
	return rep
}

func requireSameBits(t *testing.T, want, got []float32) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]),
			"step %d: loss %v with the limit, %v without", i, got[i], want[i])
	}
}

func mean(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	return s / float64(len(x))
}

// TestLimitKeepsLossBits is the example's claim: under a limit of half the
// unlimited peak the Engine swaps, stays under the limit, and the model
// learns exactly what it learns without the limit, bit for bit.
func TestLimitKeepsLossBits(t *testing.T) {
	cfg := small(t)
	free := unlimited(t, newHost(t), cfg)
	peak := free.Stats.PeakDeviceBytes

	cfg.Limit = peak / 2
	rep := limited(t, cfg)

	requireSameBits(t, free.Losses(), rep.Losses())
	st := rep.Stats
	assert.Positive(t, st.SwappedOutBytes, "half the peak must force swaps")
	assert.Positive(t, st.SwappedInBytes)
	assert.Positive(t, st.Replans, "a policy was planned")
	assert.Equal(t, seq.Stable, rep.Steps[len(rep.Steps)-1].Result.Stage)

	ls := rep.Losses()
	first, last := mean(ls[:3]), mean(ls[len(ls)-3:])
	assert.Less(t, last, 0.5*first, "the loss must fall: %v", ls)
	t.Logf("peak %d without a limit, %d under %d; swapped %d bytes out; loss %.4f -> %.4f",
		peak, st.PeakDeviceBytes, cfg.Limit, st.SwappedOutBytes, ls[0], ls[len(ls)-1])
}

// TestDynamicSequence skips blocks in phases: each switch must be detected,
// a pattern seen for the first time planned, and one seen before adopted
// from the policy cache, with the losses still those of the unlimited run.
func TestDynamicSequence(t *testing.T) {
	cfg := small(t)
	cfg.Dynamic, cfg.Phase, cfg.Patterns = true, 4, 2
	cfg.Steps = 32
	quick := seq.DefaultConfig()
	quick.M, quick.N = 2, 1
	cfg.Options = []chameleon.Option{chameleon.WithDetection(quick)}
	free := unlimited(t, newHost(t), cfg)

	cfg.Limit = free.Stats.PeakDeviceBytes / 2
	rep := limited(t, cfg)
	requireSameBits(t, free.Losses(), rep.Losses())

	var changed, planned, hits int
	pats := map[int]bool{}
	for _, s := range rep.Steps {
		r := s.Result
		pats[s.Pattern] = true
		if r.Detect.Changed {
			changed++
			assert.NotEqual(t, rep.Steps[s.Index-1].Pattern, s.Pattern, "step %d: change detected with no switch", s.Index)
			assert.True(t, strings.Contains(r.Detect.Reason, "length"), "a quarter of the blocks is a length change: %s", r.Detect.Reason)
		} else if s.Index > 0 {
			assert.Equal(t, rep.Steps[s.Index-1].Pattern, s.Pattern, "step %d: pattern switch not detected", s.Index)
		}
		if r.Planned {
			planned++
		}
		if r.CacheHit {
			hits++
		}
	}
	assert.Len(t, pats, 2, "both patterns ran")
	assert.Positive(t, changed)
	assert.GreaterOrEqual(t, planned, 2, "each pattern planned once")
	assert.Positive(t, hits, "a recurring pattern reuses its policy")
	assert.Equal(t, hits, rep.Stats.CacheHits)
	assert.LessOrEqual(t, rep.Stats.PeakDeviceBytes, cfg.Limit)
	assert.Positive(t, rep.Stats.SwappedOutBytes)
	t.Logf("%d changes, %d plans, %d cache hits over %d steps", changed, planned, hits, len(rep.Steps))
}

// TestRecomputeKeepsLossBits: with the forward's kernels handed to the
// Engine to run again, and a link slow enough that swapping cannot hide,
// the policies drop activations and recompute them, and the model learns
// exactly what it learns without the limit, bit for bit.
func TestRecomputeKeepsLossBits(t *testing.T) {
	cfg := small(t)
	free := unlimited(t, newHost(t), cfg)
	cfg.Limit = free.Stats.PeakDeviceBytes / 2
	cfg.Recompute = true
	cfg.Link = 1e8 // 100 MB/s: each swapped activation costs more than its recompute
	cfg.StepMS = 2 // op times fitted to a fixed step, whatever this machine's speed
	rep := limited(t, cfg)
	assert.Positive(t, rep.Stats.Recomputes, "activations were made again")
	requireSameBits(t, free.Losses(), rep.Losses())
}

// TestLossChunks: with a head wide enough that the whole batch's
// prediction, its target and its gradient are most of the step, the loss
// computed a chunk of the batch at a time runs under a limit below what
// the whole-batch loss's backward op alone lists, learns bit for bit what
// the chunked run without a limit learns, and what the whole-batch run
// learns up to the order the chunks' sums are added in.
func TestLossChunks(t *testing.T) {
	cfg := small(t)
	cfg.Model.Layers, cfg.Model.Out = 2, 512
	whole := unlimited(t, newHost(t), cfg)
	cfg.Model.LossChunks = 8
	free := unlimited(t, newHost(t), cfg)

	wl, cl := whole.Losses(), free.Losses()
	require.Len(t, cl, len(wl))
	for i := range wl {
		assert.InEpsilon(t, wl[i], cl[i], 1e-4, "step %d: the chunked loss is the whole batch's, summed in another order", i)
	}
	// What loss.backward lists run whole: the prediction, the target and
	// the prediction's gradient, each batch x out floats.
	m := cfg.Model
	floor := 3 * 4 * int64(m.Batch) * int64(m.Out)
	cfg.Limit = free.Stats.PeakDeviceBytes / 2
	require.Less(t, cfg.Limit, floor, "the limit must be below the whole-batch loss's working set")
	rep := limited(t, cfg)
	requireSameBits(t, cl, rep.Losses())
	st := rep.Stats
	assert.Positive(t, st.SwappedOutBytes, "the chunks' predictions and targets are swapped")
	assert.Equal(t, seq.Stable, rep.Steps[len(rep.Steps)-1].Result.Stage)
	t.Logf("peak %d whole, %d in %d chunks, %d under %d (the whole-batch loss lists %d); loss %.4f -> %.4f",
		whole.Stats.PeakDeviceBytes, free.Stats.PeakDeviceBytes, m.LossChunks, st.PeakDeviceBytes, cfg.Limit, floor, cl[0], cl[len(cl)-1])
}

// TestHoistKeepsLossBits: each parameter stepped in the backward, as soon
// as its gradient is final, learns the same bits as the step at the end,
// with and without blocks skipped; and under half the hoisted run's peak,
// on a model whose parameters, gradients and momentum outweigh its
// activations, the Engine streams them and still learns those bits.
func TestHoistKeepsLossBits(t *testing.T) {
	cfg := small(t)
	cfg.Model.Width, cfg.Model.FFN, cfg.Model.Batch = 128, 128, 32
	for _, dynamic := range []bool{false, true} {
		c := cfg
		c.Dynamic, c.Phase, c.Patterns = dynamic, 4, 2
		end := unlimited(t, newHost(t), c)
		c.Hoist = true
		hoisted := unlimited(t, newHost(t), c)
		requireSameBits(t, end.Losses(), hoisted.Losses())
		if dynamic {
			continue
		}
		m := c.Model
		require.Greater(t, 3*m.ParamBytes(), m.SavedActivationBytes(), "the parameters' state must outweigh the activations")
		c.Limit = hoisted.Stats.PeakDeviceBytes / 2
		rep := limited(t, c)
		requireSameBits(t, end.Losses(), rep.Losses())
		st := rep.Stats
		assert.Positive(t, st.SwappedOutBytes, "half the peak must force swaps")
		assert.Equal(t, seq.Stable, rep.Steps[len(rep.Steps)-1].Result.Stage)
		t.Logf("peak %d with the step at the end, %d hoisted, %d under %d; swapped %d bytes out",
			end.Stats.PeakDeviceBytes, hoisted.Stats.PeakDeviceBytes, st.PeakDeviceBytes, c.Limit, st.SwappedOutBytes)
	}
}
