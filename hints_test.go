package chameleon_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/trace"
)

// TestHintsKeepBytes: an evicted tensor leaves the device and comes back
// with its bytes, ahead of its use when prefetched, at its use otherwise;
// hints on a tensor already where they would send it do nothing.
func TestHintsKeepBytes(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	r.it = r.eng.Begin()
	a, b := r.tensor(16*kib, chameleon.Activation), r.tensor(16*kib, chameleon.Activation)
	wa, wb := randomBytes(1, 16*kib), randomBytes(2, 16*kib)
	require.NoError(t, r.op("make", nil, []*chameleon.Tensor{a, b}, func() { r.write(a, wa); r.write(b, wb) }))
	dev0 := r.eng.Stats().DeviceBytes

	require.NoError(t, r.eng.Evict(a))
	st := r.eng.Stats()
	assert.Equal(t, int64(1), st.HintEvictions)
	assert.Equal(t, int64(16*kib), st.HintEvictedBytes)
	assert.Equal(t, int64(16*kib), st.SwappedOutBytes, "an activation is copied out")
	assert.Equal(t, dev0-16*kib, st.DeviceBytes)
	require.NoError(t, r.eng.Evict(a), "evicting again does nothing")
	assert.Equal(t, int64(1), r.eng.Stats().HintEvictions)

	require.NoError(t, r.eng.Prefetch(a))
	require.NoError(t, r.eng.Prefetch(a), "a tensor arriving is left as it is")
	require.NoError(t, r.eng.Prefetch(b), "a resident one too")
	st = r.eng.Stats()
	assert.Equal(t, int64(1), st.HintPrefetches)
	assert.Equal(t, int64(1), st.SwapsIn)
	require.NoError(t, r.op("read", []*chameleon.Tensor{a, b}, nil, func() { r.check(a, wa, "prefetched"); r.check(b, wb, "resident") }))
	assert.Zero(t, r.eng.Stats().OnDemandIn, "the prefetch brought it ahead of its use")

	// Evicted and not prefetched: it comes back at its use.
	require.NoError(t, r.eng.Evict(a))
	require.NoError(t, r.eng.Evict(b))
	require.NoError(t, r.op("read", []*chameleon.Tensor{a, b}, nil, func() { r.check(a, wa, "on demand"); r.check(b, wb, "on demand") }))
	assert.Equal(t, int64(2), r.eng.Stats().OnDemandIn)

	// A Frozen tensor back on the device leaves with no copy.
	w := r.tensor(16*kib, chameleon.Frozen)
	ww := randomBytes(3, 16*kib)
	require.NoError(t, r.eng.Fill(w, ww))
	require.NoError(t, r.eng.Prefetch(w))
	before := r.eng.Stats()
	require.NoError(t, r.eng.Evict(w))
	st = r.eng.Stats()
	assert.Equal(t, before.KeptEvictions+1, st.KeptEvictions)
	assert.Equal(t, before.SwappedOutBytes, st.SwappedOutBytes, "released, not copied")
	require.NoError(t, r.op("read", []*chameleon.Tensor{w}, nil, func() { r.check(w, ww, "frozen") }))
	r.it.End()
	for _, x := range []*chameleon.Tensor{a, b, w} {
		require.NoError(t, r.eng.Release(x))
	}
	st = r.eng.Stats()
	assert.Zero(t, st.HostBytes, "no pinned buffer is lost")
	assert.Zero(t, st.DeviceBytes)
}

