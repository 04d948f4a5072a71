package plan_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/chameleon-go/chameleon/internal/testtraces"
	"github.com/chameleon-go/chameleon/layer"
	"github.com/chameleon-go/chameleon/memory"
	"github.com/chameleon-go/chameleon/mre"
	"github.com/chameleon-go/chameleon/plan"
	"github.com/chameleon-go/chameleon/trace"
)

// TestMakeKeepsTheBetterGrouping: Make plans over the logical layers and
// over each of them halved, and keeps the faster plan of the two, each the
// plan Make gives with that grouping alone; the timing's groups stay the
// grouper's. On llama7b-8l with its optimizer step in the backward at a
// quarter of its peak the halved layers win.
func TestMakeKeepsTheBetterGrouping(t *testing.T) {
	if raceEnabled {
		t.Skip("the public traces' plans are slow under the race detector")
	}
	tr := testtraces.Read(t, "llama7b-8l-bf16.jsonl.gz")
	split, origins := trace.SplitTrace(tr)
	split, _ = memory.HoistTrace(split, origins)
	in := plan.Input{Iter: split.Iterations[1], LiveOut: memory.LiveOutFromTrace(split, 1)}
	opts := []plan.Option{plan.WithRecompute(mre.Recomputable), plan.WithRecordedCurve()}
	pre, err := plan.Prepare(in, opts...)
	require.NoError(t, err)
	in.Limit = slices.Max(pre.Curve) / 4

	coarse := layer.Uniform(in.Iter.Ops, plan.DefaultGroups)
	finer := layer.Halved(coarse)
	def, err := plan.Make(in, opts...)
	require.NoError(t, err)
	one, err := plan.Make(in, append(opts, plan.WithOneGrouping())...)
	require.NoError(t, err)
	halved, err := plan.Make(in, append(opts, plan.WithOneGrouping(),
		plan.WithGrouper(plan.GrouperFunc(func([]trace.Op) []layer.Group { return finer })))...)
	require.NoError(t, err)
	t.Logf("one grouping %.2f ms, halved %.2f ms, kept %.2f ms over %d layers",
		one.Exec.IterationUS/1e3, halved.Exec.IterationUS/1e3, def.Exec.IterationUS/1e3, len(def.PlanGroups))

	assert.Equal(t, coarse, def.Groups, "the grouper's layers time the plan")
	assert.Equal(t, coarse, one.PlanGroups)
	require.True(t, def.Layout.Fits() && one.Layout.Fits() && halved.Layout.Fits())
	assert.Less(t, halved.Exec.IterationUS, one.Exec.IterationUS, "the halved layers plan faster here")
	assert.Equal(t, finer, def.PlanGroups)
	assert.Equal(t, halved.Swaps(), def.Swaps(), "the plan kept is the halved layers' plan")
	assert.Equal(t, halved.Exec.IterationUS, def.Exec.IterationUS)
}
