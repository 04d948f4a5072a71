package chameleon

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/simulate"
)

func TestDeviceDefaults(t *testing.T) {
	for name, want := range map[string]int{"npu:0": 1, "Ascend910B (npu:3)": 1, "host": 0, "NVIDIA H200 (cuda:0)": 0} {
		dev, err := host.New(1<<20, host.WithName(name))
		require.NoError(t, err)
		assert.Len(t, deviceDefaults(dev), want, name)
		require.NoError(t, dev.Close())
	}
}

// TestCloserFit: a tighter plan for placement that found no plan under its
// limit is made again at the least share the planner's error says may be
// met, with a little room, while that is still under the peak of the
// policy in force; otherwise the policy in force stays.
func TestCloserFit(t *testing.T) {
	e := &Engine{placeFit: 0.9}
	e.cfg.limit = 1000
	e.policy = &policy{exec: &simulate.Result{Peak: 950}}
	wrap := func(short int64) error {
		return fmt.Errorf("plan: %w", &mre.InfeasibleError{Limit: 900, Op: 7, Shortfall: short})
	}
	require.True(t, e.closerFit(wrap(20)))
	assert.InDelta(t, 0.92*feasibleMargin, e.placeFit, 1e-9)
	e.placeFit = 0.9
	assert.False(t, e.closerFit(wrap(49)), "at or over the peak of the policy in force")
	assert.InDelta(t, 0.9, e.placeFit, 1e-9)
	assert.False(t, e.closerFit(errors.New("no plan")), "not an infeasible limit")
	e.placeFit = 0.93
	assert.False(t, e.closerFit(wrap(20)), "no closer than the share already tried")
}
