package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon"
	"github.com/chameleon-go/chameleon/device/host"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/replay"
	"github.com/chameleon-go/chameleon/seq"
	"github.com/chameleon-go/chameleon/trace"
)

// TestEnginePlanIsCommandPlan: the Engine and the plan command share one
// planning path. The iteration the Engine profiled while replaying the
// bundled trace, planned by the command at the Engine's limit with the
// Engine's curve (the memory model's) and its allocator's page, gives the
// Engine's swaps, one for one, the same limit it planned for (lowered for
// its layout) and the same simulated time.
func TestEnginePlanIsCommandPlan(t *testing.T) {
	cases := []struct {
		path  string
		scale int64
		pct   float64
		tiers []int // WithTiers and --tiers; nil: the defaults
	}{
		{bundled, 1024, 0.85, nil},
		{filepath.Join(publicDir, "llama16-bf16.jsonl.gz"), 4096, 0.8, nil},
		{filepath.Join(publicDir, "llama16-bf16.jsonl.gz"), 4096, 0.8, []int{100}},
		{filepath.Join(publicDir, "mixtral8-eager-bf16.jsonl.gz"), 4096, 0.8, nil},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s@%v%v", filepath.Base(c.path), c.pct, c.tiers), func(t *testing.T) {
			if _, err := os.Stat(c.path); err != nil {
				t.Skip("public traces absent")
			}
			if raceEnabled && c.path != bundled {
				t.Skip("under the race detector, the bundled trace only")
			}
			tr, err := trace.ReadFile(c.path)
			require.NoError(t, err)
			scale, pct := c.scale, c.pct
			limit := int64(float64(replay.PeakBytes(tr)/scale) * pct)
			dev, err := host.New(limit)
			require.NoError(t, err)
			defer dev.Close()
			var now int64
			clock := func() time.Time { now += 17e6; return time.Unix(0, now) }
			d := seq.DefaultConfig()
			d.M, d.N = 2, 1
			opts := []chameleon.Option{chameleon.WithDetection(d), chameleon.WithClock(clock)}
			if c.tiers != nil {
				opts = append(opts, chameleon.WithTiers(c.tiers...))
			}
			rep, err := replay.Run(tr, dev, replay.Config{Scale: scale, Rounds: 2, Limit: limit, Options: opts})
			if rep != nil && rep.Engine != nil {
				defer rep.Engine.Close()
			}
			var planned *chameleon.Result
			for i := range rep.Results {
				if rep.Results[i].Plan != nil && rep.Results[i].Plan.Policy != nil {
					planned = &rep.Results[i]
					break
				}
			}
			require.NotNil(t, planned, "the Engine planned no policy (replay: %v)", err)
			eng := planned.Plan
			require.NotEmpty(t, eng.Swaps())

			// What lived past the profiled iteration is the Engine's to say:
			// the tensors the host still held at its end.
			in := plan.Input{Iter: eng.Model.Iter, LiveOut: func(id trace.TensorID) bool { return eng.Model.Lifetime(id).LiveOut }}
			cli, err := planIteration("engine-profile", 0, in, planConfig{limit: fmt.Sprintf("%dB", limit), curve: "model",
				minBytes: mre.DefaultMinBytes, prefetch: mre.DefaultPrefetchLayers, tiers: c.tiers, page: eng.Layout.Page})
			require.NoError(t, err)
			assert.Equal(t, eng.Planned, cli.PlannedBytes, "the same limit")
			assert.LessOrEqual(t, eng.Planned, eng.Limit)
			require.NotNil(t, cli.Layout)
			assert.Equal(t, eng.Layout.Fits(), cli.Layout.Fits)
			assert.Equal(t, eng.Swaps(), cli.policy.Swaps, "the same swaps")
			assert.Equal(t, eng.Exec.IterationUS/1000, cli.IterationMSExec, "the same simulated iteration")
		})
	}
}
