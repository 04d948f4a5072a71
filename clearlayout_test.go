package chameleon_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
)

// TestHeldLongerLeavesTheLayout: a host that, once its steps run under a
// layout, keeps a value it made at the step's last op into the next step
// (it released it at once in the steps profiled) holds memory the layout
// gives the next step's first blocks. The Engine moves that value off the
// layout's blocks when the next step begins: the blocks planned there keep
// their places, and the value comes back byte for byte.
func TestHeldLongerLeavesTheLayout(t *testing.T) {
	const n, size = 6, 64 << 10
	limit := int64(n * size * 6)
	hd, err := host.New(2 * limit)
	require.NoError(t, err)
	t.Cleanup(func() { hd.Close() })
	s := newStepperOn(t, hd, hd, n, size, chameleon.WithMemoryLimit(limit), chameleon.WithDetection(quick()),
		chameleon.WithSyncPlanning(true), chameleon.WithMinSwapBytes(4096), chameleon.WithMeasuredTimes(false))
	s.actX = 3

	var held *chameleon.Tensor
	keep := false
	step := func(iter int) chameleon.Result {
		it := s.eng.Begin()
		err := s.ops(it, iter, true)
		if err == nil {
			// The step's last op makes a value of a parameter's size.
			x, xerr := s.eng.NewTensor(size, chameleon.Activation, "float32", nil)
			require.NoError(t, xerr)
			// It reads the one held from the step before, if any: as
			// written a step ago, wherever it went since.
			op := &chameleon.Op{Name: "aten::_local_scalar_dense", Out: []*chameleon.Tensor{x}}
			if held != nil {
				op.In = []*chameleon.Tensor{held}
			}
			require.NoError(t, it.Before(op))
			s.write(x, bytesOf(size, byte(iter), 7))
			if held != nil {
				s.read(held)
			}
			require.NoError(t, it.After(op))
			if held != nil {
				require.NoError(t, s.eng.Release(held))
				held = nil
			}
			if keep {
				held = x
			} else {
				require.NoError(t, s.eng.Release(x))
			}
		}
		res := it.End()
		for x := range s.made {
			require.NoError(t, s.eng.Release(x))
		}
		clear(s.made)
		require.NoError(t, err, "step %d", iter)
		return res
	}
	var last chameleon.Result
	for iter := range 10 {
		last = step(iter)
	}
	require.Equal(t, "STABLE", last.Stage.String())
	require.Positive(t, last.SwapsOut, "the policy swaps")

	keep = true
	step(10)
	step(11)
	before := s.eng.Stats()
	for iter := 12; iter < 16; iter++ {
		last = step(iter)
		require.Equal(t, "STABLE", last.Stage.String(), "step %d", iter)
	}
	after := s.eng.Stats()
	t.Logf("steps 12-15: %d blocks placed, %d missed their places", after.Placed-before.Placed, after.Missed-before.Missed)
	assert.Positive(t, after.Placed-before.Placed, "the steps follow the layout")
	assert.Zero(t, after.Missed-before.Missed, "no block finds its place taken by the value held a step longer")
	assert.Zero(t, after.Evictions-before.Evictions, "nor is it pushed out of the way")
	require.NotNil(t, held)
	require.NoError(t, s.eng.Release(held))
}
