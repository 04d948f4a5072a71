package chameleon_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/replay"
)

// TestAscendMargin: on a device named as device/ascend names NPUs the
// planner gets AscendSafetyMargin; elsewhere none; an explicit margin
// replaces it. The planner is handed the Engine's settings, so each plan
// is compared with mre.Plan under the expected margin appended: it must be
// the same plan. TestDeviceDefaults checks which devices get the margin.
func TestAscendMargin(t *testing.T) {
	tr := testtraces.Read(t, testtraces.Small)
	const scale = 1024
	peak := replay.PeakBytes(tr) / scale
	limit := peak * 8 / 10
	sig := func(p *mre.Policy) string { return fmt.Sprintf("%.3f %v", p.Sim.IterationUS, p.Swaps) }
	for _, tt := range []struct {
		name   string
		extra  []chameleon.Option
		margin float64
	}{
		{"npu:0", nil, chameleon.AscendSafetyMargin},
		{"host", nil, 0},
		{"Ascend910B (npu:1)", []chameleon.Option{chameleon.WithPlanOptions(mre.WithSafetyMargin(0))}, 0},
	} {
		var planned int
		planner := plan.PlannerFunc(func(in mre.Input, opts ...mre.Option) (*mre.Policy, error) {
			pol, err := mre.Plan(in, opts...)
			if err != nil {
				return pol, err
			}
			want, err := mre.Plan(in, append(opts, mre.WithSafetyMargin(tt.margin))...)
			require.NoError(t, err)
			assert.Equal(t, sig(want), sig(pol), "%s: the plan is the one with margin %g", tt.name, tt.margin)
			planned++
			return pol, nil
		})
		dev, err := host.New(limit, host.WithName(tt.name))
		require.NoError(t, err)
		opts := append([]chameleon.Option{chameleon.WithPlanner(planner), chameleon.WithLinkBandwidth(2e9 / scale)}, tt.extra...)
		rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: 4, Limit: limit, Options: opts})
		if rep != nil && rep.Engine != nil {
			rep.Engine.Close()
		}
		require.NoError(t, err, tt.name)
		require.NoError(t, dev.Close())
		assert.Positive(t, planned, "%s: planned", tt.name)
	}
}
