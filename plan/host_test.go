package plan_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/simulate"
	"github.com/chameleon-go/chameleon/trace"
)

// TestHostCurve: an activation's buffer is held from its copy out to the
// op that waits for it, over the iteration's end for a swap that wraps; a
// parameter keeps its copy until an op writes it, all iteration long when
// none does; a tensor's swaps share one buffer.
func TestHostCurve(t *testing.T) {
	it := &trace.Iteration{Ops: make([]trace.Op, 8), Tensors: map[trace.TensorID]*trace.Tensor{
		1: {ID: 1, Bytes: 1000, Kind: trace.KindActivation},
		2: {ID: 2, Bytes: 512, Kind: trace.KindParam},
		3: {ID: 3, Bytes: 512, Kind: trace.KindParam},
		4: {ID: 4, Bytes: 100, Kind: trace.KindActivation},
	}}
	it.Ops[6].Out = []trace.TensorID{2} // the optimizer writes parameter 2
	curve := func(sw ...simulate.Swap) []int64 { return plan.HostCurve(it, sw) }
	assert.Equal(t, []int64{0, 1024, 1024, 1024, 1024, 0, 0, 0}, curve(simulate.Swap{Tensor: 1, Bytes: 1024, Out: 1, Free: 2, In: 3, Use: 4}))
	assert.Equal(t, []int64{1024, 1024, 0, 0, 0, 0, 1024, 1024}, curve(simulate.Swap{Tensor: 1, Bytes: 1024, Out: 6, Free: 7, In: 0, Use: 1}), "over the end")
	assert.Equal(t, []int64{0, 512, 512, 512, 512, 512, 512, 0}, curve(simulate.Swap{Tensor: 2, Bytes: 512, Out: 1, Free: 2, In: 2, Use: 3}), "kept until op 6 writes it")
	assert.Equal(t, slices.Repeat([]int64{512}, 8), curve(simulate.Swap{Tensor: 3, Bytes: 512, Out: 1, Free: 2, In: 2, Use: 3}), "never written: held all along")
	assert.Equal(t, []int64{0, 0, 512, 512, 512, 512, 0, 0}, curve(simulate.Swap{Tensor: 4, Bytes: 100, Out: 2, Free: 3, In: 4, Use: 5}), "rounded to blocks")
	two := curve(simulate.Swap{Tensor: 1, Bytes: 1024, Out: 0, Free: 1, In: 1, Use: 2}, simulate.Swap{Tensor: 1, Bytes: 1024, Out: 2, Free: 3, In: 4, Use: 5})
	assert.Equal(t, []int64{1024, 1024, 1024, 1024, 1024, 1024, 0, 0}, two, "one buffer per tensor")
	assert.Equal(t, int64(1024), plan.HostPeak(it, []simulate.Swap{{Tensor: 1, Bytes: 1024, Out: 1, Free: 2, In: 3, Use: 4}}))
}

// TestMakeHostLimit: on the bundled trace, a host limit below what the
// plan holds at once makes Make take another plan (a later tier, or a
// plan again for its layout) that holds less; a limit no tier meets fails with a HostLimitError,
// which is infeasibility.
func TestMakeHostLimit(t *testing.T) {
	in, peak := small(t)
	in.Limit = peak * 85 / 100
	free, err := plan.Make(in)
	require.NoError(t, err)
	freeHost := plan.HostPeak(in.Iter, free.Swaps())
	require.Positive(t, freeHost)

	capped, err := plan.Make(in, plan.WithHostLimit(freeHost-1))
	require.NoError(t, err)
	assert.NotEqual(t, free.Swaps(), capped.Swaps(), "another plan")
	assert.LessOrEqual(t, plan.HostPeak(in.Iter, capped.Swaps()), freeHost-1)
	assert.LessOrEqual(t, capped.Exec.Peak, in.Limit)

	_, err = plan.Make(in, plan.WithHostLimit(512))
	require.Error(t, err)
	var hl *plan.HostLimitError
	require.True(t, errors.As(err, &hl), "%v", err)
	assert.ErrorIs(t, err, mre.ErrInfeasible)
	assert.Equal(t, int64(512), hl.Limit)
	assert.Greater(t, hl.Peak, hl.Limit)

	_, err = plan.Make(in, plan.WithHostLimit(-1))
	assert.Error(t, err)
	t.Logf("host peak %d bytes at tier %d; capped below it: %d bytes at tier %d", freeHost, free.Planned, plan.HostPeak(in.Iter, capped.Swaps()), capped.Planned)
}