// TestPrefetchWaitsForRoom: a prefetch that finds no free device memory
// pushes nothing out; it starts once memory is free: after an Evict, or at
// the next op after a release. An Evict cancels it.
func TestPrefetchWaitsForRoom(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	r.it = r.eng.Begin()
	a, b := r.tensor(32*kib, chameleon.Activation), r.tensor(32*kib, chameleon.Activation)
	wa, wb := randomBytes(4, 32*kib), randomBytes(5, 32*kib)
	require.NoError(t, r.op("make a", nil, []*chameleon.Tensor{a}, func() { r.write(a, wa) }))
	require.NoError(t, r.eng.Evict(a))
	require.NoError(t, r.op("make b", nil, []*chameleon.Tensor{b}, func() { r.write(b, wb) }))
	c := r.tensor(32*kib, chameleon.Activation) // the device is full
	wc := randomBytes(6, 32*kib)
	require.NoError(t, r.op("make c", nil, []*chameleon.Tensor{c}, func() { r.write(c, wc) }))

	require.NoError(t, r.eng.Prefetch(a))
	st := r.eng.Stats()
	assert.Equal(t, int64(1), st.HintDeferrals)
	assert.Zero(t, st.HintPrefetches)
	assert.Zero(t, st.Evictions, "a prefetch pushes nothing out")
	require.NoError(t, r.eng.Prefetch(a), "asked again while it waits: still one")
	assert.Equal(t, int64(1), r.eng.Stats().HintDeferrals)

	require.NoError(t, r.eng.Evict(b)) // room: the prefetch starts
	st = r.eng.Stats()
	assert.Equal(t, int64(1), st.HintPrefetches)
	require.NoError(t, r.op("read", []*chameleon.Tensor{a, c}, nil, func() { r.check(a, wa, "a"); r.check(c, wc, "c") }))
	assert.Zero(t, r.eng.Stats().OnDemandIn)

	// Waiting, then cancelled by an Evict.
	require.NoError(t, r.eng.Evict(a))
	require.NoError(t, r.eng.Prefetch(b)) // only c is resident: room for b
	require.NoError(t, r.eng.Prefetch(a)) // no room left: waits
	assert.Equal(t, int64(2), r.eng.Stats().HintDeferrals)
	require.NoError(t, r.eng.Evict(a)) // cancels the wait (a is off already)
	require.NoError(t, r.eng.Release(c))
	require.NoError(t, r.op("read b", []*chameleon.Tensor{b}, nil, func() { r.check(b, wb, "b") }))
	assert.Equal(t, int64(2), r.eng.Stats().HintPrefetches, "the cancelled prefetch did not start")

	// Waiting, then started at an op's Before once a release made room.
	require.NoError(t, r.eng.Evict(b))
	d := r.tensor(32*kib, chameleon.Activation)
	e := r.tensor(32*kib, chameleon.Activation)
	require.NoError(t, r.op("make d e", nil, []*chameleon.Tensor{d, e}, nil))
	require.NoError(t, r.eng.Prefetch(a))
	require.NoError(t, r.eng.Release(d))
	assert.Equal(t, int64(2), r.eng.Stats().HintPrefetches)
	require.NoError(t, r.op("use e", []*chameleon.Tensor{e}, nil, nil))
	assert.Equal(t, int64(3), r.eng.Stats().HintPrefetches, "started at the op's Before")
	require.NoError(t, r.op("read a", []*chameleon.Tensor{a}, nil, func() { r.check(a, wa, "a") }))
	r.it.End()
	for _, x := range []*chameleon.Tensor{a, b, e} {
		require.NoError(t, r.eng.Release(x))
	}
	st = r.eng.Stats()
	assert.Zero(t, st.HostBytes)
	assert.Zero(t, st.DeviceBytes)
}

func TestHintMisuse(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	other := newRig(t, 64*kib)
	a, b := r.tensor(kib, chameleon.Activation), r.tensor(kib, chameleon.Activation)
	for _, hint := range []func(*chameleon.Tensor) error{r.eng.Evict, r.eng.Prefetch} {
		assert.ErrorContains(t, hint(nil), "nil tensor")
	}
	for _, hint := range []func(*chameleon.Tensor) error{other.eng.Evict, other.eng.Prefetch} {
		assert.ErrorContains(t, hint(a), "another Engine")
	}
	r.it = r.eng.Begin()
	require.NoError(t, r.op("make", nil, []*chameleon.Tensor{a, b}, nil))
	op := &chameleon.Op{Name: "use", In: []*chameleon.Tensor{a}}
	require.NoError(t, r.it.Before(op))
	err := r.eng.Evict(a)
	assert.ErrorContains(t, err, "evict tensor 0: the op under way lists it")
	assert.NoError(t, r.eng.Prefetch(a), "a tensor the op lists is on the device: nothing to do")
	assert.NoError(t, r.eng.Evict(b), "a tensor the op does not list may go")
	require.NoError(t, r.it.After(op))
	assert.NoError(t, r.eng.Evict(a), "after the op it may")
	r.it.End()
	require.NoError(t, r.eng.Release(a))
	for _, hint := range []func(*chameleon.Tensor) error{r.eng.Evict, r.eng.Prefetch} {
		assert.ErrorContains(t, hint(a), "released")
	}
	require.NoError(t, r.eng.Close())
	for _, hint := range []func(*chameleon.Tensor) error{r.eng.Evict, r.eng.Prefetch} {
		assert.ErrorIs(t, hint(b), chameleon.ErrClosed)
	}
}

// TestHintsWithPolicy: hints on the very tensors the policy in force moves
// (activations saved by a forward and read by a backward, under a limit
// smaller than them, and a frozen weight) copy and free each once: every
// byte is verified at every use, nothing is lost when all is released.
func TestHintsWithPolicy(t *testing.T) {
	const kib = 1 << 10
	const layers = 6
	r := newRig(t, 96*kib, chameleon.WithDetection(quick()), chameleon.WithMinSwapBytes(1))
	w := r.tensor(8*kib, chameleon.Frozen)
	ww := randomBytes(9, 8*kib)
	require.NoError(t, r.eng.Fill(w, ww))
	var planned, stable int
	for step := range 10 {
		r.it = r.eng.Begin()
		saved := make([]*chameleon.Tensor, layers)
		want := make([][]byte, layers)
		for l := range layers {
			saved[l] = r.tensor(24*kib, chameleon.Activation)
			want[l] = randomBytes(uint64(100*step+l), 24*kib)
			in := []*chameleon.Tensor{w}
			if l > 0 {
				in = append(in, saved[l-1])
			}
			o := &chameleon.Op{Name: "fwd", Module: fmt.Sprintf("layer.%d", l), Phase: trace.PhaseForward, In: in, Out: saved[l:][:1]}
			require.NoError(t, r.it.Before(o))
			r.check(w, ww, "weight")
			if l > 0 {
				r.check(saved[l-1], want[l-1], "forward input")
			}
			r.write(saved[l], want[l])
			require.NoError(t, r.it.After(o))
			if l > 0 && step%2 == 0 {
				require.NoError(t, r.eng.Evict(saved[l-1])) // idle until the backward
			}
		}
		require.NoError(t, r.eng.Evict(w))
		for l := layers - 1; l >= 0; l-- {
			if l > 0 && step%3 != 2 {
				require.NoError(t, r.eng.Prefetch(saved[l-1])) // next op's input
			}
			o := &chameleon.Op{Name: "bwd", Module: fmt.Sprintf("layer.%d", l), Phase: trace.PhaseBackward, In: []*chameleon.Tensor{w, saved[l]}}
			require.NoError(t, r.it.Before(o))
			r.check(w, ww, "weight")
			r.check(saved[l], want[l], "saved")
			require.NoError(t, r.it.After(o))
			require.NoError(t, r.eng.Release(saved[l]))
		}
		res := r.it.End()
		require.NoError(t, res.Err)
		if res.Planned {
			planned++
		}
		if res.Stage.String() == "STABLE" {
			stable++
		}
	}
	st := r.eng.Stats()
	assert.Positive(t, planned, "a policy was planned")
	assert.Positive(t, stable)
	assert.Positive(t, st.HintEvictions)
	assert.Positive(t, st.HintPrefetches)
	assert.Zero(t, st.SwappedOutBytes%(24*kib), "only whole activations are copied out, never the weight")
	assert.LessOrEqual(t, st.PeakDeviceBytes, int64(96*kib))
	require.NoError(t, r.eng.Release(w))
	st = r.eng.Stats()
	assert.Zero(t, st.HostBytes, "no pinned buffer is lost")
	assert.Zero(t, st.DeviceBytes, "no device block is lost")
	t.Logf("stats: %+v", st)
}

// TestHintsFromAnotherGoroutine: a scheduler goroutine hints at random
// while the loop runs ops over the same tensors; the only refusals are of
// tensors the op under way lists, and every byte the ops read is right.
func TestHintsFromAnotherGoroutine(t *testing.T) {
	const kib = 1 << 10
	r := newRig(t, 64*kib)
	n := 6
	xs := make([]*chameleon.Tensor, n)
	want := make([][]byte, n)
	r.it = r.eng.Begin()
	for i := range xs {
		xs[i] = r.tensor(8*kib, chameleon.Activation)
		want[i] = randomBytes(uint64(200+i), 8*kib)
		require.NoError(t, r.op("make", nil, xs[i:][:1], func() { r.write(xs[i], want[i]) }))
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var hintErr error
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			x := xs[rng.IntN(n)]
			var err error
			if rng.IntN(2) == 0 {
				err = r.eng.Evict(x)
			} else {
				err = r.eng.Prefetch(x)
			}
			if err != nil && !strings.Contains(err.Error(), "the op under way lists it") {
				hintErr = err
				return
			}
		}
	})
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		i, j := rng.IntN(n), rng.IntN(n)
		require.NoError(t, r.op("read", []*chameleon.Tensor{xs[i], xs[j]}, nil, func() {
			r.check(xs[i], want[i], "read")
			r.check(xs[j], want[j], "read")
		}))
	}
	close(stop)
	wg.Wait()
	require.NoError(t, hintErr)
	r.it.End()
	for _, x := range xs {
		require.NoError(t, r.eng.Release(x))
	}
	st := r.eng.Stats()
	assert.Zero(t, st.HostBytes)
	assert.Zero(t, st.DeviceBytes)
	t.Logf("%d hinted evictions, %d hinted prefetches, %d on-demand swap-ins", st.HintEvictions, st.HintPrefetches, st.OnDemandIn)
}
